//! The usage of global keys not yet sent to one peer region: key and rule
//! to units charged, units refunded and the time of the latest charge.
//!
//! Invariant: an entry is either here or in exactly one message not yet
//! answered (the exchange task moves entries out as it seals a message and
//! puts nothing back once sent), so each unit is reported once. Its size is
//! bounded by the keys this region touched (each key appears once however
//! often it is checked).

use crate::clock::Nanos;
use bytes::Bytes;
use std::collections::HashMap;
use tollgate_protocol::{usage_header_len, RuleName, UsageEntry};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Usage {
    charged: u64,
    refunded: u64,
    at: Nanos,
}

#[derive(Debug, Default)]
pub(super) struct Journal {
    entries: HashMap<(Bytes, RuleName), Usage>,
}

impl Journal {
    pub fn add(&mut self, key: &Bytes, rule: &RuleName, charged: u64, refunded: u64, at: Nanos) {
        let u = self.entries.entry((key.clone(), rule.clone())).or_default();
        u.charged = u.charged.saturating_add(charged);
        u.refunded = u.refunded.saturating_add(refunded);
        if charged > 0 {
            u.at = u.at.max(at);
        }
    }

    /// Moves everything of `other` into this journal.
    pub fn absorb(&mut self, other: Journal) {
        for ((key, rule), u) in other.entries {
            self.add(&key, &rule, u.charged, u.refunded, u.at);
        }
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
            self.entries.remove(k);
        }
        (out, !self.entries.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule() -> RuleName {
        RuleName::try_from("api").unwrap()
    }

    #[test]
    fn usage_of_one_key_adds_up_and_keeps_the_latest_time() {
        let mut j = Journal::default();
        let k = Bytes::from_static(b"rl:{a}");
        j.add(&k, &rule(), 2, 0, 10);
        j.add(&k, &rule(), 3, 1, 30);
        j.add(&k, &rule(), 0, 1, 40);
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
            j.add(&Bytes::from(format!("key-{i:04}")), &rule(), 1, 0, 5);
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
