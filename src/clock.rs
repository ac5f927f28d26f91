//! Server time: nanoseconds since the UNIX epoch, monotonic within a process;
//! never the client's clock.
//!
//! Every algorithm takes `now` as an argument, so the clock is read once per
//! frame by the connection and injected by tests.
//!
//! [`MonotonicClock`] reads the wall clock **once**, when it is created, and
//! from then on adds `Instant` time: `now = wall(start) + elapsed`. So
//! - within a process it never goes backwards (an NTP step of the wall clock
//!   does not move it);
//! - two processes on NTP-synced hosts agree on it up to the hosts' offset
//!   at their start (plus drift since): a GCRA `tat`, a window index or a
//!   lease expiry written by one node means the same instant on the other.
//!   Replication ships such timestamps as they are, so this is what makes a
//!   standby's state mean on promotion what it meant on the primary;
//! - fixed windows are aligned on calendar boundaries (a `1/day` fixed
//!   window resets at 00:00 UTC), and the same on every node.
//!
//! The skew between two nodes' clocks bounds how far a failover can shift
//! state: a standby whose clock is `d` ahead sees every bucket `d` fuller
//! (and every window `d` closer to its end) than the primary did. README
//! ("Replication and failover") states this as part of the guarantee.
//! `u64` nanoseconds since 1970 last until the year 2554.

use crate::sync::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Nanoseconds since the UNIX epoch (for [`ManualClock`]: whatever the test
/// set).
pub type Nanos = u64;

pub const NANOS_PER_MS: u64 = 1_000_000;

/// A source of monotonic time.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Nanos;
}

/// The production clock: the wall clock read once at creation, advanced by
/// `Instant` (monotonic) time.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
    /// Wall-clock nanoseconds since the UNIX epoch at `origin`.
    wall_at_origin: Nanos,
}

impl MonotonicClock {
    pub fn new() -> Self {
        let origin = Instant::now();
        // A wall clock before 1970 (a host without RTC, not yet synced)
        // counts from 0: time still moves forward from there.
        let wall_at_origin = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as Nanos);
        Self {
            origin,
            wall_at_origin,
        }
    }

    /// Wall-clock nanoseconds since the UNIX epoch when this clock started.
    pub fn started_at(&self) -> Nanos {
        self.wall_at_origin
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Nanos {
        let elapsed = self.origin.elapsed().as_nanos() as Nanos;
        self.wall_at_origin.saturating_add(elapsed)
    }
}

/// A clock tests move by hand.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    pub fn new(start: Nanos) -> Self {
        Self {
            now: AtomicU64::new(start),
        }
    }

    pub fn advance(&self, by: Duration) {
        // Relaxed: the value itself is the only data; no other memory is
        // published through it.
        self.now.fetch_add(by.as_nanos() as u64, Ordering::Relaxed);
    }

    pub fn set(&self, to: Nanos) {
        self.now.store(to, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        self.now.load(Ordering::Relaxed)
    }
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use super::*;

    #[test]
    fn monotonic_clock_is_anchored_on_the_wall_clock() {
        let wall = || {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .expect("after 1970")
                .as_nanos() as Nanos
        };
        let before = wall();
        let clock = MonotonicClock::new();
        let a = clock.now();
        let after = wall();
        // Within the span of the two wall readings (plus slack for the
        // wall clock being stepped by NTP while the test runs).
        let slack = 1_000_000_000;
        assert!(
            a + slack >= before && a <= after + slack,
            "{before} {a} {after}"
        );
        let b = clock.now();
        assert!(b >= a, "never backwards");
        // Two clocks of one host agree closely.
        let other = MonotonicClock::new();
        assert!(other.now().abs_diff(clock.now()) < slack);
    }
}
