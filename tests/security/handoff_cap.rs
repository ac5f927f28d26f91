//! HANDOFF honours `--max-memory`: a node that proved the cluster secret
//! hands a real `tollgate serve` process far more new keys than its cap
//! holds. With `--on-full refuse` the frames that would pass the cap are
//! answered ERROR StoreFull (the states that fit are merged); with `evict`
//! the closest to expiry make room. Either way the tables stay within the
//! cap and the node keeps serving checks.

use crate::common::RawConn;
use crate::harness::{eventually, free_addr, Node, CLUSTER_SECRET};
use tollgate_protocol::{
    ErrorCode, Record, ReplRequest, ReplResponse, Request, Response, StateEntry, StateValue,
    TableState,
};

/// The cap: 16 stripes of 16 KiB (the smallest share allowed).
const CAP: u64 = 16 * (16 << 10);
/// Keys handed over per frame, and frames at most: far past the cap
/// (a token bucket's key takes some 50 bytes of table).
const PER_FRAME: usize = 1_000;
const FRAMES: usize = 40;

fn node(on_full: &str) -> Node {
    Node::start(
        &free_addr(),
        &[
            "--max-memory",
            "256KiB",
            "--stripes",
            "16",
            "--on-full",
            on_full,
        ],
    )
}

/// Frame `f`'s records: new keys, each a token bucket an hour ahead.
fn records(f: usize) -> Vec<Record> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let tat = now + 3_600_000_000_000;
    (0..PER_FRAME)
        .map(|i| Record {
            key: format!("handed:{f}:{i}").into(),
            token_bucket: TableState::Present(StateEntry {
                expires_at: tat,
                state: StateValue::TokenBucket { tat },
            }),
            other: TableState::Unchanged,
        })
        .collect()
}

/// Sends every frame as a node; the answers, in order.
async fn hand_over(node: &Node) -> Vec<Response> {
    let mut c = RawConn::connect(node.addr.parse().unwrap()).await;
    match c
        .node_hello(CLUSTER_SECRET, tollgate_protocol::NodeScope::Cluster)
        .await
    {
        Some(Response::HelloOk { .. }) => {}
        other => panic!("HELLO proving the cluster secret: {other:?}"),
    }
    let mut answers = Vec::new();
    for f in 0..FRAMES {
        let handoff = Request::Repl(ReplRequest::Handoff {
            epoch: 1,
            records: records(f),
        });
        let id = f as u32 + 1;
        c.send(id, &handoff).await;
        let (got, answer) = c.recv().await;
        assert_eq!(got, id);
        answers.push(answer);
    }
    answers
}

/// `name`'s value on the node's /metrics once the sweeper published a
/// value satisfying `ready`.
async fn metric(node: &Node, name: &str, ready: impl Fn(f64) -> bool) -> f64 {
    eventually(&format!("{name} is published"), || async {
        let wait = std::time::Duration::from_secs(5);
        let text =
            tollgate::admin_client::call(&node.admin, hyper::Method::GET, "/metrics", None, wait)
                .await
                .ok()?
                .text();
        let value = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))?
            .trim()
            .parse::<f64>()
            .ok()?;
        ready(value).then_some(value)
    })
    .await
}

/// The node still answers a check of a key it holds.
async fn still_serves(node: &Node) {
    let mut c = RawConn::ready(node.addr.parse().unwrap()).await;
    let pair = crate::common::tb("handed:0:0", 1, 60_000, 5, 1);
    let answers = c.check(9, crate::common::batch_of(vec![vec![pair]])).await;
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert!(
        !matches!(answers[0], tollgate_protocol::CheckResult::Error(_)),
        "{answers:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_past_the_memory_cap_is_refused_with_store_full() {
    let node = node("refuse");
    let answers = hand_over(&node).await;
    let first_full = answers
        .iter()
        .position(|a| {
            matches!(
                a,
                Response::Error {
                    code: ErrorCode::StoreFull,
                    ..
                }
            )
        })
        .unwrap_or_else(|| panic!("no frame was refused: {:?}", &answers[..3]));
    assert!(first_full > 0, "the first frame fits in 256 KiB");
    assert!(
        matches!(
            answers[0],
            Response::Repl(ReplResponse::HandedOff { merged }) if merged as usize == PER_FRAME
        ),
        "{:?}",
        answers[0]
    );
    match &answers[first_full] {
        Response::Error { message, .. } => {
            assert!(message.contains("memory cap"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    let refused = metric(&node, "tollgate_keys_refused_total", |v| v > 0.0).await;
    assert!(refused > 0.0);
    let memory = metric(&node, "tollgate_memory_bytes", |v| v > 0.0).await;
    assert!(memory <= CAP as f64, "{memory} bytes past the {CAP} cap");
    still_serves(&node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_past_the_memory_cap_evicts_with_evict() {
    let node = node("evict");
    let answers = hand_over(&node).await;
    for a in &answers {
        assert!(
            matches!(a, Response::Repl(ReplResponse::HandedOff { .. })),
            "{a:?}"
        );
    }
    let evicted = metric(&node, "tollgate_keys_evicted_total", |v| v > 0.0).await;
    assert!(evicted > 0.0);
    let memory = metric(&node, "tollgate_memory_bytes", |v| v > 0.0).await;
    assert!(memory <= CAP as f64, "{memory} bytes past the {CAP} cap");
}
