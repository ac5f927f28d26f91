//! What calls become on the wire: answers out of order reach their
//! callers, concurrent checks leave as one frame, first calls share one
//! connection attempt, the server's limits, errors and admin calls, a
//! refused config, and priorities as CHECK2.

use super::*;

/// (1) Many tasks pipeline calls on one connection; the server answers them
/// in reverse order; each caller gets its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_order_answers_reach_their_callers() {
    within(async {
        const CALLS: usize = 64;
        let (listener, addr) = listen().await;
        let server = tokio::spawn(async move {
            let mut peer = Peer::accept(&listener).await;
            peer.handshake(ServerLimits::default()).await;
            // The client may merge calls that queue together into one
            // frame, so wait for CALLS checks, not CALLS frames.
            let mut requests = Vec::new();
            let mut checks = 0;
            while checks < CALLS {
                let (id, request) = peer.next_request().await.expect("a request");
                checks += match &request {
                    Request::Check(batch) => batch.len(),
                    other => panic!("unexpected {other:?}"),
                };
                requests.push((id, request));
            }
            let answers: Vec<_> = requests
                .iter()
                .rev()
                .map(|(id, request)| (*id, answer(request)))
                .collect();
            peer.send(&answers).await;
            peer // keeps the connection open until the test is done
        });

        let client = Client::connect(addr.to_string(), config(PATIENT))
            .await
            .expect("connect");
        let calls: Vec<_> = (0..CALLS as u64)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move { (i, client.check(format!("k{i}"), limit(), 1).await) })
            })
            .collect();
        for call in calls {
            let (i, outcome) = call.await.expect("call task");
            assert_eq!(remaining(&outcome), Some(i), "caller {i} got {outcome:?}");
        }
        assert_eq!(client.in_flight(), 0);
        drop(server.await.expect("server"));
    })
    .await;
}

/// (5) Automatic coalescing: concurrent `check()` calls queued on one
/// connection at the same moment leave as **one** CHECK frame, and each
/// call gets its own result back. Deterministic on the current-thread
/// runtime: its run queue is FIFO (no LIFO slot), so all spawned calls run,
/// each queueing its request, before the writer task is polled; the writer
/// then takes the whole queue at once.
#[tokio::test]
async fn concurrent_checks_leave_as_one_check_frame() {
    within(async {
        const CALLS: usize = 32;
        let (listener, addr) = listen().await;
        let server = tokio::spawn(async move {
            let mut peer = Peer::accept(&listener).await;
            peer.handshake(ServerLimits::default()).await;
            let mut requests = Vec::new();
            let mut checks = 0;
            while checks < CALLS {
                let frames = peer.read_some().await.expect("client open");
                for (_, request) in &frames {
                    if let Request::Check(batch) = request {
                        checks += batch.len();
                    }
                }
                requests.extend(frames);
            }
            let answers: Vec<_> = requests
                .iter()
                .map(|(id, request)| (*id, answer(request)))
                .collect();
            peer.send(&answers).await;
            (requests.len(), peer)
        });

        let client = Client::connect(addr.to_string(), config(PATIENT))
            .await
            .expect("connect");
        let calls: Vec<_> = (0..CALLS as u64)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move { (i, client.check(format!("k{i}"), limit(), 1).await) })
            })
            .collect();
        for call in calls {
            let (i, outcome) = call.await.expect("call task");
            assert_eq!(remaining(&outcome), Some(i));
        }
        let (frames, _peer) = server.await.expect("server");
        assert_eq!(frames, 1, "{CALLS} concurrent checks in {frames} frames");
    })
    .await;
}

/// Concurrent calls on a lazy client start exactly one connection attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_calls_share_one_connection_attempt() {
    within(async {
        const CALLS: u64 = 50;
        let (listener, addr) = listen().await;
        let accepted = spawn_server(listener, ServerLimits::default());
        let client = Client::new(addr.to_string(), config(PATIENT)).expect("valid config");
        assert_eq!(client.server_info(), None, "new() must not connect");
        let calls: Vec<_> = (0..CALLS)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move { (i, client.check(format!("k{i}"), limit(), 1).await) })
            })
            .collect();
        for call in calls {
            let (i, outcome) = call.await.expect("call task");
            assert_eq!(remaining(&outcome), Some(i));
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    })
    .await;
}

/// Requests over the limits the server announced are refused locally (the
/// server never sees them); per-check and whole-request server errors are
/// reported apart; reset, peek, ping and close work.
#[tokio::test]
async fn server_limits_errors_and_admin_calls() {
    within(async {
        let limits = ServerLimits {
            // A CHECK body is 5 (opcode, id) + 2 + per check 1 + per pair
            // (31 + key length): two single checks with keys of 2 and 7
            // bytes take 80 bytes and fit; a group of two 8-byte keys takes
            // 86 and does not.
            max_frame: 84,
            max_batch: 2,
            max_group: 2,
            max_key_len: 8,
        };
        let (listener, addr) = listen().await;
        let (seen, mut seen_rx) = mpsc::unbounded_channel::<Request>();
        let server = tokio::spawn(async move {
            let mut peer = Peer::accept(&listener).await;
            peer.handshake(limits).await;
            while let Some((id, request)) = peer.next_request().await {
                let response = match &request {
                    Request::Check(batch)
                        if &batch.iter().next().unwrap()[0].key[..] == b"drain" =>
                    {
                        Response::Error {
                            code: ErrorCode::ShuttingDown,
                            message: "draining".into(),
                        }
                    }
                    other => answer(other),
                };
                seen.send(request).expect("test alive");
                peer.send(&[(id, response)]).await;
            }
        });

        let client = Client::connect(addr.to_string(), config(PATIENT))
            .await
            .expect("connect");
        assert_eq!(
            client.server_info(),
            Some(ServerInfo {
                version: PROTOCOL_VERSION,
                role: Role::Primary,
                epoch: EPOCH,
                offset: 0,
                limits,
            })
        );

        // Refused locally.
        let mut batch = CheckBatch::default();
        for i in 0..3 {
            batch.push(pair(&format!("k{i}")));
        }
        assert!(matches!(
            client.check_batch(batch).await,
            Err(Error::BatchTooLarge { checks: 3, max: 2 })
        ));
        assert!(matches!(
            client.check("k23456789", limit(), 1).await,
            Outcome::Rejected(tollgate_client::Rejection {
                code: ErrorCode::KeyTooLong,
                ..
            })
        ));
        assert!(matches!(
            client
                .check_group(vec![pair("{a}1"), pair("{a}2"), pair("{a}3")])
                .await,
            Outcome::Rejected(tollgate_client::Rejection {
                code: ErrorCode::BatchTooLarge,
                ..
            })
        ));
        let oversized = client
            .check_group(vec![pair("{a}12345"), pair("{a}23456")])
            .await;
        assert!(matches!(
            oversized,
            Outcome::Rejected(tollgate_client::Rejection {
                code: ErrorCode::FrameTooLarge,
                ..
            })
        ));
        assert!(!oversized.is_allowed(), "a rejected request never passes");
        assert_eq!(client.reset(Vec::new()).await.expect("empty reset"), 0);
        assert!(
            seen_rx.try_recv().is_err(),
            "a refused request reached the server"
        );

        // Answered by the server.
        assert_eq!(remaining(&client.check("k3", limit(), 1).await), Some(3));
        assert_eq!(remaining(&client.peek("k4", limit(), 1).await), Some(4));
        let invalid = client.check("invalid", limit(), 1).await;
        assert!(matches!(
            invalid,
            Outcome::Rejected(tollgate_client::Rejection {
                code: ErrorCode::InvalidLimit,
                ..
            })
        ));
        assert!(!invalid.is_allowed(), "rejected, whatever the fail mode");
        assert!(matches!(
            client.check("drain", limit(), 1).await,
            Outcome::Undecided {
                why: Undecided::ServerError(ErrorCode::ShuttingDown),
                ..
            }
        ));
        let mut batch = CheckBatch::default();
        batch.push(pair("k1"));
        batch.push(pair("invalid"));
        let results = client.peek_batch(batch).await.expect("peek batch");
        assert_eq!(results[0], decision_for(b"k1"));
        assert_eq!(results[1], CheckResult::Error(ErrorCode::InvalidLimit));
        assert_eq!(
            client
                .reset(vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")])
                .await
                .expect("reset"),
            2
        );
        client.ping().await.expect("ping");

        // Leases: the id of an allowed acquire, then released by id.
        let acquired = client.check("lease7", limit(), 1).await;
        assert_eq!(acquired.lease(), Some(7));
        assert!(client.release("lease7", 7).await.expect("release"));
        assert!(!client.release("lease7", 8).await.expect("release"));
        let leases = |ids: &[u64]| -> Vec<LeaseRef> {
            ids.iter()
                .map(|&lease| LeaseRef {
                    key: Bytes::from_static(b"lease"),
                    lease,
                })
                .collect()
        };
        assert_eq!(
            client.release_many(leases(&[1, 3])).await.expect("release"),
            2
        );
        assert_eq!(client.release_many(Vec::new()).await.expect("empty"), 0);
        // Refunds: the decision after it, or the per-check refusal as an error.
        let refunded = client.refund("k6", limit(), 3).await.expect("refund");
        assert_eq!(refunded.remaining, 6);
        let refused = client.refund("leases", limit(), 1).await;
        assert!(
            matches!(
                refused,
                Err(Error::Server {
                    code: ErrorCode::InvalidLimit,
                    ..
                })
            ),
            "{refused:?}"
        );
        let mut batch = CheckBatch::default();
        batch.push(pair("k2"));
        batch.push(pair("leases"));
        let results = client.refund_batch(batch).await.expect("refund batch");
        assert_eq!(results[0], decision_for(b"k2"));
        assert_eq!(results[1], CheckResult::Error(ErrorCode::InvalidLimit));
        // Refused locally, like the other requests.
        assert!(matches!(
            client.release_many(leases(&[1, 3, 5])).await,
            Err(Error::BatchTooLarge { checks: 3, max: 2 })
        ));
        assert!(matches!(
            client.release("k23456789", 1).await,
            Err(Error::KeyTooLong { len: 9, max: 8 })
        ));
        assert!(matches!(
            client
                .refund_group(vec![pair("{a}1"), pair("{a}2"), pair("{a}3")])
                .await,
            Err(Error::GroupTooLarge { .. })
        ));

        let kinds: Vec<&str> = std::iter::from_fn(|| seen_rx.try_recv().ok())
            .map(|request| match request {
                Request::Check(_) => "check",
                Request::Check2(_) => "check2",
                Request::Peek(_) => "peek",
                Request::Reset(_) => "reset",
                Request::Refund(_) => "refund",
                Request::Release(_) => "release",
                Request::Ping => "ping",
                Request::Hello { .. } => "hello",
                Request::Repl(_) => "repl",
                Request::Topology => "topology",
                Request::Usage(_) => "usage",
                Request::NodeChallenge => "node_challenge",
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "check", "peek", "check", "check", "peek", "reset", "ping", "check", "release",
                "release", "release", "refund", "refund", "refund"
            ]
        );

        client.close();
        assert!(matches!(client.ping().await, Err(Error::Closed)));
        assert!(matches!(
            client.check("k1", limit(), 1).await,
            Outcome::Undecided {
                why: Undecided::Unavailable,
                ..
            }
        ));
        // The server sees the connection end.
        server.await.expect("server");
    })
    .await;
}

/// An invalid configuration is refused before any network activity, with
/// the numbers, by `connect` and by `new` alike.
#[tokio::test]
async fn invalid_config_is_refused_with_its_numbers() {
    within(async {
        let (listener, addr) = listen().await;
        let config = ClientConfig {
            backoff_min: Duration::from_secs(5),
            backoff_max: Duration::from_secs(1),
            ..config(PATIENT)
        };
        match Client::connect(addr.to_string(), config.clone()).await {
            Err(Error::Config(ConfigError::BackoffInverted { min, max })) => {
                assert_eq!((min, max), (Duration::from_secs(5), Duration::from_secs(1)));
            }
            other => panic!("expected a config error, got {other:?}"),
        }
        // `new` refuses it too: never a client that silently fails open.
        assert!(matches!(
            Client::new(addr.to_string(), config),
            Err(Error::Config(ConfigError::BackoffInverted { .. }))
        ));
        assert!(
            tokio::time::timeout(Duration::from_millis(100), listener.accept())
                .await
                .is_err(),
            "connected despite an invalid config"
        );
    })
    .await;
}

/// A priority (on the handle or the policy) sends CHECK2 with a fresh
/// idempotency key per check; a shed check is undecided (server error
/// Shed) and takes the fail mode; without a priority, plain CHECK.
#[tokio::test]
async fn priority_checks_go_as_check2_with_fresh_keys_and_shed_is_undecided() {
    within(async {
        let (listener, addr) = listen().await;
        let (seen, mut seen_rx) = mpsc::unbounded_channel::<Request>();
        tokio::spawn(async move {
            let mut peer = Peer::accept(&listener).await;
            peer.handshake(ServerLimits::default()).await;
            while let Some((id, request)) = peer.next_request().await {
                let response = answer(&request);
                seen.send(request).expect("test listens");
                peer.send(&[(id, response)]).await;
            }
        });
        let client = Client::connect(addr.to_string(), config(PATIENT))
            .await
            .expect("connects");
        let low = client.with_priority(tollgate_client::Priority::Low);
        assert_eq!(remaining(&low.check("k3", limit(), 1).await), Some(3));
        assert_eq!(remaining(&low.check("k4", limit(), 1).await), Some(4));
        match low.check("shed", limit(), 1).await {
            Outcome::Undecided { why, .. } => {
                assert_eq!(why, Undecided::ServerError(ErrorCode::Shed));
            }
            other => panic!("expected undecided, got {other:?}"),
        }
        let policy = tollgate_client::Policy::new("search")
            .unwrap()
            .limit("per-second", limit())
            .unwrap()
            .with_priority(tollgate_client::Priority::High);
        assert!(client.check_policy(&policy, b"u1", 1).await.is_allowed());
        assert_eq!(remaining(&client.check("k5", limit(), 1).await), Some(5));

        let seen: Vec<Request> = std::iter::from_fn(|| seen_rx.try_recv().ok()).collect();
        let tags: Vec<_> = seen
            .iter()
            .filter_map(|r| match r {
                Request::Check2(t) => Some(t.tags()[0]),
                _ => None,
            })
            .collect();
        assert_eq!(tags.len(), 4, "{seen:?}");
        use tollgate_client::Priority::{High, Low};
        assert_eq!(
            tags.iter().map(|t| t.priority).collect::<Vec<_>>(),
            [Low, Low, Low, High]
        );
        assert!(tags.iter().all(|t| !t.idempotency.is_none()));
        let keys: std::collections::HashSet<_> = tags.iter().map(|t| t.idempotency).collect();
        assert_eq!(keys.len(), 4, "a fresh key per check");
        assert!(
            matches!(seen.last(), Some(Request::Check(_))),
            "no priority: CHECK"
        );
    })
    .await;
}
