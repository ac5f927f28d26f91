//! A client given several nodes of one shard, against fake nodes whose role
//! and epoch the test flips: it picks the primary with the highest epoch,
//! follows a NotPrimary answer to the new primary within the same call, and
//! is undecided (then recovers) while no node is primary.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tollgate_client::{
    Algorithm, CheckResult, Client, ClientConfig, ErrorCode, Limit, Outcome, Role, ServerLimits,
    Undecided, WireDecision as Decision,
};
use tollgate_protocol::{decode_request, encode_response, Request, Response, PROTOCOL_VERSION};

/// A fake node: answers HELLO with its current role and epoch, CHECK with a
/// decision whose `remaining` is its `id` when primary, NotPrimary
/// otherwise.
#[derive(Clone)]
struct FakeNode {
    addr: SocketAddr,
    state: Arc<Mutex<(Role, u64)>>,
}

impl FakeNode {
    async fn start(id: u64, role: Role, epoch: u64) -> FakeNode {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new((role, epoch)));
        let shared = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let state = shared.clone();
                tokio::spawn(async move {
                    let mut buf = BytesMut::with_capacity(4096);
                    loop {
                        match stream.read_buf(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                        let mut out = BytesMut::new();
                        while let Some((rid, request)) =
                            decode_request(&mut buf, &ServerLimits::default()).unwrap()
                        {
                            let (role, epoch) = *state.lock().unwrap();
                            let response = match request {
                                Request::Hello { .. } => Response::HelloOk {
                                    version: PROTOCOL_VERSION,
                                    role,
                                    epoch,
                                    offset: 0,
                                    limits: ServerLimits::default(),
                                },
                                Request::Check(batch) if role == Role::Primary => {
                                    Response::Checked(
                                        batch
                                            .iter()
                                            .map(|_| {
                                                CheckResult::Decision(Decision {
                                                    allowed: true,
                                                    shadow_denied: false,
                                                    pair: 0,
                                                    limit: 10,
                                                    remaining: id,
                                                    reset_after_ms: 0,
                                                    retry_after_ms: 0,
                                                    lease: None,
                                                })
                                            })
                                            .collect(),
                                    )
                                }
                                _ => Response::Error {
                                    code: ErrorCode::NotPrimary,
                                    message: "standby".into(),
                                },
                            };
                            encode_response(rid, &response, &mut out).unwrap();
                        }
                        if stream.write_all(&out).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        FakeNode { addr, state }
    }

    fn set(&self, role: Role, epoch: u64) {
        *self.state.lock().unwrap() = (role, epoch);
    }
}

fn limit() -> Limit {
    Limit {
        algorithm: Algorithm::TokenBucket,
        count: 5,
        period_ms: 1000,
        burst: 10,
    }
}

fn shard(nodes: &[&FakeNode]) -> Client {
    Client::new_shard(
        nodes.iter().map(|n| n.addr.to_string()).collect(),
        ClientConfig {
            deadline: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(1),
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_millis(50),
            fallback: None,
            ..ClientConfig::default()
        },
    )
    .expect("valid config")
}

/// Which node answered a check (its id is the decision's `remaining`).
fn answered_by(outcome: &Outcome) -> Option<u64> {
    outcome.decision().map(|d| d.remaining)
}

#[tokio::test]
async fn the_primary_with_the_highest_epoch_is_chosen() {
    let standby = FakeNode::start(1, Role::Standby, 9).await;
    let old = FakeNode::start(2, Role::Primary, 1).await;
    let new = FakeNode::start(3, Role::Primary, 3).await;
    let client = shard(&[&standby, &old, &new]);
    let outcome = client.check("k", limit(), 1).await;
    assert_eq!(answered_by(&outcome), Some(3), "{outcome:?}");
    assert_eq!(client.connected_addr(), Some(new.addr.to_string()));
    assert_eq!(client.server_info().map(|i| i.epoch), Some(3));
}

#[tokio::test]
async fn not_primary_sends_the_same_call_to_the_new_primary() {
    let a = FakeNode::start(1, Role::Primary, 1).await;
    let b = FakeNode::start(2, Role::Standby, 1).await;
    let client = shard(&[&a, &b]);
    assert_eq!(answered_by(&client.check("k", limit(), 1).await), Some(1));
    // Failover: A is demoted, B promoted. The next call is answered by B,
    // within its own deadline, without an undecided answer in between.
    a.set(Role::Standby, 2);
    b.set(Role::Primary, 2);
    let outcome = client.check("k", limit(), 1).await;
    assert_eq!(answered_by(&outcome), Some(2), "{outcome:?}");
    assert_eq!(client.connected_addr(), Some(b.addr.to_string()));
}

#[tokio::test]
async fn without_a_primary_checks_are_undecided_until_one_appears() {
    let a = FakeNode::start(1, Role::Standby, 1).await;
    let b = FakeNode::start(2, Role::Standby, 1).await;
    let client = shard(&[&a, &b]);
    let outcome = client.check("k", limit(), 1).await;
    assert!(
        matches!(
            outcome,
            Outcome::Undecided {
                why: Undecided::Unavailable,
                ..
            }
        ),
        "no primary: fail open or closed"
    );
    b.set(Role::Primary, 2);
    // The next rounds come after the backoff (10-50 ms, jittered).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if answered_by(&client.check("k", limit(), 1).await) == Some(2) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never found B");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
