//! The examples of PROTOCOL.md §15, byte for byte: each dump matches its
//! annotated table, and a live server answers the documented requests with
//! exactly the documented bytes.

use crate::common::*;
use tokio::io::AsyncReadExt;
use tollgate_protocol::{Request, Response};

const SECRET: &str = "spec-cluster-secret";

/// Every ```text dump under §15's "### Examples", in order, each checked
/// against the `| Bytes | Field |` table after it.
fn examples() -> Vec<Vec<u8>> {
    let doc = include_str!("../../protocol/PROTOCOL.md");
    let section = &doc[doc.find("## 15. ").expect("§15")..];
    // §15 only: the sections after it have examples of their own.
    let section = &section[..section.find("\n## 16. ").unwrap_or(section.len())];
    let examples = &section[section.find("### Examples").expect("its examples")..];
    let hex = |text: &str| -> Vec<u8> {
        text.split_whitespace()
            .map(|b| u8::from_str_radix(b, 16).expect("hex byte"))
            .collect()
    };
    let mut dumps = Vec::new();
    for block in examples.split("```text\n").skip(1) {
        let (dump, rest) = block.split_once("```").expect("a closed block");
        let bytes = hex(dump);
        let table = rest
            .split("| Bytes | Field |\n|---|---|\n")
            .nth(1)
            .expect("an annotated table after the dump");
        let from_rows: Vec<u8> = table
            .lines()
            .take_while(|l| l.starts_with("| `"))
            .flat_map(|l| hex(l[3..].split('`').next().unwrap()))
            .collect();
        assert_eq!(from_rows, bytes, "the table does not add up to the dump");
        dumps.push(bytes);
    }
    assert_eq!(dumps.len(), 4);
    dumps
}

/// Sends `request` raw and reads exactly as many bytes as `answer` has.
async fn exchange(conn: &mut RawConn, request: &[u8], answer: &[u8]) -> Vec<u8> {
    conn.send_raw(request).await;
    let mut got = vec![0; answer.len()];
    tokio::time::timeout(PATIENCE, conn.stream.read_exact(&mut got))
        .await
        .expect("answered in time")
        .expect("the whole answer");
    got
}

#[tokio::test]
async fn the_section_14_examples_are_what_the_server_sends() {
    let dumps = examples();
    let server = TestServer::start_with(|c| c.auth.cluster_secret = Some(SECRET.into())).await;

    let mut client = RawConn::ready(server.addr).await;
    assert_eq!(exchange(&mut client, &dumps[0], &dumps[1]).await, dumps[1]);

    let mut node = RawConn::connect(server.addr).await;
    assert!(matches!(
        node.node_hello(SECRET, tollgate_protocol::NodeScope::Cluster)
            .await,
        Some(Response::HelloOk { epoch: 1, .. })
    ));
    assert_eq!(exchange(&mut node, &dumps[2], &dumps[3]).await, dumps[3]);
    // The server goes on serving.
    let mut fresh = RawConn::ready(server.addr).await;
    fresh.send(9, &Request::Ping).await;
    assert!(matches!(fresh.recv().await, (9, Response::Pong)));
    server.stop().await;
}
