//! Server time: a monotonic nanosecond counter, never the client's clock.
//!
//! Every algorithm takes `now` as an argument, so the clock is read once per
//! frame by the connection and injected by tests. [`Nanos`] counts from the
//! clock's origin (process start for [`MonotonicClock`]), so it never goes
//! backwards and fits a `u64` for centuries.

use crate::sync::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Nanoseconds since the clock's origin.
pub type Nanos = u64;

pub const NANOS_PER_MS: u64 = 1_000_000;

/// A source of monotonic time.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Nanos;
}

/// The production clock: `Instant` since construction.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Nanos {
        // u64 nanoseconds overflow after ~584 years of uptime.
        self.origin.elapsed().as_nanos() as Nanos
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
