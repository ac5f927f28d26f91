//! The client against servers that fail: silent (the deadline), absent
//! (backoff, fail fast), stuck in the handshake, dropping the connection
//! with calls pending, and refusing the handshake (a typed error).

use super::*;

/// (2) A server that never answers: the call is undecided at its deadline,
/// fail-open allows and fail-closed denies, nothing stays pending, and the
/// answer that comes too late does not confuse the next call.
#[tokio::test]
async fn silent_server_gives_deadline_exceeded_within_the_deadline() {
    within(async {
        let (listener, addr) = listen().await;
        let (timed_out, timed_out_rx) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let mut peer = Peer::accept(&listener).await;
            peer.handshake(ServerLimits::default()).await;
            let (late_id, late) = peer.next_request().await.expect("first check");
            timed_out_rx.await.expect("signal");
            // Far too late: the caller gave up. Claims a remaining of 999.
            let late_answer = match answer(&late) {
                Response::Checked(_) => Response::Checked(vec![decision_for(b"k999")]),
                other => other,
            };
            peer.send(&[(late_id, late_answer)]).await;
            // The timeout made the connection suspect: the client probes it
            // with a PING, answered here, before the second check comes.
            loop {
                let (id, request) = peer.next_request().await.expect("second check");
                peer.send(&[(id, answer(&request))]).await;
                if request != Request::Ping {
                    break;
                }
            }
            // Read and never answer from here on.
            while peer.next_request().await.is_some() {}
        });

        let deadline = Duration::from_millis(50);
        let client = Client::connect(addr.to_string(), config(deadline))
            .await
            .expect("connect");
        let started = Instant::now();
        let outcome = client.check("k0", limit(), 1).await;
        let took = started.elapsed();
        assert!(
            matches!(
                outcome,
                Outcome::Undecided {
                    why: Undecided::DeadlineExceeded,
                    ..
                }
            ),
            "{:?}",
            outcome
        );
        assert!(outcome.is_allowed(), "the default is fail-open");
        assert!(took >= deadline, "gave up early: {took:?}");
        assert!(
            took < Duration::from_secs(2),
            "deadline not enforced: {took:?}"
        );
        assert_eq!(client.in_flight(), 0, "timed-out call left a pending entry");

        timed_out.send(()).expect("server waits");
        let outcome = client.with_deadline(PATIENT).check("k1", limit(), 1).await;
        assert_eq!(remaining(&outcome), Some(1), "{outcome:?}");

        // A call whose future is dropped (e.g. by the caller's own select)
        // leaves nothing behind either.
        let patient = client.with_deadline(PATIENT);
        let dropped =
            tokio::time::timeout(Duration::from_millis(50), patient.check("k2", limit(), 1)).await;
        assert!(dropped.is_err());
        assert_eq!(client.in_flight(), 0, "dropped call left a pending entry");

        // Result-returning calls report the deadline with its number.
        match client.ping().await {
            Err(Error::Timeout { after }) => assert_eq!(after, deadline),
            other => panic!("expected a timeout, got {other:?}"),
        }
        server.abort();
    })
    .await;
}

/// (3) Nothing listening: the call is Unavailable at once; during the
/// backoff window calls fail fast without even trying to connect, though a
/// server has come up meanwhile.
#[tokio::test]
async fn nothing_listening_is_unavailable_and_backoff_fails_fast() {
    within(async {
        let addr = listen().await.1; // the listener is dropped: the port is closed
        let config = ClientConfig {
            backoff_min: Duration::from_secs(30),
            backoff_max: Duration::from_secs(60),
            ..config(Duration::from_secs(2))
        };

        match Client::connect(addr.to_string(), config.clone()).await {
            Err(Error::Connect { addr: a, .. }) => assert_eq!(a, addr.to_string()),
            other => panic!("expected a connect error, got {other:?}"),
        }

        let client = Client::new(addr.to_string(), config).expect("valid config");
        let started = Instant::now();
        let outcome = client.check("k", limit(), 1).await;
        assert!(
            matches!(
                outcome,
                Outcome::Undecided {
                    why: Undecided::Unavailable,
                    ..
                }
            ),
            "{:?}",
            outcome
        );
        assert!(outcome.is_allowed());
        assert!(started.elapsed() < Duration::from_millis(500));

        // The server comes up, but the client is backing off: no attempt.
        let listener = TcpListener::bind(addr).await.expect("rebind");
        for _ in 0..20 {
            match client.ping().await {
                Err(Error::Unavailable { retry_in, cause }) => {
                    // First failure: a delay in [backoff_min / 2, backoff_min].
                    assert!(retry_in > Duration::from_secs(10), "{retry_in:?}");
                    assert!(matches!(*cause, Error::Connect { .. }), "{cause:?}");
                }
                other => panic!("expected Unavailable, got {other:?}"),
            }
            assert!(matches!(
                client.check("k", limit(), 1).await,
                Outcome::Undecided {
                    why: Undecided::Unavailable,
                    ..
                }
            ));
        }
        assert!(
            tokio::time::timeout(Duration::from_millis(200), listener.accept())
                .await
                .is_err(),
            "the client connected while backing off"
        );
    })
    .await;
}

/// (3b) A server that accepts but never answers HELLO: the attempt ends at
/// the connect timeout, and then calls fail fast instead of waiting for
/// another connect timeout.
#[tokio::test]
async fn stuck_handshake_times_out_then_calls_fail_fast() {
    within(async {
        // The kernel completes the TCP handshake from the backlog; nobody
        // ever reads the HELLO.
        let (_listener, addr) = listen().await;
        let connect_timeout = Duration::from_secs(1);
        let config = ClientConfig {
            connect_timeout,
            backoff_min: Duration::from_secs(30),
            backoff_max: Duration::from_secs(60),
            ..config(Duration::from_secs(5))
        };

        match Client::connect(addr.to_string(), config.clone()).await {
            Err(Error::ConnectTimeout { after, .. }) => assert_eq!(after, connect_timeout),
            other => panic!("expected a connect timeout, got {other:?}"),
        }

        let client = Client::new(addr.to_string(), config).expect("valid config");
        // The first call waits for the attempt (its deadline is longer).
        match client.ping().await {
            Err(Error::Unavailable { cause, .. }) => {
                assert!(matches!(*cause, Error::ConnectTimeout { .. }), "{cause:?}")
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
        let started = Instant::now();
        let outcome = client.check("k", limit(), 1).await;
        assert!(
            matches!(
                outcome,
                Outcome::Undecided {
                    why: Undecided::Unavailable,
                    ..
                }
            ),
            "{:?}",
            outcome
        );
        assert!(
            started.elapsed() < connect_timeout / 2,
            "waited {:?} while backing off",
            started.elapsed()
        );
    })
    .await;
}

/// (4) The server drops the connection: every pending call fails at once
/// (long before its deadline) with ConnectionLost, and the next call
/// reconnects to the server restarted on the same port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_connection_fails_pending_calls_and_next_call_reconnects() {
    within(async {
        const CALLS: usize = 8;
        let (listener, addr) = listen().await;
        let server = tokio::spawn(async move {
            let mut peer = Peer::accept(&listener).await;
            peer.handshake(ServerLimits::default()).await;
            // Coalesced or not, the server holds all the checks unanswered.
            let mut received = 0;
            while received < CALLS {
                for (_, request) in peer.read_some().await.expect("client open") {
                    if let Request::Check(batch) = request {
                        received += batch.len();
                    }
                }
            }
            // Dropping both ends the connection and frees the port.
            drop(peer);
            drop(listener);
            received
        });

        let deadline = Duration::from_secs(20);
        let client = Client::connect(addr.to_string(), config(deadline))
            .await
            .expect("connect");
        let started = Instant::now();
        let calls: Vec<_> = (0..CALLS)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move { client.check(format!("k{i}"), limit(), 1).await })
            })
            .collect();
        assert_eq!(server.await.expect("server"), CALLS);
        for call in calls {
            assert!(matches!(
                call.await.expect("call task"),
                Outcome::Undecided {
                    why: Undecided::ConnectionLost,
                    ..
                }
            ));
        }
        assert!(
            started.elapsed() < deadline / 2,
            "calls waited for their deadline"
        );
        assert_eq!(client.in_flight(), 0);

        let listener = TcpListener::bind(addr).await.expect("rebind the same port");
        let accepted = spawn_server(listener, ServerLimits::default());
        let outcome = client.check("k5", limit(), 1).await;
        assert_eq!(remaining(&outcome), Some(5), "{outcome:?}");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(client.server_info().map(|i| i.epoch), Some(EPOCH));
    })
    .await;
}

/// (6) The server refuses the handshake: `connect` returns the typed error,
/// with the code and message the server sent. The HELLO carried the
/// configured name and token.
#[tokio::test]
async fn refused_handshake_is_a_typed_error() {
    within(async {
        let (listener, addr) = listen().await;
        let server = tokio::spawn(async move {
            let mut peer = Peer::accept(&listener).await;
            let (id, hello) = peer.next_request().await.expect("HELLO");
            peer.send(&[(
                id,
                Response::Error {
                    code: ErrorCode::UnsupportedVersion,
                    message: "only version 9".into(),
                },
            )])
            .await;
            hello
        });
        let config = ClientConfig {
            client_name: "gateway-eu-1".into(),
            auth_token: Some(b"s3cret".to_vec()),
            ..config(PATIENT)
        };
        match Client::connect(addr.to_string(), config).await {
            Err(Error::Handshake { code, message }) => {
                assert_eq!(code, ErrorCode::UnsupportedVersion);
                assert_eq!(message, "only version 9");
            }
            other => panic!("expected a handshake error, got {other:?}"),
        }
        assert_eq!(
            server.await.expect("server"),
            Request::Hello {
                version: PROTOCOL_VERSION,
                client_name: "gateway-eu-1".into(),
                auth_token: Some(Bytes::from_static(b"s3cret")),
            }
        );
    })
    .await;
}
