//! Keys as the store holds them: inline when short, on the heap otherwise.
//!
//! Most rate-limit keys are short (`rl:{k42}:s`, an API key id plus a
//! suffix). Holding up to [`INLINE`] bytes inside the table entry saves a
//! heap allocation and its 16-32 bytes of allocator overhead per key, which
//! is most of the memory a token bucket needs. The enum is 24 bytes either
//! way (asserted below).

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

    pub fn as_bytes(&self) -> &[u8] {
        match self {
            StoredKey::Inline { len, bytes } => &bytes[..usize::from(*len)],
            StoredKey::Heap(b) => b,
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

#[cfg(test)]
mod tests {
    use super::*;

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
