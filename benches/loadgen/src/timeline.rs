//! Per-interval samples of a run, for `--plot`: decided checks, errors and
//! a latency histogram for each interval of the measurement window.
//!
//! Invariants:
//! - an answer is counted in the interval its arrival falls in, measured
//!   from the window's start, so the samples add up to the run's totals
//!   (the same answers, the same latencies as the summary's);
//! - the last interval may be shorter than the others (the window's length
//!   need not be a multiple); its rate is over its own length;
//! - each connection keeps its own timeline, merged at the end like the
//!   recorders, so recording takes no lock. An interval's histogram is
//!   allocated when its first answer arrives, at 2 significant digits from
//!   1 µs (about 14 KB), so 50 connections over 30 one-second intervals
//!   stay near 20 MB.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// Interval of the samples unless `--plot-interval` says otherwise.
pub const DEFAULT_PLOT_INTERVAL: &str = "1s";
/// Most samples a run may ask for (`--duration` / `--plot-interval`): each
/// connection may hold a histogram per sample.
pub const MAX_SAMPLES: usize = 3_600;

/// Finest latency an interval's histogram tells apart, in ns.
const INTERVAL_LOWEST_NS: u64 = 1_000;
/// Longest latency an interval's histogram holds exactly, in ns.
const INTERVAL_HIGHEST_NS: u64 = 3_600 * 1_000_000_000;
/// Significant digits of an interval's histogram (1% resolution is finer
/// than a plot can show).
const INTERVAL_SIGFIG: u8 = 2;

/// One interval: what arrived in `[start + i * interval, start + (i+1) *
/// interval)`.
#[derive(Default)]
struct Slot {
    checks: u64,
    errors: u64,
    latency: Option<Histogram<u32>>,
}

/// Samples over a measurement window.
pub struct Timeline {
    start: Instant,
    length: Duration,
    interval: Duration,
    slots: Vec<Slot>,
}

/// What one interval measured, as plotted.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// End of the interval, in seconds since the measurement began.
    pub at_s: f64,
    /// Decided checks per second of the interval.
    pub checks_per_sec: f64,
    pub errors: u64,
    /// Latency percentiles in µs; `None` when nothing was decided in the
    /// interval.
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p999_us: Option<f64>,
}

impl Timeline {
    /// A timeline over `length` from `start`, one slot per `interval`
    /// (the last one possibly shorter).
    pub fn new(start: Instant, length: Duration, interval: Duration) -> Self {
        assert!(!interval.is_zero(), "a zero interval");
        let count = length.as_nanos().div_ceil(interval.as_nanos()).max(1);
        let mut slots = Vec::new();
        slots.resize_with(count as usize, Slot::default);
        Self {
            start,
            length,
            interval,
            slots,
        }
    }

    fn slot(&mut self, done: Instant) -> Option<&mut Slot> {
        let since = done.checked_duration_since(self.start)?;
        if since >= self.length {
            return None;
        }
        let index = since.as_nanos() / self.interval.as_nanos();
        self.slots.get_mut(usize::try_from(index).ok()?)
    }

    /// An answer arrived at `done` with `checks` decided and `errors`
    /// failed; `latency_ns` when it decided any.
    pub fn record(&mut self, done: Instant, checks: u64, errors: u64, latency_ns: Option<u64>) {
        let Some(slot) = self.slot(done) else { return };
        slot.checks += checks;
        slot.errors += errors;
        if let Some(ns) = latency_ns {
            slot.latency
                .get_or_insert_with(|| {
                    Histogram::new_with_bounds(
                        INTERVAL_LOWEST_NS,
                        INTERVAL_HIGHEST_NS,
                        INTERVAL_SIGFIG,
                    )
                    .expect("valid histogram bounds")
                })
                .saturating_record(ns);
        }
    }

    /// Adds another connection's timeline over the same window.
    pub fn merge(&mut self, other: Timeline) {
        for (mine, theirs) in self.slots.iter_mut().zip(other.slots) {
            mine.checks += theirs.checks;
            mine.errors += theirs.errors;
            match (&mut mine.latency, theirs.latency) {
                (Some(h), Some(t)) => h.add(&t).expect("same histogram bounds"),
                (slot @ None, t) => *slot = t,
                (Some(_), None) => {}
            }
        }
    }

    /// One sample per interval, in order.
    pub fn samples(&self) -> Vec<Sample> {
        let quantile = |h: &Option<Histogram<u32>>, q: f64| {
            h.as_ref()
                .filter(|h| !h.is_empty())
                .map(|h| h.value_at_quantile(q) as f64 / 1_000.0)
        };
        let mut out = Vec::with_capacity(self.slots.len());
        for (i, slot) in self.slots.iter().enumerate() {
            let from = self.interval * i as u32;
            let to = (from + self.interval).min(self.length);
            let secs = (to - from).as_secs_f64();
            out.push(Sample {
                at_s: to.as_secs_f64(),
                checks_per_sec: if secs > 0.0 {
                    slot.checks as f64 / secs
                } else {
                    0.0
                },
                errors: slot.errors,
                p50_us: quantile(&slot.latency, 0.5),
                p99_us: quantile(&slot.latency, 0.99),
                p999_us: quantile(&slot.latency, 0.999),
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_fall_in_the_interval_of_their_arrival() {
        let start = Instant::now();
        let mut a = Timeline::new(start, Duration::from_millis(2500), Duration::from_secs(1));
        let ms = Duration::from_millis;
        a.record(start + ms(10), 8, 0, Some(100_000));
        a.record(start + ms(1500), 4, 2, Some(300_000));
        // Before the window and after it: not counted.
        a.record(start - ms(1), 100, 0, Some(1));
        a.record(start + ms(2500), 100, 0, Some(1));
        let mut b = Timeline::new(start, Duration::from_millis(2500), Duration::from_secs(1));
        b.record(start + ms(2400), 5, 0, Some(2_000_000));
        b.record(start + ms(20), 2, 0, Some(100_000));
        a.merge(b);
        let samples = a.samples();
        assert_eq!(samples.len(), 3);
        assert_eq!(samples[0].at_s, 1.0);
        assert_eq!(samples[0].checks_per_sec, 10.0);
        assert_eq!(samples[1].errors, 2);
        // The last interval is half as long: 5 checks in 0.5 s.
        assert_eq!(samples[2].at_s, 2.5);
        assert_eq!(samples[2].checks_per_sec, 10.0);
        let p50 = samples[2].p50_us.unwrap();
        assert!((p50 - 2000.0).abs() < 20.0, "{p50}");
        let p99 = samples[1].p99_us.unwrap();
        assert!((p99 - 300.0).abs() < 3.0, "{p99}");
    }

    #[test]
    fn an_interval_without_answers_has_no_latency() {
        let start = Instant::now();
        let t = Timeline::new(start, Duration::from_secs(2), Duration::from_secs(1));
        let samples = t.samples();
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[1].checks_per_sec, 0.0);
        assert_eq!(samples[1].p99_us, None);
    }
}
