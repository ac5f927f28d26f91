//! Decision events: every denial, every shadow denial, every refusal and a
//! sample of allowed checks, published fire-and-forget to NATS
//! (`--events nats://HOST:PORT`) for dashboards, alerts and analytics.
//!
//! ```text
//!  check path --Events::offer (sample, try_send)--> bounded queue
//!      --publisher task (next_batch: first event + linger, one NATS message
//!        per event, flush per batch)--> NATS
//! ```
//!
//! Invariants:
//! - the check path never waits: [`Events::offer`] samples, builds the
//!   event and `try_send`s it; a full queue drops the event and counts it
//!   (`tollgate_events_dropped_total{reason="queue_full"}`);
//! - the queue is bounded (`--events-queue`), so a slow or absent broker
//!   costs at most that many events of memory;
//! - what the node and region are is stamped by the publisher, not carried
//!   through the queue;
//! - the metrics exist whether or not events are on (a dashboard's queries
//!   always find them);
//! - the publisher wakes once per batch, not per event: after a batch's
//!   first event it sleeps `--events-linger` and then takes what has
//!   queued meanwhile, so a steady trickle of events costs one wake-up and
//!   one write to the broker per linger instead of one per event (the
//!   publisher runs on the server's own cores).
//!
//! The NATS side (`nats.rs`) needs the cargo feature `events` (async-nats);
//! without it `--events` is refused at start. The broker may ask for TLS
//! (`tls://`, `--events-tls-ca`, loaded at start like every other CA of
//! the server) and credentials (a user and password, or a token).

#[cfg(feature = "events")]
mod nats;

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tollgate_protocol::{ErrorCode, Limit};

/// How events are published: the `--events*` settings, checked.
#[derive(Debug, Clone)]
pub struct EventsConfig {
    /// `nats://HOST:PORT` or `tls://HOST:PORT`.
    pub url: String,
    pub subject: String,
    /// Fraction of allowed checks sent (denials and refusals: all).
    pub sample: f64,
    /// Events waiting at most; more are dropped.
    pub queue: usize,
    /// Events published per flush at most.
    pub batch: usize,
    /// How long a batch's first event waits for others
    /// (the publisher's `next_batch`).
    pub linger: std::time::Duration,
    /// Added to each event when set.
    pub region: Option<String>,
    /// CA to verify the broker by (TLS is then required).
    pub tls_ca: Option<PathBuf>,
    pub auth: NatsAuth,
}

/// The credentials presented to NATS.
#[derive(Clone, PartialEq, Eq)]
pub enum NatsAuth {
    None,
    UserPassword { user: String, password: String },
    Token(String),
}

/// Never prints a secret (the config is logged in debug output).
impl std::fmt::Debug for NatsAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => f.write_str("None"),
            Self::UserPassword { user, .. } => write!(f, "UserPassword({user:?}, <redacted>)"),
            Self::Token(_) => f.write_str("Token(<redacted>)"),
        }
    }
}

/// Why events cannot be published.
#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    #[error("--events needs the cargo feature `events` (this binary was built without it)")]
    NotBuilt,
    #[error("--events-tls-ca: {0}")]
    Tls(#[from] crate::tls::TlsError),
}

/// What a check came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Allowed,
    Denied,
    ShadowDenied,
    /// Answered with an error code instead of a decision.
    Refused,
}

/// One decision, as queued (the publisher adds `node` and `region`).
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// Unix time, milliseconds.
    pub time_ms: u64,
    /// The key of the pair that decided (lossy UTF-8; `key_hex` when it is
    /// not UTF-8).
    pub key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_hex: Option<String>,
    /// The named rule that decided; `None`: an inline limit.
    pub rule: Option<String>,
    /// The inline limit that decided (absent for a rule).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<InlineLimit>,
    /// Absent when the check named a rule that does not exist.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<&'static str>,
    pub decision: Outcome,
    /// The error code of a refusal (`"StoreFull"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<&'static str>,
    pub cost: u32,
    /// Units left after the check (absent for a refusal).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining: Option<u64>,
}

/// An inline limit, as events show it.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct InlineLimit {
    pub count: u64,
    pub period_ms: u64,
    pub burst: u64,
}

impl From<&Limit> for InlineLimit {
    fn from(l: &Limit) -> Self {
        Self {
            count: l.count,
            period_ms: l.period_ms,
            burst: l.burst,
        }
    }
}

/// The events' counters (`tollgate_events_*`).
#[derive(Debug, Clone)]
pub struct EventMetrics {
    pub published: IntCounter,
    pub dropped_full: IntCounter,
    pub dropped_failed: IntCounter,
    pub queued: IntGauge,
}

impl EventMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let published = IntCounter::new(
            "tollgate_events_published_total",
            "Decision events handed to the NATS client (--events): sent, or buffered \
             by it while it reconnects.",
        )?;
        let dropped = IntCounterVec::new(
            Opts::new(
                "tollgate_events_dropped_total",
                "Decision events dropped: the queue was full (queue_full) or the broker \
                 refused them (publish_failed).",
            ),
            &["reason"],
        )?;
        let queued = IntGauge::new(
            "tollgate_events_queued",
            "Decision events waiting to be published.",
        )?;
        registry.register(Box::new(published.clone()))?;
        registry.register(Box::new(dropped.clone()))?;
        registry.register(Box::new(queued.clone()))?;
        Ok(Self {
            published,
            dropped_full: dropped.with_label_values(&["queue_full"]),
            dropped_failed: dropped.with_label_values(&["publish_failed"]),
            queued,
        })
    }
}

/// The check path's end of the queue.
#[derive(Debug)]
pub struct Events {
    tx: mpsc::Sender<Event>,
    sample: f64,
    metrics: EventMetrics,
}

/// The publisher's end, started by [`Publisher::run`] once the node's
/// address is known.
#[cfg_attr(not(feature = "events"), allow(dead_code))]
pub struct Publisher {
    rx: mpsc::Receiver<Event>,
    config: EventsConfig,
    /// From `--events-tls-ca`, read at start.
    tls: Option<Arc<rustls::ClientConfig>>,
    metrics: EventMetrics,
}

/// The queue between the two.
pub fn channel(
    config: EventsConfig,
    metrics: EventMetrics,
) -> Result<(Events, Publisher), EventsError> {
    if !cfg!(feature = "events") {
        return Err(EventsError::NotBuilt);
    }
    let tls = match &config.tls_ca {
        Some(ca) => Some(crate::tls::client_config(ca)?),
        None => None,
    };
    let (tx, rx) = mpsc::channel(config.queue.max(1));
    Ok((
        Events {
            tx,
            sample: config.sample,
            metrics: metrics.clone(),
        },
        Publisher {
            rx,
            config,
            tls,
            metrics,
        },
    ))
}

/// What the check path knows of a decided check.
pub struct Decided<'a> {
    pub key: &'a [u8],
    pub rule: Option<&'a str>,
    /// The limit that decided (a rule's, or the inline one); None for an
    /// unknown rule.
    pub limit: Option<&'a Limit>,
    pub cost: u32,
    pub outcome: Outcome,
    pub remaining: Option<u64>,
    pub code: Option<ErrorCode>,
}

impl Events {
    /// Whether a check with this outcome is sent: all but allowed ones,
    /// and allowed ones with probability `--events-sample`. Cheap: one
    /// comparison, and a thread-local random number for allowed checks.
    pub fn wants(&self, outcome: Outcome) -> bool {
        outcome != Outcome::Allowed || (self.sample > 0.0 && fastrand::f64() < self.sample)
    }

    /// Queues the event of `d` without waiting; a full queue drops it
    /// (counted). Call only when [`wants`](Self::wants) said yes.
    pub fn offer(&self, d: Decided<'_>) {
        let (key, key_hex) = match std::str::from_utf8(d.key) {
            Ok(k) => (k.to_owned(), None),
            Err(_) => (
                String::from_utf8_lossy(d.key).into_owned(),
                Some(d.key.iter().map(|b| format!("{b:02x}")).collect()),
            ),
        };
        let event = Event {
            time_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |t| t.as_millis() as u64),
            key,
            key_hex,
            rule: d.rule.map(str::to_owned),
            limit: d.limit.filter(|_| d.rule.is_none()).map(InlineLimit::from),
            algorithm: d.limit.map(|l| l.algorithm.name()),
            decision: d.outcome,
            code: d.code.map(ErrorCode::name),
            cost: d.cost,
            remaining: d.remaining,
        };
        match self.tx.try_send(event) {
            Ok(()) => self.metrics.queued.inc(),
            Err(_) => self.metrics.dropped_full.inc(),
        }
    }
}

/// Waits for the next events and appends up to `limit` of them to
/// `batch`: the first one, then, after `linger` (none when the first
/// already fill it), whatever queued meanwhile. False when the queue is
/// closed and empty. Sleeping rather than receiving during the linger is
/// the point: each receive that waits is a wake-up per event.
#[cfg_attr(not(feature = "events"), allow(dead_code))]
pub(crate) async fn next_batch(
    rx: &mut mpsc::Receiver<Event>,
    batch: &mut Vec<Event>,
    limit: usize,
    linger: std::time::Duration,
) -> bool {
    if rx.recv_many(batch, limit).await == 0 {
        return false;
    }
    if batch.len() < limit && !linger.is_zero() {
        tokio::time::sleep(linger).await;
        while batch.len() < limit {
            match rx.try_recv() {
                Ok(event) => batch.push(event),
                Err(_) => break,
            }
        }
    }
    true
}

impl Publisher {
    /// Publishes until `stop`, then what is still queued (at most
    /// `grace`), then returns. `node` is this node's advertised address.
    #[cfg(feature = "events")]
    pub async fn run(
        self,
        node: String,
        stop: tokio_util::sync::CancellationToken,
        grace: std::time::Duration,
    ) {
        nats::publish(self, node, stop, grace).await;
    }

    /// Without the feature there is no publisher ([`channel`] refuses).
    #[cfg(not(feature = "events"))]
    pub async fn run(
        self,
        _node: String,
        _stop: tokio_util::sync::CancellationToken,
        _grace: std::time::Duration,
    ) {
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_protocol::Algorithm;

    #[test]
    fn denials_are_always_wanted_allowed_ones_by_sample() {
        let metrics = EventMetrics::register(&Registry::new()).unwrap();
        let (tx, _rx) = mpsc::channel(1);
        let none = Events {
            tx: tx.clone(),
            sample: 0.0,
            metrics: metrics.clone(),
        };
        assert!(none.wants(Outcome::Denied));
        assert!(none.wants(Outcome::ShadowDenied));
        assert!(none.wants(Outcome::Refused));
        assert!(!(0..1000).any(|_| none.wants(Outcome::Allowed)));
        let all = Events {
            tx,
            sample: 1.0,
            metrics,
        };
        assert!((0..1000).all(|_| all.wants(Outcome::Allowed)));
    }

    fn denial(key: &str) -> Event {
        Event {
            time_ms: 1,
            key: key.into(),
            key_hex: None,
            rule: Some("r".into()),
            limit: None,
            algorithm: Some("token-bucket"),
            decision: Outcome::Denied,
            code: None,
            cost: 1,
            remaining: Some(0),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_waits_the_linger_for_later_events() {
        let (tx, mut rx) = mpsc::channel(16);
        let linger = std::time::Duration::from_millis(5);
        tokio::spawn(async move {
            tx.send(denial("a")).await.unwrap();
            // Two more inside the linger, one after it.
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            tx.send(denial("b")).await.unwrap();
            tx.send(denial("c")).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            tx.send(denial("d")).await.unwrap();
        });
        let mut batch = Vec::new();
        assert!(next_batch(&mut rx, &mut batch, 8, linger).await);
        let keys: Vec<&str> = batch.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c"]);
        batch.clear();
        assert!(next_batch(&mut rx, &mut batch, 8, linger).await);
        assert_eq!(batch.len(), 1);
        // The sender is gone and the queue empty: the end.
        batch.clear();
        assert!(!next_batch(&mut rx, &mut batch, 8, linger).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_stops_at_its_limit_and_zero_linger_does_not_wait() {
        let (tx, mut rx) = mpsc::channel(16);
        for key in ["a", "b", "c"] {
            tx.send(denial(key)).await.unwrap();
        }
        let mut batch = Vec::new();
        let long = std::time::Duration::from_secs(3600);
        assert!(next_batch(&mut rx, &mut batch, 2, long).await);
        assert_eq!(batch.len(), 2);
        batch.clear();
        let before = tokio::time::Instant::now();
        tx.send(denial("d")).await.unwrap();
        assert!(next_batch(&mut rx, &mut batch, 8, std::time::Duration::ZERO).await);
        assert_eq!(batch.len(), 2, "c and d, at once");
        assert_eq!(tokio::time::Instant::now(), before);
    }

    #[test]
    fn a_full_queue_drops_and_counts() {
        let metrics = EventMetrics::register(&Registry::new()).unwrap();
        let (tx, _rx) = mpsc::channel(2);
        let events = Events {
            tx,
            sample: 1.0,
            metrics: metrics.clone(),
        };
        let limit = Limit {
            algorithm: Algorithm::TokenBucket,
            count: 1,
            period_ms: 1000,
            burst: 1,
        };
        for _ in 0..5 {
            events.offer(Decided {
                key: b"\xffk",
                rule: None,
                limit: Some(&limit),
                cost: 1,
                outcome: Outcome::Denied,
                remaining: Some(0),
                code: None,
            });
        }
        assert_eq!(metrics.queued.get(), 2);
        assert_eq!(metrics.dropped_full.get(), 3);
    }
}
