//! What one connection records during a run: request latencies in HDR
//! histograms, decided and failed checks, error reasons, and (for `--plot`)
//! per-interval samples. Each connection has its own recorder, so recording
//! takes no lock; they are merged into one per target at the end, and
//! [`report`](crate::report) turns that into a summary.
//!
//! Invariants:
//! - only answers that arrive inside the measurement window (after the
//!   warm-up, before the end) are counted, so `ops_per_sec` is exact:
//!   decided checks in the window divided by its length;
//! - latency is recorded once per request (a frame of `batch` checks, or a
//!   Redis pipeline of `batch` commands), in nanoseconds, in an HDR
//!   histogram with 3 significant digits; closed loop measures from the
//!   actual send, open loop from the intended send time;
//! - errors are never dropped: every failed check is counted, by reason.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::targets::Answer;
use crate::timeline::Timeline;

/// Longest latency the histogram holds exactly; longer ones are clamped
/// (and still counted).
const MAX_TRACKED_NS: u64 = 3_600 * 1_000_000_000;

/// The measurement window: answers arriving in `[start, end)` count.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub start: Instant,
    pub end: Instant,
}

impl Window {
    pub fn contains(&self, t: Instant) -> bool {
        t >= self.start && t < self.end
    }

    pub fn length(&self) -> Duration {
        self.end - self.start
    }
}

/// What one connection saw. Merged into one per target at the end.
pub struct Recorder {
    pub(crate) window: Window,
    /// Request latency in ns.
    pub(crate) latency: Histogram<u32>,
    /// Open loop: how late each request was sent after its due time, in
    /// ns (the generator's own lag, or a full pipeline). Part of `latency`.
    pub(crate) send_lag: Histogram<u32>,
    /// Open loop: latency from the actual send, in ns (what the server and
    /// the network took, without the generator's lag).
    pub(crate) service: Histogram<u32>,
    pub(crate) requests: u64,
    pub(crate) allowed: u64,
    pub(crate) denied: u64,
    pub(crate) errors: u64,
    pub(crate) errors_by_reason: BTreeMap<String, u64>,
    /// Open loop: requests due before the end that were never sent because
    /// the connection was still behind schedule.
    pub(crate) unsent: u64,
    /// Per-interval samples, for `--plot`.
    pub(crate) timeline: Option<Timeline>,
}

impl Recorder {
    pub fn new(window: Window) -> Self {
        Self {
            window,
            latency: Histogram::new_with_bounds(1, MAX_TRACKED_NS, 3)
                .expect("valid histogram bounds"),
            send_lag: Histogram::new_with_bounds(1, MAX_TRACKED_NS, 3)
                .expect("valid histogram bounds"),
            service: Histogram::new_with_bounds(1, MAX_TRACKED_NS, 3)
                .expect("valid histogram bounds"),
            requests: 0,
            allowed: 0,
            denied: 0,
            errors: 0,
            errors_by_reason: BTreeMap::new(),
            unsent: 0,
            timeline: None,
        }
    }

    pub fn window(&self) -> Window {
        self.window
    }

    /// Also keeps per-interval samples (`--plot`), one every `interval`.
    pub fn sampled(mut self, interval: Option<Duration>) -> Self {
        self.timeline = interval.map(|i| Timeline::new(self.window.start, self.window.length(), i));
        self
    }

    /// Records one answered request: `from` is when its latency starts
    /// (actual or intended send), `done` when the answer arrived.
    pub fn record(&mut self, from: Instant, done: Instant, answer: &Answer) {
        if !self.window.contains(done) {
            return;
        }
        self.requests += 1;
        self.allowed += u64::from(answer.allowed);
        self.denied += u64::from(answer.denied);
        if answer.errors > 0 {
            self.errors += u64::from(answer.errors);
            let reason = answer.error.as_deref().unwrap_or("unknown");
            *self.errors_by_reason.entry(reason.to_owned()).or_default() +=
                u64::from(answer.errors);
        }
        // A request that decided nothing (all failed) says nothing about
        // the server's latency; its checks are counted as errors above.
        let decided = answer.allowed + answer.denied;
        let latency = (decided > 0).then(|| {
            let ns = done.saturating_duration_since(from).as_nanos();
            u64::try_from(ns).unwrap_or(u64::MAX).max(1)
        });
        if let Some(ns) = latency {
            self.latency.saturating_record(ns);
        }
        if let Some(timeline) = &mut self.timeline {
            timeline.record(done, decided.into(), answer.errors.into(), latency);
        }
    }

    /// Open loop: a request sent at `sent` was answered at `done` (its
    /// latency from the due time goes through [`record`](Self::record)).
    pub fn record_service(&mut self, sent: Instant, done: Instant, answer: &Answer) {
        if self.window.contains(done) && answer.allowed + answer.denied > 0 {
            let ns = done.saturating_duration_since(sent).as_nanos();
            self.service
                .saturating_record(u64::try_from(ns).unwrap_or(u64::MAX).max(1));
        }
    }

    /// Open loop: a request due at `due` went out at `sent`.
    pub fn record_send_lag(&mut self, due: Instant, sent: Instant) {
        if self.window.contains(sent) {
            let ns = sent.saturating_duration_since(due).as_nanos();
            self.send_lag
                .saturating_record(u64::try_from(ns).unwrap_or(u64::MAX).max(1));
        }
    }

    pub fn add_unsent(&mut self, n: u64) {
        self.unsent += n;
    }

    pub fn merge(&mut self, other: Recorder) {
        self.latency
            .add(&other.latency)
            .expect("same histogram bounds");
        self.send_lag
            .add(&other.send_lag)
            .expect("same histogram bounds");
        self.service
            .add(&other.service)
            .expect("same histogram bounds");
        self.requests += other.requests;
        self.allowed += other.allowed;
        self.denied += other.denied;
        self.errors += other.errors;
        for (reason, n) in other.errors_by_reason {
            *self.errors_by_reason.entry(reason).or_default() += n;
        }
        self.unsent += other.unsent;
        if let (Some(mine), Some(theirs)) = (&mut self.timeline, other.timeline) {
            mine.merge(theirs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_outside_the_window_do_not_count() {
        let start = Instant::now() + Duration::from_secs(5);
        let window = Window {
            start,
            end: start + Duration::from_secs(1),
        };
        let mut r = Recorder::new(window);
        let ok = Answer {
            allowed: 1,
            ..Answer::default()
        };
        r.record(
            start - Duration::from_millis(2),
            start - Duration::from_millis(1),
            &ok,
        );
        r.record(window.end, window.end, &ok);
        assert_eq!(r.requests, 0);
        r.record(start, start, &ok);
        assert_eq!(r.requests, 1);
    }
}
