//! Replication and failover: a primary streams its state to a standby,
//! epochs fence a replaced primary, a standby takes over by command or
//! after heartbeat loss. Wire format: `PROTOCOL.md` §13; guarantees: the
//! README's "Replication and failover".
//!
//! ```text
//!            primary                                      standby
//!  check -> stripe lock -> write + ChangeLog       repl task: follow()
//!  repl task (Source): every --repl-flush   ==REPL_CHANGES/SNAPSHOT==>  apply under
//!    drain stripes -> frames -> backlog            <==REPL_ACK========   stripe locks
//!  every --heartbeat: REPL_HEARTBEAT  ======================>  watch_primary():
//!  peer probe (STATUS + announce) ----> peer                    promote after
//!                                                               --failover-after
//! ```
//!
//! - [`node`]: role, epoch, transitions (each logged);
//! - [`primary`]: the sender (drains, backlog, the attached standby);
//! - [`standby`]: the follower and the failover watchdog;
//! - [`peer`]: start-up decision, peer probes, announces;
//! - [`state`]: store states <-> records;
//! - [`metrics`]: `tollgate_replication_*`, refreshed at each scrape.
//!
//! One supervisor task per server runs the current role's tasks and
//! restarts them whenever the role changes.

pub(crate) mod metrics;
pub(crate) mod node;
pub(crate) mod peer;
pub(crate) mod primary;
pub(crate) mod standby;
pub(crate) mod state;

use crate::clock::NANOS_PER_MS;
use crate::server::Shared;
use primary::{Handover, Source};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tollgate_protocol::{NodeStatus, Role};

/// Runs replication for the server's whole life.
pub(crate) async fn supervise(
    shared: Arc<Shared>,
    mut handovers: mpsc::Receiver<Handover>,
    shutdown: CancellationToken,
) {
    tokio::select! {
        _ = shutdown.cancelled() => return,
        _ = peer::start(&shared) => {}
    }
    let mut generation = shared.node.subscribe();
    loop {
        generation.borrow_and_update();
        let role = shared.node.role();
        let duties = async {
            match role {
                Role::Primary => primary_duties(&shared, &mut handovers).await,
                Role::Standby => standby_duties(&shared, &mut handovers).await,
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = generation.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = duties => {}
        }
    }
}

async fn primary_duties(shared: &Arc<Shared>, handovers: &mut mpsc::Receiver<Handover>) {
    let source = Source::new(shared.clone());
    let probe = async {
        match &shared.config.peer {
            Some(peer) => peer::probe(shared.clone(), peer.clone()).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = source.run(handovers) => {}
        _ = probe => {}
    }
    // A step-down ends the probe; wait for the supervisor to switch roles.
    std::future::pending::<()>().await
}

async fn standby_duties(shared: &Arc<Shared>, handovers: &mut mpsc::Receiver<Handover>) {
    // Connections that asked to replicate while this node was primary.
    let refuse = async {
        while let Some(h) = handovers.recv().await {
            tracing::info!(peer = %h.peer, "dropping a replication connection: no longer primary");
        }
    };
    tokio::select! {
        _ = standby::follow(shared.clone()) => {}
        _ = standby::watch_primary(shared.clone()) => {}
        _ = refuse => {}
    }
    std::future::pending::<()>().await
}

/// A STATUS answer as one JSON object: `role`, `epoch`, `offset`, `addr`,
/// `primary` (null on a primary) and every named field.
pub(crate) fn status_json(s: &NodeStatus) -> serde_json::Value {
    let role = match s.role {
        Role::Primary => "primary",
        Role::Standby => "standby",
    };
    let mut v = serde_json::json!({
        "role": role,
        "epoch": s.epoch,
        "offset": s.offset,
        "addr": s.addr,
        "primary": (!s.primary.is_empty()).then_some(&s.primary),
    });
    for (name, value) in &s.fields {
        v[name] = (*value).into();
    }
    v
}

/// This node's answer to STATUS.
pub(crate) fn status(shared: &Shared) -> NodeStatus {
    let node = &shared.node;
    let view = node.view();
    let stats = &node.stats;
    let capture = shared.store.capture_stats();
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let mut fields: Vec<(String, u64)> = Vec::with_capacity(16);
    let mut put = |name: &str, value: u64| fields.push((name.to_owned(), value));
    put("synced", u64::from(view.synced));
    match view.role {
        Role::Standby => {
            let complete = get(&stats.complete_as_of);
            let lag_ms = if complete == 0 {
                0
            } else {
                shared.clock.now().saturating_sub(complete) / NANOS_PER_MS
            };
            put("lag_ms", lag_ms);
            put(
                "lag_offsets",
                get(&stats.primary_offset).saturating_sub(node.offset()),
            );
            if let Some(silence) = node.silence() {
                put("heard_ms", silence.as_millis() as u64);
            }
        }
        Role::Primary => {
            put("passes", get(&stats.passes));
            put("replica_connected", get(&stats.replica_connected));
            put("replica_offset", get(&stats.replica_offset));
            put(
                "lag_offsets",
                node.offset().saturating_sub(get(&stats.replica_offset)),
            );
        }
    }
    put("full_syncs", get(&stats.full_syncs));
    put("stripe_resyncs", capture.stripe_resyncs);
    put("buffer_overflows", capture.overflows);
    put("buffered_changes", capture.buffered as u64);
    put("buffer_cap", shared.store.change_capacity() as u64);
    put("backlog_bytes", get(&stats.backlog_bytes));
    put("backlog_resets", get(&stats.backlog_resets));
    put("promotions", get(&stats.promotions));
    put("role_changes", get(&stats.role_changes));
    NodeStatus {
        role: view.role,
        epoch: view.epoch,
        offset: node.offset(),
        addr: node.advertise(),
        primary: view.primary.unwrap_or_default(),
        fields,
    }
}
