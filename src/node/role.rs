//! This node's standing: role, epoch, the primary it follows, and the
//! numbers `tollgate status` shows. Written by the role source and the
//! replication tasks, read by everyone.
//!
//! Invariants:
//! - every role change goes through [`RoleState::promote`],
//!   [`RoleState::start_as_primary`], [`RoleState::step_down`] or, in
//!   cluster mode, [`RoleState::lead`], [`RoleState::follow_elected`] and
//!   [`RoleState::orphan`] (epochs from etcd, not checked), which log it and
//!   wake the supervisor (a `watch` generation); nothing else writes the
//!   role;
//! - the role is an atomic read on every request, so checks pay one load;
//! - the epoch only grows, except that a standby reports the epoch of the
//!   primary it follows (which is at least the one it knew when it chose to
//!   follow it);
//! - a promotion takes `max(every epoch heard of) + 1`, so a promoted node
//!   outranks every primary it has heard of;
//! - an epoch from another node is believed only up to `--max-epoch-gap`
//!   above the highest this node knows ([`EpochError::TooFar`]): one absurd
//!   claim (2^40, `u64::MAX`) cannot fence every later promotion out, or
//!   overflow the next one, which is checked too ([`EpochError::Exhausted`]).

use super::refusal::{EpochError, Refusal};
use parking_lot::Mutex;
// Not `crate::sync`: nothing here is modelled by loom.
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::Instant;
use tokio::sync::watch;
use tollgate_protocol::Role;

const PRIMARY: u8 = Role::Primary as u8;
const STANDBY: u8 = Role::Standby as u8;

/// Why a role changed, for the log line.
pub(crate) type Reason = &'static str;

#[derive(Debug)]
pub(crate) struct RoleState {
    role: AtomicU8,
    epoch: AtomicU64,
    /// Primary: the last offset numbered. Standby: the last offset applied.
    offset: AtomicU64,
    state: Mutex<State>,
    /// Bumped on every role change (and change of the primary followed);
    /// the supervisor restarts the role's tasks when it moves.
    generation: watch::Sender<u64>,
    /// Where this node is reached (`--advertise`, else the address it
    /// listens on, known once it is bound).
    advertise: Mutex<String>,
    pub stats: Stats,
    /// When the node started; `heard_at` and friends count from it.
    started: Instant,
    /// `--max-epoch-gap`.
    max_gap: u64,
}

#[derive(Debug)]
struct State {
    /// Standby: the node it follows (None while a starting node has not
    /// found one yet).
    primary: Option<String>,
    /// Primary: the id of its stream. Standby: the id of the stream its copy
    /// comes from (0: nothing to resume).
    replid: u64,
    /// Standby: it holds a complete copy (a full sync finished since it
    /// started following). Primary: always.
    synced: bool,
    /// Standby: it has been in sync at least once while following, so its
    /// copy is worth promoting.
    ever_synced: bool,
    /// Highest epoch this node has heard of from any other node.
    highest_seen: u64,
    /// It stepped down from primary and has not yet handed its states to
    /// the primary it follows: its copy may hold charges nobody else has,
    /// so it must not be replaced by a full sync before they are merged
    /// there (see `replication::standby`).
    owes_handoff: bool,
}

/// Counters and gauges of replication (status, metrics).
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub promotions: AtomicU64,
    pub role_changes: AtomicU64,
    pub full_syncs: AtomicU64,
    /// Primary: a standby is attached (0/1).
    pub replica_connected: AtomicU64,
    /// Primary: the offset the standby last acknowledged.
    pub replica_offset: AtomicU64,
    pub backlog_bytes: AtomicU64,
    /// Primary: drain passes completed (each reads every stripe once).
    pub passes: AtomicU64,
    pub backlog_resets: AtomicU64,
    /// Standby: the primary's last numbered offset, from its heartbeats.
    pub primary_offset: AtomicU64,
    /// Standby: nanoseconds (primary clock) up to which its copy is known
    /// complete.
    pub complete_as_of: AtomicU64,
    /// Standby: when it last heard from its primary, ms since the node
    /// started, plus 1 (0: never).
    pub heard_at_ms: AtomicU64,
    /// Standby: 1 while it holds an open stream whose last read did not
    /// time out. Frames may be waiting in that socket (the node was
    /// paused), so its silence is not yet proof that the primary is gone.
    pub streaming: AtomicU64,
    /// Handoffs sent (after stepping down) and received (merged).
    pub handoffs_sent: AtomicU64,
    pub handoffs_received: AtomicU64,
}

/// A consistent copy of the role and its details.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RoleView {
    pub role: Role,
    pub epoch: u64,
    pub primary: Option<String>,
    pub replid: u64,
    pub synced: bool,
    pub ever_synced: bool,
    pub highest_seen: u64,
}

impl RoleState {
    /// A node starting as `role` (a standby following `primary`), taking
    /// epochs up to `max_gap` above the highest it knows.
    pub fn new(role: Role, primary: Option<String>, advertise: String, max_gap: u64) -> Self {
        let (generation, _) = watch::channel(0);
        let primary_now = role == Role::Primary;
        Self {
            role: AtomicU8::new(role as u8),
            epoch: AtomicU64::new(u64::from(primary_now)),
            offset: AtomicU64::new(0),
            state: Mutex::new(State {
                primary,
                replid: if primary_now { new_replid() } else { 0 },
                synced: primary_now,
                ever_synced: false,
                highest_seen: 0,
                owes_handoff: false,
            }),
            generation,
            advertise: Mutex::new(advertise),
            stats: Stats::default(),
            started: Instant::now(),
            max_gap,
        }
    }

    pub fn advertise(&self) -> String {
        self.advertise.lock().clone()
    }

    pub fn set_advertise(&self, addr: String) {
        *self.advertise.lock() = addr;
    }

    /// The role, one atomic load (the request path).
    pub fn role(&self) -> Role {
        // Relaxed: the role is a value of its own; a request that races a
        // role change is either served or refused, both are fine (a demoted
        // node's counts are discarded by its resync).
        match self.role.load(Ordering::Relaxed) {
            PRIMARY => Role::Primary,
            _ => Role::Standby,
        }
    }

    pub fn is_primary(&self) -> bool {
        self.role() == Role::Primary
    }

    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }

    pub fn offset(&self) -> u64 {
        self.offset.load(Ordering::Relaxed)
    }

    pub fn set_offset(&self, offset: u64) {
        self.offset.store(offset, Ordering::Relaxed);
    }

    pub fn view(&self) -> RoleView {
        let state = self.state.lock();
        RoleView {
            role: self.role(),
            epoch: self.epoch(),
            primary: state.primary.clone(),
            replid: state.replid,
            synced: state.synced,
            ever_synced: state.ever_synced,
            highest_seen: state.highest_seen,
        }
    }

    /// Wakes on every role change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Why a standby does not serve a write, naming its primary.
    pub fn not_primary(&self) -> Refusal {
        let state = self.state.lock();
        Refusal::NotPrimary {
            primary: state.primary.clone(),
            epoch: self.epoch(),
        }
    }

    /// Whether `epoch`, claimed by another node, is believable: at most
    /// `--max-epoch-gap` above the highest epoch this node knows.
    fn credible(&self, state: &State, epoch: u64) -> Result<(), EpochError> {
        let known = self.epoch().max(state.highest_seen);
        if epoch > known.saturating_add(self.max_gap) {
            return Err(EpochError::TooFar {
                theirs: epoch,
                known,
                gap: self.max_gap,
            });
        }
        Ok(())
    }

    /// Remembers that some node claims `epoch`, if it is believable.
    pub fn heard_of_epoch(&self, epoch: u64) -> Result<(), EpochError> {
        let mut state = self.state.lock();
        self.credible(&state, epoch)?;
        state.highest_seen = state.highest_seen.max(epoch);
        Ok(())
    }

    /// Becomes primary at `max(known epochs) + 1` (unless already primary).
    /// Returns the epoch and whether the node already was primary.
    pub fn promote(&self, reason: Reason) -> Result<(u64, bool), EpochError> {
        self.become_primary(reason, true, None)
    }

    /// Becomes primary at exactly `epoch`, the one an election outside the
    /// node handed it (cluster mode: etcd's revision, trusted as it is).
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub fn lead(&self, epoch: u64, reason: Reason) {
        {
            let mut state = self.state.lock();
            state.highest_seen = state.highest_seen.max(epoch);
        }
        // Cannot fail: the epoch is given, not computed.
        let _ = self.become_primary(reason, true, Some(epoch));
    }

    fn become_primary(
        &self,
        reason: Reason,
        promotion: bool,
        at: Option<u64>,
    ) -> Result<(u64, bool), EpochError> {
        let mut state = self.state.lock();
        if self.is_primary() {
            return Ok((self.epoch(), true));
        }
        let known = self.epoch().max(state.highest_seen);
        let epoch = match at {
            Some(epoch) => epoch,
            None => known.checked_add(1).ok_or(EpochError::Exhausted(known))?,
        };
        let from = state.primary.take();
        state.replid = new_replid();
        state.synced = true;
        // Its own copy was never replaced (the handoff comes before any
        // sync), so it serves on with what it admitted.
        state.owes_handoff = false;
        self.epoch.store(epoch, Ordering::Relaxed);
        self.role.store(PRIMARY, Ordering::Relaxed);
        if promotion {
            self.stats.promotions.fetch_add(1, Ordering::Relaxed);
        }
        self.stats.role_changes.fetch_add(1, Ordering::Relaxed);
        drop(state);
        tracing::warn!(
            from = "standby",
            to = "primary",
            epoch,
            previous_primary = from.as_deref().unwrap_or("none"),
            reason,
            "role change"
        );
        self.generation.send_modify(|g| *g += 1);
        Ok((epoch, false))
    }

    /// Starts as primary after a startup probe found no better node;
    /// `known_epoch` is the highest epoch the probe saw.
    pub fn start_as_primary(&self, known_epoch: u64, reason: Reason) -> Result<(), EpochError> {
        self.heard_of_epoch(known_epoch)?;
        self.become_primary(reason, false, None).map(drop)
    }

    /// Becomes (or stays) a standby that follows nobody for now (cluster
    /// mode: its shard has no primary, or its lease is gone). Its copy is
    /// left as it is: as complete as it was, and resumable.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub fn orphan(&self, reason: Reason) {
        let mut state = self.state.lock();
        let was = self.role();
        if was == Role::Standby && state.primary.is_none() {
            return;
        }
        if was == Role::Primary {
            state.owes_handoff = true;
            self.stats.role_changes.fetch_add(1, Ordering::Relaxed);
        }
        let previous = state.primary.take();
        self.role.store(STANDBY, Ordering::Relaxed);
        drop(state);
        tracing::warn!(
            from = if was == Role::Primary {
                "primary"
            } else {
                "standby"
            },
            to = "standby",
            epoch = self.epoch(),
            previous_primary = previous.as_deref().unwrap_or("none"),
            primary = "none",
            reason,
            "role change"
        );
        self.generation.send_modify(|g| *g += 1);
    }

    /// [`step_down`](Self::step_down) to a primary an election outside the
    /// node named (cluster mode: etcd), whose epoch is trusted as it is
    /// (etcd revisions jump far between two elections of a shard).
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub fn follow_elected(&self, primary: String, epoch: u64, reason: Reason) {
        // Cannot fail: the epoch is not checked.
        let _ = self.change_primary(primary, epoch, reason, false);
    }

    /// Becomes (or stays) a standby following `primary`, which claims
    /// `epoch`. Its copy is no longer resumable: the next stream is a full
    /// sync. A standby already following `primary` stays as it is (its
    /// stream reports the primary's epoch).
    pub fn step_down(&self, primary: String, epoch: u64, reason: Reason) -> Result<(), EpochError> {
        self.change_primary(primary, epoch, reason, true)
    }

    fn change_primary(
        &self,
        primary: String,
        epoch: u64,
        reason: Reason,
        check: bool,
    ) -> Result<(), EpochError> {
        let mut state = self.state.lock();
        if check {
            self.credible(&state, epoch)?;
        }
        let was = self.role();
        state.highest_seen = state.highest_seen.max(epoch);
        if was == Role::Standby && state.primary.as_deref() == Some(primary.as_str()) {
            return Ok(());
        }
        let old_epoch = self.epoch();
        if was == Role::Primary {
            state.owes_handoff = true;
        }
        state.primary = Some(primary.clone());
        state.replid = 0;
        state.synced = false;
        state.ever_synced = false;
        self.epoch.store(epoch.max(old_epoch), Ordering::Relaxed);
        self.role.store(STANDBY, Ordering::Relaxed);
        self.stats.role_changes.fetch_add(1, Ordering::Relaxed);
        self.stats.heard_at_ms.store(0, Ordering::Relaxed);
        drop(state);
        let from = match was {
            Role::Primary => "primary",
            Role::Standby => "standby",
        };
        tracing::warn!(
            from,
            to = "standby",
            old_epoch,
            epoch,
            %primary,
            reason,
            "role change"
        );
        self.generation.send_modify(|g| *g += 1);
        Ok(())
    }

    /// A standby's stream started: it follows a stream of `replid` at
    /// `epoch`; a full sync makes its copy incomplete until it finishes.
    pub fn stream_started(
        &self,
        replid: u64,
        epoch: u64,
        offset: Option<u64>,
    ) -> Result<(), EpochError> {
        let mut state = self.state.lock();
        self.credible(&state, epoch)?;
        state.replid = replid;
        state.highest_seen = state.highest_seen.max(epoch);
        if let Some(offset) = offset {
            state.synced = false;
            self.set_offset(offset);
        }
        self.epoch.store(epoch, Ordering::Relaxed);
        Ok(())
    }

    /// Whether this standby must hand its states to its primary before it
    /// follows it (it stepped down from primary since it last did).
    pub fn owes_handoff(&self) -> bool {
        self.state.lock().owes_handoff
    }

    /// The primary has merged this node's states.
    pub fn handed_off(&self) {
        self.state.lock().owes_handoff = false;
        self.stats.handoffs_sent.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the follower holds an open stream that has not gone silent.
    pub fn is_streaming(&self) -> bool {
        self.stats.streaming.load(Ordering::Relaxed) == 1
    }

    pub fn set_streaming(&self, on: bool) {
        self.stats.streaming.store(u64::from(on), Ordering::Relaxed);
    }

    /// A standby has applied a complete copy.
    pub fn mark_synced(&self) {
        let mut state = self.state.lock();
        if !state.synced {
            tracing::info!(offset = self.offset(), "in sync with the primary");
        }
        state.synced = true;
        state.ever_synced = true;
    }

    /// A standby heard from its primary now.
    pub fn heard(&self) {
        let ms = self.started.elapsed().as_millis() as u64 + 1;
        self.stats.heard_at_ms.store(ms, Ordering::Relaxed);
    }

    /// How long since a standby last heard from its primary (None: never,
    /// since it started following it).
    pub fn silence(&self) -> Option<std::time::Duration> {
        let at = self.stats.heard_at_ms.load(Ordering::Relaxed);
        if at == 0 {
            return None;
        }
        let now = self.started.elapsed().as_millis() as u64 + 1;
        Some(std::time::Duration::from_millis(now.saturating_sub(at)))
    }
}

/// A random, non-zero stream id.
fn new_replid() -> u64 {
    fastrand::u64(1..)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GAP: u64 = 1000;

    #[test]
    fn absurd_epochs_are_refused_and_change_nothing() {
        let node = RoleState::new(Role::Primary, None, "a:1".into(), GAP);
        let too_far = EpochError::TooFar {
            theirs: u64::MAX,
            known: 1,
            gap: GAP,
        };
        assert_eq!(node.heard_of_epoch(u64::MAX), Err(too_far.clone()));
        assert_eq!(node.step_down("b:1".into(), u64::MAX, "test"), Err(too_far));
        assert!(matches!(
            node.step_down("b:1".into(), 1 << 40, "test"),
            Err(EpochError::TooFar { theirs, .. }) if theirs == 1 << 40
        ));
        // Just inside the gap is fine.
        assert_eq!(node.heard_of_epoch(1 + GAP), Ok(()));
        let view = node.view();
        assert_eq!(
            (view.role, node.epoch(), view.highest_seen),
            (Role::Primary, 1, 1 + GAP)
        );
        let standby = RoleState::new(Role::Standby, Some("a:1".into()), "b:1".into(), GAP);
        assert!(standby.stream_started(9, u64::MAX, Some(0)).is_err());
        assert_eq!(standby.epoch(), 0);
    }

    #[test]
    fn a_promotion_past_the_largest_epoch_is_refused_not_wrapped() {
        let node = RoleState::new(Role::Standby, Some("a:1".into()), "b:1".into(), u64::MAX);
        node.stream_started(7, u64::MAX, Some(0)).unwrap();
        assert_eq!(node.promote("test"), Err(EpochError::Exhausted(u64::MAX)));
        assert!(!node.is_primary());
        assert_eq!(node.epoch(), u64::MAX);
    }

    #[test]
    fn promotion_outranks_every_epoch_heard_of() {
        let node = RoleState::new(Role::Standby, Some("a:1".into()), "b:1".into(), GAP);
        assert_eq!(node.epoch(), 0);
        node.stream_started(7, 3, Some(0)).unwrap();
        node.heard_of_epoch(5).unwrap();
        let (epoch, was) = node.promote("test").unwrap();
        assert_eq!((epoch, was), (6, false));
        assert!(node.is_primary());
        assert_eq!(node.promote("again"), Ok((6, true)));
        assert_ne!(node.view().replid, 7);
    }

    #[test]
    fn stepping_down_adopts_the_higher_epoch_and_forgets_the_stream() {
        let node = RoleState::new(Role::Primary, None, "a:1".into(), GAP);
        assert_eq!(node.epoch(), 1);
        let gen = node.subscribe();
        node.step_down("b:1".into(), 4, "test").unwrap();
        assert!(gen.has_changed().unwrap());
        let view = node.view();
        assert_eq!(view.role, Role::Standby);
        assert_eq!(view.epoch, 4);
        assert_eq!(view.replid, 0);
        assert_eq!(view.primary.as_deref(), Some("b:1"));
        assert!(!view.synced);
        assert!(node.not_primary().to_string().contains("b:1"));
        // It served as primary: its states go to b before any sync.
        assert!(node.owes_handoff());
        node.handed_off();
        assert!(!node.owes_handoff());
        // Switching primaries as a standby owes nothing more.
        node.step_down("c:1".into(), 5, "test").unwrap();
        assert!(!node.owes_handoff());
    }

    #[test]
    fn an_elected_epoch_is_taken_as_it_is() {
        // etcd revisions jump far past --max-epoch-gap between elections.
        let node = RoleState::new(Role::Standby, None, "a:1".into(), GAP);
        node.follow_elected("b:1".into(), 1_000_000, "test");
        assert_eq!(node.epoch(), 1_000_000);
        node.orphan("test");
        assert_eq!(node.view().primary, None);
        node.lead(5_000_000, "test");
        assert_eq!((node.role(), node.epoch()), (Role::Primary, 5_000_000));
        node.orphan("test");
        assert!(node.owes_handoff(), "a primary orphaned owes its states");
    }
}
