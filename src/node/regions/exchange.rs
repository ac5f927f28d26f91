//! The exchange tasks: one per peer region sending this region's usage,
//! and a monitor deciding whether the region is cut off.
//!
//! Each sender, every interval while this node is primary: moves its
//! journal (what the share-out left it, if anything) into its pending
//! usage, then takes the unanswered USAGE again, or else the next one
//! sealed for it at the share-out (outbox.rs), or else seals one of at
//! most `exchange-max-bytes` from its pending usage, and sends it (then,
//! while usage is left and the interval lasts, the next) over
//! a node link (HELLO proving the region secret, or the cluster secret
//! without one) and waits for USAGE_OK. A
//! message is numbered once (session, seq) and resent unchanged until
//! answered, so the receiver applies it at most once; the session is the
//! time this node became the region's primary, so a receiver can refuse an
//! earlier primary's late messages. A Malformed refusal
//! (the peer does not know this region, say) drops it with a warning
//! rather than retrying it forever. One message is in flight per peer.
//! Each handshake tells the peer's `max_frame`: messages are sealed to fit
//! every peer they go to, and one sealed larger than its peer takes
//! (before that peer was first heard, or refused FrameTooLarge) goes back
//! into the pending usage, to be sealed again to fit, rather than be
//! resent as it is for good.

use super::journal::Journal;
use super::{Peer, Regions};
use crate::log_text::Escaped;
use crate::node::link::{unexpected, Link, LinkError};
use crate::node::shared::Core;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tollgate_protocol::{
    ErrorCode, NodeScope, Response, Role, UsageFrame, FRAME_HEADER_LEN, MIN_FRAME_BODY,
};
// A learned size of its own; nothing else is ordered by it.
use crate::sync::Ordering::Relaxed;

/// Runs the monitor and one sender per peer until `shutdown`.
pub(crate) async fn run(core: Arc<Core>, regions: Arc<Regions>, shutdown: CancellationToken) {
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..regions.peers.len() {
        tasks.spawn(send_loop(
            core.clone(),
            regions.clone(),
            index,
            shutdown.clone(),
        ));
    }
    let mut tick = tokio::time::interval(regions.config.interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tick.tick() => { regions.assess(core.clock.now()); }
        }
    }
    tasks.shutdown().await;
}

/// A session: the sender's start time (ns since the UNIX epoch), so that a
/// receiver can tell a later session from an earlier one (PROTOCOL.md
/// §16); never 0, and distinct for two senders started in the same
/// nanosecond only by chance, which does not matter: sessions are per
/// sending region and a region has one primary.
fn new_session(now: crate::clock::Nanos) -> u64 {
    now.max(1)
}

/// What one sender keeps between intervals.
struct Sender {
    session: u64,
    /// Whether the node was primary at the previous interval.
    primary: bool,
    seq: u64,
    pending: Journal,
    unanswered: Option<UsageFrame>,
    link: Option<Link>,
    /// Whether the peer's last answer refused our credentials (warned once).
    refused_auth: bool,
}

async fn send_loop(
    core: Arc<Core>,
    regions: Arc<Regions>,
    index: usize,
    shutdown: CancellationToken,
) {
    let interval = regions.config.interval;
    // A call may take a few intervals over a slow path; past that the peer
    // counts as silent and the link is opened afresh.
    let timeout = (interval * 4).max(Duration::from_secs(1));
    let mut s = Sender {
        session: new_session(core.clock.now()),
        primary: false,
        seq: 0,
        pending: Journal::default(),
        unanswered: None,
        link: None,
        refused_auth: false,
    };
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if core.role.role() != Role::Primary {
            // A standby's counters are the primary's copy: it reports nothing
            // and keeps no link.
            s.link = None;
            s.primary = false;
            continue;
        }
        if !s.primary {
            // Exchanging (again) as the region's primary: a new session,
            // later than that of any primary before it.
            s.primary = true;
            s.session = new_session(core.clock.now());
            s.seq = 0;
            // A message left unanswered by an earlier term goes first, in
            // the new session: under its old one the peer would refuse it
            // as older once any later primary of this region was heard,
            // and drop usage that was never applied. (Applied already, its
            // answer lost: it counts twice, which only makes the limit
            // stricter, as any retry across a failover.)
            if let Some(usage) = s.unanswered.as_mut() {
                s.seq = 1;
                usage.renumber(s.session, s.seq);
            }
        }
        // A backlog (more usage than one message holds) is drained at once,
        // message after message, rather than one message per interval, for
        // as long as the interval lasts: usage that waits is usage the
        // peers do not see.
        let started = tokio::time::Instant::now();
        loop {
            let more = tokio::select! {
                _ = shutdown.cancelled() => return,
                more = exchange_once(&core, &regions, index, &mut s, timeout) => more,
            };
            // Stepped down meanwhile: the next tick says so (and sends no more).
            let primary = core.role.role() == Role::Primary;
            if !more || !primary || started.elapsed() >= interval {
                break;
            }
        }
    }
}

/// Sends one USAGE (the unanswered one again, or a fresh one) and returns
/// whether it was answered with usage still waiting to be sent.
async fn exchange_once(
    core: &Core,
    regions: &Regions,
    index: usize,
    s: &mut Sender,
    timeout: Duration,
) -> bool {
    let peer = &regions.peers[index];
    let metrics = regions.metrics.peer(&peer.config.name);
    let mut fresh = regions.take_journal(index, core.clock.now());
    s.pending.absorb(&mut fresh);
    regions.recycle(fresh);
    let mut usage = if let Some(usage) = s.unanswered.take() {
        usage
    } else if let Some(mut usage) = regions.take_sealed(index) {
        // Sealed at the share-out, unnumbered: this sender's next.
        s.seq += 1;
        usage.renumber(s.session, s.seq);
        usage
    } else {
        let numbers = (s.session, s.seq + 1, core.clock.now());
        let buf = regions.buffers.take();
        // A region name is 1 to 64 bytes (checked at start), which the
        // length byte holds: this does not fail.
        let mut usage = match UsageFrame::new(buf, regions.name(), numbers) {
            Ok(usage) => usage,
            Err(e) => {
                tracing::error!(error = %e, "a USAGE of this region cannot be encoded");
                return false;
            }
        };
        let left = s.pending.seal_into(
            regions.message_cap(1 << index),
            regions.name().len(),
            &mut usage,
        );
        if left {
            regions.metrics.capped.inc();
        }
        s.seq += 1;
        usage
    };
    let answer = match connect(core, peer, &mut s.link, timeout).await {
        Ok(()) if message_len(&usage) > peer.max_message.load(Relaxed) => {
            // Sealed for a larger frame than the peer takes (before its
            // handshake told its size, or it restarted with a smaller
            // one): refused whole, it would be resent as it is for good.
            // Its usage goes back to be sealed again to fit. (Unanswered
            // before, and applied by the peer as it was then: it counts
            // twice, which only makes the limit stricter.)
            take_back(regions, index, s, usage);
            regions.set_pending_bytes(index, s.pending.bytes());
            return true;
        }
        Ok(()) => call(&mut s.link, &mut usage).await,
        Err(e) => Err(e),
    };
    // Exact again: merged keys and sealed ones make room for new keys.
    regions.set_pending_bytes(index, s.pending.bytes());
    // Unanswered (kept for a resend): the messages sealed for the peer
    // are folded into its journal at the next share-out (outbox.rs).
    let malformed = |e: &LinkError| matches!(e, LinkError::Refused { code, .. } if *code == ErrorCode::Malformed);
    regions.set_unanswered(index, answer.as_ref().is_err_and(|e| !malformed(e)));
    match answer {
        Ok(ack) if ack.region != peer.config.name => {
            tracing::warn!(
                peer = %peer.config.name, answered = %Escaped(&ack.region),
                "the address of a peer region leads to another region; usage dropped"
            );
            metrics.send_failures.inc();
            regions.buffers.give_back(usage.into_buf());
            false
        }
        Ok(_) => {
            s.refused_auth = false;
            metrics.keys_sent.inc_by(u64::from(usage.entries()));
            regions.buffers.give_back(usage.into_buf());
            peer.last_acked
                .fetch_max(core.clock.now(), crate::sync::Ordering::Relaxed);
            peer.acked.fetch_add(1, crate::sync::Ordering::Relaxed);
            // More to send now: what did not fit, or what waited behind an
            // unanswered message.
            !s.pending.is_empty() || regions.has_sealed(index)
        }
        // Too large all the same (the frame size it told is not what it
        // takes): never applied, so sealed again to fit what a new
        // handshake tells.
        Err(LinkError::Refused {
            code: ErrorCode::FrameTooLarge,
            ..
        }) => {
            metrics.send_failures.inc();
            s.link = None;
            take_back(regions, index, s, usage);
            regions.set_pending_bytes(index, s.pending.bytes());
            false
        }
        // Malformed: the peer will never take this message (it does not
        // know this region, say); drop it rather than retry it forever.
        Err(LinkError::Refused { code, message }) if code == ErrorCode::Malformed => {
            tracing::warn!(
                peer = %peer.config.name, %code, reason = %Escaped(&message),
                "peer region refused our usage; message dropped"
            );
            metrics.send_failures.inc();
            s.link = None;
            regions.buffers.give_back(usage.into_buf());
            false
        }
        // Anything else (a standby answering NotPrimary during a failover
        // there, a broken connection): the same message again next time.
        Err(e) => {
            if matches!(&e, LinkError::Refused { code, .. } if *code == ErrorCode::AuthFailed) {
                // Not a passing fault: the two regions' secrets differ (one
                // has --region-secret, the other not, say). Said once per
                // refused stretch, not once per interval.
                if !s.refused_auth {
                    tracing::warn!(
                        peer = %peer.config.name, error = %e,
                        "peer region refused this node's credentials (check --region-secret and --cluster-secret on both); will retry"
                    );
                }
                s.refused_auth = true;
            }
            tracing::debug!(peer = %peer.config.name, error = %e, "usage exchange failed; will resend");
            metrics.send_failures.inc();
            s.link = None;
            s.unanswered = Some(usage);
            false
        }
    }
}

/// Opens `link` to `peer` if need be, learning from its HELLO_OK the
/// largest message it takes.
async fn connect(
    core: &Core,
    peer: &Peer,
    link: &mut Option<Link>,
    timeout: Duration,
) -> Result<(), LinkError> {
    if link.is_none() {
        let (opened, hello) = Link::open_as(
            core,
            &peer.config.addr,
            "region exchange",
            timeout,
            NodeScope::Region,
            Some(&peer.config.name),
        )
        .await?;
        let max_message = hello.max_frame.saturating_sub(MIN_FRAME_BODY) as usize;
        peer.max_message.store(max_message, Relaxed);
        *link = Some(opened);
    }
    Ok(())
}

/// The bytes of `usage` that count against the receiver's message size:
/// its frame less the length, opcode and request id.
fn message_len(usage: &UsageFrame) -> usize {
    usage.len() - FRAME_HEADER_LEN - MIN_FRAME_BODY as usize
}

/// Takes `usage`, never answered, back into the sender's pending usage,
/// each entry under the peers its rule's entries there have, to be sealed
/// again; what the journal had no room for (names past its 65,536) is
/// counted as dropped.
fn take_back(regions: &Regions, index: usize, s: &mut Sender, usage: UsageFrame) {
    let names = s.pending.rule_peers();
    let peers_of = |rule: &[u8]| {
        (names.iter())
            .find(|(name, _)| name.as_bytes() == rule)
            .map_or(1 << index, |&(_, peers)| peers)
    };
    let peer = &regions.peers[index];
    tracing::info!(
        peer = %peer.config.name, bytes = message_len(&usage),
        max = peer.max_message.load(Relaxed),
        "a USAGE sealed larger than the peer region takes is sealed again to fit"
    );
    let (entries, units) = s.pending.absorb_message(&usage, &regions.hasher, &peers_of);
    if entries > 0 {
        peer.dropped.0.inc_by(entries);
        peer.dropped.1.inc_by(units);
    }
    regions.buffers.give_back(usage.into_buf());
}

/// Sends `usage` on `link`, opened by [`connect`], and returns the answer.
/// The message is lent, not given: kept for a resend, or its buffer for the
/// next message.
async fn call(
    link: &mut Option<Link>,
    usage: &mut UsageFrame,
) -> Result<tollgate_protocol::UsageAck, LinkError> {
    let Some(l) = link.as_mut() else {
        return Err(LinkError::Closed);
    };
    match l.call_usage(usage).await? {
        Response::UsageOk(ack) => Ok(ack),
        other => Err(unexpected("USAGE", &other)),
    }
}
