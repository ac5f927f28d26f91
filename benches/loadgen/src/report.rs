//! What a run measured, and how it is shown: per-connection recorders merged
//! into one [`Summary`] per target, printed as a human table, as one JSON
//! line per target (`--json`), and as ratios between targets.
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
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::targets::Answer;

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
    window: Window,
    /// Request latency in ns.
    latency: Histogram<u32>,
    /// Open loop: how late each request was sent after its due time, in
    /// ns (the generator's own lag, or a full pipeline). Part of `latency`.
    send_lag: Histogram<u32>,
    /// Open loop: latency from the actual send, in ns (what the server and
    /// the network took, without the generator's lag).
    service: Histogram<u32>,
    requests: u64,
    allowed: u64,
    denied: u64,
    errors: u64,
    errors_by_reason: BTreeMap<String, u64>,
    /// Open loop: requests due before the end that were never sent because
    /// the connection was still behind schedule.
    unsent: u64,
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
        }
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
        if answer.allowed + answer.denied > 0 {
            let ns = done.saturating_duration_since(from).as_nanos();
            self.latency
                .saturating_record(u64::try_from(ns).unwrap_or(u64::MAX).max(1));
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
    }
}

/// The workload, as it goes into every report line.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadFields {
    /// `closed` (as fast as answers come) or `open` (fixed arrival rate).
    pub mode: &'static str,
    pub connections: u32,
    /// Requests in flight per connection.
    pub pipeline: u32,
    /// Checks per request.
    pub batch: u32,
    pub keys: u32,
    pub distribution: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zipf_skew: Option<f64>,
    pub cost: u32,
    /// Token bucket refill, as given (`100/min`).
    pub limit_rate: String,
    pub limit_burst: u64,
    /// Open loop: target arrival rate in checks/s (`null` when closed).
    pub rate: Option<f64>,
    pub duration_s: f64,
    pub warmup_s: f64,
    /// Worker threads of the generator.
    pub threads: usize,
    pub deadline_ms: u64,
}

/// One target's result; one JSON line with `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub target: &'static str,
    pub addr: String,
    /// The server's self-description (version, limits).
    pub server: String,
    /// Decided checks (allowed + denied) per second of the window.
    pub ops_per_sec: f64,
    /// Requests (frames / pipelines) answered per second.
    pub requests_per_sec: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
    /// What the latency figures measure.
    pub latency: &'static str,
    pub checks: u64,
    pub allowed: u64,
    pub denied: u64,
    pub errors: u64,
    pub errors_by_reason: BTreeMap<String, u64>,
    pub requests: u64,
    /// Open loop: requests due in the run but never sent (behind schedule).
    pub unsent: u64,
    /// Open loop: how late requests left after their due time (generator
    /// lag or a full pipeline), p50/p99/max in µs; `null` in closed loop.
    pub send_lag_p50_us: Option<f64>,
    pub send_lag_p99_us: Option<f64>,
    pub send_lag_max_us: Option<f64>,
    /// Open loop: latency from the actual send (server and network only),
    /// p50/p99/p99.9 in µs; `null` in closed loop, whose `p50_us` and
    /// others are already measured from the actual send.
    pub service_p50_us: Option<f64>,
    pub service_p99_us: Option<f64>,
    pub service_p999_us: Option<f64>,
    #[serde(flatten)]
    pub workload: WorkloadFields,
}

/// Latency quantile in µs, one decimal.
fn quantile_us(h: &Histogram<u32>, q: f64) -> f64 {
    if h.is_empty() {
        return 0.0;
    }
    round1(h.value_at_quantile(q) as f64 / 1_000.0)
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

impl Summary {
    pub fn new(
        target: &'static str,
        addr: String,
        server: String,
        recorder: &Recorder,
        workload: WorkloadFields,
    ) -> Self {
        let secs = recorder.window.length().as_secs_f64();
        let h = &recorder.latency;
        let checks = recorder.allowed + recorder.denied;
        let open = workload.mode == "open";
        Self {
            target,
            addr,
            server,
            ops_per_sec: (checks as f64 / secs).round(),
            requests_per_sec: (recorder.requests as f64 / secs).round(),
            p50_us: quantile_us(h, 0.50),
            p90_us: quantile_us(h, 0.90),
            p99_us: quantile_us(h, 0.99),
            p999_us: quantile_us(h, 0.999),
            max_us: if h.is_empty() {
                0.0
            } else {
                round1(h.max() as f64 / 1_000.0)
            },
            mean_us: if h.is_empty() {
                0.0
            } else {
                round1(h.mean() / 1_000.0)
            },
            latency: if open {
                "per request, from its intended send time"
            } else {
                "per request, from send to answer"
            },
            checks,
            allowed: recorder.allowed,
            denied: recorder.denied,
            errors: recorder.errors,
            errors_by_reason: recorder.errors_by_reason.clone(),
            requests: recorder.requests,
            unsent: recorder.unsent,
            send_lag_p50_us: open.then(|| quantile_us(&recorder.send_lag, 0.5)),
            send_lag_p99_us: open.then(|| quantile_us(&recorder.send_lag, 0.99)),
            send_lag_max_us: open.then(|| quantile_us(&recorder.send_lag, 1.0)),
            service_p50_us: open.then(|| quantile_us(&recorder.service, 0.5)),
            service_p99_us: open.then(|| quantile_us(&recorder.service, 0.99)),
            service_p999_us: open.then(|| quantile_us(&recorder.service, 0.999)),
            workload,
        }
    }

    /// The `--json` line.
    pub fn json_line(&self) -> String {
        serde_json::to_string(self).expect("a summary always serializes")
    }
}

/// Thousands separators for the table.
fn grouped(n: f64) -> String {
    let s = format!("{:.0}", n.max(0.0));
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The workload line printed above the table.
pub fn describe_workload(w: &WorkloadFields) -> String {
    let mut s = format!(
        "{} loop, {} connections x pipeline {} x batch {}, {} keys {}",
        w.mode, w.connections, w.pipeline, w.batch, w.keys, w.distribution
    );
    if let Some(skew) = w.zipf_skew {
        let _ = write!(s, " (skew {skew})");
    }
    let _ = write!(
        s,
        ", token bucket {} burst {} cost {}, {}s after {}s warm-up, {} generator threads",
        w.limit_rate, w.limit_burst, w.cost, w.duration_s, w.warmup_s, w.threads
    );
    if let Some(rate) = w.rate {
        let _ = write!(s, ", arrival rate {} checks/s", grouped(rate));
    }
    s
}

/// The human table: one row per target, then error reasons and ratios.
pub fn table(summaries: &[Summary]) -> String {
    let mut out = String::new();
    if let Some(first) = summaries.first() {
        let _ = writeln!(out, "{}", describe_workload(&first.workload));
        let _ = writeln!(out, "latency: {}, in µs", first.latency);
    }
    let _ = writeln!(
        out,
        "{:<13} {:<22} {:>12} {:>10} {:>9} {:>9} {:>9} {:>10} {:>12} {:>10} {:>8}",
        "target",
        "addr",
        "checks/s",
        "req/s",
        "p50",
        "p99",
        "p99.9",
        "max",
        "allowed",
        "denied",
        "errors"
    );
    for s in summaries {
        let _ = writeln!(
            out,
            "{:<13} {:<22} {:>12} {:>10} {:>9.1} {:>9.1} {:>9.1} {:>10.1} {:>12} {:>10} {:>8}",
            s.target,
            s.addr,
            grouped(s.ops_per_sec),
            grouped(s.requests_per_sec),
            s.p50_us,
            s.p99_us,
            s.p999_us,
            s.max_us,
            s.allowed,
            s.denied,
            s.errors
        );
    }
    for s in summaries {
        if !s.server.is_empty() {
            let _ = writeln!(out, "  {}: {}", s.target, s.server);
        }
        for (reason, n) in &s.errors_by_reason {
            let _ = writeln!(out, "  {} errors: {n} x {reason}", s.target);
        }
        if let (Some(p50), Some(p99), Some(max)) =
            (s.send_lag_p50_us, s.send_lag_p99_us, s.send_lag_max_us)
        {
            let _ = writeln!(
                out,
                "  {}: requests left after their due time by p50 {p50:.1} µs, p99 {p99:.1} µs, \
                 max {max:.1} µs (generator lag or a full pipeline; included in the latency)",
                s.target
            );
        }
        if let (Some(p50), Some(p99), Some(p999)) =
            (s.service_p50_us, s.service_p99_us, s.service_p999_us)
        {
            let _ = writeln!(
                out,
                "  {}: latency from the actual send (without that lag): \
                 p50 {p50:.1} µs, p99 {p99:.1} µs, p99.9 {p999:.1} µs",
                s.target
            );
        }
        if s.unsent > 0 {
            let _ = writeln!(
                out,
                "  {}: {} requests fell behind the schedule and were never sent: \
                 the target (or the generator) could not keep up with the rate; \
                 latencies understate the backlog",
                s.target, s.unsent
            );
        }
        if let Some(rate) = s.workload.rate {
            if s.ops_per_sec < 0.95 * rate {
                let _ = writeln!(
                    out,
                    "  {}: reached {} of the {} checks/s asked for",
                    s.target,
                    grouped(s.ops_per_sec),
                    grouped(rate)
                );
            }
        }
    }
    out.push_str(&ratios(summaries));
    out
}

/// `tollgate / other` for each other target: throughput, and latency (lower
/// is better, so a ratio below 1 means Tollgate answers faster).
pub fn ratios(summaries: &[Summary]) -> String {
    let mut out = String::new();
    let Some(base) = summaries.iter().find(|s| s.target == "tollgate") else {
        return out;
    };
    for other in summaries.iter().filter(|s| s.target != "tollgate") {
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        let _ = writeln!(
            out,
            "tollgate / {}: {:.2}x checks/s; latency p50 {:.2}x, p99 {:.2}x",
            other.target,
            ratio(base.ops_per_sec, other.ops_per_sec),
            ratio(base.p50_us, other.p50_us),
            ratio(base.p99_us, other.p99_us),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload() -> WorkloadFields {
        WorkloadFields {
            mode: "closed",
            connections: 2,
            pipeline: 4,
            batch: 8,
            keys: 1000,
            distribution: "zipf",
            zipf_skew: Some(0.99),
            cost: 1,
            limit_rate: "100/min".to_owned(),
            limit_burst: 100,
            rate: None,
            duration_s: 1.0,
            warmup_s: 0.0,
            threads: 2,
            deadline_ms: 1000,
        }
    }

    fn recorder_with(window: Window, latencies_us: &[u64]) -> Recorder {
        let mut r = Recorder::new(window);
        for &us in latencies_us {
            let done = window.start + Duration::from_millis(1);
            let answer = Answer {
                allowed: 7,
                denied: 1,
                ..Answer::default()
            };
            r.record(done - Duration::from_micros(us), done, &answer);
        }
        r
    }

    #[test]
    fn json_line_has_the_promised_fields() {
        let start = Instant::now();
        let window = Window {
            start,
            end: start + Duration::from_secs(1),
        };
        let mut r = recorder_with(window, &[100, 200, 300]);
        r.record(
            start + Duration::from_millis(2),
            start + Duration::from_millis(3),
            &Answer::failed(8, "deadline exceeded"),
        );
        let s = Summary::new(
            "tollgate",
            "127.0.0.1:1".into(),
            String::new(),
            &r,
            workload(),
        );
        let line = s.json_line();
        assert!(!line.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        for field in [
            "target",
            "ops_per_sec",
            "p50_us",
            "p99_us",
            "p999_us",
            "max_us",
            "errors",
            "connections",
            "pipeline",
            "batch",
            "keys",
            "distribution",
            "zipf_skew",
            "mode",
            "rate",
            "limit_rate",
            "limit_burst",
            "cost",
            "duration_s",
        ] {
            assert!(v.get(field).is_some(), "missing {field} in {line}");
        }
        assert_eq!(v["target"], "tollgate");
        assert_eq!(v["checks"], 24);
        assert_eq!(v["ops_per_sec"], 24.0);
        assert_eq!(v["requests"], 4);
        assert_eq!(v["errors"], 8);
        assert_eq!(v["errors_by_reason"]["deadline exceeded"], 8);
        assert!(v["rate"].is_null());
        // HDR with 3 significant digits: within 0.1%.
        let p50 = v["p50_us"].as_f64().unwrap();
        assert!((p50 - 200.0).abs() < 0.5, "{p50}");
        let max = v["max_us"].as_f64().unwrap();
        assert!((max - 300.0).abs() < 0.5, "{max}");
    }

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

    #[test]
    fn merged_recorders_add_up_and_ratios_compare_tollgate() {
        let start = Instant::now();
        let window = Window {
            start,
            end: start + Duration::from_secs(1),
        };
        let mut a = recorder_with(window, &[100; 10]);
        a.merge(recorder_with(window, &[100; 10]));
        let tollgate = Summary::new("tollgate", "a:1".into(), String::new(), &a, workload());
        let b = recorder_with(window, &[400; 5]);
        let redis = Summary::new("redis", "b:2".into(), String::new(), &b, workload());
        assert_eq!(tollgate.requests, 20);
        assert_eq!(tollgate.ops_per_sec, 160.0);
        let text = ratios(&[tollgate.clone(), redis.clone()]);
        assert!(text.contains("tollgate / redis: 4.00x checks/s"), "{text}");
        assert!(text.contains("p50 0.25x"), "{text}");
        let table = table(&[tollgate, redis]);
        assert!(table.contains("closed loop, 2 connections x pipeline 4 x batch 8"));
        assert_eq!(grouped(1234567.0), "1,234,567");
        assert_eq!(grouped(999.0), "999");
    }
}
