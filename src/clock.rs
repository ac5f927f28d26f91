//! Server time: nanoseconds since the UNIX epoch, monotonic within a process;
//! never the client's clock.
//!
//! Every algorithm takes `now` as an argument, so the clock is read once per
//! frame by the connection and injected by tests.
//!
//! [`MonotonicClock`] follows the wall clock without ever stepping back:
//! `now = value + (monotonic time since at)`, where the anchor
//! `(at, value)` is set from the wall clock at creation and corrected by
//! [`Clock::check_wall`], which the server calls every sweeper tick:
//! - wall clock ahead of the server clock by more than [`WALL_TOLERANCE`]
//!   (an NTP step forward, a node started before NTP synced, a suspend the
//!   monotonic clock did not count): the server clock **steps forward** to
//!   it. Buckets refill and windows move on by the step, as they would have
//!   had the time been counted;
//! - wall clock behind (an NTP step back): the server clock never steps
//!   back, it **runs slower** by 1/2^[`SLEW_SHIFT`] (1/16) until the wall
//!   clock has caught up. Meanwhile buckets refill and windows and leases
//!   run 1/16 slower: limits are stricter, never looser;
//! - within the tolerance it runs at the monotonic clock's rate.
//!
//! So two processes on NTP-synced hosts agree on it up to the hosts' offset
//! (plus, after a step back, what is left of the slew): a GCRA `tat`, a
//! window index or a lease expiry written by one node means the same
//! instant on the other. Replication ships such timestamps as they are,
//! which is what makes a standby's state mean on promotion what it meant on
//! the primary; states from a clock ahead are honoured by every algorithm,
//! never read as empty. Fixed windows are aligned on calendar boundaries (a
//! `1/day` fixed window resets at 00:00 UTC), the same on every node.
//!
//! The anchor is a seqlock of three atomics: one writer (re-checks are
//! serialized by a mutex), readers never write shared memory, so reading
//! the clock costs a few loads on every core. The clock never steps back;
//! the one imprecision is at a change of rate (a slew starting or ending,
//! at most once per re-check): a reader that loaded the old anchor just
//! before may read up to 1/16 of its own delay between loading the anchor
//! and reading the monotonic clock (nanoseconds, unless it is preempted
//! right there) ahead of a reader using the new one. The algorithms treat
//! that like any clock skew. `u64` nanoseconds since 1970 last until the
//! year 2554.

use crate::sync::{fence, AtomicBool, AtomicU64, Mutex, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Nanoseconds since the UNIX epoch (for [`ManualClock`]: whatever the test
/// set).
pub type Nanos = u64;

pub const NANOS_PER_MS: u64 = 1_000_000;

/// Differences between the wall clock and the server clock up to this
/// (1 ms) are left alone: reading two clocks one after the other is that
/// noisy on a loaded host, and NTP slews the wall clock itself.
pub const WALL_TOLERANCE: Nanos = NANOS_PER_MS;

/// A server clock ahead of the wall clock runs slower by 1/2^this (1/16)
/// until the wall clock catches up: a step back of one second is absorbed
/// in 16 s, of one hour in 16 h, with limits 1/16 stricter meanwhile.
pub const SLEW_SHIFT: u32 = 4;

/// A source of monotonic time.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Nanos;

    /// The clock at `at`, an instant the caller has just read for itself
    /// (a frame's latency starts there): one read of the monotonic clock
    /// serves both. Clocks that follow no `Instant` answer [`Self::now`].
    fn now_at(&self, at: Instant) -> Nanos {
        let _ = at;
        self.now()
    }

    /// Compares the clock with the wall clock and corrects it (see the
    /// module docs). `None` for clocks that follow no wall clock (tests).
    fn check_wall(&self) -> Option<WallCheck> {
        None
    }
}

/// What one [`Clock::check_wall`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WallCheck {
    /// Wall clock minus server clock when checked, in nanoseconds: positive
    /// when the server clock was behind.
    pub offset: i64,
    /// The server clock stepped forward by `offset`.
    pub stepped: bool,
    /// The server clock runs slow (it is ahead of the wall clock).
    pub slewing: bool,
}

/// Where [`MonotonicClock`] reads time: the wall clock and a monotonic
/// clock. Production uses [`SystemSources`]; tests move both by hand.
pub trait TimeSources: Send + Sync + 'static {
    /// Wall-clock nanoseconds since the UNIX epoch (0 before 1970).
    fn wall(&self) -> Nanos;
    /// Monotonic nanoseconds since some fixed origin.
    fn monotonic(&self) -> Nanos;

    /// [`Self::monotonic`] at `at` (sources that do not follow `Instant`
    /// read themselves).
    fn monotonic_at(&self, at: Instant) -> Nanos {
        let _ = at;
        self.monotonic()
    }
}

/// The system's wall clock and `Instant`.
#[derive(Debug, Clone, Copy)]
pub struct SystemSources {
    origin: Instant,
}

impl TimeSources for SystemSources {
    fn wall(&self) -> Nanos {
        // A wall clock before 1970 (a host without RTC, not yet synced)
        // counts from 0: time still moves forward from there, and the
        // first re-check after NTP syncs steps to it.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as Nanos)
    }

    fn monotonic(&self) -> Nanos {
        self.monotonic_at(Instant::now())
    }

    fn monotonic_at(&self, at: Instant) -> Nanos {
        at.saturating_duration_since(self.origin).as_nanos() as Nanos
    }
}

/// The production clock: the wall clock, made monotonic (module docs).
#[derive(Debug)]
pub struct MonotonicClock<S: TimeSources = SystemSources> {
    sources: S,
    /// Even when stable, odd while the writer changes the anchor.
    seq: AtomicU64,
    /// Monotonic reading the anchor was set at.
    at: AtomicU64,
    /// Server time at `at`.
    value: AtomicU64,
    /// Running 1/2^SLEW_SHIFT slow since `at`.
    slow: AtomicBool,
    /// Serializes re-checks: the seqlock has one writer at a time.
    writer: Mutex<()>,
    /// Wall-clock time at creation.
    started_at: Nanos,
}

impl MonotonicClock {
    pub fn new() -> Self {
        Self::with_sources(SystemSources {
            origin: Instant::now(),
        })
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

/// Server time `elapsed` after an anchor of `value`, at full or slow rate.
fn advance(value: Nanos, elapsed: Nanos, slow: bool) -> Nanos {
    let elapsed = if slow {
        elapsed - (elapsed >> SLEW_SHIFT)
    } else {
        elapsed
    };
    value.saturating_add(elapsed)
}

impl<S: TimeSources> MonotonicClock<S> {
    /// A clock reading `sources`, starting at their wall time.
    pub fn with_sources(sources: S) -> Self {
        let (at, wall) = (sources.monotonic(), sources.wall());
        Self {
            sources,
            seq: AtomicU64::new(0),
            at: AtomicU64::new(at),
            value: AtomicU64::new(wall),
            slow: AtomicBool::new(false),
            writer: Mutex::new(()),
            started_at: wall,
        }
    }

    /// Wall-clock nanoseconds since the UNIX epoch when this clock started.
    pub fn started_at(&self) -> Nanos {
        self.started_at
    }

    /// The anchor, read consistently (seqlock reader).
    fn anchor(&self) -> (Nanos, Nanos, bool) {
        loop {
            // Acquire: the fields below are read after this load; pairs
            // with the writer's final Release store.
            let before = self.seq.load(Ordering::Acquire);
            if before & 1 == 0 {
                // Relaxed: validated by the sequence check below.
                let at = self.at.load(Ordering::Relaxed);
                let value = self.value.load(Ordering::Relaxed);
                let slow = self.slow.load(Ordering::Relaxed);
                // Acquire fence: the field loads above happen before the
                // second sequence load.
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == before {
                    return (at, value, slow);
                }
            }
            std::hint::spin_loop();
        }
    }

    fn publish(&self, at: Nanos, value: Nanos, slow: bool) {
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq + 1, Ordering::Relaxed);
        // Release fence: a reader that sees any new field also sees the
        // odd sequence (and retries).
        fence(Ordering::Release);
        self.at.store(at, Ordering::Relaxed);
        self.value.store(value, Ordering::Relaxed);
        self.slow.store(slow, Ordering::Relaxed);
        // Release: a reader that sees the new sequence sees the fields.
        self.seq.store(seq + 2, Ordering::Release);
    }
}

impl<S: TimeSources> Clock for MonotonicClock<S> {
    fn now(&self) -> Nanos {
        let (at, value, slow) = self.anchor();
        // Read after the anchor: the writer read its `at` before publishing,
        // so this is at least `at`.
        let mono = self.sources.monotonic();
        advance(value, mono.saturating_sub(at), slow)
    }

    fn now_at(&self, instant: Instant) -> Nanos {
        let (at, value, slow) = self.anchor();
        // Read before the anchor, so it may be short of a just-published
        // `at`: the clock then reads the anchor's value, which is never
        // behind what the previous anchor gave at that instant.
        let mono = self.sources.monotonic_at(instant);
        advance(value, mono.saturating_sub(at), slow)
    }

    fn check_wall(&self) -> Option<WallCheck> {
        let _writer = self.writer.lock();
        let (at, value, slow) = self.anchor();
        let mono = self.sources.monotonic();
        let wall = self.sources.wall();
        let now = advance(value, mono.saturating_sub(at), slow);
        let offset = i128::from(wall) - i128::from(now);
        let offset = offset.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
        let tolerance = WALL_TOLERANCE as i64;
        let check = WallCheck {
            offset,
            stepped: offset > tolerance,
            slewing: offset < -tolerance,
        };
        if check.stepped {
            tracing::warn!(
                offset_ms = offset / NANOS_PER_MS as i64,
                "wall clock ahead of the server clock: stepping forward"
            );
            self.publish(mono, wall, false);
        } else if check.slewing != slow {
            if check.slewing {
                tracing::warn!(
                    offset_ms = offset / NANOS_PER_MS as i64,
                    "wall clock behind the server clock: running 1/16 slow until it catches up"
                );
            }
            // Re-anchored where the old rate leaves off: continuous.
            self.publish(mono, now, check.slewing);
        }
        Some(check)
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
    use std::sync::Arc;

    const S: Nanos = 1_000_000_000;

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
        // The re-check finds the wall clock where the clock is.
        let check = clock.check_wall().expect("follows the wall clock");
        assert!(check.offset.unsigned_abs() < slack, "{check:?}");
    }

    /// Wall and monotonic time moved by the test.
    #[derive(Debug, Default)]
    struct Hands {
        wall: std::sync::atomic::AtomicU64,
        mono: std::sync::atomic::AtomicU64,
    }

    impl TimeSources for Arc<Hands> {
        fn wall(&self) -> Nanos {
            self.wall.load(std::sync::atomic::Ordering::Relaxed)
        }
        fn monotonic(&self) -> Nanos {
            self.mono.load(std::sync::atomic::Ordering::Relaxed)
        }
    }

    impl Hands {
        /// Real time passing: both clocks move.
        fn pass(&self, by: Nanos) {
            use std::sync::atomic::Ordering::Relaxed;
            self.wall.fetch_add(by, Relaxed);
            self.mono.fetch_add(by, Relaxed);
        }

        /// The wall clock alone is stepped (NTP), by a signed amount.
        fn step_wall(&self, by: i64) {
            let wall = self.wall.load(std::sync::atomic::Ordering::Relaxed);
            let to = wall.checked_add_signed(by).expect("in range");
            self.wall.store(to, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn manual(start: Nanos) -> (Arc<Hands>, MonotonicClock<Arc<Hands>>) {
        let hands = Arc::new(Hands::default());
        hands
            .wall
            .store(start, std::sync::atomic::Ordering::Relaxed);
        hands
            .mono
            .store(7 * S, std::sync::atomic::Ordering::Relaxed);
        let clock = MonotonicClock::with_sources(hands.clone());
        (hands, clock)
    }

    #[test]
    fn a_wall_clock_step_forward_is_followed_at_the_next_check() {
        let (hands, clock) = manual(1_000 * S);
        hands.pass(S);
        assert_eq!(clock.now(), 1_001 * S);
        // NTP steps the wall clock 30 s forward (or the host slept and the
        // monotonic clock did not count it).
        hands.step_wall(30 * 1_000_000_000);
        assert_eq!(clock.now(), 1_001 * S, "not before the re-check");
        let check = clock.check_wall().unwrap();
        assert_eq!(
            check,
            WallCheck {
                offset: 30 * 1_000_000_000,
                stepped: true,
                slewing: false
            }
        );
        assert_eq!(clock.now(), 1_031 * S);
        hands.pass(S);
        assert_eq!(clock.now(), 1_032 * S);
        // In step again: nothing to do.
        let check = clock.check_wall().unwrap();
        assert_eq!(
            (check.offset, check.stepped, check.slewing),
            (0, false, false)
        );
    }

    #[test]
    fn a_wall_clock_step_back_is_absorbed_by_running_slow_never_backwards() {
        let (hands, clock) = manual(1_000 * S);
        // NTP steps the wall clock 2 s back.
        hands.step_wall(-2 * 1_000_000_000);
        let check = clock.check_wall().unwrap();
        assert_eq!(check.offset, -2 * 1_000_000_000);
        assert!(check.slewing && !check.stepped);
        assert_eq!(clock.now(), 1_000 * S, "no step back");
        // 1/16 slow: 16 s of real time gain 1 s on the clock.
        let mut last = clock.now();
        for _ in 0..16 {
            hands.pass(S);
            let now = clock.now();
            assert_eq!(now - last, S - S / 16);
            last = now;
            assert!(clock.check_wall().unwrap().slewing);
        }
        assert_eq!(clock.now(), 1_000 * S + 15 * S);
        assert_eq!(hands.wall(), 998 * S + 16 * S);
        // 16 s more and the wall clock has caught up: full rate again.
        for _ in 0..16 {
            hands.pass(S);
            clock.check_wall();
        }
        let check = clock.check_wall().unwrap();
        assert!(!check.slewing, "{check:?}");
        assert!(check.offset.unsigned_abs() <= WALL_TOLERANCE, "{check:?}");
        let before = clock.now();
        hands.pass(S);
        assert_eq!(clock.now() - before, S);
    }

    #[test]
    fn readers_never_see_a_torn_anchor() {
        // A writer re-anchoring back and forth (10 ms steps, slews) while
        // readers read: a torn anchor (the `at` of one, the value of
        // another) would be off by about a step. Each reader's values stay
        // in range and never decrease by more than the rate-change
        // imprecision (module docs): 1/16 of the 2 ms the test's monotonic
        // clock moves in all.
        let (hands, clock) = manual(1_000 * S);
        let clock = Arc::new(clock);
        std::thread::scope(|s| {
            let writer = {
                let (hands, clock) = (hands.clone(), clock.clone());
                s.spawn(move || {
                    for i in 0..2_000 {
                        hands.pass(1_000);
                        hands.step_wall(if i % 2 == 0 { -10_000_000 } else { 10_000_000 });
                        clock.check_wall();
                    }
                })
            };
            for _ in 0..2 {
                let clock = clock.clone();
                s.spawn(move || {
                    let mut last = 0;
                    for _ in 0..20_000 {
                        let now = clock.now();
                        assert!((1_000 * S..1_100 * S).contains(&now), "{now}");
                        assert!(now + 2_000_000 / 16 >= last, "{now} < {last}");
                        last = last.max(now);
                    }
                });
            }
            writer.join().unwrap();
        });
    }
}
