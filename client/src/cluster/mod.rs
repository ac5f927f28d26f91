//! Cluster mode: routing each check to the shard that owns its slot
//! (PROTOCOL.md §14, "What a client does").
//!
//! ```text
//!  check ─ slot(key) ─> SlotMap ─> Shard (primary round, breakers) ─> answer
//!  batch ─ split by shard ─> one CHECK per shard, at once ─> merged in order
//!     MOVED ─────────> refresh the map (from the named node first), resend once
//!     TryAgain, node unreachable, NotPrimary ─> wait (growing), refresh, resend
//! ```
//!
//! Invariants:
//! - the slot is computed by the protocol crate's function, the one the
//!   server uses; an atomic group whose keys span slots is answered
//!   CrossSlot locally, as the server would, without a round trip;
//! - only answers that charged nothing are resent: MOVED, TryAgain,
//!   NotPrimary, ShuttingDown, and failures before the request left
//!   (connect, backoff, breaker, no primary, no owner). A lost connection
//!   or a timeout may have charged, and is reported, not resent;
//! - a call follows at most one MOVED (then the map is refreshed); a second
//!   is [`Error::Moved`]; every wait and refresh is bounded by the call's
//!   deadline, so with the default 5 ms deadline a failure is reported at
//!   once rather than waited out;
//! - refreshes are serialized, and one that finds the map refreshed since
//!   the failing attempt read it does not fetch again, so a burst of MOVED
//!   answers costs one TOPOLOGY; a background task also refreshes every
//!   `topology_refresh`;
//! - a one-pair check whose slot's shard is connected is sent by the handle
//!   itself on that connection (`single::Ready`, no future of its own);
//!   every answer but a decision then goes through `Cluster::resume`, the
//!   routed path's rules from its first attempt on, so the rules above hold
//!   whichever path a check took.

mod batch;
mod map;
mod single;
mod topology;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tollgate_protocol::slot::Slot;
use tollgate_protocol::{CheckResult, ErrorCode, Moved, Pair, Response};

use crate::backoff;
use crate::config::ClientConfig;
use crate::connection::pending::{Answer, BatchKind, Checks};
use crate::connection::Deadline;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::shard::Shard;
use map::SlotMap;
pub(crate) use single::{FirstAttempt, Ready};

/// What the routing has done so far; see [`Client::cluster_stats`](crate::Client::cluster_stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClusterStats {
    /// The version of the slot map in use (0 before the first TOPOLOGY, and
    /// for a server outside a cluster).
    pub version: u64,
    /// Shards in the map.
    pub shards: usize,
    /// MOVED answers followed.
    pub moved: u64,
    /// Resends after TryAgain, NotPrimary or an unreachable shard.
    pub retries: u64,
    /// Slot maps fetched (TOPOLOGY answers installed).
    pub refreshes: u64,
}

pub(crate) struct Cluster {
    seeds: Vec<String>,
    map: ArcSwap<SlotMap>,
    /// Bumped at every installed map; an attempt remembers the one it routed
    /// by, so a refresh after its failure is skipped when another caller
    /// refreshed meanwhile.
    generation: AtomicU64,
    /// Serializes refreshes.
    refreshing: tokio::sync::Mutex<()>,
    /// Single-node connections used to ask TOPOLOGY, by address.
    probes: parking_lot::Mutex<HashMap<String, Arc<Shard>>>,
    config: ClientConfig,
    metrics: Option<Arc<Metrics>>,
    moved: AtomicU64,
    retries: AtomicU64,
}

/// A check of a batch still to answer: its index in the batch, its slot.
pub(super) type Todo = (usize, u16);

/// Why an attempt is worth making again.
pub(super) enum Retry {
    Moved(Moved),
    /// TryAgain, NotPrimary, or a failure before the request left.
    Later(Result<Answer, Error>),
}

/// A call's retry budget besides its deadline.
#[derive(Default)]
pub(super) struct Attempts {
    followed_moved: bool,
    waits: u32,
}

impl Cluster {
    pub(crate) fn new(
        seeds: Vec<String>,
        config: ClientConfig,
        metrics: Option<Arc<Metrics>>,
    ) -> Self {
        Self {
            seeds,
            map: ArcSwap::from_pointee(SlotMap::empty()),
            generation: AtomicU64::new(0),
            refreshing: tokio::sync::Mutex::new(()),
            probes: parking_lot::Mutex::new(HashMap::new()),
            config,
            metrics,
            moved: AtomicU64::new(0),
            retries: AtomicU64::new(0),
        }
    }

    pub(crate) fn stats(&self) -> ClusterStats {
        let map = self.map.load();
        ClusterStats {
            version: map.version,
            shards: map.shards.len(),
            moved: self.moved.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            refreshes: self.generation.load(Ordering::Relaxed),
        }
    }

    /// Each shard of the map: its id and its nodes' addresses.
    pub(crate) fn shards(&self) -> Vec<(u16, Vec<String>)> {
        self.map
            .load()
            .shards
            .iter()
            .map(|s| {
                let addrs = s
                    .shard
                    .as_ref()
                    .map(|s| s.addrs().map(str::to_owned).collect())
                    .unwrap_or_default();
                (s.id, addrs)
            })
            .collect()
    }

    /// Closes every connection of the map and the probes.
    pub(crate) fn close(&self) {
        for shard in self.all_shards() {
            shard.close();
        }
        for shard in self.probes.lock().values() {
            shard.close();
        }
    }

    /// The limits the first shard to have answered a handshake announced
    /// (every node of a cluster is run with the same limits); `None`
    /// before any handshake.
    pub(crate) fn announced_limits(&self) -> Option<tollgate_protocol::ServerLimits> {
        let map = self.map.load();
        map.shards
            .iter()
            .filter_map(|s| s.shard.as_ref())
            .find_map(|s| s.announced_limits())
    }

    /// Every shard of the map that has nodes.
    pub(crate) fn all_shards(&self) -> Vec<Arc<Shard>> {
        let map = self.map.load();
        map.shards.iter().filter_map(|s| s.shard.clone()).collect()
    }

    /// The shard that serves `key` now (refreshing an empty map first).
    pub(crate) async fn shard_for(
        &self,
        key: &[u8],
        deadline: Deadline,
    ) -> Result<Arc<Shard>, Error> {
        let generation = self.generation.load(Ordering::Acquire);
        if self.map.load().is_empty() {
            self.refresh_after(generation, None, deadline).await?;
        }
        let map = self.map.load();
        map.shard_of(Slot::of(key).get())
            .map(|(_, s)| Arc::clone(s))
    }

    /// Fetches the map now (`connect_cluster`, the background task).
    pub(crate) async fn refresh(&self, deadline: Deadline) -> Result<(), Error> {
        let generation = self.generation.load(Ordering::Acquire);
        self.refresh_after(generation, None, deadline).await
    }

    /// Refreshes the map every `topology_refresh` until `stop`.
    pub(crate) async fn refresh_loop(self: Arc<Self>, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(self.config.topology_refresh) => {}
            }
            if let Err(error) = self
                .refresh(Deadline::after(self.config.connect_timeout))
                .await
            {
                tracing::debug!(%error, "background refresh of the slot map failed");
            }
        }
    }

    /// Fetches and installs a map, unless one was installed since
    /// `generation` (another caller refreshed meanwhile).
    async fn refresh_after(
        &self,
        generation: u64,
        prefer: Option<&str>,
        deadline: Deadline,
    ) -> Result<(), Error> {
        let work = async {
            let _serial = self.refreshing.lock().await;
            if self.generation.load(Ordering::Acquire) != generation {
                return Ok(());
            }
            let topology = self.fetch(prefer, deadline).await?;
            let previous = self.map.load_full();
            if !previous.is_empty() && topology.version < previous.version {
                // A stale node: keep the newer map.
                return Ok(());
            }
            match SlotMap::build(&topology, &previous, &self.config, self.metrics.as_ref()) {
                Ok(map) => {
                    tracing::debug!(
                        version = map.version,
                        shards = map.shards.len(),
                        "slot map installed"
                    );
                    self.map.store(Arc::new(map));
                    self.generation.fetch_add(1, Ordering::AcqRel);
                    Ok(())
                }
                Err(error) => {
                    tracing::warn!(%error, version = topology.version, "TOPOLOGY answer ignored: not a map of every slot");
                    Ok(())
                }
            }
        };
        tokio::time::timeout_at(deadline.at, work)
            .await
            .unwrap_or_else(|_| Err(deadline.exceeded()))
    }

    /// Sends checks of `kind`, routed by slot.
    pub(crate) async fn checks(
        &self,
        kind: BatchKind,
        checks: Checks,
        deadline: Deadline,
    ) -> Result<Answer, Error> {
        match checks {
            Checks::Batch(batch) => Box::pin(self.batch(kind, batch, deadline))
                .await
                .map(Answer::Results),
            Checks::One(pair) => {
                let slot = Slot::of(&pair.key).get();
                self.single(kind, slot, Checks::One(pair), deadline).await
            }
            Checks::Group(pairs) => match group_slot(&pairs) {
                Some(slot) => {
                    self.single(kind, slot, Checks::Group(pairs), deadline)
                        .await
                }
                None => Ok(Answer::One(CheckResult::Error(ErrorCode::CrossSlot))),
            },
            // CHECK2: one check (or group) with its idempotency key, kept
            // across the resend a MOVED causes (nothing was charged then).
            Checks::Tagged(tag, pairs) => match group_slot(&pairs) {
                Some(slot) => {
                    self.single(kind, slot, Checks::Tagged(tag, pairs), deadline)
                        .await
                }
                None => Ok(Answer::One(CheckResult::Error(ErrorCode::CrossSlot))),
            },
        }
    }

    /// The map to route by and its generation; fetched first when there is
    /// none yet (a client made with `Client::cluster` routes its first
    /// call by a map fetched within that call's deadline).
    pub(super) async fn current_map(&self, deadline: Deadline) -> (u64, Arc<SlotMap>) {
        let generation = self.generation.load(Ordering::Acquire);
        let map = self.map.load_full();
        if !map.is_empty() {
            return (generation, map);
        }
        if let Err(error) = Box::pin(self.refresh_after(generation, None, deadline)).await {
            tracing::debug!(%error, "no slot map yet");
        }
        (
            self.generation.load(Ordering::Acquire),
            self.map.load_full(),
        )
    }

    /// Waits and refreshes before a resend; `Err` with the answer to give
    /// when the call must end (second MOVED, or no time left).
    pub(super) async fn prepare_retry(
        &self,
        why: Retry,
        generation: u64,
        attempts: &mut Attempts,
        deadline: Deadline,
    ) -> Result<(), Result<Answer, Error>> {
        match why {
            Retry::Moved(moved) => {
                if attempts.followed_moved {
                    return Err(Err(Error::Moved {
                        slot: moved.slot,
                        addr: moved.addr,
                    }));
                }
                attempts.followed_moved = true;
                self.moved.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(slot = moved.slot, addr = %moved.addr, version = moved.version, "MOVED: refreshing the slot map");
                if let Err(error) = self
                    .refresh_after(generation, Some(&moved.addr), deadline)
                    .await
                {
                    tracing::debug!(%error, "slot map refresh after MOVED failed");
                }
                self.reconnect_to(&moved);
                Ok(())
            }
            Retry::Later(answer) => {
                attempts.waits += 1;
                let wait = backoff::delay(
                    self.config.try_again_backoff,
                    self.config.backoff_max,
                    attempts.waits,
                );
                if Instant::now() + wait >= deadline.at {
                    return Err(answer);
                }
                tokio::time::sleep(wait).await;
                self.retries.fetch_add(1, Ordering::Relaxed);
                if let Err(error) = self.refresh_after(generation, None, deadline).await {
                    tracing::debug!(%error, "slot map refresh before a resend failed");
                }
                Ok(())
            }
        }
    }

    /// After MOVED naming a node of the slot's shard (a failover within the
    /// node set the map already had): drop the shard's connection to
    /// another node, so the next call finds the primary again.
    fn reconnect_to(&self, moved: &Moved) {
        let map = self.map.load();
        if let Ok((_, shard)) = map.shard_of(moved.slot) {
            if shard.connected_addr().is_some_and(|a| a != moved.addr) {
                shard.drop_connection();
            }
        }
    }
}

/// What to do with an attempt's result: `Ok` to return it, `Err` to resend.
pub(super) fn classify(result: Result<Answer, Error>) -> Result<Result<Answer, Error>, Retry> {
    match result {
        Ok(Answer::Response(Response::Moved(moved))) => Err(Retry::Moved(moved)),
        Ok(Answer::One(CheckResult::Error(ErrorCode::TryAgain))) => Err(Retry::Later(result)),
        Ok(Answer::Response(Response::Error { code, .. })) if resendable(code) => {
            Err(Retry::Later(result))
        }
        Err(Error::Server { code, .. }) if resendable(code) => Err(Retry::Later(result)),
        Err(
            Error::Connect { .. }
            | Error::ConnectTimeout { .. }
            | Error::Unavailable { .. }
            | Error::NoPrimary { .. }
            | Error::BreakerOpen { .. }
            | Error::NoOwner { .. }
            | Error::NoTopology { .. },
        ) => Err(Retry::Later(result)),
        other => Ok(other),
    }
}

/// Error codes of a request that was not evaluated and may go again.
fn resendable(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::TryAgain | ErrorCode::NotPrimary | ErrorCode::ShuttingDown
    )
}

/// The slot of an atomic group; `None` when its keys span slots. An empty
/// group goes to slot 0, whose node refuses it as the server would.
pub(super) fn group_slot(pairs: &[Pair]) -> Option<u16> {
    let Some(first) = pairs.first() else {
        return Some(0);
    };
    let slot = Slot::of(&first.key);
    pairs[1..]
        .iter()
        .all(|p| Slot::of(&p.key) == slot)
        .then_some(slot.get())
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use tollgate_protocol::units::Rate;
    use tollgate_protocol::Limit;

    use super::*;

    fn pair(key: &'static str) -> Pair {
        Pair::inline(
            Bytes::from_static(key.as_bytes()),
            Limit::token_bucket(Rate::per_second(5), 10),
            1,
        )
    }

    #[test]
    fn groups_sharing_a_tag_have_one_slot_and_others_none() {
        let tagged = [pair("rl:{acme}:s"), pair("rl:{acme}:day")];
        assert_eq!(group_slot(&tagged), Some(Slot::of(b"acme").get()));
        assert_eq!(group_slot(&[pair("foo"), pair("bar")]), None);
        assert_eq!(group_slot(&[]), Some(0));
    }

    #[test]
    fn only_answers_that_charged_nothing_are_resent() {
        let moved = Moved {
            slot: 1,
            version: 2,
            addr: "a:1".into(),
        };
        assert!(matches!(
            classify(Ok(Answer::Response(Response::Moved(moved)))),
            Err(Retry::Moved(_))
        ));
        assert!(matches!(
            classify(Ok(Answer::One(CheckResult::Error(ErrorCode::TryAgain)))),
            Err(Retry::Later(_))
        ));
        assert!(matches!(
            classify(Err(Error::NoOwner {
                slot: 1,
                version: 0
            })),
            Err(Retry::Later(_))
        ));
        assert!(matches!(classify(Err(Error::ConnectionLost)), Ok(Err(_))));
        assert!(matches!(
            classify(Err(Error::Timeout {
                after: std::time::Duration::from_millis(5)
            })),
            Ok(Err(_))
        ));
        assert!(matches!(
            classify(Ok(Answer::One(CheckResult::Error(ErrorCode::CrossSlot)))),
            Ok(Ok(_))
        ));
    }
}
