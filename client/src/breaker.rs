//! The circuit breaker kept per node.
//!
//! ```text
//!  Closed ──(consecutive failures, or error rate over the window)──> Open{until}
//!    ▲                                                                  │ until passed
//!    │ the probe call is answered                                       ▼
//!    └──────────────────────────────────────────────────────────── HalfOpen: one probe call
//!                          the probe fails: Open again, open time doubled ┘
//! ```
//!
//! A failure is a call that timed out, a connection lost under waiting
//! calls, or a connection attempt that failed; a success is any answer from
//! the node (a denial or an error frame is still an answer). While open,
//! calls to the node fail at once without touching the network (the local
//! fallback decides them), and shard rounds skip the node, so a hung
//! primary costs nothing while its standby takes over.
//!
//! Counting is done in batches (per socket read, per deadline sweep), not
//! per call: the call path only reads one atomic while closed. Pure logic
//! with an injected `now`, so the transitions are tested exactly.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::config::BreakerConfig;

const CLOSED: u8 = 0;
const OPEN: u8 = 1;
const HALF_OPEN: u8 = 2;

/// A breaker's state, as reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    /// Calls fail fast until the open time passes.
    Open,
    /// One probe call may go through.
    HalfOpen,
}

/// A state change, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Transition {
    pub to: BreakerState,
}

pub(crate) struct Breaker {
    config: BreakerConfig,
    /// The state, read lock-free on every call. Relaxed: it only gates
    /// admission; the counts behind it are under `inner`.
    state: AtomicU8,
    inner: Mutex<Inner>,
}

struct Inner {
    consecutive: u32,
    window_start: Instant,
    calls: u32,
    failures: u32,
    open_until: Instant,
    /// Current open time; doubles while probes fail.
    open_for: Duration,
    /// A probe call was let through and has not reported yet; a new one
    /// goes after `probe_expires` (a probe refused locally never reports).
    probe_out: bool,
    probe_expires: Instant,
}

impl Breaker {
    pub(crate) fn new(config: BreakerConfig, now: Instant) -> Self {
        let open_for = config.open_for;
        Self {
            config,
            state: AtomicU8::new(CLOSED),
            inner: Mutex::new(Inner {
                consecutive: 0,
                window_start: now,
                calls: 0,
                failures: 0,
                open_until: now,
                open_for,
                probe_out: false,
                probe_expires: now,
            }),
        }
    }

    pub(crate) fn state(&self) -> BreakerState {
        match self.state.load(Ordering::Relaxed) {
            CLOSED => BreakerState::Closed,
            OPEN => BreakerState::Open,
            _ => BreakerState::HalfOpen,
        }
    }

    /// Whether a call may go to the node now; `Err(retry_in)` when not.
    pub(crate) fn admit(&self, now: Instant) -> Result<Option<Transition>, Duration> {
        if self.state.load(Ordering::Relaxed) == CLOSED {
            return Ok(None);
        }
        let mut inner = self.inner.lock();
        match self.state.load(Ordering::Relaxed) {
            CLOSED => Ok(None),
            OPEN if now < inner.open_until => Err(inner.open_until - now),
            _ => {
                let was_open = self.state.swap(HALF_OPEN, Ordering::Relaxed) == OPEN;
                if inner.probe_out && now < inner.probe_expires {
                    return Err(inner.probe_expires - now);
                }
                inner.probe_out = true;
                inner.probe_expires = now + inner.open_for;
                Ok(was_open.then_some(Transition {
                    to: BreakerState::HalfOpen,
                }))
            }
        }
    }

    /// How long a call would be refused now, without taking the probe:
    /// open and not yet due, or half-open with its probe out. `None` when
    /// a call would be admitted (closed, or a probe is due).
    pub(crate) fn refusing(&self, now: Instant) -> Option<Duration> {
        if self.state.load(Ordering::Relaxed) == CLOSED {
            return None;
        }
        let inner = self.inner.lock();
        match self.state.load(Ordering::Relaxed) {
            CLOSED => None,
            OPEN if now < inner.open_until => Some(inner.open_until - now),
            _ if inner.probe_out && now < inner.probe_expires => Some(inner.probe_expires - now),
            _ => None,
        }
    }

    /// Whether a shard round should skip the node (open, not yet due for a
    /// probe).
    pub(crate) fn skip(&self, now: Instant) -> bool {
        self.state.load(Ordering::Relaxed) == OPEN && now < self.inner.lock().open_until
    }

    /// Counts `answered` answers and `failed` failures seen together.
    pub(crate) fn record(&self, answered: u32, failed: u32, now: Instant) -> Option<Transition> {
        if answered == 0 && failed == 0 {
            return None;
        }
        let mut inner = self.inner.lock();
        match self.state.load(Ordering::Relaxed) {
            // Late answers of calls sent before it opened change nothing.
            OPEN => None,
            HALF_OPEN if failed > 0 => Some(self.open(&mut inner, now, true)),
            HALF_OPEN => {
                self.state.store(CLOSED, Ordering::Relaxed);
                inner.consecutive = 0;
                inner.calls = 0;
                inner.failures = 0;
                inner.window_start = now;
                inner.open_for = self.config.open_for;
                inner.probe_out = false;
                Some(Transition {
                    to: BreakerState::Closed,
                })
            }
            _ => {
                if now.duration_since(inner.window_start) >= self.config.window {
                    inner.window_start = now;
                    inner.calls = 0;
                    inner.failures = 0;
                }
                inner.calls = inner.calls.saturating_add(answered + failed);
                inner.failures = inner.failures.saturating_add(failed);
                if answered > 0 {
                    inner.consecutive = 0;
                }
                inner.consecutive = inner.consecutive.saturating_add(failed);
                let rate_exceeded = inner.calls >= self.config.min_calls
                    && u64::from(inner.failures) * 100
                        >= u64::from(inner.calls) * u64::from(self.config.error_percent);
                if failed > 0
                    && (inner.consecutive >= self.config.consecutive_failures || rate_exceeded)
                {
                    Some(self.open(&mut inner, now, false))
                } else {
                    None
                }
            }
        }
    }

    fn open(&self, inner: &mut Inner, now: Instant, probe_failed: bool) -> Transition {
        if probe_failed {
            inner.open_for = (inner.open_for * 2).min(self.config.open_max);
        }
        inner.open_until = now + inner.open_for;
        inner.probe_out = false;
        inner.consecutive = 0;
        inner.calls = 0;
        inner.failures = 0;
        inner.window_start = now;
        self.state.store(OPEN, Ordering::Relaxed);
        Transition {
            to: BreakerState::Open,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> BreakerConfig {
        BreakerConfig {
            consecutive_failures: 3,
            error_percent: 50,
            min_calls: 10,
            window: Duration::from_secs(10),
            open_for: Duration::from_millis(100),
            open_max: Duration::from_millis(350),
        }
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn consecutive_failures_open_then_one_probe_closes() {
        let t0 = Instant::now();
        let b = Breaker::new(config(), t0);
        assert_eq!(b.record(0, 2, t0), None);
        assert_eq!(b.record(1, 0, t0), None, "an answer resets the run");
        assert_eq!(b.record(0, 2, t0), None);
        assert_eq!(
            b.record(0, 1, t0),
            Some(Transition {
                to: BreakerState::Open
            })
        );
        assert_eq!(b.admit(t0 + 10 * MS), Err(90 * MS));
        assert!(b.skip(t0 + 10 * MS));
        assert_eq!(b.refusing(t0 + 10 * MS), Some(90 * MS));
        assert_eq!(b.refusing(t0 + 100 * MS), None, "a probe is due");
        // Due: one probe goes, the next call waits for it.
        assert_eq!(
            b.admit(t0 + 100 * MS),
            Ok(Some(Transition {
                to: BreakerState::HalfOpen
            }))
        );
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert!(b.admit(t0 + 101 * MS).is_err());
        assert!(b.refusing(t0 + 101 * MS).is_some(), "the probe is out");
        assert_eq!(
            b.record(1, 0, t0 + 102 * MS),
            Some(Transition {
                to: BreakerState::Closed
            })
        );
        assert_eq!(b.admit(t0 + 103 * MS), Ok(None));
    }

    #[test]
    fn failed_probes_double_the_open_time_up_to_the_cap() {
        let t0 = Instant::now();
        let b = Breaker::new(config(), t0);
        b.record(0, 3, t0);
        let mut now = t0;
        for open_ms in [200u64, 350, 350] {
            now += Duration::from_millis(500);
            assert!(b.admit(now).is_ok(), "a probe is due");
            assert_eq!(
                b.record(0, 1, now),
                Some(Transition {
                    to: BreakerState::Open
                })
            );
            assert_eq!(b.admit(now), Err(Duration::from_millis(open_ms)));
        }
    }

    #[test]
    fn the_error_rate_opens_without_a_long_run() {
        let t0 = Instant::now();
        let b = Breaker::new(config(), t0);
        // Alternating answers and failures: never 3 in a row, but 50%.
        for i in 0..4 {
            assert_eq!(b.record(1, 1, t0 + i * MS), None);
        }
        assert_eq!(
            b.record(1, 1, t0 + 5 * MS),
            Some(Transition {
                to: BreakerState::Open
            })
        );
        // A window that rolled over forgets old failures.
        let b = Breaker::new(config(), t0);
        for i in 0..4 {
            b.record(1, 1, t0 + i * MS);
        }
        assert_eq!(b.record(1, 1, t0 + Duration::from_secs(11)), None);
    }

    #[test]
    fn a_probe_that_never_reports_expires() {
        let t0 = Instant::now();
        let b = Breaker::new(config(), t0);
        b.record(0, 3, t0);
        assert!(b.admit(t0 + 100 * MS).is_ok());
        assert!(b.admit(t0 + 150 * MS).is_err());
        assert!(b.admit(t0 + 201 * MS).is_ok(), "the lost probe is replaced");
    }
}
