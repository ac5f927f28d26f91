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

const CRC16: crc::Crc<u16> = crc::Crc::<u16>::new(&crc::CRC_16_XMODEM);

/// A hash slot in `0..SLOT_COUNT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot(u16);

impl Slot {
    /// The slot of `key`, honouring its hash tag.
    pub fn of(key: &[u8]) -> Self {
        Slot(CRC16.checksum(hash_tag(key)) % SLOT_COUNT)
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

    #[test]
    fn crc16_matches_the_published_xmodem_vector() {
        assert_eq!(CRC16.checksum(b"123456789"), 0x31C3);
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
