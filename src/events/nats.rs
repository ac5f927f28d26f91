//! The publisher task: takes queued events in batches and publishes each
//! as one NATS message (JSON) on `--events-subject`, flushing once per
//! batch.
//!
//! The client connects in the background and keeps reconnecting
//! (async-nats's own backoff): while the broker is away, its buffer and
//! then the queue fill, and new events are dropped and counted on the
//! check path. A publish the client refuses is counted as
//! `publish_failed`. On stop, what is queued is published within the
//! grace period (`--shutdown-grace`), then flushed; with the broker away,
//! the stop waits that long.

use super::{Event, Publisher};
use serde::Serialize;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub(super) async fn publish(
    mut publisher: Publisher,
    node: String,
    stop: CancellationToken,
    grace: Duration,
) {
    let config = &publisher.config;
    let client = match async_nats::ConnectOptions::new()
        .name("tollgate")
        .retry_on_initial_connect()
        .connect(config.url.as_str())
        .await
    {
        Ok(client) => client,
        Err(e) => {
            // Only an unusable address gets here (retrying covers an
            // absent broker): events are dropped as the queue fills.
            tracing::error!(url = %config.url, error = %e, "decision events: cannot connect to NATS");
            return;
        }
    };
    tracing::info!(url = %config.url, subject = %config.subject, "decision events to NATS");
    let stamp = Stamp {
        node,
        region: config.region.clone(),
    };
    let subject = config.subject.clone();
    let metrics = publisher.metrics.clone();
    let mut batch = Vec::with_capacity(config.batch);
    let limit = config.batch;
    let send = |batch: &mut Vec<Event>| {
        let client = &client;
        let subject = &subject;
        let metrics = &metrics;
        let stamp = &stamp;
        let events = std::mem::take(batch);
        async move {
            metrics.queued.sub(events.len() as i64);
            for event in &events {
                let payload = encode(event, stamp);
                match client.publish(subject.clone(), payload.into()).await {
                    Ok(()) => metrics.published.inc(),
                    Err(e) => {
                        tracing::debug!(error = %e, "decision event not published");
                        metrics.dropped_failed.inc();
                    }
                }
            }
            if let Err(e) = client.flush().await {
                tracing::debug!(error = %e, "decision events: flush failed");
            }
        }
    };
    let rx = &mut publisher.rx;
    let steady = async {
        loop {
            if rx.recv_many(&mut batch, limit).await == 0 {
                return;
            }
            send(&mut batch).await;
        }
    };
    // A publish waiting on an absent broker must not hold up the stop: the
    // batch in flight is given up (at most --events-batch events).
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = steady => return,
    }
    batch.clear();
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
            send(&mut batch).await;
        }
    };
    if tokio::time::timeout(grace, drain).await.is_err() {
        tracing::warn!("decision events: not all queued events were published before stopping");
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
