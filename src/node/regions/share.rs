//! The interval's share-out and what the senders take: the shared journal
//! goes to each peer's outbox (outbox.rs), sealed once into messages for
//! every peer keeping up and as a journal to each peer behind, and each
//! peer's sender (exchange.rs) takes its messages, then its journal, from
//! there.

use super::journal::Journal;
use super::{Peer, Regions};
use crate::clock::Nanos;
use crate::sync::Ordering;
use smallvec::SmallVec;
use tollgate_protocol::UsageFrame;

impl Regions {
    /// Shares the shared journal out (outbox.rs): the peers keeping up,
    /// of those every entry's rule lists, take it as messages sealed once
    /// for them all; each other peer takes the entries of the rules listing
    /// it as a journal (a copy; the journal itself for the last when none
    /// is sealed), into which the messages still waiting for it are folded
    /// first, dropping the keys new to it, counted, past what its bound
    /// leaves.
    ///
    /// Once an interval: the first sender to tick shares out for all, and
    /// the others, ticking a moment later, find their share waiting. (Shared
    /// out again for each, the journal would be replaced by one sized for
    /// that moment's few keys, and grow again all interval long.)
    pub(super) fn share_out(&self, now: Nanos) {
        let half = self.config.interval.as_nanos() as u64 / 2;
        let mut recorded = {
            let mut shared = self.shared.lock();
            let last = self.shared_at.load(Ordering::Relaxed);
            if shared.is_empty() || now.saturating_sub(last) < half {
                return;
            }
            // Relaxed: read and written under the shared journal's lock.
            self.shared_at.store(now, Ordering::Relaxed);
            // A spare: popped from a short list, a table only when none
            // is kept (the first intervals). Once an interval, here, the
            // spares' recent peak fades.
            self.spares.fade();
            let next = self.spares.take(shared.len());
            // Empty: the hint is cleared, and set by the first record.
            next.publish(&self.shared_hint);
            std::mem::replace(&mut *shared, next)
        };
        let (bound, wire) = (self.config.journal_max_bytes, recorded.wire_bytes());
        let listed = recorded.listed_by_all();
        let sealed_for = (self.peers.iter().enumerate())
            .filter(|&(i, p)| listed & (1 << i) != 0 && p.outbox.lock().keeps_up(wire, bound))
            .fold(0u64, |bits, (i, _)| bits | 1 << i);
        let behind: SmallVec<[usize; 4]> = (0..self.peers.len())
            .filter(|i| sealed_for & (1 << i) == 0)
            .collect();
        for (n, &i) in behind.iter().enumerate() {
            let share = if sealed_for == 0 && n + 1 == behind.len() {
                std::mem::take(&mut recorded).into_share(i)
            } else {
                let mut share = self.spares.take(recorded.len());
                recorded.share_into(i, &mut share);
                share
            };
            self.take_share(&self.peers[i], share);
        }
        if sealed_for != 0 {
            self.seal_for(sealed_for, &mut recorded, now);
        }
        self.spares.give_back(recorded);
    }

    /// Merges `share` into `peer`'s journal, within what its bound leaves,
    /// with the messages still waiting for it folded in first.
    fn take_share(&self, peer: &Peer, mut share: Journal) {
        if share.is_empty() {
            self.spares.give_back(share);
            return;
        }
        let bound = self.config.journal_max_bytes;
        let mut outbox = peer.outbox.lock();
        let folded = outbox.fold_sealed(&self.hasher, &self.buffers, bound);
        let room = bound.saturating_sub(outbox.held());
        let shared = outbox.journal.absorb_within(&mut share, room);
        peer.held.store(outbox.held(), Ordering::Relaxed);
        drop(outbox);
        self.spares.give_back(share);
        let (entries, units) = (folded.0 + shared.0, folded.1 + shared.1);
        if entries > 0 {
            peer.dropped.0.inc_by(entries);
            peer.dropped.1.inc_by(units);
        }
    }

    /// Seals `recorded` into messages once and queues them for each peer
    /// of `peers` (bits): the last takes them, the others copies. An entry
    /// no message holds is counted as dropped for each.
    fn seal_for(&self, peers: u64, recorded: &mut Journal, now: Nanos) {
        let names = recorded.rule_peers();
        let region = self.name();
        let mut sealed = Vec::new();
        // Numbered by each sender as it sends them. A region name is 1 to
        // 64 bytes (checked at start): `new` does not fail.
        let mut next = || UsageFrame::new(self.buffers.take(), region, (0, 0, now)).ok();
        let limits = (self.message_cap(peers), region.len());
        let (entries, units) = recorded.seal_all(limits, &mut next, &mut sealed);
        let last = 63 - peers.leading_zeros() as usize;
        for (i, peer) in self.peers.iter().enumerate() {
            if peers & (1 << i) == 0 {
                continue;
            }
            let frames = if i == last {
                std::mem::take(&mut sealed)
            } else {
                (sealed.iter())
                    .map(|f| f.copy_into(self.buffers.take()))
                    .collect()
            };
            // Capped: more usage than one message holds.
            self.metrics
                .capped
                .inc_by(frames.len().saturating_sub(1) as u64);
            let mut outbox = peer.outbox.lock();
            outbox.push_sealed(frames, names.clone());
            peer.held.store(outbox.held(), Ordering::Relaxed);
            drop(outbox);
            if entries > 0 {
                peer.dropped.0.inc_by(entries);
                peer.dropped.1.inc_by(units);
            }
        }
    }

    /// Shares the shared journal out, then hands peer `index`'s journal to
    /// its sender (its bytes still held: they are the sender's pending now).
    pub(super) fn take_journal(&self, index: usize, now: Nanos) -> Journal {
        self.share_out(now);
        // The share out swaps its share in for the empty journal left
        // here (journal.rs, `absorb_within`), so it needs no table; one
        // that does not fit whole is walked into a table sized for it.
        self.peers[index].outbox.lock().take_journal()
    }

    /// The oldest message sealed for peer `index`, for its sender to number
    /// and send (its bytes no longer held: in flight, like a message sealed
    /// out of the sender's pending usage).
    pub(super) fn take_sealed(&self, index: usize) -> Option<UsageFrame> {
        let peer = &self.peers[index];
        let mut outbox = peer.outbox.lock();
        let frame = outbox.pop_sealed();
        peer.held.store(outbox.held(), Ordering::Relaxed);
        frame
    }

    /// Whether a message sealed for peer `index` waits.
    pub(super) fn has_sealed(&self, index: usize) -> bool {
        self.peers[index].outbox.lock().has_sealed()
    }

    /// Keeps a journal a sender has emptied, for the next interval.
    pub(super) fn recycle(&self, journal: Journal) {
        self.spares.give_back(journal);
    }

    /// Whether peer `index`'s sender's last message went unanswered.
    pub(super) fn set_unanswered(&self, index: usize, unanswered: bool) {
        self.peers[index].outbox.lock().set_unanswered(unanswered);
    }

    /// What peer `index`'s sender holds now (after merging and sealing).
    pub(super) fn set_pending_bytes(&self, index: usize, bytes: usize) {
        let peer = &self.peers[index];
        let mut outbox = peer.outbox.lock();
        outbox.set_pending(bytes);
        peer.held.store(outbox.held(), Ordering::Relaxed);
    }
}
