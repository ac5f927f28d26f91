//! Sealing a journal: its entries encoded straight into USAGE messages,
//! a message at a time for a peer behind ([`Journal::seal_into`]) or all
//! of them in one walk for the peers keeping up ([`Journal::seal_all`]),
//! the walk asking for the lines of the entries it reads next.

use super::{entry_bytes, Entry, Journal};
#[cfg(test)]
use bytes::BytesMut;
use tollgate_protocol::{usage_header_len, UsageEntry, UsageFrame};

impl Journal {
    /// [`Journal::seal_into`] a new message, read back as the receiver
    /// decodes it: its entries, and whether some were left.
    #[cfg(test)]
    pub fn seal(&mut self, max_bytes: usize, region_len: usize) -> (Vec<UsageEntry>, bool) {
        let region = "r".repeat(region_len);
        let mut frame = UsageFrame::new(BytesMut::new(), &region, (1, 1, 0)).unwrap();
        let left = self.seal_into(max_bytes, region_len, &mut frame);
        (decoded(&mut frame).entries, left)
    }

    /// Takes out entries for one USAGE of at most `max_bytes` (with the
    /// header for a region name of `region_len` bytes) into `out`, a
    /// message with no entry yet; the rest stays. Returns whether some
    /// were left for lack of room.
    ///
    /// The entries are encoded straight into the message: sealed into
    /// [`UsageEntry`] lists, each entry took a slice of a key block and a
    /// clone of its rule name (four reference-count updates, with their
    /// drops), was encoded again to be sent and dropped once answered:
    /// 4.5% of the server's CPU under a global rule, in perf.
    pub fn seal_into(&mut self, max_bytes: usize, region_len: usize, out: &mut UsageFrame) -> bool {
        debug_assert!(out.is_empty(), "sealed into a message holding entries");
        let room = std::cell::Cell::new(max_bytes.saturating_sub(usage_header_len(region_len)));
        let names = &self.names;
        let mut freed = 0;
        let taken = self.entries.extract_if(|e| {
            let len = UsageEntry::encoded_len(e.key.as_bytes(), &names[usize::from(e.rule)].rule);
            let fits = len <= room.get();
            if fits {
                room.set(room.get() - len);
            }
            fits
        });
        for Entry {
            key, rule, usage, ..
        } in taken
        {
            let rule = &names[usize::from(rule)].rule;
            let key = key.as_bytes();
            freed += entry_bytes(key, rule);
            // Cannot fail: a key is at most u16::MAX bytes (the protocol's
            // own field), and a message holds far fewer than u32::MAX
            // entries (`max_bytes` is within a frame).
            let pushed = out.push(key, rule, (usage.charged, usage.refunded, usage.at));
            debug_assert!(
                pushed.is_ok(),
                "an entry the message cannot hold: {pushed:?}"
            );
            // Full, as near as entries of this size tell: stop here rather
            // than walk the rest of a large journal for a smaller entry
            // (what is not walked stays, for the next message).
            if room.get() < UsageEntry::encoded_len(key, rule) {
                break;
            }
        }
        self.bytes -= freed;
        if self.entries.is_empty() {
            self.names.clear();
        }
        !self.entries.is_empty()
    }

    /// Seals every entry into messages of at most `max_bytes` (with the
    /// header for a region name of `region_len` bytes) in one walk of the
    /// table, each message begun by `next` (None: none to be had, the rest
    /// is left out), and appended to `out`. The journal is left empty, its
    /// table's room kept. Returns what was left out (entries, units
    /// charged and refunded): an entry no whole message holds (a key near
    /// `max-key-len` under a small `exchange-max-bytes`), which would
    /// otherwise wait for good.
    ///
    /// Once an interval, for every peer keeping up (share.rs, `share_out`):
    /// sealed for each peer from a journal of its own, every entry was
    /// copied into that journal and encoded once per peer (9% of the
    /// server's CPU under a global rule with two peers, in perf).
    pub fn seal_all(
        &mut self,
        (max_bytes, region_len): (usize, usize),
        next: &mut dyn FnMut() -> Option<UsageFrame>,
        out: &mut Vec<UsageFrame>,
    ) -> (u64, u64) {
        let whole = max_bytes.saturating_sub(usage_header_len(region_len));
        let mut open: Option<(UsageFrame, usize)> = None;
        let mut left_out = (0u64, 0u64);
        // Read in place, then dropped by `clear` (a second walk, reading
        // each entry again for a key on the heap: 0.65% of the server's
        // CPU, in perf): `drain` gives entries by value, their places
        // unknown, and erased as they are read (`retain`) they would leave
        // tombstones, which `clear` keeps in an empty table: less room.
        let mut ahead = FetchAhead::default();
        for entry in self.entries.iter() {
            ahead.past(entry);
            let Entry {
                key, rule, usage, ..
            } = entry;
            let rule = &self.names[usize::from(*rule)].rule;
            let key = key.as_bytes();
            let len = UsageEntry::encoded_len(key, rule);
            if len <= whole && open.as_ref().is_none_or(|(_, room)| *room < len) {
                out.extend(open.take().map(|(frame, _)| frame));
                open = next().map(|frame| (frame, whole));
            }
            let Some((frame, room)) = open.as_mut().filter(|_| len <= whole) else {
                let units = usage.charged.saturating_add(usage.refunded);
                left_out = (left_out.0 + 1, left_out.1.saturating_add(units));
                continue;
            };
            // Cannot fail: see `seal_into`.
            let pushed = frame.push(key, rule, (usage.charged, usage.refunded, usage.at));
            debug_assert!(
                pushed.is_ok(),
                "an entry the message cannot hold: {pushed:?}"
            );
            *room -= len;
        }
        out.extend(open.map(|(frame, _)| frame));
        self.entries.clear();
        self.bytes = 0;
        self.names.clear();
        left_out
    }
}

/// Asks for the lines of the entries a walk of a journal's table reads
/// next. A journal sealed whole was written all interval long, an entry
/// to a line at random, and is read once: without this, nearly all of the
/// seal's time was the load of each entry (4.2% of the server's CPU under
/// a global rule, in perf; 3.2% with it). A walk goes up the bucket
/// indexes, and hashbrown keeps its buckets below its control bytes, the
/// first highest: the entries to come are on the lines below. (Were the
/// layout another, the fetches would only be wasted: a prefetch is a
/// hint.)
pub(super) struct FetchAhead {
    /// The lowest address asked for so far (`usize::MAX`: none).
    asked: usize,
}

impl Default for FetchAhead {
    fn default() -> Self {
        Self { asked: usize::MAX }
    }
}

impl FetchAhead {
    /// How far below the entry read the lines are asked for: 32 entries
    /// (8 left the load waiting still).
    pub(super) const BYTES: usize = 32 * std::mem::size_of::<Entry>();

    /// Asks for the lines down to `BYTES` below `entry` not asked for yet.
    #[inline]
    fn past(&mut self, entry: &Entry) {
        if let Some((to, len)) = self.span(entry as *const Entry as usize) {
            crate::prefetch::range(to, len);
        }
    }

    /// The span to ask for past an entry at address `at` (start, length:
    /// at most `BYTES`), none when all of it was asked for already.
    pub(super) fn span(&mut self, at: usize) -> Option<(usize, usize)> {
        let from = self.asked.min(at);
        let to = at.saturating_sub(Self::BYTES);
        (from > to).then(|| {
            self.asked = to;
            (to, from - to)
        })
    }
}

/// `frame` as the receiver decodes it (sent as request 1).
#[cfg(test)]
pub(in crate::node::regions) fn decoded(frame: &mut UsageFrame) -> tollgate_protocol::UsageReport {
    let mut bytes = BytesMut::from(frame.frame(1).unwrap());
    let limits = tollgate_protocol::ServerLimits {
        max_frame: u32::MAX,
        max_key_len: u16::MAX,
        ..Default::default()
    };
    match tollgate_protocol::decode_request(&mut bytes, &limits) {
        Ok(Some((_, tollgate_protocol::Request::Usage(report)))) => report,
        other => panic!("a sealed USAGE decodes as one: {other:?}"),
    }
}
