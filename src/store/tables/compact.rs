//! What a compact table holds and looks up by: an entry ([`Compact`]: a
//! key slot and a packed state) and a key as a lookup compares it
//! ([`Probe`]: its 16-byte short slot, or its bytes). The tables split by
//! key width (split.rs) and the prefetch hints that name where an entry
//! sits (hint.rs) both build on them.

use crate::store::key::ShortKey;

/// One entry of a compact table: a key slot and a packed state.
#[derive(Debug)]
pub(super) struct Compact<K, P> {
    pub(super) key: K,
    pub(super) state: P,
}

/// A key as a lookup compares it: its short slot, or its bytes.
#[derive(Debug, Clone, Copy)]
pub(super) enum Probe<'k> {
    Short(ShortKey),
    Long(&'k [u8]),
}

impl<'k> Probe<'k> {
    #[inline]
    pub(super) fn of(key: &'k [u8]) -> Self {
        match ShortKey::new(key) {
            Some(short) => Probe::Short(short),
            None => Probe::Long(key),
        }
    }

    pub(super) fn is_short(&self) -> bool {
        matches!(self, Probe::Short(_))
    }
}
