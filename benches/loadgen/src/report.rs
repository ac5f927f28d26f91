//! How a run is shown: the merged [`Recorder`] of each target becomes one
//! [`Summary`], printed as a human table, as one JSON line per target
//! (`--json`), and as ratios between targets. What is counted, and when,
//! is the recorder's business (see [`crate::recorder`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::recorder::Recorder;
use crate::timeline::{Sample, Timeline};

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
    /// Per-interval samples (`--plot`; empty without it).
    #[serde(skip)]
    pub samples: Vec<Sample>,
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
            samples: recorder
                .timeline
                .as_ref()
                .map(Timeline::samples)
                .unwrap_or_default(),
        }
    }

    /// The `--json` line.
    pub fn json_line(&self) -> String {
        serde_json::to_string(self).expect("a summary always serializes")
    }
}

/// Thousands separators for the table.
pub fn grouped(n: f64) -> String {
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
    use crate::recorder::Window;
    use crate::targets::Answer;
    use std::time::{Duration, Instant};

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
