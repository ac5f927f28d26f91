//! Cluster mode (`Client::connect_cluster`) against one scripted node: it
//! does not know TOPOLOGY, so the client takes it for a one-shard map of
//! itself (a probe connection asks, the shard's connection then carries
//! the checks). What is checked is what the wire shows: concurrent checks
//! routed by slot still leave as one frame, and a MOVED answer to a check
//! sent on the connected shard is followed once, with a refresh, and the
//! resend is the request first sent (key, limit, cost, CHECK2 tag).

use super::*;

/// What the node saw: each CHECK and CHECK2 frame.
type Frames = Arc<std::sync::Mutex<Vec<Request>>>;

/// The number of checks in each frame the node saw.
fn sizes(frames: &Frames) -> Vec<usize> {
    frames
        .lock()
        .expect("not poisoned")
        .iter()
        .map(|frame| match frame {
            Request::Check(batch) => batch.len(),
            Request::Check2(tagged) => tagged.len(),
            other => panic!("not a check frame: {other:?}"),
        })
        .collect()
}

/// A node that answers every connection: TOPOLOGY with UnknownOpcode, the
/// first `moved` CHECK or CHECK2 frames with MOVED (naming itself),
/// everything else as [`answer`] does. Each read's requests are answered
/// with one write.
fn spawn_node(listener: TcpListener, moved: usize) -> Frames {
    let frames = Frames::default();
    let seen = Arc::clone(&frames);
    let moved = Arc::new(AtomicUsize::new(moved));
    tokio::spawn(async move {
        let addr = listener.local_addr().expect("addr").to_string();
        loop {
            let mut peer = Peer::accept(&listener).await;
            let (seen, moved, addr) = (Arc::clone(&seen), Arc::clone(&moved), addr.clone());
            tokio::spawn(async move {
                peer.handshake(ServerLimits::default()).await;
                while let Some(requests) = peer.read_some().await {
                    let answers: Vec<_> = requests
                        .iter()
                        .map(|(id, request)| {
                            let first_key = match request {
                                Request::Check(batch) => batch.iter().next().map(|c| &c[0].key),
                                Request::Check2(tagged) => {
                                    tagged.iter().next().map(|(_, c)| &c[0].key)
                                }
                                _ => return (*id, answer(request)),
                            };
                            let first_key = first_key.expect("a check").clone();
                            seen.lock().expect("not poisoned").push(request.clone());
                            let follow = moved
                                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                                    n.checked_sub(1)
                                })
                                .is_ok();
                            if follow {
                                let slot = tollgate_protocol::slot::Slot::of(&first_key);
                                let moved = tollgate_protocol::Moved {
                                    slot: slot.get(),
                                    version: 1,
                                    addr: addr.clone(),
                                };
                                return (*id, Response::Moved(moved));
                            }
                            (*id, answer(request))
                        })
                        .collect();
                    peer.send(&answers).await;
                }
            });
        }
    });
    frames
}

/// Concurrent `check()` calls of a cluster client, all to the one shard,
/// leave as **one** CHECK frame, as a single-shard client's do (calls.rs,
/// test 5): routing must not split or serialise what the connection's
/// writer would merge. Deterministic on the current-thread runtime, for
/// the reason given there.
#[tokio::test]
async fn concurrent_cluster_checks_leave_as_one_check_frame() {
    within(async {
        const CALLS: usize = 32;
        let (listener, addr) = listen().await;
        let frames = spawn_node(listener, 0);
        let client = Client::connect_cluster(vec![addr.to_string()], config(PATIENT))
            .await
            .expect("connect");
        // The first check connects the shard (the routed path).
        assert_eq!(remaining(&client.check("k0", limit(), 1).await), Some(0));
        frames.lock().expect("not poisoned").clear();

        let calls: Vec<_> = (1..=CALLS as u64)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move { (i, client.check(format!("k{i}"), limit(), 1).await) })
            })
            .collect();
        for call in calls {
            let (i, outcome) = call.await.expect("call task");
            assert_eq!(remaining(&outcome), Some(i), "caller {i} got {outcome:?}");
        }
        let frames = sizes(&frames);
        assert_eq!(
            frames,
            vec![CALLS],
            "{CALLS} concurrent checks in {} frames",
            frames.len()
        );
        assert_eq!(client.in_flight(), 0);
        let stats = client.cluster_stats().expect("cluster mode");
        assert_eq!((stats.moved, stats.retries), (0, 0));
    })
    .await;
}

/// A MOVED answer to a check sent on the connected shard's connection is
/// followed once: the map is refreshed (from the node it names) and the
/// check sent again, answered; a second MOVED for the same call is
/// reported, not followed.
#[tokio::test]
async fn moved_on_a_connected_shard_is_followed_once() {
    within(async {
        // A node whose first CHECK frame is answered MOVED.
        let (listener, addr) = listen().await;
        let frames = spawn_node(listener, 1);
        let client = Client::connect_cluster(vec![addr.to_string()], config(PATIENT))
            .await
            .expect("connect");
        let before = client.cluster_stats().expect("cluster mode");
        // Connect the shard with a call the node answers: a PEEK is not a
        // CHECK frame, so the MOVED goes to the check below.
        assert_eq!(remaining(&client.peek("k0", limit(), 1).await), Some(0));
        let outcome = client.check("k7", limit(), 1).await;
        assert_eq!(remaining(&outcome), Some(7), "got {outcome:?}");
        let stats = client.cluster_stats().expect("cluster mode");
        assert_eq!(stats.moved, 1, "{stats:?}");
        assert_eq!(stats.refreshes, before.refreshes + 1, "{stats:?}");
        assert_eq!(sizes(&frames), vec![1, 1]);

        // A node answering every CHECK with MOVED: the call follows the
        // first, and the second is its answer (no decision).
        let (listener, addr) = listen().await;
        let frames = spawn_node(listener, usize::MAX);
        let client = Client::connect_cluster(vec![addr.to_string()], config(PATIENT))
            .await
            .expect("connect");
        assert_eq!(remaining(&client.peek("k0", limit(), 1).await), Some(0));
        let outcome = client.check("k7", limit(), 1).await;
        assert!(
            matches!(
                outcome,
                Outcome::Undecided {
                    why: Undecided::Unavailable,
                    ..
                }
            ),
            "got {outcome:?}"
        );
        assert_eq!(client.cluster_stats().expect("cluster mode").moved, 1);
        assert_eq!(sizes(&frames), vec![1, 1]);
    })
    .await;
}

/// The check sent again after a MOVED is the check first sent: the same
/// key, limit and cost, and for a CHECK2 the same idempotency key and
/// priority (nothing was charged, so the server must see the same request
/// again). Short keys and keys longer than what a check keeps by value,
/// plain and CHECK2.
#[tokio::test]
async fn a_resend_after_moved_is_the_check_first_sent() {
    within(async {
        let other = Limit {
            algorithm: Algorithm::SlidingWindow,
            count: 70,
            period_ms: 60_000,
            burst: 0,
        };
        for key in ["k7".to_owned(), format!("k{:0>90}", 7)] {
            for priority in [None, Some(tollgate_client::Priority::High)] {
                let (listener, addr) = listen().await;
                let frames = spawn_node(listener, 1);
                let client = Client::connect_cluster(vec![addr.to_string()], config(PATIENT))
                    .await
                    .expect("connect");
                // Connect the shard with a call that is not a CHECK frame,
                // so that the check below takes the connected path.
                assert_eq!(remaining(&client.peek("k0", limit(), 1).await), Some(0));
                let client = match priority {
                    Some(priority) => client.with_priority(priority),
                    None => client,
                };
                let outcome = client.check(key.clone(), other, 3).await;
                let case = format!("key of {} bytes, priority {priority:?}", key.len());
                assert_eq!(remaining(&outcome), Some(7), "{case}: {outcome:?}");
                assert_eq!(
                    client.cluster_stats().expect("cluster mode").moved,
                    1,
                    "{case}"
                );
                let frames = frames.lock().expect("not poisoned").clone();
                assert_eq!(frames.len(), 2, "{case}: {frames:?}");
                assert_eq!(frames[0], frames[1], "{case}: the resend differs");
                let sent = Pair {
                    key: Bytes::from(key.clone()),
                    limit: other.into(),
                    cost: 3,
                };
                match (&frames[0], priority) {
                    (Request::Check(batch), None) => {
                        assert_eq!(batch.len(), 1, "{case}");
                        assert_eq!(batch.iter().next().expect("a check"), [sent], "{case}");
                    }
                    (Request::Check2(tagged), Some(priority)) => {
                        let (tag, check) = tagged.iter().next().expect("a check");
                        assert_eq!(check, [sent], "{case}");
                        assert_eq!(tag.priority, priority, "{case}");
                        assert_ne!(tag.idempotency, Default::default(), "{case}");
                    }
                    (frame, _) => panic!("{case}: unexpected frame {frame:?}"),
                }
            }
        }
    })
    .await;
}
