//! A node's etcd lease, seen from the node: the monotonic instant until
//! which it is *known* to be valid, and the task that renews it.
//!
//! The deadline is `sent + ttl - margin`, where `sent` is when the last
//! **acknowledged** renewal was sent (not when its answer came back: etcd
//! renewed the lease at some moment after `sent`, so its expiry is at least
//! `sent + ttl` on etcd's clock) and `margin` covers the difference of clock
//! rates between this node and the etcd leader. So whenever
//! [`LeaseDeadline::is_valid`] is true, etcd has not yet expired the lease,
//! hence has not handed the node's primary role to anyone else. That is
//! what lets a primary serve writes without asking etcd per request, and
//! what makes a primary that was paused past its TTL refuse when it
//! resumes: its deadline has passed, and only an acknowledged renewal can
//! move it.
//!
//! The deadline only moves forward. Once etcd answers that the lease is
//! gone, the deadline is *lost* for good: the node must join again with a
//! new lease (its registration and primary key went with the old one).
//! The check path reads one atomic ([`LeaseDeadline::is_valid_at`]); async
//! code can wait for changes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::Etcd;
use crate::sync::{AtomicU64, Ordering};

/// Pause before renewing again after a failed renewal (a broken stream, a
/// member down): short, so the lease is renewed through another member
/// well before the deadline, without spinning.
const RETRY_AFTER_FAILURE: Duration = Duration::from_millis(200);

/// The lease's validity as this node knows it.
#[derive(Debug)]
pub struct LeaseDeadline {
    lease: i64,
    origin: Instant,
    /// Nanoseconds after `origin` until which the lease is known valid;
    /// [`LOST`] once etcd said it is gone. Only grows until then.
    until: AtomicU64,
    /// Renewals acknowledged so far (for metrics and tests).
    renewals: AtomicU64,
    /// Wakes tasks waiting for a renewal or the loss (`until` as sent).
    changes: watch::Sender<u64>,
}

/// `until` value of a lease etcd no longer has.
const LOST: u64 = u64::MAX;

impl LeaseDeadline {
    /// A lease known valid until `until`.
    pub(crate) fn new(lease: i64, until: Instant) -> Arc<Self> {
        let origin = Instant::now();
        let nanos = Self::nanos(origin, until);
        Arc::new(Self {
            lease,
            origin,
            until: AtomicU64::new(nanos),
            renewals: AtomicU64::new(0),
            changes: watch::Sender::new(nanos),
        })
    }

    fn nanos(origin: Instant, t: Instant) -> u64 {
        // Saturates below LOST: a deadline 584 years away is not a thing.
        u64::try_from(t.saturating_duration_since(origin).as_nanos())
            .map_or(LOST - 1, |n| n.min(LOST - 1))
    }

    /// The etcd lease id.
    pub fn lease_id(&self) -> i64 {
        self.lease
    }

    /// Until when the lease is known valid; None once it is lost.
    pub fn valid_until(&self) -> Option<Instant> {
        // Relaxed: the value is self-contained, and a reader that sees an
        // older (smaller) deadline only refuses a little early.
        match self.until.load(Ordering::Relaxed) {
            LOST => None,
            n => Some(self.origin + Duration::from_nanos(n)),
        }
    }

    /// True while `now` is before the deadline (the check path's test).
    pub fn is_valid_at(&self, now: Instant) -> bool {
        self.valid_until().is_some_and(|until| now < until)
    }

    pub fn is_valid(&self) -> bool {
        self.is_valid_at(Instant::now())
    }

    /// Time left before the deadline (zero once passed or lost).
    pub fn time_left(&self) -> Duration {
        self.valid_until().map_or(Duration::ZERO, |until| {
            until.saturating_duration_since(Instant::now())
        })
    }

    /// True once etcd said the lease is gone.
    pub fn is_lost(&self) -> bool {
        self.until.load(Ordering::Relaxed) == LOST
    }

    /// Renewals acknowledged by etcd since the lease was granted.
    pub fn renewals(&self) -> u64 {
        self.renewals.load(Ordering::Relaxed)
    }

    /// Moves the deadline to `until` if that is later.
    pub(crate) fn extend(&self, until: Instant) {
        let nanos = Self::nanos(self.origin, until);
        let before = self.until.fetch_max(nanos, Ordering::Relaxed);
        if before != LOST {
            self.renewals.fetch_add(1, Ordering::Relaxed);
            self.changes.send_replace(nanos.max(before));
        }
    }

    pub(crate) fn lose(&self) {
        self.until.store(LOST, Ordering::Relaxed);
        self.changes.send_replace(LOST);
    }

    /// Resolves once the deadline has passed (or the lease is lost) with
    /// no renewal moving it in time.
    pub async fn expired(&self) {
        let mut changes = self.changes.subscribe();
        loop {
            let Some(until) = self.valid_until() else {
                return;
            };
            if Instant::now() >= until {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(until.into()) => {}
                _ = changes.changed() => {}
            }
        }
    }

    /// Resolves once the lease is known valid past `t` (true), or lost
    /// (false).
    pub async fn valid_past(&self, t: Instant) -> bool {
        let mut changes = self.changes.subscribe();
        loop {
            match self.valid_until() {
                None => return false,
                Some(until) if until > t => return true,
                Some(_) => {}
            }
            if changes.changed().await.is_err() {
                return false;
            }
        }
    }
}

/// Renews `deadline`'s lease every `interval` until `cancel`, or until
/// etcd says the lease is gone. `ttl` is the granted TTL, `margin` comes
/// off every deadline. One renewal is in flight at a time, so each answer
/// belongs to the last renewal sent.
pub(crate) async fn renew(
    etcd: Etcd,
    deadline: Arc<LeaseDeadline>,
    ttl: Duration,
    interval: Duration,
    margin: Duration,
    cancel: CancellationToken,
) {
    let id = deadline.lease_id();
    let mut stream: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
    let mut next = Instant::now() + interval;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep_until(next.into()) => {}
        }
        let sent = Instant::now();
        let answer = tokio::time::timeout(etcd.request_timeout(), async {
            match &mut stream {
                // Opening the stream sends a first renewal and waits for
                // its answer (etcd-client checks that its TTL is above 0).
                None => {
                    let opened = etcd.client().lease_keep_alive(id).await?;
                    stream = Some(opened);
                    Ok(Some(ttl))
                }
                Some((keeper, responses)) => {
                    keeper.keep_alive().await?;
                    match responses.message().await? {
                        Some(r) if r.ttl() > 0 => Ok(Some(Duration::from_secs(r.ttl() as u64))),
                        Some(_) => Ok(None),
                        None => Err(etcd_client::Error::LeaseKeepAliveError(
                            "keepalive stream closed".into(),
                        )),
                    }
                }
            }
        })
        .await;
        match answer {
            Ok(Ok(Some(granted))) => {
                deadline.extend(sent + granted.saturating_sub(margin));
                next = sent + interval;
            }
            Ok(Ok(None)) => return lost(&deadline),
            Ok(Err(e)) if is_lease_gone(&e) => return lost(&deadline),
            Ok(Err(e)) => {
                tracing::warn!(lease = format!("{id:x}"), error = %e, "etcd lease renewal failed");
                stream = None;
                next = sent + RETRY_AFTER_FAILURE.min(interval);
            }
            Err(_) => {
                tracing::warn!(
                    lease = format!("{id:x}"),
                    "etcd lease renewal got no answer in time"
                );
                stream = None;
                next = Instant::now() + RETRY_AFTER_FAILURE.min(interval);
            }
        }
    }
}

fn lost(deadline: &LeaseDeadline) {
    tracing::error!(
        lease = format!("{:x}", deadline.lease_id()),
        "etcd lease expired: registration and primary role are gone"
    );
    deadline.lose();
}

/// True when etcd answered that the lease does not exist (any more):
/// etcd-client's own check on opening the stream, or etcd's gRPC error
/// "etcdserver: requested lease not found".
fn is_lease_gone(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::LeaseKeepAliveError(msg) => msg.contains("not found"),
        etcd_client::Error::GRpcStatus(status) => status.message().contains("lease not found"),
        _ => false,
    }
}
