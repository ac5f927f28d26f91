//! Pair mode, the [`RoleSource`] of `--peer` and `--replica-of`: the other
//! node of the pair is asked at start-up, probed by a primary every
//! heartbeat, and heard from when it announces itself; an operator promotes
//! by PROMOTE; a standby promotes itself after `--failover-after` of
//! silence from its primary.
//!
//! Rules (docs/REPLICATION.md states what they buy):
//! - **at start**, a node with a peer serves nothing until it has asked it
//!   (asking again until `--repl-timeout` if it does not answer):
//!   a peer that is primary is followed (a restarted ex-primary comes back
//!   as standby at the new epoch); a peer that is a standby holding a
//!   complete copy while its own primary is gone (or is this very node) is
//!   promoted and followed, because this node restarted empty; otherwise
//!   the node takes its configured role (primary, or standby of
//!   `--replica-of`);
//! - **a primary** probes its peer every heartbeat, describing itself, and
//!   steps down when the peer is primary with a higher epoch (equal epochs:
//!   the node with the greater address steps down, so exactly one does);
//! - **any node** told (by a probe's announce) of a primary that outranks
//!   it steps down and follows it;
//! - **a standby** that has been in sync promotes itself once its primary
//!   has been silent for `--failover-after` (if set), and its replication
//!   stream has ended: frames already in its socket (it was paused) are
//!   read before silence is concluded;
//! - **a primary that steps down** hands every state it holds to the
//!   primary it is about to follow (HANDOFF, merged there key by key with
//!   the copy with less quota left winning) before it asks for a full
//!   sync, so nothing it admitted is handed back;
//! - **a primary that was stalled** (its probe did not run for longer than
//!   `--failover-after`: the process was paused, or starved) refuses
//!   writes with NotPrimary until its peer has answered a probe: its
//!   standby may have taken over meanwhile, and a charge admitted in that
//!   moment could only be merged into the new primary's count, not added
//!   to it. A peer that stays unreachable for another `--failover-after`
//!   is taken to be gone, and the primary serves again.
//!
//! Every conversation with the peer goes over a [`Link`] (TLS when the
//! node runs it, HELLO with the cluster secret), and every epoch the peer
//! claims is checked by the role state before it counts: an absurd one is
//! logged and ignored, never followed.

use super::gate::Gate;
use super::link::{unexpected, Link, LinkError};
use super::refusal::{EpochError, Refusal};
use super::shared::Core;
use super::source::{Access, Duty, RoleSource};
use crate::config::ReplicationSettings;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tollgate_protocol::{Announce, NodeStatus, ReplRequest, ReplResponse, Request, Response, Role};

/// The role source of a pair of nodes.
pub(crate) struct PairMode {
    core: Arc<Core>,
    stall: StallFence,
}

/// Whether this primary may have been stalled past its standby's patience
/// (see the module's rules). Only armed while a probe runs, with a peer
/// and `--failover-after`.
struct StallFence {
    /// When the fence's clock started.
    base: Instant,
    /// Milliseconds since `base` (+1) of the watchdog's last tick; 0 while
    /// no probe runs.
    alive: AtomicU64,
    /// Milliseconds since `base` (+1) of the stall the watchdog saw; 0: none
    /// since the peer last answered.
    stalled_at: AtomicU64,
    /// `--failover-after`: the standby's patience.
    after: Option<Duration>,
}

impl StallFence {
    fn now(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
    }

    fn longer_than_patience(&self, since: u64, now: u64) -> bool {
        self.after
            .is_some_and(|after| Duration::from_millis(now.saturating_sub(since)) > after)
    }

    /// Whether writes must wait: the watchdog is late, or saw a stall the
    /// peer has not answered since.
    fn holds(&self) -> bool {
        let alive = self.alive.load(Ordering::Acquire);
        alive != 0
            && self.after.is_some()
            && (self.stalled() || self.longer_than_patience(alive, self.now()))
    }

    /// The watchdog's tick: a gap longer than the patience (the process
    /// was stopped, or starved) is a stall. Returns the gap then.
    fn tick(&self) -> Option<Duration> {
        let now = self.now();
        let last = self.alive.swap(now, Ordering::AcqRel);
        if last == 0 || !self.longer_than_patience(last, now) {
            return None;
        }
        let _ = self
            .stalled_at
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire);
        Some(Duration::from_millis(now - last))
    }

    /// Whether a stall was seen that the peer has not answered since.
    fn stalled(&self) -> bool {
        self.stalled_at.load(Ordering::Acquire) != 0
    }

    /// The peer answered: whatever happened during the stall is known.
    fn clear(&self) {
        self.stalled_at.store(0, Ordering::Release);
    }

    /// The peer did not answer: after a whole patience of that since the
    /// stall, it is taken to be gone (not serving in this node's place).
    fn unanswered(&self) {
        let at = self.stalled_at.load(Ordering::Acquire);
        if at != 0 && self.longer_than_patience(at, self.now()) {
            self.clear();
        }
    }
}

/// The watchdog: ticks every heartbeat, beside the probe (which may wait
/// on its peer far longer), so only a stall of the whole process shows as
/// a gap.
async fn watchdog(stall: &StallFence, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        if let Some(gap) = stall.tick() {
            tracing::warn!(
                ?gap,
                "this primary was stalled longer than --failover-after; refusing writes until the peer answers"
            );
        }
    }
}

/// Disarms the fence when the probe ends (step-down, or its task dropped).
struct Armed<'a>(&'a StallFence);

impl<'a> Armed<'a> {
    fn new(fence: &'a StallFence) -> Self {
        fence.clear();
        fence.alive.store(fence.now(), Ordering::Release);
        Self(fence)
    }
}

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        self.0.alive.store(0, Ordering::Release);
        self.0.clear();
    }
}

impl PairMode {
    pub fn new(core: Arc<Core>) -> Self {
        let after = core.settings.failover_after;
        Self {
            core,
            stall: StallFence {
                base: Instant::now(),
                alive: AtomicU64::new(0),
                stalled_at: AtomicU64::new(0),
                after,
            },
        }
    }

    /// The role a node holds until [`start`] has settled it, and the
    /// primary it follows: a node with a peer starts as a standby of nobody
    /// and asks the peer first.
    pub fn starting_role(settings: &ReplicationSettings) -> (Role, Option<String>) {
        match (&settings.replica_of, &settings.peer) {
            (Some(p), _) => (Role::Standby, Some(p.clone())),
            (None, Some(_)) => (Role::Standby, None),
            (None, None) => (Role::Primary, None),
        }
    }
}

impl RoleSource for PairMode {
    fn admit(&self, access: Access) -> Result<Gate<'_>, Refusal> {
        let role = &self.core.role;
        let serves = match access {
            Access::Write => role.is_primary() && !self.stall.holds(),
            Access::Read => role.is_primary() || self.core.settings.serve_stale_reads,
        };
        if serves {
            Ok(Gate::All)
        } else {
            Err(role.not_primary())
        }
    }

    fn leads(&self) -> Result<(), Refusal> {
        self.admit(Access::Write).map(|_| ())
    }

    fn start(&self) -> Duty<'_> {
        Box::pin(start(&self.core))
    }

    fn duties(&self, role: Role) -> Duty<'_> {
        match (role, &self.core.settings.peer) {
            (Role::Primary, Some(peer)) => Box::pin(probe(&self.core, &self.stall, peer.clone())),
            (Role::Primary, None) => Box::pin(std::future::pending()),
            (Role::Standby, _) => Box::pin(watch_primary(&self.core)),
        }
    }

    fn promote(&self) -> Result<(u64, bool), Refusal> {
        Ok(self.core.role.promote("PROMOTE request")?)
    }

    fn heard_of(&self, announce: &Announce) -> Result<(), Refusal> {
        on_announce(&self.core, announce)
    }
}

/// Whether a primary at (`epoch`, `addr`) outranks one at (`my_epoch`,
/// `my_addr`).
pub(crate) fn outranks(epoch: u64, addr: &str, my_epoch: u64, my_addr: &str) -> bool {
    epoch > my_epoch || (epoch == my_epoch && addr < my_addr)
}

/// How long a conversation with the peer may take.
fn patience(core: &Core) -> Duration {
    core.settings.repl_timeout.min(Duration::from_secs(1))
}

/// A connection to the peer, opened when first needed and dropped on any
/// error (the next call opens a new one).
struct PeerLink<'a> {
    core: &'a Core,
    peer: String,
    link: Option<Link>,
}

impl<'a> PeerLink<'a> {
    fn new(core: &'a Core, peer: String) -> Self {
        Self {
            core,
            peer,
            link: None,
        }
    }

    async fn call(&mut self, request: &Request) -> Result<Response, LinkError> {
        let link = match &mut self.link {
            Some(link) => link,
            None => {
                let (link, _) =
                    Link::open(self.core, &self.peer, "tollgate-peer", patience(self.core)).await?;
                self.link.insert(link)
            }
        };
        let answer = link.call(request).await;
        if answer.is_err() {
            self.link = None;
        }
        answer
    }

    /// STATUS, describing this node when `announce` is given.
    async fn status(&mut self, announce: Option<Announce>) -> Result<NodeStatus, LinkError> {
        match self
            .call(&Request::Repl(ReplRequest::Status { announce }))
            .await?
        {
            Response::Repl(ReplResponse::Status(s)) => Ok(s),
            other => Err(unexpected("STATUS", &other)),
        }
    }

    /// PROMOTE: the epoch the peer is primary at.
    async fn promote(&mut self) -> Result<u64, LinkError> {
        match self.call(&Request::Repl(ReplRequest::Promote)).await? {
            Response::Repl(ReplResponse::Promoted { epoch, .. }) => Ok(epoch),
            other => Err(unexpected("PROMOTE", &other)),
        }
    }
}

/// Decides the starting role of a node with a peer (see the module docs).
/// A node without one starts in its configured role directly.
async fn start(core: &Core) {
    let node = &core.role;
    let config = &core.settings;
    let Some(peer) = config.peer.clone() else {
        return;
    };
    let me = node.advertise();
    // A peer that is slow to answer (busy, restarting too) is asked again
    // until --repl-timeout: taking the primary role on a missed answer
    // would serve checks beside the real primary until the next probe.
    // Checked: --repl-timeout has no ceiling, and a sum past the clock's
    // range means "never give up", not a panic.
    let give_up = tokio::time::Instant::now().checked_add(config.repl_timeout);
    let mut link = PeerLink::new(core, peer.clone());
    let status = loop {
        let status = link.status(None).await;
        match status {
            Err(e) if give_up.is_none_or(|d| tokio::time::Instant::now() < d) => {
                tracing::debug!(%peer, error = %e, "start: no answer from the peer yet");
                tokio::time::sleep(config.heartbeat).await;
            }
            status => break status,
        }
    };
    let fallback = |known_epoch: u64, why: &'static str| {
        let settled = match &config.replica_of {
            Some(primary) => node.step_down(primary.clone(), known_epoch, why),
            None => node.start_as_primary(known_epoch, why),
        };
        if let Err(e) = settled {
            tracing::error!(error = %e, "start: cannot take the configured role");
        }
    };
    // An epoch the peer claims counts only if it is believable.
    let status = status.map(|s| match node.heard_of_epoch(s.epoch) {
        Ok(()) => Some(s),
        Err(e) => {
            tracing::warn!(%peer, error = %e, "start: ignoring the peer's answer");
            None
        }
    });
    match status {
        Ok(Some(s)) if s.role == Role::Primary => {
            settle(node.step_down(peer, s.epoch, "start: the peer is primary"));
        }
        Ok(Some(s)) if holds_the_data(core, &s, &me) => {
            tracing::info!(%peer, epoch = s.epoch, "start: the peer holds the data; promoting it");
            match link.promote().await {
                Ok(epoch) => settle(node.step_down(
                    peer,
                    epoch,
                    "start: promoted the peer, which held the data",
                )),
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "start: cannot promote the peer");
                    fallback(s.epoch, "start: the peer could not be promoted");
                }
            }
        }
        Ok(Some(s)) => fallback(
            s.epoch,
            "start: the peer is a standby without a complete copy",
        ),
        Ok(None) => fallback(0, "start: the peer's answer was refused"),
        Err(e) => {
            tracing::info!(%peer, error = %e, "start: the peer does not answer");
            fallback(0, "start: no answer from the peer");
        }
    }
}

/// Logs a role change that the role state refused (an absurd epoch).
fn settle(changed: Result<(), EpochError>) {
    if let Err(e) = changed {
        tracing::warn!(error = %e, "role change refused");
    }
}

/// A standby peer whose copy is worth more than this (restarted, empty)
/// node's: complete, and either following this node or cut off from its
/// primary.
fn holds_the_data(core: &Core, s: &NodeStatus, me: &str) -> bool {
    let lost_primary = s
        .field("heard_ms")
        .is_none_or(|ms| Duration::from_millis(ms) > core.settings.heartbeat.saturating_mul(3));
    s.role == Role::Standby && s.field("synced") == Some(1) && (s.primary == me || lost_primary)
}

/// A primary's probe of its peer, every heartbeat, until it steps down (or
/// the task is dropped).
async fn probe(core: &Core, stall: &StallFence, peer: String) {
    let _armed = Armed::new(stall);
    tokio::select! {
        () = watchdog(stall, core.settings.heartbeat) => {}
        () = ask_peer(core, stall, peer) => {}
    }
}

/// The probe proper: asks the peer every heartbeat (backing off while it
/// is unreachable) and steps down when it outranks this node.
async fn ask_peer(core: &Core, stall: &StallFence, peer: String) {
    let node = &core.role;
    let mut link = PeerLink::new(core, peer.clone());
    let mut tick = tokio::time::interval(core.settings.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reachable = true;
    // An unreachable peer is asked again after a growing pause (one
    // heartbeat, doubling, up to ten): a peer that restarts settles its
    // own role by asking this node before this node's announces reach it.
    let mut failures = 0u32;
    let mut skip = 0u32;
    loop {
        tick.tick().await;
        // After a stall the peer is asked at once, whatever the backoff.
        if skip > 0 && !stall.stalled() {
            skip -= 1;
            continue;
        }
        let me = node.advertise();
        let announce = Announce {
            role: node.role(),
            epoch: node.epoch(),
            addr: me.clone(),
        };
        match link.status(Some(announce)).await {
            Ok(s) => {
                failures = 0;
                skip = 0;
                if !reachable {
                    tracing::info!(%peer, role = ?s.role, epoch = s.epoch, "peer reachable again");
                    reachable = true;
                }
                if let Err(e) = node.heard_of_epoch(s.epoch) {
                    tracing::warn!(%peer, error = %e, "ignoring the peer's answer");
                    continue;
                }
                if s.role == Role::Primary && outranks(s.epoch, &s.addr, node.epoch(), &me) {
                    settle(node.step_down(
                        peer.clone(),
                        s.epoch,
                        "the peer is primary at a higher epoch",
                    ));
                    return;
                }
                stall.clear();
            }
            Err(e) => {
                stall.unanswered();
                if reachable {
                    tracing::info!(%peer, error = %e, "peer unreachable");
                    reachable = false;
                }
                skip = (1u32 << failures.min(4)).min(10) - 1;
                failures = failures.saturating_add(1);
            }
        }
    }
}

/// A node told about another by a STATUS announce (from a connection
/// that proved it is a node); an unbelievable epoch is refused whole.
fn on_announce(core: &Core, announce: &Announce) -> Result<(), Refusal> {
    let node = &core.role;
    node.heard_of_epoch(announce.epoch)?;
    if announce.role != Role::Primary {
        return Ok(());
    }
    let view = node.view();
    let me = node.advertise();
    if announce.addr == me {
        return Ok(());
    }
    match view.role {
        Role::Primary if outranks(announce.epoch, &announce.addr, view.epoch, &me) => {
            node.step_down(
                announce.addr.clone(),
                announce.epoch,
                "told of a primary at a higher epoch",
            )?;
        }
        Role::Standby
            if announce.epoch > view.epoch
                && view.primary.as_deref() != Some(announce.addr.as_str()) =>
        {
            node.step_down(
                announce.addr.clone(),
                announce.epoch,
                "told of a primary at a higher epoch than the one followed",
            )?;
        }
        _ => {}
    }
    Ok(())
}

/// Promotes this standby once its primary has been silent for
/// `--failover-after` (if set), provided it has been in sync.
async fn watch_primary(core: &Core) {
    let Some(after) = core.settings.failover_after else {
        return std::future::pending().await;
    };
    let node = &core.role;
    let mut tick = tokio::time::interval(
        core.settings
            .heartbeat
            .min(after / 4)
            .max(Duration::from_millis(1)),
    );
    loop {
        tick.tick().await;
        let view = node.view();
        if !view.ever_synced {
            continue;
        }
        // An open stream that has not timed out may hold unread frames
        // (this node was paused): the follower reads them first, and ends
        // the stream itself once it stays silent for `after`.
        if node.is_streaming() {
            continue;
        }
        if let Some(silence) = node.silence() {
            if silence >= after {
                tracing::warn!(
                    primary = view.primary.as_deref().unwrap_or("none"),
                    silence_ms = silence.as_millis() as u64,
                    "no heartbeat from the primary within --failover-after; promoting"
                );
                if let Err(e) = node.promote("failover: the primary stopped sending heartbeats") {
                    tracing::error!(error = %e, "failover: cannot promote");
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::outranks;

    #[test]
    fn exactly_one_of_two_equal_primaries_steps_down() {
        assert!(outranks(3, "b", 2, "a"));
        assert!(!outranks(2, "b", 3, "a"));
        // Same epoch: the greater address steps down.
        assert!(outranks(2, "a:1", 2, "b:1"));
        assert!(!outranks(2, "b:1", 2, "a:1"));
    }
}
