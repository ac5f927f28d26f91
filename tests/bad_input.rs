//! Hostile and broken input: every case gets a clear error, the server keeps
//! serving everyone else, and no counter changes.

mod common;

use common::*;
use std::time::Duration;
use tollgate_protocol::{CheckResult, ErrorCode, Request, Response, PROTOCOL_VERSION};

/// A bystander connection holding state that must survive everything.
async fn bystander(server: &TestServer) -> RawConn {
    let mut c = RawConn::ready(server.addr).await;
    let r = c
        .check(1, batch_of(vec![vec![tb("bystander", 1, 60_000, 5, 2)]]))
        .await;
    assert!(allowed(&r[0]));
    c
}

/// The bystander still works and its counter moved only by its own checks.
async fn assert_unharmed(server: &TestServer, c: &mut RawConn) {
    c.send(
        77,
        &Request::Peek(batch_of(vec![vec![tb("bystander", 1, 60_000, 5, 1)]])),
    )
    .await;
    match c.recv().await {
        (77, Response::Checked(r)) => match r[0] {
            CheckResult::Decision(d) => assert_eq!(d.remaining, 2, "bystander's counter unchanged"),
            e => panic!("{e:?}"),
        },
        other => panic!("{other:?}"),
    }
    assert_eq!(server.store.len(), 1, "no other key was created");
}

fn error_code(r: &(u32, Response)) -> ErrorCode {
    match r {
        (_, Response::Error { code, message }) => {
            assert!(!message.is_empty(), "errors carry a message");
            *code
        }
        other => panic!("expected ERROR, got {other:?}"),
    }
}

#[tokio::test]
async fn random_bytes_never_hurt_other_clients() {
    let server = TestServer::start().await;
    let mut by = bystander(&server).await;
    // xorshift: deterministic garbage, different per connection.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for round in 0..50 {
        let mut garbage = vec![0u8; 64 + round * 37];
        for b in &mut garbage {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        // Half the rounds after a valid handshake, half before.
        let mut c = if round % 2 == 0 {
            RawConn::connect(server.addr).await
        } else {
            RawConn::ready(server.addr).await
        };
        c.send_raw(&garbage).await;
        let _ = tokio::io::AsyncWriteExt::shutdown(&mut c.stream).await;
        // Whatever comes back must be well-formed frames, then a close.
        while c.try_recv().await.is_some() {}
    }
    assert_unharmed(&server, &mut by).await;
    server.stop().await;
}

#[tokio::test]
async fn oversized_frame_is_refused_before_reading_it_and_closes() {
    let server = TestServer::start_with(|c| c.limits.max_frame = 64 * 1024).await;
    let mut by = bystander(&server).await;
    let mut c = RawConn::ready(server.addr).await;
    // Announce 1 GiB; send only the header.
    c.send_raw(&[0x40, 0, 0, 0, 0x03, 0, 0, 0, 9]).await;
    assert_eq!(error_code(&c.recv().await), ErrorCode::FrameTooLarge);
    c.expect_closed().await;
    // A frame shorter than its own header is as untrustworthy.
    let mut c = RawConn::ready(server.addr).await;
    c.send_raw(&[0, 0, 0, 2, 0x02, 0]).await;
    let r = c.recv().await;
    assert!(matches!(
        error_code(&r),
        ErrorCode::Malformed | ErrorCode::FrameTooLarge
    ));
    c.expect_closed().await;
    assert_unharmed(&server, &mut by).await;
    server.stop().await;
}

#[tokio::test]
async fn broken_frames_get_an_error_and_the_connection_goes_on() {
    let server = TestServer::start().await;
    let mut by = bystander(&server).await;
    let mut c = RawConn::ready(server.addr).await;

    // Unknown opcode.
    c.send_raw(&[0, 0, 0, 5, 0x42, 0, 0, 0, 7]).await;
    let r = c.recv().await;
    assert_eq!((r.0, error_code(&r)), (7, ErrorCode::UnknownOpcode));

    // A CHECK frame whose body stops in the middle of a pair (truncated
    // inside a well-delimited frame).
    let mut good = bytes::BytesMut::new();
    tollgate_protocol::encode_request(
        8,
        &Request::Check(batch_of(vec![vec![tb("t", 1, 1000, 1, 1)]])),
        &mut good,
    )
    .unwrap();
    let cut = good.len() - 6;
    let mut truncated = good[..cut].to_vec();
    truncated[..4].copy_from_slice(&((cut - 4) as u32).to_be_bytes());
    c.send_raw(&truncated).await;
    let r = c.recv().await;
    assert_eq!((r.0, error_code(&r)), (8, ErrorCode::Malformed));

    // Bytes left over after a valid PING body.
    c.send_raw(&[0, 0, 0, 6, 0x02, 0, 0, 0, 9, 0xAA]).await;
    let r = c.recv().await;
    assert_eq!((r.0, error_code(&r)), (9, ErrorCode::Malformed));

    // Over-long key (default max 256).
    let long = "k".repeat(300);
    c.send(
        10,
        &Request::Check(batch_of(vec![vec![tb(&long, 1, 1000, 1, 1)]])),
    )
    .await;
    let r = c.recv().await;
    assert_eq!((r.0, error_code(&r)), (10, ErrorCode::KeyTooLong));

    // Too many checks in one frame.
    let checks = (0..1025)
        .map(|i| vec![tb(&format!("b{i}"), 1, 1000, 1, 1)])
        .collect();
    c.send(11, &Request::Check(batch_of(checks))).await;
    let r = c.recv().await;
    assert_eq!((r.0, error_code(&r)), (11, ErrorCode::BatchTooLarge));

    // HELLO twice.
    c.send(
        12,
        &Request::Hello {
            version: PROTOCOL_VERSION,
            client_name: "again".into(),
            auth_token: None,
        },
    )
    .await;
    let r = c.recv().await;
    assert_eq!(r.0, 12);
    error_code(&r);

    // Still the same connection, still working.
    c.send(13, &Request::Ping).await;
    assert_eq!(c.recv().await, (13, Response::Pong));
    assert_unharmed(&server, &mut by).await;
    server.stop().await;
}

#[tokio::test]
async fn impossible_limits_and_costs_are_per_check_errors() {
    let server = TestServer::start().await;
    let mut by = bystander(&server).await;
    let mut c = RawConn::ready(server.addr).await;
    let bad = vec![
        vec![tb("z", 0, 1000, 1, 1)],              // zero rate
        vec![tb("z", 1, 0, 1, 1)],                 // zero period
        vec![tb("z", 1, 1000, 0, 1)],              // zero burst
        vec![tb("z", 1, 1000, 1, 0)],              // zero cost
        vec![tb("z", u64::MAX, 1000, 1, 1)],       // huge rate
        vec![tb("z", 1, u64::MAX, 1, 1)],          // huge period
        vec![tb("z", 1, 1000, u64::MAX, 1)],       // huge burst
        vec![tb("z", 1_000_000_000_000, 1, 1, 1)], // faster than one per ns
    ];
    let n = bad.len();
    let results = c.check(1, batch_of(bad)).await;
    assert_eq!(
        results,
        vec![CheckResult::Error(ErrorCode::InvalidLimit); n]
    );
    // A cost above the burst is not an error but a denial that never clears.
    let r = c
        .check(2, batch_of(vec![vec![tb("z", 1, 1000, 5, u32::MAX)]]))
        .await;
    match r[0] {
        CheckResult::Decision(d) => {
            assert!(!d.allowed);
            assert_eq!(d.retry_after_ms, tollgate_protocol::RETRY_NEVER);
        }
        e => panic!("{e:?}"),
    }
    assert_unharmed(&server, &mut by).await;
    server.stop().await;
}

#[tokio::test]
async fn handshake_failures_close_the_connection() {
    let server =
        TestServer::start_with(|c| c.auth.auth_token = Some("s3cret-client-token".into())).await;

    let hello = |version, token: Option<&str>| Request::Hello {
        version,
        client_name: "t".into(),
        auth_token: token.map(|t| bytes::Bytes::copy_from_slice(t.as_bytes())),
    };
    // Wrong version.
    let mut c = RawConn::connect(server.addr).await;
    c.send(1, &hello(PROTOCOL_VERSION + 1, Some("s3cret-client-token")))
        .await;
    assert_eq!(error_code(&c.recv().await), ErrorCode::UnsupportedVersion);
    c.expect_closed().await;
    // Missing and wrong token.
    for token in [None, Some("guess")] {
        let mut c = RawConn::connect(server.addr).await;
        c.send(1, &hello(PROTOCOL_VERSION, token)).await;
        assert_eq!(error_code(&c.recv().await), ErrorCode::AuthFailed);
        c.expect_closed().await;
    }
    // A check before HELLO.
    let mut c = RawConn::connect(server.addr).await;
    c.send(
        1,
        &Request::Check(batch_of(vec![vec![tb("h", 1, 1000, 1, 1)]])),
    )
    .await;
    assert_eq!(error_code(&c.recv().await), ErrorCode::HandshakeRequired);
    c.expect_closed().await;
    assert!(server.store.is_empty());
    // The right token works.
    let mut c = RawConn::connect(server.addr).await;
    c.send(1, &hello(PROTOCOL_VERSION, Some("s3cret-client-token")))
        .await;
    assert!(matches!(c.recv().await, (1, Response::HelloOk { .. })));
    server.stop().await;
}

#[tokio::test]
async fn slow_and_silent_clients_are_timed_out() {
    let server = TestServer::start_with(|c| {
        c.network.handshake_timeout = Duration::from_millis(200);
        c.network.frame_timeout = Duration::from_millis(200);
        c.network.idle_timeout = Duration::from_millis(300);
    })
    .await;
    let mut by = RawConn::ready(server.addr).await;
    // Never says HELLO.
    let mut silent = RawConn::connect(server.addr).await;
    // Starts a frame and trickles it, never completing it.
    let mut slow = RawConn::ready(server.addr).await;
    slow.send_raw(&[0, 0, 0, 40, 0x03]).await;
    let trickle = tokio::spawn(async move {
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if tokio::io::AsyncWriteExt::write_all(&mut slow.stream, &[0])
                .await
                .is_err()
            {
                break;
            }
        }
        slow
    });
    silent.expect_closed().await;
    let mut slow = trickle.await.unwrap();
    slow.expect_closed().await;
    // An idle, handshaken connection is closed after idle_timeout.
    by.expect_closed().await;
    server.stop().await;
}
