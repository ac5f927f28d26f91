//! Keys as the store holds them: inline when short, on the heap otherwise.
//!
//! Most rate-limit keys are short (`rl:{k42}:s`, an API key id plus a
//! suffix). Holding up to [`INLINE`] bytes inside the table entry saves a
//! heap allocation and its 16-32 bytes of allocator overhead per key, which
//! is most of the memory a token bucket needs. The enum is 24 bytes either
//! way (asserted below).
//!
//! The compact tables also keep a 16-byte [`ShortKey`] slot for the keys
//! that fit it exactly (the common `rl:{xxxxxxxx}:ab` shape): a key of at
//! most 16 bytes not ending in a 0 byte is zero-padded, and its length is
//! 16 less its trailing zeros. Which slot a key takes is a function of its
//! bytes alone, so a lookup knows which table to probe.

/// Longest key stored inline.
pub const INLINE: usize = 22;

#[derive(Clone, PartialEq, Eq)]
pub enum StoredKey {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<[u8]>),
}

const _: () = assert!(std::mem::size_of::<StoredKey>() == 24);

impl StoredKey {
    pub fn new(key: &[u8]) -> Self {
        if key.len() <= INLINE {
            let mut bytes = [0u8; INLINE];
            bytes[..key.len()].copy_from_slice(key);
            StoredKey::Inline {
                len: key.len() as u8,
                bytes,
            }
        } else {
            StoredKey::Heap(key.into())
        }
    }

    /// The empty key, for [`Self::fill`] to write in place.
    pub const EMPTY: StoredKey = StoredKey::Inline {
        len: 0,
        bytes: [0; INLINE],
    };

    /// Makes this key, [`EMPTY`](Self::EMPTY) where it is to stay, `key`:
    /// as [`Self::new`], but a short key's bytes are copied in place. Built
    /// aside and moved, the move reads back in wide loads what the copy
    /// wrote in narrower stores, a store-forwarding stall (a standby's
    /// capture paid it on every write it recorded).
    pub fn fill(&mut self, key: &[u8]) {
        match self {
            // EMPTY's bytes are all zero, as `new` pads them.
            StoredKey::Inline { len, bytes } if *len == 0 && key.len() <= INLINE => {
                bytes[..key.len()].copy_from_slice(key);
                *len = key.len() as u8;
            }
            _ => *self = StoredKey::new(key),
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        match self {
            StoredKey::Inline { len, bytes } => &bytes[..usize::from(*len)],
            StoredKey::Heap(b) => b,
        }
    }

    /// Whether this is `key` (as `as_bytes() == key`). An inline key of
    /// 16 bytes or more (the long keys a compact table compares most) is
    /// compared as two overlapping fixed-width words, not by a call to
    /// `memcmp`.
    #[inline]
    pub fn is(&self, key: &[u8]) -> bool {
        match self {
            StoredKey::Inline { len, bytes } => {
                let n = usize::from(*len);
                if n != key.len() {
                    return false;
                }
                if n < 16 {
                    return bytes[..n] == *key;
                }
                let head = |b: &[u8]| <[u8; 16]>::try_from(&b[..16]).ok().map(u128::from_ne_bytes);
                let tail = |b: &[u8]| {
                    <[u8; 8]>::try_from(&b[n - 8..n])
                        .ok()
                        .map(u64::from_ne_bytes)
                };
                head(bytes) == head(key) && tail(bytes) == tail(key)
            }
            StoredKey::Heap(b) => **b == *key,
        }
    }

    /// Heap bytes owned beyond the entry itself (for memory accounting).
    pub fn heap_bytes(&self) -> usize {
        match self {
            StoredKey::Inline { .. } => 0,
            StoredKey::Heap(b) => b.len(),
        }
    }
}

impl std::fmt::Debug for StoredKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", bytes::Bytes::copy_from_slice(self.as_bytes()))
    }
}

/// Longest key a [`ShortKey`] holds.
pub const SHORT: usize = 16;

/// A key of at most [`SHORT`] bytes that does not end in a 0 byte (the
/// empty key too), zero-padded: the padding is unambiguous because the key
/// itself never ends in one.
///
/// Aligned to 8 so that it is read and copied as two aligned words:
/// unaligned at offset 1 of an enum, its copies were split across stores
/// of other widths, and a load spanning two stores waits for both to reach
/// the cache (a store-forwarding stall, some 15 cycles each time).
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(align(8))]
pub struct ShortKey([u8; SHORT]);

const _: () = assert!(std::mem::size_of::<ShortKey>() == SHORT);

impl ShortKey {
    /// The short slot of `key`, when it fits one.
    #[inline]
    pub fn new(key: &[u8]) -> Option<Self> {
        if let Ok(bytes) = <[u8; SHORT]>::try_from(key) {
            // The common case: one 16-byte load, no length-dependent copy.
            return (bytes[SHORT - 1] != 0).then_some(Self(bytes));
        }
        if key.len() > SHORT || key.last() == Some(&0) {
            return None;
        }
        let mut bytes = [0u8; SHORT];
        bytes[..key.len()].copy_from_slice(key);
        Some(Self(bytes))
    }

    pub fn as_bytes(&self) -> &[u8] {
        // The last byte is the most significant: its leading zero bits
        // count the padding.
        let padding = u128::from_le_bytes(self.0).leading_zeros() / 8;
        &self.0[..SHORT - padding as usize]
    }
}

impl std::fmt::Debug for ShortKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", bytes::Bytes::copy_from_slice(self.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_keys_are_the_ones_padding_cannot_confuse() {
        let key = |len: usize, last: u8| -> Vec<u8> {
            let mut k: Vec<u8> = (1..=len).map(|i| i as u8).collect();
            if let Some(b) = k.last_mut() {
                *b = last;
            }
            k
        };
        for len in [0, 1, 15, 16] {
            let k = key(len, 0xff);
            let short = ShortKey::new(&k).expect("fits");
            assert_eq!(short.as_bytes(), &k[..], "{len}");
        }
        // Too long, or ending in a 0 byte (its padding would be read as
        // part of it): the long slot.
        for k in [key(17, 1), key(300, 1), key(1, 0), key(15, 0), key(16, 0)] {
            assert!(ShortKey::new(&k).is_none(), "{k:?}");
        }
        // A 0 byte inside the key is kept.
        let inner = [b'a', 0, 0, b'b'];
        assert_eq!(ShortKey::new(&inner).unwrap().as_bytes(), &inner[..]);
        assert_ne!(ShortKey::new(b"ab"), ShortKey::new(b"abc"));
    }

    /// A key filled in place is the key `new` builds (bytes, padding and
    /// all: equality compares the whole inline array), at every length
    /// around the inline size; a non-empty key is replaced whole.
    #[test]
    fn a_key_filled_in_place_is_the_key_new_builds() {
        for len in 0..=INLINE + 3 {
            let key: Vec<u8> = (0..len).map(|i| i as u8 + 1).collect();
            let mut filled = StoredKey::EMPTY;
            filled.fill(&key);
            assert!(filled == StoredKey::new(&key), "{len}");
            assert_eq!(filled.as_bytes(), &key[..]);
            let mut reused = StoredKey::new(&[0xee; INLINE]);
            reused.fill(&key);
            assert!(reused == StoredKey::new(&key), "{len} over a full key");
        }
    }

    /// `is` answers as comparing the bytes would, at every length around
    /// the inline sizes and with a difference at every place.
    #[test]
    fn is_compares_every_byte() {
        for len in 0..=INLINE + 3 {
            let key: Vec<u8> = (0..len).map(|i| i as u8 + 1).collect();
            let stored = StoredKey::new(&key);
            assert!(stored.is(&key), "{len}");
            for i in 0..len {
                let mut other = key.clone();
                other[i] ^= 0x40;
                assert!(!stored.is(&other), "{len} at {i}");
            }
            for other in [
                &key[..len.saturating_sub(1)],
                &[&key[..], &[0]].concat()[..],
            ] {
                assert_eq!(stored.is(other), other == &key[..], "{len} vs {other:?}");
            }
        }
    }

    #[test]
    fn round_trips_at_the_inline_boundary() {
        for len in [0, 1, INLINE - 1, INLINE, INLINE + 1, 300] {
            let key: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let stored = StoredKey::new(&key);
            assert_eq!(stored.as_bytes(), &key[..]);
            assert_eq!(matches!(stored, StoredKey::Inline { .. }), len <= INLINE);
            assert_eq!(stored.heap_bytes(), if len <= INLINE { 0 } else { len });
        }
    }
}
