//! The usage of global keys not yet sent to one peer region: key and rule
//! to units charged, units refunded and the time of the latest charge.
//!
//! Invariant: an entry is either here or in exactly one message not yet
//! answered (the exchange task moves entries out as it seals a message and
//! puts nothing back once sent), so each unit is reported once.
//!
//! Its size: each key appears once however often it is checked, and the
//! caller gives the room left (`--region-journal-max-bytes` for one peer,
//! this journal and the sender's pending one together); a key new to the
//! journal that does not fit is dropped, while keys already in it keep
//! adding up. Dropping the newcomer rather than evicting an older key keeps
//! every reported sum exact (a key is reported in full or not at all), costs
//! nothing to decide, and cannot be steered by a client into erasing the
//! usage of a hot key by checking many cold ones.

use crate::clock::Nanos;
use bytes::Bytes;
use std::collections::HashMap;
use tollgate_protocol::{usage_header_len, RuleName, UsageEntry};

/// What an entry is counted as besides its key and rule name: the map's
/// slot (key, rule and usage), doubled for the spare room a hash map keeps
/// as it grows, and the headers of the two heap blocks the names take.
const ENTRY_OVERHEAD: usize = 2 * std::mem::size_of::<((Bytes, RuleName), Usage)>() + 32;

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
    fn merge(&mut self, charged: u64, refunded: u64, at: Nanos) {
        self.charged = self.charged.saturating_add(charged);
        self.refunded = self.refunded.saturating_add(refunded);
        if charged > 0 {
            self.at = self.at.max(at);
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct Journal {
    entries: HashMap<(Bytes, RuleName), Usage>,
    /// The entries' bytes as [`entry_bytes`] counts them.
    bytes: usize,
}

impl Journal {
    /// Adds usage of `key` under `rule`. A key not yet here is taken only
    /// when its entry fits in `room` bytes; returns false when it did not
    /// (nothing recorded). The key and name are copied: the caller's are
    /// slices of a whole request frame, which they would keep alive.
    pub fn add(
        &mut self,
        key: &Bytes,
        rule: &RuleName,
        (charged, refunded, at): (u64, u64, Nanos),
        room: usize,
    ) -> bool {
        // Clones of the caller's handles, for the lookup only.
        if let Some(u) = self.entries.get_mut(&(key.clone(), rule.clone())) {
            u.merge(charged, refunded, at);
            return true;
        }
        let bytes = entry_bytes(key, rule);
        if bytes > room {
            return false;
        }
        let Ok(rule) = RuleName::new(Bytes::copy_from_slice(rule.as_bytes())) else {
            // A valid name copied is valid; never happens.
            return false;
        };
        let mut u = Usage::default();
        u.merge(charged, refunded, at);
        self.entries.insert((Bytes::copy_from_slice(key), rule), u);
        self.bytes += bytes;
        true
    }

    /// Moves everything of `other` into this journal (no room asked: what
    /// `other` holds was counted against the same bound already, and a key
    /// in both takes less room merged).
    pub fn absorb(&mut self, other: Journal) {
        for (k, u) in other.entries {
            match self.entries.get_mut(&k) {
                Some(mine) => mine.merge(u.charged, u.refunded, u.at),
                None => {
                    self.bytes += entry_bytes(&k.0, &k.1);
                    self.entries.insert(k, u);
                }
            }
        }
    }

    /// The bytes the entries are counted as.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Takes out entries for one USAGE of at most `max_bytes` (with the
    /// header for a region name of `region_len` bytes); the rest stays.
    /// Returns the entries and whether some were left for lack of room.
    pub fn seal(&mut self, max_bytes: usize, region_len: usize) -> (Vec<UsageEntry>, bool) {
        let mut room = max_bytes.saturating_sub(usage_header_len(region_len));
        let mut out = Vec::new();
        let mut taken = Vec::new();
        for ((key, rule), u) in &self.entries {
            let entry = UsageEntry {
                key: key.clone(),
                rule: rule.clone(),
                charged: u.charged,
                refunded: u.refunded,
                at: u.at,
            };
            let len = entry.wire_len();
            if len > room {
                continue;
            }
            room -= len;
            taken.push((key.clone(), rule.clone()));
            out.push(entry);
        }
        for k in &taken {
            if self.entries.remove(k).is_some() {
                self.bytes -= entry_bytes(&k.0, &k.1);
            }
        }
        (out, !self.entries.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOM: usize = usize::MAX;

    fn rule() -> RuleName {
        RuleName::try_from("api").unwrap()
    }

    #[test]
    fn a_full_journal_drops_new_keys_and_keeps_adding_up_old_ones() {
        let mut j = Journal::default();
        let one = entry_bytes(b"key-0000", &rule());
        let room = |j: &Journal| (10 * one).saturating_sub(j.bytes());
        for i in 0..100 {
            let key = Bytes::from(format!("key-{i:04}"));
            assert_eq!(j.add(&key, &rule(), (1, 0, 5), room(&j)), i < 10, "{i}");
        }
        assert_eq!((j.len(), j.bytes()), (10, 10 * one));
        // A key already there still counts every unit.
        for _ in 0..5 {
            assert!(j.add(&Bytes::from_static(b"key-0003"), &rule(), (2, 1, 9), 0));
        }
        // Moving it into another journal (the sender's pending one) keeps
        // the count; a key in both is counted once.
        let mut pending = Journal::default();
        pending.add(&Bytes::from_static(b"key-0003"), &rule(), (1, 0, 1), ROOM);
        pending.absorb(j);
        assert_eq!((pending.len(), pending.bytes()), (10, 10 * one));
        let (entries, left) = pending.seal(1 << 20, 2);
        assert!(!left);
        assert_eq!(pending.bytes(), 0);
        let three = entries.iter().find(|e| &e.key[..] == b"key-0003").unwrap();
        assert_eq!((three.charged, three.refunded), (1 + 1 + 10, 5));
    }

    #[test]
    fn a_journaled_key_is_a_copy_not_a_slice_of_the_frame() {
        let frame = Bytes::from(vec![b'k'; 4096]);
        let key = frame.slice(0..8);
        let mut j = Journal::default();
        j.add(&key, &rule(), (1, 0, 1), ROOM);
        let (entries, _) = j.seal(1 << 20, 2);
        // A slice would point into the frame's 4 KiB.
        let at = entries[0].key.as_ptr() as usize;
        let start = frame.as_ptr() as usize;
        assert!(!(start..start + frame.len()).contains(&at));
    }

    #[test]
    fn usage_of_one_key_adds_up_and_keeps_the_latest_time() {
        let mut j = Journal::default();
        let k = Bytes::from_static(b"rl:{a}");
        j.add(&k, &rule(), (2, 0, 10), ROOM);
        j.add(&k, &rule(), (3, 1, 30), ROOM);
        j.add(&k, &rule(), (0, 1, 40), ROOM);
        let (entries, left) = j.seal(1 << 20, 2);
        assert!(!left);
        assert_eq!(entries.len(), 1);
        let e = &entries[0];
        assert_eq!((e.charged, e.refunded, e.at), (5, 2, 30));
        assert_eq!(j.len(), 0);
    }

    #[test]
    fn a_message_takes_what_fits_and_leaves_the_rest() {
        let mut j = Journal::default();
        for i in 0..100 {
            j.add(
                &Bytes::from(format!("key-{i:04}")),
                &rule(),
                (1, 0, 5),
                ROOM,
            );
        }
        // Each entry: 2 + 8 + 1 + 3 + 24 = 38 bytes.
        let max = usage_header_len(2) + 38 * 30;
        let (first, left) = j.seal(max, 2);
        assert_eq!(first.len(), 30);
        assert!(left);
        assert_eq!(j.len(), 70);
        let mut rest = 0;
        while j.len() > 0 {
            rest += j.seal(max, 2).0.len();
        }
        assert_eq!(rest, 70);
    }
}
