//! The usage of global keys not yet sent: key and rule to units charged,
//! units refunded and the time of the latest charge. The check path
//! records into one journal for all peer regions (each rule name kept with
//! the set of peers its rule lists); at each exchange that journal is
//! shared out (share.rs): sealed once into messages for the peers keeping
//! up, or taken by each peer behind into a journal of its own, from which
//! its sender seals messages.
//!
//! Invariant: for each peer, an entry is either in the shared journal, in
//! the peer's journal (or its sender's pending one), in exactly one
//! message sealed for it and not yet sent, or in exactly one message to it
//! not yet answered (entries move out as they are sealed, a message folded
//! back into the journal is gone from the queue, and nothing is put back
//! once sent), so each unit is reported once to each peer.
//!
//! Its size: each key appears once however often it is checked, and the
//! caller gives the room left (`--region-journal-max-bytes` for one peer,
//! this journal, the messages sealed for it and the sender's pending
//! journal together); a key new to the
//! journal that does not fit is dropped, while keys already in it keep
//! adding up. Dropping the newcomer rather than evicting an older key keeps
//! every reported sum exact (a key is reported in full or not at all), costs
//! nothing to decide, and cannot be steered by a client into erasing the
//! usage of a hot key by checking many cold ones.
//!
//! Rule names are kept once per journal (a handful of global rules against
//! up to millions of keys): an entry names its rule by index, and sealing
//! writes each entry's name from that one copy. Keys are held as the store
//! holds them ([`StoredKey`]: inline up to 22 bytes), so recording a short
//! key allocates nothing and an entry fills one cache line (a longer key is
//! allocated once per journal it is in); sealing encodes entries straight
//! into the message ([`Journal::seal_into`]).

use crate::clock::Nanos;
use crate::store::{StoredKey, TableHint};
use ahash::RandomState;
use bytes::Bytes;
#[cfg(test)]
use bytes::BytesMut;
use hashbrown::HashTable;
use tollgate_protocol::{RuleName, UsageFrame};

/// What an entry is counted as besides its key and rule name: the table's
/// slot, doubled for the spare room a hash table keeps as it grows, and the
/// headers of the heap blocks a long key and the names take.
const ENTRY_OVERHEAD: usize = 2 * std::mem::size_of::<Entry>() + 32;

/// What an entry takes in a message besides its key and rule name: their
/// lengths and its three counts (`UsageEntry::encoded_len`).
const WIRE_OVERHEAD: usize = 2 + 1 + 3 * 8;
const _: () = assert!(WIRE_OVERHEAD < ENTRY_OVERHEAD);

/// The bytes an entry of `key` under `rule` is counted as.
fn entry_bytes(key: &[u8], rule: &RuleName) -> usize {
    key.len() + rule.as_bytes().len() + ENTRY_OVERHEAD
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Usage {
    charged: u64,
    refunded: u64,
    at: Nanos,
}

impl Usage {
    fn merge(&mut self, other: Usage) {
        self.charged = self.charged.saturating_add(other.charged);
        self.refunded = self.refunded.saturating_add(other.refunded);
        if other.charged > 0 {
            self.at = self.at.max(other.at);
        }
    }
}

/// One key under one rule (and the peers it goes to). Held in a [`HashTable`] rather than a map keyed
/// by (key, rule) so a lookup hashes and compares the caller's slices as
/// they are, with no handle cloned per check. The entry keeps its hash:
/// every journal of a node hashes with the same [`JournalHasher`], so a
/// check's usage is hashed once for all its peers, and neither a table's
/// growth nor a sender absorbing a journal hashes a key again.
#[derive(Debug, Clone)]
#[repr(align(64))]
struct Entry {
    hash: u64,
    key: StoredKey,
    /// Its rule and peers: an index into the journal's `names`.
    rule: u16,
    usage: Usage,
}

/// The hasher of every journal of one node: ahash, seeded at random once
/// per process (clients choose the keys, so the seed must be secret).
#[derive(Debug, Clone, Default)]
pub(super) struct JournalHasher(RandomState);

impl JournalHasher {
    /// The hash [`Journal::add`] takes for `key` under `rule`.
    pub fn hash(&self, key: &[u8], rule: &RuleName) -> u64 {
        self.hash_bytes(key, rule.as_bytes())
    }

    /// [`JournalHasher::hash`] of a rule name's bytes.
    fn hash_bytes(&self, key: &[u8], rule: &[u8]) -> u64 {
        self.0.hash_one((key, rule))
    }
}

impl Entry {
    fn is(&self, key: &[u8], rule: u16) -> bool {
        self.rule == rule && self.key.is(key)
    }
}

// One cache line, aligned to one (a table's slots then are too): an entry
// new to the journal is one miss to write, not two (as an entry with a
// `Bytes` key, 72 bytes, mostly was).
const _: () = assert!(std::mem::size_of::<Entry>() == 64 && std::mem::align_of::<Entry>() == 64);

/// A rule name and the peer regions its rule lists, as bits (bit `i`:
/// peer `i` of the node; a node has at most
/// [`MAX_REGION_PEERS`](crate::config::MAX_REGION_PEERS), 64). The same
/// name with other peers (the rule was changed) is another name: its
/// entries go to other peers.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Name {
    rule: RuleName,
    peers: u64,
}

/// Usage not yet sent: the node's shared journal, or one peer's (see the
/// module's header). Journals are merged only with journals of the same
/// node, made with the same [`JournalHasher`] (the hashes they keep must
/// agree).
#[derive(Debug, Default)]
pub(super) struct Journal {
    entries: HashTable<Entry>,
    /// The names the entries index, each once; emptied with the journal,
    /// so names of rules since removed do not pile up.
    names: Vec<Name>,
    /// The entries' bytes as [`entry_bytes`] counts them.
    bytes: usize,
}

/// At most this many rule names in one journal: an entry's index is a
/// u16. Past it (65,536 global rules used within one interval) new names
/// are refused like keys that do not fit.
const MAX_NAMES: usize = u16::MAX as usize + 1;

impl Journal {
    /// An empty journal whose table has room for `entries` entries (a new
    /// spare, `spares.rs`), so an interval's keys do not grow a table from
    /// nothing.
    pub fn with_capacity(entries: usize) -> Self {
        Self {
            entries: HashTable::with_capacity(entries),
            names: Vec::new(),
            bytes: 0,
        }
    }

    /// Empties the journal and keeps its table's room, for the next
    /// interval's keys (see `spares.rs`).
    pub fn clear(&mut self) {
        // Even when empty: a table emptied by sealing (`extract_if`) keeps
        // a tombstone in most slots it took from, and those count against
        // its room until the table is reset. Kept so, a table held a
        // fraction of its room; the next interval's `reserve` rebuilt it or
        // moved it to a new allocation, whose pages the check path then
        // faulted in (4.8% of the server's CPU under a global rule, in
        // perf). `HashTable::clear` skips an empty table; a drain resets
        // every control byte whatever the table holds (one byte per slot,
        // 1/64 of the table), which the tests check.
        drop(self.entries.drain());
        self.names.clear();
        self.bytes = 0;
    }

    /// Makes room for `entries` entries in all, so they go in without the
    /// table growing (and moving every entry) on the way.
    pub fn reserve(&mut self, entries: usize) {
        let more = entries.saturating_sub(self.entries.len());
        self.entries.reserve(more, |e| e.hash);
    }

    /// Gives back the table's room beyond `entries` entries (or those it
    /// holds, if more).
    pub fn shrink_to(&mut self, entries: usize) {
        self.entries.shrink_to(entries, |e| e.hash);
    }

    /// How many entries the table holds before it grows.
    pub fn capacity(&self) -> usize {
        self.entries.capacity()
    }

    /// A hint for journals' tables, to prefetch where an entry is probed
    /// for ([`Journal::publish`]).
    pub fn new_hint() -> TableHint {
        TableHint::new::<Entry>()
    }

    /// Publishes where this journal's table is to `hint`: after it moved
    /// (grew, or another journal took its place).
    pub fn publish(&self, hint: &TableHint) {
        hint.publish(&self.entries);
    }

    /// Checks that `hint` names where this journal's entries are (see
    /// `TableHint::assert_names`); how many entries it checked.
    #[cfg(test)]
    pub fn assert_hint(&self, hint: &TableHint) -> usize {
        hint.assert_names(&self.entries, |e| e.hash)
    }

    /// The index of `rule` for `peers` among the names, if it is there. A
    /// linear walk: a journal names a handful of global rules.
    fn name_index(&self, rule: &[u8], peers: u64) -> Option<u16> {
        self.names
            .iter()
            .position(|n| n.peers == peers && n.rule.as_bytes() == rule)
            .map(|i| i as u16)
    }

    /// The index of `rule` for `peers`, added (copied: the caller's name,
    /// when longer than a `RuleName` holds inline, is a slice of a request
    /// frame) when new; None when the names are full.
    fn intern(&mut self, rule: &RuleName, peers: u64) -> Option<u16> {
        if let Some(i) = self.name_index(rule.as_bytes(), peers) {
            return Some(i);
        }
        if self.names.len() >= MAX_NAMES {
            return None;
        }
        let rule = RuleName::new(Bytes::copy_from_slice(rule.as_bytes())).ok()?;
        self.names.push(Name { rule, peers });
        Some((self.names.len() - 1) as u16)
    }

    /// Adds usage of `key` under `rule`, whose [`JournalHasher::hash`] is
    /// `hash`, for the peers whose bits are set in `peers`. A key not yet
    /// here is taken only when its entry fits in `room` bytes; returns
    /// false when it did not (nothing recorded). The key and name are
    /// copied: the caller's key (and a long name) are slices of a whole
    /// request frame, which they would keep alive.
    pub fn add(
        &mut self,
        (hash, key, rule, peers): (u64, &[u8], &RuleName, u64),
        (charged, refunded, at): (u64, u64, Nanos),
        room: usize,
    ) -> bool {
        let usage = Usage {
            charged,
            refunded,
            at: if charged > 0 { at } else { 0 },
        };
        let known = self.name_index(rule.as_bytes(), peers);
        if let Some(i) = known {
            if let Some(e) = self.entries.find_mut(hash, |e| e.is(key, i)) {
                e.usage.merge(usage);
                return true;
            }
        }
        let bytes = entry_bytes(key, rule);
        if bytes > room {
            return false;
        }
        let Some(rule) = known.or_else(|| self.intern(rule, peers)) else {
            return false;
        };
        let entry = Entry {
            hash,
            key: StoredKey::new(key),
            rule,
            usage,
        };
        self.insert_new(entry);
        self.bytes += bytes;
        true
    }

    fn insert_new(&mut self, entry: Entry) {
        self.entries.insert_unique(entry.hash, entry, |e| e.hash);
    }

    /// Moves everything of `other` into this journal (no room asked: what
    /// `other` holds was counted against the same bound already, and a key
    /// in both takes less room merged).
    pub fn absorb(&mut self, other: &mut Journal) {
        self.absorb_within(other, usize::MAX);
    }

    /// Moves `other` into this journal; a key new here is taken only while
    /// the bytes added stay within `room`. Returns what was left out:
    /// entries and units (charged and refunded). The smaller of the two is
    /// walked when all of `other` fits: a sender taking each interval's
    /// usage into a pending one that is empty (the peer keeps up) only
    /// swaps them. `other` is left empty, holding one of the two tables,
    /// for reuse.
    pub fn absorb_within(&mut self, other: &mut Journal, room: usize) -> (u64, u64) {
        let mut room = room;
        if other.bytes <= room && other.entries.len() > self.entries.len() {
            // All of other fits, so whatever this journal adds to it counts
            // against nothing: it was held already.
            std::mem::swap(self, other);
            room = usize::MAX;
        }
        if other.entries.is_empty() {
            other.clear();
            return (0, 0);
        }
        if self.capacity() == 0 {
            // A peer's hand-over slot keeps no table (mod.rs,
            // `take_journal`); one that did not fit all of `other` is
            // sized for it at once rather than grown key by key.
            self.reserve(other.len());
        }
        // Other's name indexes, as indexes here. A name that finds no room
        // (65,536 names already) loses its entries, counted like keys
        // dropped for want of room: never happens with any real rule set.
        let names: Vec<Option<u16>> = other
            .names
            .iter()
            .map(|n| self.intern(&n.rule, n.peers))
            .collect();
        let (mut added, mut dropped) = (0, (0, 0));
        for mut entry in other.entries.drain() {
            let units = entry.usage.charged.saturating_add(entry.usage.refunded);
            let Some(rule) = names[usize::from(entry.rule)] else {
                dropped = (dropped.0 + 1, dropped.1 + units);
                continue;
            };
            entry.rule = rule;
            if let Some(mine) = self
                .entries
                .find_mut(entry.hash, |e| e.is(entry.key.as_bytes(), rule))
            {
                mine.usage.merge(entry.usage);
                continue;
            }
            let bytes = self.bytes_of(&entry);
            if added + bytes > room {
                dropped = (dropped.0 + 1, dropped.1 + units);
                continue;
            }
            added += bytes;
            self.insert_new(entry);
        }
        self.bytes += added;
        other.clear();
        dropped
    }

    /// The bytes [`Journal::absorb_message`] of `message` would add: its
    /// entries whose key is new here (one already here only adds up).
    pub fn bytes_to_absorb(
        &self,
        message: &UsageFrame,
        hasher: &JournalHasher,
        peers_of: &dyn Fn(&[u8]) -> u64,
    ) -> usize {
        let mut bytes = 0;
        for (key, rule, _) in message.entries_pushed() {
            let name = self.name_index(rule, peers_of(rule));
            let known = name.is_some_and(|i| {
                let hash = hasher.hash_bytes(key, rule);
                self.entries.find(hash, |e| e.is(key, i)).is_some()
            });
            if !known {
                bytes += key.len() + rule.len() + ENTRY_OVERHEAD;
            }
        }
        bytes
    }

    /// Takes back the usage of `message`, sealed and never sent, as entries
    /// of this journal (no room asked: the caller made sure of it with
    /// [`Journal::bytes_to_absorb`]); each entry's rule goes to the peers
    /// `peers_of` gives for its name, so a rule's entries merge with those
    /// shared out to the peer since. Returns what was left out: entries and
    /// units (charged and refunded), of names past the journal's 65,536.
    pub fn absorb_message(
        &mut self,
        message: &UsageFrame,
        hasher: &JournalHasher,
        peers_of: &dyn Fn(&[u8]) -> u64,
    ) -> (u64, u64) {
        let mut dropped = (0, 0);
        let mut name: Option<(RuleName, u64)> = None;
        for (key, rule, (charged, refunded, at)) in message.entries_pushed() {
            // A message's entries mostly name one rule: made once.
            if name.as_ref().is_none_or(|(n, _)| n.as_bytes() != rule) {
                name = RuleName::new(Bytes::copy_from_slice(rule))
                    .ok()
                    .map(|n| (n, peers_of(rule)));
            }
            let taken = name.as_ref().is_some_and(|(rule, peers)| {
                let hash = hasher.hash(key, rule);
                self.add(
                    (hash, key, rule, *peers),
                    (charged, refunded, at),
                    usize::MAX,
                )
            });
            if !taken {
                dropped = (dropped.0 + 1, dropped.1 + charged.saturating_add(refunded));
            }
        }
        dropped
    }

    /// Each name and the peers its rule lists (bits), for messages sealed
    /// from this journal to be taken back by rule ([`Journal::absorb_message`]).
    pub fn rule_peers(&self) -> Vec<(RuleName, u64)> {
        self.names
            .iter()
            .map(|n| (n.rule.clone(), n.peers))
            .collect()
    }

    /// What `entry` is counted as ([`entry_bytes`]).
    fn bytes_of(&self, entry: &Entry) -> usize {
        entry_bytes(
            entry.key.as_bytes(),
            &self.names[usize::from(entry.rule)].rule,
        )
    }

    /// Puts the entries for peer `peer` into `out`, an empty journal (a
    /// copy, walked in this table's slot order: an entry's slot in `out`
    /// starts from the same hash bits, so they land in about that order,
    /// not at random).
    pub fn share_into(&self, peer: usize, out: &mut Journal) {
        debug_assert!(out.is_empty(), "shared into a journal holding entries");
        out.clear();
        out.reserve(self.entries.len());
        out.names.clone_from(&self.names);
        for e in self.entries.iter().filter(|e| self.goes_to(e, peer)) {
            out.bytes += self.bytes_of(e);
            out.insert_new(e.clone());
        }
    }

    /// The entries for peer `peer`, this journal's own (its last taker).
    pub fn into_share(mut self, peer: usize) -> Journal {
        let names = std::mem::take(&mut self.names);
        let mut freed = 0;
        self.entries.retain(|e| {
            let name = &names[usize::from(e.rule)];
            let keep = name.peers & (1 << peer) != 0;
            if !keep {
                freed += entry_bytes(e.key.as_bytes(), &name.rule);
            }
            keep
        });
        self.names = names;
        self.bytes -= freed;
        self
    }

    fn goes_to(&self, entry: &Entry, peer: usize) -> bool {
        self.names[usize::from(entry.rule)].peers & (1 << peer) != 0
    }

    /// The peers every entry goes to (bits): those all its names list.
    pub fn listed_by_all(&self) -> u64 {
        self.names.iter().fold(u64::MAX, |all, n| all & n.peers)
    }

    /// The bytes the entries take in messages, headers aside (what
    /// [`Journal::seal_all`] writes).
    pub fn wire_bytes(&self) -> usize {
        // Counted as its key, its rule name and ENTRY_OVERHEAD; on the
        // wire, the two and WIRE_OVERHEAD.
        self.bytes - self.entries.len() * (ENTRY_OVERHEAD - WIRE_OVERHEAD)
    }

    /// The bytes the entries are counted as.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

mod seal;

#[cfg(test)]
pub(super) use seal::decoded;

#[cfg(test)]
mod tests;
