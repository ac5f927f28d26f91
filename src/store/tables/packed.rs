//! Fixed and sliding windows packed into 16 bytes beside their key, for
//! the windows' compact table (32-byte entries with a short key).
//!
//! A window's entry stores no expiry: the algorithms write a charged fixed
//! window to expire at its window's end, `(index + 1) * W`, and a sliding
//! window at `(index + 2) * W` while it has a current count (`index + 1`
//! with only a previous one), so the index, the window length and the
//! counts give the expiry back with two multiplications; reading an entry
//! divides nothing. The top bit tells the two kinds apart; the next one is
//! always set, so that the high word is never zero and an `Option<Window>`
//! is two words, returned in registers (through memory, the words were
//! stored one by one and then copied as one 16-byte load, which waits for
//! both stores: a store-forwarding stall on every write):
//!
//! ```text
//!   fixed:   0 | 1 | index (62 bits)        | window ms (32) | count (32)
//!   sliding: 1 | 1 | index (46) | window ms (32) | prev (24) | cur (24)
//! ```
//!
//! A state that does not pack exactly ([`Window::pack`]: a count past the
//! field, a window that is not whole milliseconds or past `u32::MAX` ms, an
//! expiry the algorithm would not write) goes to the general table
//! instead: packing never loses information.

use crate::algorithm::{FixedWindowState, State, WindowState};
use crate::clock::{Nanos, NANOS_PER_MS};
use crate::store::Entry;
use std::num::NonZeroU64;

/// A fixed or sliding window's state, packed (see the module docs). Two
/// words rather than a `u128`, whose 16-byte alignment would pad an entry
/// with a 24-byte key slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Window {
    lo: u64,
    hi: NonZeroU64,
}

const SLIDING: u128 = 1 << 127;
/// Set in every packed window (see the module docs).
const PACKED: u128 = 1 << 126;
const U24: u64 = (1 << 24) - 1;

/// `window` in whole milliseconds, when it is one, not zero, and fits a
/// `u32`.
fn whole_ms(window: Nanos) -> Option<u64> {
    let ms = window / NANOS_PER_MS;
    (window % NANOS_PER_MS == 0 && ms > 0 && ms <= u64::from(u32::MAX)).then_some(ms)
}

/// The length in whole milliseconds of the window that makes `windows`
/// of them end at `expires_at`, when there is one and it fits a `u32`;
/// `hint` (a length in nanoseconds) is tried first.
fn window_ms(expires_at: Nanos, windows: u64, hint: Option<Nanos>) -> Option<u64> {
    // `whole_ms` divides by a constant: a multiplication, not a `div`.
    if let Some(ms) = hint.and_then(whole_ms) {
        if windows.checked_mul(ms * NANOS_PER_MS) == Some(expires_at) {
            return Some(ms);
        }
    }
    if expires_at % windows != 0 {
        return None;
    }
    whole_ms(expires_at / windows)
}

/// Windows from a sliding window's index to its expiry (see the module).
fn sliding_windows(cur: u64) -> u64 {
    if cur > 0 {
        2
    } else {
        1
    }
}

impl Window {
    fn bits(self) -> u128 {
        u128::from(self.hi.get()) << 64 | u128::from(self.lo)
    }

    fn from_bits(bits: u128) -> Self {
        let hi = NonZeroU64::new(((bits | PACKED) >> 64) as u64);
        Self {
            lo: bits as u64,
            hi: hi.expect("the PACKED bit is set"),
        }
    }

    /// `entry` packed, when it is a fixed or sliding window that packs
    /// exactly (`Window::entry` gives `entry` back). `hint` is the window
    /// length `entry` most likely has, in nanoseconds (the policy's that
    /// wrote it, or the key's packed state's): when right, that length is
    /// confirmed by a multiplication; otherwise it is found by a division,
    /// which costs tens of cycles more. A wrong hint changes nothing but
    /// the cost.
    pub(super) fn pack(entry: &Entry, hint: Option<Nanos>) -> Option<Self> {
        let expires_at = entry.expires_at;
        let bits = match &entry.state {
            State::FixedWindow(s) => {
                let ms = window_ms(expires_at, s.index.checked_add(1)?, hint)?;
                let count = u32::try_from(s.count).ok()?;
                if s.index >= 1 << 62 {
                    return None;
                }
                u128::from(s.index) << 64 | u128::from(ms) << 32 | u128::from(count)
            }
            State::SlidingWindow(s) => {
                let windows = s.index.checked_add(sliding_windows(s.cur))?;
                let ms = window_ms(expires_at, windows, hint)?;
                if s.index >= 1 << 46 || s.prev > U24 || s.cur > U24 {
                    return None;
                }
                SLIDING
                    | u128::from(s.index) << 80
                    | u128::from(ms) << 48
                    | u128::from(s.prev) << 24
                    | u128::from(s.cur)
            }
            _ => return None,
        };
        Some(Self::from_bits(bits))
    }

    /// The window length in nanoseconds.
    pub(super) fn window(self) -> Nanos {
        self.window_ms() * NANOS_PER_MS
    }

    /// The window length in milliseconds.
    fn window_ms(self) -> u64 {
        let bits = self.bits();
        if bits & SLIDING == 0 {
            (bits >> 32) as u64 & u64::from(u32::MAX)
        } else {
            (bits >> 48) as u64 & u64::from(u32::MAX)
        }
    }

    /// The entry this stands for.
    pub(super) fn entry(self) -> Entry {
        let bits = self.bits();
        let field = |shift: u32, width: u32| (bits >> shift) as u64 & ((1 << width) - 1);
        if bits & SLIDING == 0 {
            let index = field(64, 62);
            let window = field(32, 32) * NANOS_PER_MS;
            Entry {
                state: State::FixedWindow(FixedWindowState {
                    index,
                    count: field(0, 32),
                }),
                expires_at: (index + 1) * window,
            }
        } else {
            let (index, cur) = (field(80, 46), field(0, 24));
            let window = field(48, 32) * NANOS_PER_MS;
            Entry {
                state: State::SlidingWindow(WindowState {
                    index,
                    prev: field(24, 24),
                    cur,
                }),
                expires_at: (index + sliding_windows(cur)) * window,
            }
        }
    }

    pub(super) fn expires_at(self) -> Nanos {
        self.entry().expires_at
    }
}

const _: () = assert!(std::mem::size_of::<Option<Window>>() == 16);

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    fn fixed(index: u64, count: u64, expires_at: Nanos) -> Entry {
        Entry {
            state: State::FixedWindow(FixedWindowState { index, count }),
            expires_at,
        }
    }

    fn sliding(index: u64, prev: u64, cur: u64, expires_at: Nanos) -> Entry {
        Entry {
            state: State::SlidingWindow(WindowState { index, prev, cur }),
            expires_at,
        }
    }

    /// Window lengths (ns) to hint with: right or wrong for any entry of
    /// these tests, and some no packed window can have.
    fn hints(e: &Entry) -> Vec<Nanos> {
        vec![
            2 * S,
            2 * NANOS_PER_MS,
            // A length that divides most: right for the multiplication only
            // when the index says so.
            NANOS_PER_MS,
            // Not whole milliseconds, zero, past u32 ms, and the entry's
            // own expiry (right for index 0 only).
            NANOS_PER_MS + 1,
            0,
            (u64::from(u32::MAX) + 1) * NANOS_PER_MS,
            u64::MAX,
            e.expires_at,
        ]
    }

    /// Packing with a hint of the window length (the policy's, or the
    /// key's current state's) gives what packing alone does, whatever the
    /// hint.
    fn same_packing_with_any_hint(e: &Entry, packed: Option<Window>) {
        let mut hints = hints(e);
        hints.extend(packed.map(Window::window));
        for hint in hints {
            assert_eq!(Window::pack(e, Some(hint)), packed, "{e:?} hint {hint}");
        }
    }

    #[test]
    fn fixed_windows_pack_exactly_or_not_at_all() {
        // Today's index of a 1 ms window, a day, 49 days; counts to u32.
        let today = 1_800_000_000_000;
        for (index, w, count) in [
            (today, NANOS_PER_MS, 4),
            (20_000, 86_400 * S, 9),
            (3, 4_233_600 * S, u64::from(u32::MAX)),
            (0, S, 0),
        ] {
            let e = fixed(index, count, (index + 1) * w);
            let packed = Window::pack(&e, None).expect("packs");
            assert_eq!(packed.entry(), e);
            assert_eq!(packed.expires_at(), e.expires_at);
            same_packing_with_any_hint(&e, Some(packed));
        }
        // Not the end of its window, not whole milliseconds, a count or a
        // window past u32, a zero end: kept whole elsewhere.
        for e in [
            fixed(1, 4, 2 * S + 1),
            fixed(1, 4, 2 * 3_000_001),
            fixed(1, u64::from(u32::MAX) + 1, 2 * S),
            fixed(0, 1, (u64::from(u32::MAX) + 1) * NANOS_PER_MS),
            fixed(0, 1, 0),
            fixed(u64::MAX, 1, 2 * S),
            fixed(1 << 62, 1, ((1 << 62) + 1) * 2),
        ] {
            assert!(Window::pack(&e, None).is_none(), "{e:?}");
            same_packing_with_any_hint(&e, None);
        }
        let bucket = Entry {
            state: State::TokenBucket { tat: S },
            expires_at: S,
        };
        assert!(Window::pack(&bucket, None).is_none());
    }

    #[test]
    fn sliding_windows_pack_exactly_or_not_at_all() {
        let today = 1_800_000_000_000;
        // As the algorithm writes them: a current count keeps the state
        // until the next window ends, a previous one until this one ends.
        for (index, w, prev, cur) in [
            (5, S, 3, 1),
            (5, S, 0, 7),
            (9, 60 * S, 4, 0),
            (today, NANOS_PER_MS, U24, U24),
            (3, 4_233_600 * S, 1, 1),
        ] {
            let windows = if cur > 0 { index + 2 } else { index + 1 };
            let e = sliding(index, prev, cur, windows * w);
            let packed = Window::pack(&e, None).expect("packs");
            assert_eq!(packed.entry(), e);
            assert_eq!(packed.expires_at(), e.expires_at);
            same_packing_with_any_hint(&e, Some(packed));
        }
        for e in [
            // Ends that are not the algorithm's.
            sliding(5, 3, 1, 6 * S),
            sliding(5, 3, 0, 7 * S + 7),
            // Not whole milliseconds; counts past 24 bits; an index past
            // 46 bits (only a window under 1 ms reaches one before u64
            // time runs out) or one that overflows.
            sliding(0, 0, 1, 2 * 1_500_001),
            sliding(5, U24 + 1, 1, 7 * S),
            sliding(5, 0, U24 + 1, 7 * S),
            sliding(1 << 46, 0, 1, ((1 << 46) + 2) * 1000),
            sliding(u64::MAX, 0, 1, 7 * S),
        ] {
            assert!(Window::pack(&e, None).is_none(), "{e:?}");
            same_packing_with_any_hint(&e, None);
        }
    }
}
