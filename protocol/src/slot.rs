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

/// CRC16-XMODEM (polynomial 0x1021, initial value 0, no reflection), one
/// byte per step: `TABLE[i]` is the CRC of the byte `i`.
const TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
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
        table[i] = crc;
        i += 1;
    }
    table
};

/// One byte into a running CRC16-XMODEM.
#[inline(always)]
fn step(crc: u16, byte: u8) -> u16 {
    (crc << 8) ^ TABLE[usize::from((crc >> 8) as u8 ^ byte)]
}

/// CRC16-XMODEM of `bytes`, continuing from `crc`.
fn crc16(mut crc: u16, bytes: &[u8]) -> u16 {
    for &b in bytes {
        crc = step(crc, b);
    }
    crc
}

/// A hash slot in `0..SLOT_COUNT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot(u16);

impl Slot {
    /// The slot of `key`, honouring its hash tag: `crc16(hash_tag(key))`,
    /// computed while the braces are looked for (every check pays for
    /// this, so the key is walked once rather than scanned, then hashed).
    pub fn of(key: &[u8]) -> Self {
        // The CRC of the whole key, up to the first `{`.
        let mut whole = 0;
        let mut open = key.len();
        for (i, &b) in key.iter().enumerate() {
            if b == b'{' {
                open = i;
                break;
            }
            whole = step(whole, b);
        }
        // The CRC of what follows the `{`, up to the first `}` (None: no
        // `{`).
        if let Some(after) = key.get(open + 1..) {
            let mut tag = 0;
            for (i, &b) in after.iter().enumerate() {
                if b == b'}' {
                    // A non-empty tag decides the slot; an empty one does not.
                    if i > 0 {
                        return Slot(tag % SLOT_COUNT);
                    }
                    break;
                }
                tag = step(tag, b);
            }
        }
        // No `{`, no `}` after it, or an empty tag: the whole key, finished
        // from where the first loop stopped (`open <= key.len()`).
        Slot(crc16(whole, &key[open..]) % SLOT_COUNT)
    }

    pub fn get(self) -> u16 {
        self.0
    }
}

/// The bytes that decide a key's slot: the non-empty text between the first
/// `{` and the first `}` after it, or the whole key.
pub fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        let rest = &key[open + 1..];
        if let Some(close) = rest.iter().position(|&b| b == b'}') {
            if close > 0 {
                return &rest[..close];
            }
        }
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Just;

    /// The `crc` crate's CRC16-XMODEM, as the reference.
    const CRC16: crc::Crc<u16> = crc::Crc::<u16>::new(&crc::CRC_16_XMODEM);

    #[test]
    fn crc16_matches_the_published_xmodem_vector() {
        assert_eq!(crc16(0, b"123456789"), 0x31C3);
        assert_eq!(CRC16.checksum(b"123456789"), 0x31C3);
    }

    proptest::proptest! {
        /// The one-pass slot is CRC16 of the hash tag, for keys dense in
        /// braces (the cases where the tag and the whole key differ).
        #[test]
        fn one_pass_slot_matches_crc_of_the_hash_tag(
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
