//! Hash tags and slots, exactly as Redis Cluster defines them.
//!
//! A key's hash tag is the part between the first `{` and the next `}` when
//! that part is non-empty; otherwise the whole key is hashed. The slot is
//! CRC16-XMODEM of those bytes mod 16384. So `rl:{acme}:second` and
//! `rl:{acme}:day` share a slot, and therefore a store stripe, which is what
//! makes a multi-key check atomic under one lock.
//!
//! The one copy of the function: the server's store and cluster routing and
//! the client's cluster routing all use it, so they agree on every key.

pub use crate::cluster::SLOT_COUNT;

/// CRC16-XMODEM (polynomial 0x1021, initial value 0, no reflection) by
/// tables: `TABLES[k][i]` is the CRC of the byte `i` followed by `k` zero
/// bytes. The CRC is linear and its register is two bytes wide, so the CRC
/// of eight bytes from a register `crc` is that of the bytes with `crc`
/// folded into the first two, and each byte's part comes from the table of
/// its distance to the end: eight lookups that do not wait on each other.
const TABLES: [[u16; 256]; 8] = {
    let mut tables = [[0u16; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        tables[0][i] = crc;
        i += 1;
    }
    // One more zero byte after the CRC `t`: shift it out by a byte.
    let mut k = 1;
    while k < 8 {
        let mut i = 0;
        while i < 256 {
            let t = tables[k - 1][i];
            tables[k][i] = ((t & 0xFF) << 8) ^ tables[0][(t >> 8) as usize];
            i += 1;
        }
        k += 1;
    }
    tables
};

/// The CRC from register `crc` over `N` bytes (`N` in 1..=8), by the
/// tables: only the first two lookups depend on `crc`.
#[inline(always)]
fn crc_step<const N: usize>(crc: u16, bytes: &[u8; N]) -> u16 {
    let mut out = 0;
    let mut i = 0;
    while i < N {
        let fold = match i {
            0 => (crc >> 8) as u8,
            1 => crc as u8,
            _ => 0,
        };
        out ^= TABLES[N - 1 - i][usize::from(bytes[i] ^ fold)];
        i += 1;
    }
    // The register's bytes beyond the message (one byte only) shift on.
    if N == 1 {
        out ^= crc << 8;
    }
    out
}

/// CRC16-XMODEM of `bytes`, eight bytes a step (four, two and one for the
/// tail). Every check pays for its key's slot, in the client's cluster
/// mode and the server's store: a byte-at-a-time table walk is one
/// dependent load per byte, this about one per eight (issue 25).
#[inline]
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc = 0u16;
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        crc = crc_step::<8>(crc, word.try_into().expect("eight bytes"));
    }
    let mut tail = words.remainder();
    if let Some((four, rest)) = tail.split_first_chunk::<4>() {
        crc = crc_step(crc, four);
        tail = rest;
    }
    if let Some((two, rest)) = tail.split_first_chunk::<2>() {
        crc = crc_step(crc, two);
        tail = rest;
    }
    if let Some((one, _)) = tail.split_first_chunk::<1>() {
        crc = crc_step(crc, one);
    }
    crc
}

/// The index of the first `needle` in `hay`, eight bytes at a time (a
/// key's braces are looked for on every check).
#[inline]
fn find(hay: &[u8], needle: u8) -> Option<usize> {
    const LOW: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let pattern = LOW * u64::from(needle);
    let mut words = hay.chunks_exact(8);
    let mut base = 0;
    for word in &mut words {
        let mut bytes = [0; 8];
        bytes.copy_from_slice(word);
        // Zero bytes of `x` are the needle's places. The lowest flagged
        // byte is a true zero: a false flag needs a borrow from below it.
        let x = u64::from_le_bytes(bytes) ^ pattern;
        let zeros = x.wrapping_sub(LOW) & !x & HIGH;
        if zeros != 0 {
            return Some(base + (zeros.trailing_zeros() / 8) as usize);
        }
        base += 8;
    }
    let tail = words.remainder();
    tail.iter().position(|&b| b == needle).map(|i| base + i)
}

/// A hash slot in `0..SLOT_COUNT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot(u16);

impl Slot {
    /// The slot of `key`, honouring its hash tag.
    ///
    /// `#[inline]`, as the functions it calls: it is a few dozen
    /// instructions on every routed check, and out of line in another
    /// crate each of them was a call through the GOT.
    #[inline]
    pub fn of(key: &[u8]) -> Self {
        Slot(crc16(hash_tag(key)) % SLOT_COUNT)
    }

    pub fn get(self) -> u16 {
        self.0
    }
}

/// Who owns each slot, as runs of one owner in slot order. Not a
/// 16384-entry array: that is 32 KiB, and a check of a random key read a
/// random line of it, a cache miss per check (issue 25). A handful of
/// runs stay in cache, and finding a slot's run is a binary search of a
/// few compares (none when one owner holds every slot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRuns(Box<[(u16, u16)]>);

impl SlotRuns {
    /// Every slot owned by `owner`.
    pub fn uniform(owner: u16) -> Self {
        Self(Box::new([(SLOT_COUNT - 1, owner)]))
    }

    /// The runs of `owners`, the owner of each slot in slot order (one
    /// entry per slot; slots past a shorter list have owner `u16::MAX`,
    /// entries past [`SLOT_COUNT`] are ignored).
    pub fn of(owners: &[u16]) -> Self {
        let mut runs: Vec<(u16, u16)> = Vec::new();
        for (slot, &owner) in (0..SLOT_COUNT).zip(owners) {
            match runs.last_mut() {
                Some((last, o)) if *o == owner => *last = slot,
                _ => runs.push((slot, owner)),
            }
        }
        // Slots past a short `owners` have none (u16::MAX), so the last
        // run always ends at the last slot and every slot finds one.
        if runs.last().is_none_or(|&(last, _)| last < SLOT_COUNT - 1) {
            runs.push((SLOT_COUNT - 1, u16::MAX));
        }
        Self(runs.into_boxed_slice())
    }

    /// The owner of `slot` (of `slot % SLOT_COUNT`).
    #[inline]
    pub fn owner(&self, slot: u16) -> u16 {
        let slot = slot % SLOT_COUNT;
        match &self.0[..] {
            [only] => only.1,
            runs => runs[runs.partition_point(|&(last, _)| last < slot)].1,
        }
    }

    /// How many runs of one owner the slots make.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true: there is always at least one run.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The bytes that decide a key's slot: the non-empty text between the first
/// `{` and the first `}` after it, or the whole key.
#[inline]
pub fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = find(key, b'{') {
        let rest = &key[open + 1..];
        if let Some(close) = find(rest, b'}') {
            if close > 0 {
                return &rest[..close];
            }
        }
    }
    key
}

#[cfg(test)]
mod tests {
    #[test]
    fn slot_runs_answer_the_owner_of_every_slot() {
        use super::{SlotRuns, SLOT_COUNT};
        // Interleaved spans, one slot runs, and the last slot alone.
        let owners: Vec<u16> = (0..SLOT_COUNT)
            .map(|s| match s {
                0..=99 => 2,
                100 => 0,
                101..=8000 => 1,
                16383 => 7,
                _ => 2,
            })
            .collect();
        let runs = SlotRuns::of(&owners);
        assert_eq!(runs.len(), 5);
        for slot in 0..SLOT_COUNT {
            assert_eq!(runs.owner(slot), owners[usize::from(slot)], "slot {slot}");
        }
        assert_eq!(runs.owner(SLOT_COUNT + 100), 0, "taken modulo SLOT_COUNT");
        let one = SlotRuns::uniform(3);
        assert_eq!((one.len(), one.owner(0), one.owner(16383)), (1, 3, 3));
        assert_eq!(
            SlotRuns::of(&vec![4; usize::from(SLOT_COUNT)]),
            SlotRuns::uniform(4)
        );
        // A short list: the slots past it have no owner.
        let short = SlotRuns::of(&[5, 5]);
        assert_eq!(
            (short.owner(1), short.owner(2), short.owner(16383)),
            (5, u16::MAX, u16::MAX)
        );
        assert_eq!(SlotRuns::of(&[]), SlotRuns::uniform(u16::MAX));
    }

    use super::*;
    use proptest::strategy::Just;

    /// The `crc` crate's CRC16-XMODEM, as the reference.
    const CRC16: crc::Crc<u16> = crc::Crc::<u16>::new(&crc::CRC_16_XMODEM);

    #[test]
    fn crc16_matches_the_published_xmodem_vector() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(CRC16.checksum(b"123456789"), 0x31C3);
    }

    proptest::proptest! {
        /// The slot is the reference CRC16 of the hash tag, for keys dense
        /// in braces (the cases where the tag and the whole key differ).
        #[test]
        fn slot_matches_the_reference_crc_of_the_hash_tag(
            key in proptest::collection::vec(
                proptest::prop_oneof![
                    Just(b'{'), Just(b'}'), Just(b'a'), proptest::num::u8::ANY
                ],
                0..40,
            )
        ) {
            let expected = CRC16.checksum(hash_tag(&key)) % SLOT_COUNT;
            proptest::prop_assert_eq!(Slot::of(&key).get(), expected);
        }

        /// The word-at-a-time search finds what a byte loop finds.
        #[test]
        fn find_matches_a_byte_loop(
            hay in proptest::collection::vec(
                proptest::prop_oneof![Just(b'{'), Just(b'}'), proptest::num::u8::ANY],
                0..40,
            ),
            needle in proptest::prop_oneof![Just(b'{'), Just(b'}'), proptest::num::u8::ANY],
        ) {
            proptest::prop_assert_eq!(find(&hay, needle), hay.iter().position(|&b| b == needle));
        }

        /// The eight-bytes-a-step CRC is the crate's, at every length.
        #[test]
        fn crc16_matches_the_reference(data in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            proptest::prop_assert_eq!(crc16(&data), CRC16.checksum(&data));
        }
    }

    #[test]
    fn slots_match_redis_cluster() {
        // Values from `CLUSTER KEYSLOT` in Redis.
        assert_eq!(Slot::of(b"foo").get(), 12182);
        assert_eq!(Slot::of(b"bar").get(), 5061);
        assert_eq!(Slot::of(b"hello").get(), 866);
        assert_eq!(Slot::of(b"").get(), 0);
    }

    #[test]
    fn hash_tag_rules() {
        assert_eq!(hash_tag(b"rl:{acme}:second"), b"acme");
        assert_eq!(hash_tag(b"{user1000}.following"), b"user1000");
        // Empty tag: the whole key is hashed.
        assert_eq!(hash_tag(b"foo{}{bar}"), b"foo{}{bar}");
        // Only the first `{` counts, up to the first `}` after it.
        assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
        // No closing brace: whole key.
        assert_eq!(hash_tag(b"foo{bar"), b"foo{bar");
        assert_eq!(Slot::of(b"rl:{key42}:second"), Slot::of(b"rl:{key42}:day"));
        assert_eq!(Slot::of(b"rl:{key42}:second"), Slot::of(b"key42"));
    }
}
