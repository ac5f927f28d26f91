//! The STATUS answer: role, epoch, offsets and the replication counters,
//! as `tollgate status` and `GET /v1/replication` show them.

use super::shared::Core;
use crate::clock::NANOS_PER_MS;
use std::sync::atomic::{AtomicU64, Ordering};
use tollgate_protocol::{NodeStatus, Role};

/// This node's answer to STATUS.
pub(crate) fn status(core: &Core) -> NodeStatus {
    let node = &core.role;
    let view = node.view();
    let stats = &node.stats;
    let capture = core.store.capture_stats();
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let mut fields: Vec<(String, u64)> = Vec::with_capacity(16);
    let mut put = |name: &str, value: u64| fields.push((name.to_owned(), value));
    put("synced", u64::from(view.synced));
    match view.role {
        Role::Standby => {
            put("lag_ms", lag_ms(core));
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
    put("buffer_cap", core.store.change_capacity() as u64);
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

/// Standby: how far behind the primary its copy is, in ms of the primary's
/// clock (0 before it has heard how far the primary got).
pub(crate) fn lag_ms(core: &Core) -> u64 {
    let complete = core.role.stats.complete_as_of.load(Ordering::Relaxed);
    if complete == 0 {
        0
    } else {
        core.clock.now().saturating_sub(complete) / NANOS_PER_MS
    }
}

/// A STATUS answer as one JSON object: `role`, `epoch`, `offset`, `addr`,
/// `primary` (null on a primary) and every named field.
pub(crate) fn to_json(s: &NodeStatus) -> serde_json::Value {
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
