//! Reconnect backoff: exponential with "equal jitter".
//!
//! After the n-th consecutive failed attempt the client waits a delay drawn
//! uniformly from `[d/2, d]`, where `d = min(backoff_min * 2^(n-1),
//! backoff_max)`. The fixed half guarantees a floor (a dead server is not
//! hammered); the random half spreads a fleet of gateways that lost the same
//! server at the same moment. The randomness is `fastrand`'s thread-local
//! generator (seeded from the OS): fine for spreading reconnects, not for
//! anything secret.

use std::time::Duration;

/// The delay before the next attempt after `failures` (>= 1) consecutive
/// failed attempts.
pub(crate) fn delay(min: Duration, max: Duration, failures: u32) -> Duration {
    delay_with(min, max, failures, &mut fastrand::Rng::new())
}

/// [`delay`] with the random source given, so tests can seed it.
fn delay_with(min: Duration, max: Duration, failures: u32, rng: &mut fastrand::Rng) -> Duration {
    // 2^31 * backoff_min overflows nothing that matters: the cap applies
    // first, and checked_mul saturates to `max` on overflow.
    let doublings = failures.saturating_sub(1).min(31);
    let ceiling = min
        .checked_mul(1u32 << doublings)
        .map_or(max, |d| d.min(max));
    let half = ceiling / 2;
    let spread_ns = u64::try_from((ceiling - half).as_nanos()).unwrap_or(u64::MAX);
    half + Duration::from_nanos(rng.u64(0..=spread_ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_millis(50);
    const MAX: Duration = Duration::from_secs(2);

    #[test]
    fn delay_doubles_within_equal_jitter_bounds_and_caps() {
        let mut rng = fastrand::Rng::with_seed(42);
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
                let d = delay_with(MIN, MAX, failures, &mut rng);
                assert!(
                    d >= ceiling / 2 && d <= ceiling,
                    "failures {failures}: {d:?}"
                );
            }
        }
    }

    #[test]
    fn jitter_spreads_delays() {
        let mut rng = fastrand::Rng::with_seed(7);
        let delays: std::collections::HashSet<Duration> =
            (0..50).map(|_| delay_with(MIN, MAX, 3, &mut rng)).collect();
        assert!(delays.len() > 40, "only {} distinct delays", delays.len());
    }

    #[test]
    fn equal_min_and_max_still_jitter_in_the_upper_half() {
        let d = delay(MAX, MAX, 5);
        assert!(d >= MAX / 2 && d <= MAX);
    }
}
