//! What waits to go to one peer region, and the buffers its messages are
//! written into.
//!
//! A peer's usage waits in one of three forms:
//! - messages sealed at the interval's share-out (share.rs),
//!   once for every peer keeping up: each takes the same bytes under its
//!   own numbers, so no entry is copied into a journal per peer and
//!   encoded per peer;
//! - a journal of its own, merged per key, for a peer behind (down, or
//!   slower than the usage): what waits for it then grows with the keys,
//!   not with the checks, and a hot key adds up in place however long the
//!   peer stays away;
//! - its sender's pending journal (exchange.rs), what it took from the
//!   journal and has not yet sealed.
//!
//! A peer keeps up when its sender's last message was answered, nothing
//! of it waits merged (its journal and its sender's pending usage are
//! empty) and the messages waiting for it, with the interval's, stay
//! within half its bound (a backlog being drained, message after message).
//! It then takes the interval's usage as sealed messages. A peer behind
//! (down, or slower than the usage) takes it as a journal, into which the
//! messages still waiting for it are first folded back, each whole while
//! its entries fit the bound as journal entries (which take more room than
//! on the wire): what waits for a peer behind is one journal, merged per
//! key, within its bound as before (and the messages that did not fit,
//! sent first), and once the peer answers again it is sent in as few
//! messages as its bytes need.

use super::journal::{Journal, JournalHasher};
use crate::sync::Mutex;
use bytes::BytesMut;
use std::collections::VecDeque;
use tollgate_protocol::{RuleName, UsageFrame};

/// What waits for one peer besides its sender's unanswered message.
#[derive(Debug, Default)]
pub(super) struct Outbox {
    /// Usage shared out to it as a journal (the peer was behind), not yet
    /// taken by its sender.
    pub journal: Journal,
    /// Messages sealed for it, oldest first, not yet taken by its sender.
    sealed: VecDeque<UsageFrame>,
    /// Their bytes.
    sealed_bytes: usize,
    /// The rule names of the latest and the peers each lists, for folding
    /// them back by rule. (A rule of an earlier interval's messages gone
    /// since goes to no peer listed: folded back, its entries are sent
    /// apart from the rule's others, which the receiver adds up all the
    /// same.)
    sealed_names: Vec<(RuleName, u64)>,
    /// The bytes of its sender's pending journal, as the sender last said.
    pending: usize,
    /// Whether its sender's last message went unanswered (the peer is
    /// down, or cut off).
    unanswered: bool,
}

impl Outbox {
    /// The bytes waiting for the peer: its journal, its sealed messages and
    /// its sender's pending usage (what `region-journal-max-bytes` bounds).
    pub fn held(&self) -> usize {
        self.journal.bytes() + self.sealed_bytes + self.pending
    }

    /// Whether the peer keeps up (see the module's header), with messages
    /// of `wire_bytes` more to come, under its `bound`.
    pub fn keeps_up(&self, wire_bytes: usize, bound: usize) -> bool {
        !self.unanswered
            && self.journal.is_empty()
            && self.pending == 0
            && self.sealed_bytes.saturating_add(wire_bytes) <= bound / 2
    }

    /// Queues messages sealed for the peer from a journal whose names were
    /// `names` ([`Journal::rule_peers`]).
    pub fn push_sealed(&mut self, frames: Vec<UsageFrame>, names: Vec<(RuleName, u64)>) {
        for frame in frames {
            self.sealed_bytes += frame.len();
            self.sealed.push_back(frame);
        }
        self.sealed_names = names;
    }

    /// Folds the messages still waiting back into the journal (the peer
    /// fell behind), oldest first, their buffers given back: each whole,
    /// while its entries fit within `bound` as journal entries; the rest
    /// stay queued (held within the bound as they are), for the sender to
    /// send before the journal. Returns what was left out: entries and
    /// units, of names past the journal's room for names.
    pub fn fold_sealed(
        &mut self,
        hasher: &JournalHasher,
        buffers: &Buffers,
        bound: usize,
    ) -> (u64, u64) {
        let mut dropped = (0, 0);
        let names = std::mem::take(&mut self.sealed_names);
        let peers_of = |rule: &[u8]| {
            (names.iter())
                .find(|(name, _)| name.as_bytes() == rule)
                .map_or(0, |&(_, peers)| peers)
        };
        while let Some(frame) = self.sealed.front() {
            // Its own bytes are freed as it is folded.
            let room = bound.saturating_sub(self.held()) + frame.len();
            if self.journal.bytes_to_absorb(frame, hasher, &peers_of) > room {
                break;
            }
            let Some(frame) = self.pop_sealed() else {
                break;
            };
            let (entries, units) = self.journal.absorb_message(&frame, hasher, &peers_of);
            dropped = (dropped.0 + entries, dropped.1 + units);
            buffers.give_back(frame.into_buf());
        }
        if self.has_sealed() {
            self.sealed_names = names;
        }
        dropped
    }

    /// The oldest message sealed for the peer, for its sender to number and
    /// send.
    pub fn pop_sealed(&mut self) -> Option<UsageFrame> {
        let frame = self.sealed.pop_front()?;
        self.sealed_bytes -= frame.len();
        Some(frame)
    }

    /// How many sealed messages wait.
    #[cfg(test)]
    pub fn sealed_len(&self) -> usize {
        self.sealed.len()
    }

    /// Whether a sealed message waits.
    pub fn has_sealed(&self) -> bool {
        !self.sealed.is_empty()
    }

    /// What its sender's pending journal holds now.
    pub fn set_pending(&mut self, bytes: usize) {
        self.pending = bytes;
    }

    /// Hands the journal to the sender, its bytes counted as the sender's
    /// pending usage until the sender says what it holds once merged.
    pub fn take_journal(&mut self) -> Journal {
        let journal = std::mem::take(&mut self.journal);
        self.pending += journal.bytes();
        journal
    }

    /// Whether its sender's last message went unanswered.
    pub fn set_unanswered(&mut self, unanswered: bool) {
        self.unanswered = unanswered;
    }
}

/// The buffers of messages done with (answered or dropped), for the next
/// ones to be written where their pages are already: a new buffer of
/// `exchange-max-bytes` takes a page fault per page as it is first written.
#[derive(Debug)]
pub(super) struct Buffers {
    kept: Mutex<Vec<BytesMut>>,
    /// At most this many kept.
    max: usize,
}

impl Buffers {
    pub fn new(max: usize) -> Self {
        Self {
            kept: Mutex::new(Vec::with_capacity(max)),
            max,
        }
    }

    /// A kept buffer, or a new one.
    pub fn take(&self) -> BytesMut {
        self.kept.lock().pop().unwrap_or_default()
    }

    /// Keeps `buf` for a next message, unless enough are kept.
    pub fn give_back(&self, buf: BytesMut) {
        let mut kept = self.kept.lock();
        if kept.len() < self.max && buf.capacity() > 0 {
            kept.push(buf);
        }
    }
}
