//! Reconnect backoff: exponential with "equal jitter".
//!
//! After the n-th consecutive failed attempt the client waits a delay drawn
//! uniformly from `[d/2, d]`, where `d = min(backoff_min * 2^(n-1),
//! backoff_max)`. The fixed half guarantees a floor (a dead server is not
//! hammered); the random half spreads a fleet of gateways that lost the same
//! server at the same moment. Pure: the random source is passed in, so the
//! numbers are tested exactly.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The delay before the next attempt after `failures` (>= 1) consecutive
/// failed attempts.
pub(crate) fn delay(min: Duration, max: Duration, failures: u32, rng: &mut XorShift64) -> Duration {
    // 2^31 * backoff_min overflows nothing that matters: the cap applies
    // first, and checked_mul saturates to `max` on overflow.
    let doublings = failures.saturating_sub(1).min(31);
    let ceiling = min
        .checked_mul(1u32 << doublings)
        .map_or(max, |d| d.min(max));
    let half = ceiling / 2;
    let spread = ceiling - half;
    // Whole nanoseconds are plenty of resolution; the modulo bias of a 64-bit
    // draw over a range below 2^32 ns (~4 s) is negligible.
    let spread_ns = u64::try_from(spread.as_nanos()).unwrap_or(u64::MAX);
    let jitter_ns = match spread_ns {
        0 => 0,
        n => rng.next_u64() % (n + 1),
    };
    half + Duration::from_nanos(jitter_ns)
}

/// Marsaglia's xorshift64: a few instructions, no dependency, and more than
/// enough randomness for spreading reconnects. Not for anything secret.
#[derive(Debug, Clone)]
pub(crate) struct XorShift64(u64);

impl XorShift64 {
    /// A generator seeded from the wall clock and an address on the stack,
    /// so two clients started in the same nanosecond still differ.
    pub(crate) fn from_entropy() -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let local = 0u8;
        let addr = std::ptr::addr_of!(local) as u64;
        Self::new(nanos ^ addr.rotate_left(32))
    }

    pub(crate) fn new(seed: u64) -> Self {
        // The all-zero state is a fixed point of xorshift.
        Self(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_millis(50);
    const MAX: Duration = Duration::from_secs(2);

    #[test]
    fn delay_doubles_within_equal_jitter_bounds_and_caps() {
        let mut rng = XorShift64::new(42);
        for (failures, ceiling_ms) in [
            (1, 50),
            (2, 100),
            (3, 200),
            (6, 1600),
            (7, 2000),
            (40, 2000),
        ] {
            let ceiling = Duration::from_millis(ceiling_ms);
            for _ in 0..200 {
                let d = delay(MIN, MAX, failures, &mut rng);
                assert!(
                    d >= ceiling / 2 && d <= ceiling,
                    "failures {failures}: {d:?}"
                );
            }
        }
    }

    #[test]
    fn jitter_spreads_delays() {
        let mut rng = XorShift64::new(7);
        let delays: std::collections::HashSet<Duration> =
            (0..50).map(|_| delay(MIN, MAX, 3, &mut rng)).collect();
        assert!(delays.len() > 40, "only {} distinct delays", delays.len());
    }

    #[test]
    fn equal_min_and_max_still_jitter_in_the_upper_half() {
        let mut rng = XorShift64::new(1);
        let d = delay(MAX, MAX, 5, &mut rng);
        assert!(d >= MAX / 2 && d <= MAX);
    }

    #[test]
    fn zero_seed_does_not_stick() {
        let mut rng = XorShift64::new(0);
        assert_ne!(rng.next_u64(), 0);
    }
}
