//! The publisher task: takes queued events in batches (the first event,
//! then what queues within `--events-linger`) and publishes each as one
//! NATS message (JSON) on `--events-subject`, flushing once per batch.
//!
//! The client connects in the background and keeps reconnecting
//! (async-nats's own backoff): while the broker is away, its buffer and
//! then the queue fill, and new events are dropped and counted on the
//! check path. A publish the client refuses is counted as
//! `publish_failed`. On stop, what is queued is published within the
//! grace period (`--shutdown-grace`), then flushed; with the broker away,
//! the stop waits that long.
//!
//! A broker that refuses the credentials or the TLS handshake is retried
//! like an absent one; the first failure of each run of them is logged at
//! error level, naming the settings to check, so a wrong password shows in
//! the log rather than only as dropped events. Checks never wait on any of
//! this.

use super::{next_batch, Event, EventMetrics, NatsAuth, Publisher};
use async_nats::{ClientError, ConnectOptions};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub(super) async fn publish(
    mut publisher: Publisher,
    node: String,
    stop: CancellationToken,
    grace: Duration,
) {
    let Some(client) = connect(&publisher).await else {
        return;
    };
    let config = &publisher.config;
    let sender = Sender {
        client,
        subject: config.subject.clone(),
        metrics: publisher.metrics.clone(),
        stamp: Stamp {
            node,
            region: config.region.clone(),
        },
    };
    let (limit, linger) = (config.batch, config.linger);
    let mut batch = Vec::with_capacity(limit);
    let rx = &mut publisher.rx;
    let steady = async {
        while next_batch(rx, &mut batch, limit, linger).await {
            sender.send(&mut batch).await;
        }
    };
    // A publish waiting on an absent broker must not hold up the stop: the
    // batch in flight is given up (at most --events-batch events). A batch
    // still lingering is not in flight: it is published below.
    tokio::select! {
        _ = stop.cancelled() => {}
        () = steady => return,
    }
    // Stopping: what is queued now goes out, within the grace period.
    let drain = async {
        loop {
            while batch.len() < limit {
                match rx.try_recv() {
                    Ok(event) => batch.push(event),
                    Err(_) => break,
                }
            }
            if batch.is_empty() {
                break;
            }
            sender.send(&mut batch).await;
        }
    };
    if tokio::time::timeout(grace, drain).await.is_err() {
        tracing::warn!("decision events: not all queued events were published before stopping");
    }
}

/// The NATS client, connecting (and reconnecting) in the background;
/// `None` (logged) only for an unusable address.
async fn connect(publisher: &Publisher) -> Option<async_nats::Client> {
    let config = &publisher.config;
    let url = shown(&config.url);
    let tls = publisher.tls.is_some() || config.url.starts_with("tls://");
    let options = connect_options(publisher).event_callback({
        let url = url.clone();
        let failing = Arc::new(AtomicBool::new(false));
        move |event| log_event(event, url.clone(), tls, failing.clone())
    });
    match options.connect(config.url.as_str()).await {
        Ok(client) => {
            tracing::info!(%url, subject = %config.subject, tls, "decision events to NATS");
            Some(client)
        }
        Err(e) => {
            // Only an unusable address gets here (retrying covers an
            // absent broker): events are dropped as the queue fills.
            tracing::error!(%url, error = %e, "decision events: cannot connect to NATS");
            None
        }
    }
}

/// Publishes batches of events on the subject, each stamped.
struct Sender {
    client: async_nats::Client,
    subject: String,
    metrics: EventMetrics,
    stamp: Stamp,
}

impl Sender {
    /// Publishes (and empties) `batch`, one message per event, then
    /// flushes once.
    async fn send(&self, batch: &mut Vec<Event>) {
        let events = std::mem::take(batch);
        self.metrics.queued.sub(events.len() as i64);
        for event in &events {
            let payload = encode(event, &self.stamp);
            match self
                .client
                .publish(self.subject.clone(), payload.into())
                .await
            {
                Ok(()) => self.metrics.published.inc(),
                Err(e) => {
                    tracing::debug!(error = %e, "decision event not published");
                    self.metrics.dropped_failed.inc();
                }
            }
        }
        if let Err(e) = self.client.flush().await {
            tracing::debug!(error = %e, "decision events: flush failed");
        }
    }
}

/// The client's options: a name, retrying from the start, the TLS config
/// of `--events-tls-ca` (TLS then required) and the credentials.
fn connect_options(publisher: &Publisher) -> ConnectOptions {
    let mut options = ConnectOptions::new()
        .name("tollgate")
        .retry_on_initial_connect();
    if let Some(tls) = &publisher.tls {
        options = options
            .tls_client_config(rustls::ClientConfig::clone(tls))
            .require_tls(true);
    }
    match &publisher.config.auth {
        NatsAuth::None => options,
        NatsAuth::UserPassword { user, password } => {
            options.user_and_password(user.clone(), password.clone())
        }
        NatsAuth::Token(token) => options.token(token.clone()),
    }
}

/// Logs what the client reports: the first connection failure of a run at
/// error level with what to check, the rest of the run at debug (the
/// client retries every few seconds), and every (re)connection.
async fn log_event(event: async_nats::Event, url: String, tls: bool, failing: Arc<AtomicBool>) {
    match event {
        async_nats::Event::Connected => {
            failing.store(false, Ordering::Relaxed);
            tracing::info!(%url, "decision events: connected to NATS");
        }
        async_nats::Event::Disconnected => {
            tracing::warn!(%url, "decision events: disconnected from NATS; reconnecting");
        }
        async_nats::Event::ClientError(ClientError::Other(error)) => {
            let hint = hint(&error, tls);
            if failing.swap(true, Ordering::Relaxed) {
                tracing::debug!(%url, %error, hint, "decision events: cannot connect to NATS");
            } else {
                tracing::error!(%url, %error, hint, "decision events: cannot connect to NATS");
            }
        }
        async_nats::Event::ServerError(error) => {
            tracing::warn!(%url, %error, "decision events: NATS server error");
        }
        event => tracing::debug!(%url, %event, "decision events: NATS client"),
    }
}

/// What to check for a connection error of the client. Its kinds are only
/// text by the time they are reported, and a certificate the CA does not
/// verify is reported as an I/O error, like a refused connection.
fn hint(error: &str, tls: bool) -> &'static str {
    if error.contains("authorization") || error.contains("nonce") {
        "NATS refused the credentials: check --events-user/--events-password (TOLLGATE_EVENTS_USER, TOLLGATE_EVENTS_PASSWORD) or --events-token (TOLLGATE_EVENTS_TOKEN)"
    } else if error.contains("TLS") || tls {
        "the broker is unreachable or the TLS handshake failed: check the address, tls:// and --events-tls-ca against the server's certificate; retrying (events are dropped once --events-queue is full)"
    } else {
        "the broker is unreachable: check the address; retrying (events are dropped once --events-queue is full)"
    }
}

/// `url` without a `user:password@` part, for the log.
fn shown(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((_, host)) => format!("{scheme}://<redacted>@{host}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// What the publisher stamps on every event it sends.
#[derive(Debug, Clone, Serialize)]
struct Stamp {
    node: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    region: Option<String>,
}

/// The message sent: the event and the stamp, one flat JSON object.
#[derive(Serialize)]
struct Message<'a> {
    #[serde(flatten)]
    event: &'a Event,
    #[serde(flatten)]
    stamp: &'a Stamp,
}

/// One event as the JSON the broker receives.
fn encode(event: &Event, stamp: &Stamp) -> Vec<u8> {
    // Serializing plain fields cannot fail.
    serde_json::to_vec(&Message { event, stamp }).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::super::{InlineLimit, Outcome};
    use super::*;

    fn event() -> Event {
        Event {
            time_ms: 1,
            key: "k".into(),
            key_hex: None,
            rule: None,
            limit: Some(InlineLimit {
                count: 5,
                period_ms: 1000,
                burst: 10,
            }),
            algorithm: Some("token-bucket"),
            decision: Outcome::ShadowDenied,
            code: None,
            cost: 2,
            remaining: Some(0),
        }
    }

    #[test]
    fn credentials_in_the_url_are_not_logged() {
        assert_eq!(shown("nats://u:p@h:4222"), "nats://<redacted>@h:4222");
        assert_eq!(shown("tls://h:4222"), "tls://h:4222");
        assert!(hint("authorization violation", true).contains("--events-password"));
        assert!(hint("TLS error", false).contains("--events-tls-ca"));
        assert!(hint("IO error", true).contains("--events-tls-ca"));
        assert!(!hint("IO error", false).contains("--events-tls-ca"));
    }

    #[test]
    fn an_event_is_one_flat_json_object() {
        let stamp = Stamp {
            node: "n1:7700".into(),
            region: Some("eu".into()),
        };
        let v: serde_json::Value = serde_json::from_slice(&encode(&event(), &stamp)).unwrap();
        assert_eq!(v["decision"], "shadow_denied");
        assert_eq!(v["node"], "n1:7700");
        assert_eq!(v["region"], "eu");
        assert_eq!(v["limit"]["burst"], 10);
        assert_eq!(v["rule"], serde_json::Value::Null);
        assert!(v.get("code").is_none());
    }
}
