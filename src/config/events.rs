//! The decision events' settings (`--events*`): where events go, how the
//! broker is reached (TLS, credentials), which are sent, how many may
//! wait. See `crate::events`.

use super::{at_least, at_most, at_most_long, human, redacted, ConfigError};
use crate::events::{EventsConfig, NatsAuth};
use crate::units::parse_duration;
use clap::Args;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

pub const DEFAULT_EVENTS_SUBJECT: &str = "tollgate.decisions";
pub const DEFAULT_EVENTS_SAMPLE: f64 = 0.01;
pub const DEFAULT_EVENTS_QUEUE: usize = 65_536;
pub const DEFAULT_EVENTS_BATCH: usize = 256;
/// How long the publisher waits, after the first event of a batch, for
/// more to join it: one write to the broker per few milliseconds instead
/// of one per event (at 1% of 1M checks/s, 10,000 writes a second).
pub const DEFAULT_EVENTS_LINGER: &str = "5ms";
/// Longest linger accepted: events are for dashboards and alerts, which a
/// second's delay already blurs.
pub const MAX_EVENTS_LINGER: Duration = Duration::from_secs(1);
/// Most events that may wait: about 200 bytes each, so 400 MB at most.
pub const MAX_EVENTS_QUEUE: usize = 1 << 21;
/// Longest subject accepted (NATS has no hard limit; this is a typo guard).
pub const MAX_EVENTS_SUBJECT_LEN: usize = 256;

/// Decision events to NATS.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Decision events")]
#[serde(rename_all = "kebab-case")]
pub struct EventSettings {
    /// Publish decision events to this NATS server (`nats://HOST:PORT`, or
    /// `tls://HOST:PORT` to require TLS): every denial, shadow denial and
    /// refusal, and --events-sample of the allowed checks. Needs the cargo
    /// feature `events`.
    #[arg(long, value_name = "URL")]
    pub events: Option<String>,

    /// NATS subject the events are published on.
    #[arg(long, default_value = DEFAULT_EVENTS_SUBJECT)]
    pub events_subject: String,

    /// Fraction of allowed checks sent as events (0 to 1).
    #[arg(long, default_value_t = DEFAULT_EVENTS_SAMPLE)]
    pub events_sample: f64,

    /// Events waiting to be published at most; more are dropped (and
    /// counted), never waited for.
    #[arg(long, default_value_t = DEFAULT_EVENTS_QUEUE)]
    pub events_queue: usize,

    /// Events published per flush to NATS at most.
    #[arg(long, default_value_t = DEFAULT_EVENTS_BATCH)]
    pub events_batch: usize,

    /// How long the first event of a batch waits for more before the
    /// batch is published (0: at once; at most 1s). Fewer, larger writes
    /// to the broker, on the server's own cores.
    #[arg(long, default_value = DEFAULT_EVENTS_LINGER, value_parser = parse_duration)]
    #[serde(serialize_with = "human")]
    pub events_linger: Duration,

    /// Region stamped on every event (e.g. `eu-west-1`).
    #[arg(long)]
    pub events_region: Option<String>,

    /// CA (PEM) to verify the NATS server's certificate by; TLS is then
    /// required, whatever the scheme (default for `tls://`: the system's
    /// roots).
    #[arg(long, value_name = "FILE")]
    pub events_tls_ca: Option<PathBuf>,

    /// NATS user name (with --events-password).
    #[arg(long, env = "TOLLGATE_EVENTS_USER")]
    pub events_user: Option<String>,

    /// NATS password of --events-user.
    #[arg(long, env = "TOLLGATE_EVENTS_PASSWORD", hide_env_values = true)]
    #[serde(serialize_with = "redacted")]
    pub events_password: Option<String>,

    /// NATS authentication token (instead of a user and password).
    #[arg(long, env = "TOLLGATE_EVENTS_TOKEN", hide_env_values = true)]
    #[serde(serialize_with = "redacted")]
    pub events_token: Option<String>,
}

impl EventSettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if let Some(url) = &self.events {
            let rest = url
                .strip_prefix("nats://")
                .or_else(|| url.strip_prefix("tls://"))
                .unwrap_or("");
            if rest.is_empty() || rest.contains(['/', ' ']) {
                return Err(ConfigError::EventsUrl { url: url.clone() });
            }
        }
        self.auth()?;
        let subject = &self.events_subject;
        if subject.is_empty()
            || subject.len() > MAX_EVENTS_SUBJECT_LEN
            || subject
                .split('.')
                .any(|t| t.is_empty() || t == "*" || t == ">")
            || subject.contains(char::is_whitespace)
        {
            return Err(ConfigError::EventsSubject {
                subject: subject.clone(),
                max: MAX_EVENTS_SUBJECT_LEN,
            });
        }
        if !(0.0..=1.0).contains(&self.events_sample) {
            return Err(ConfigError::NotAFraction {
                name: "events-sample",
                value: self.events_sample.to_string(),
            });
        }
        at_least("events-queue", self.events_queue as u64, 1)?;
        at_most(
            "events-queue",
            self.events_queue as u64,
            MAX_EVENTS_QUEUE as u64,
        )?;
        at_least("events-batch", self.events_batch as u64, 1)?;
        at_most(
            "events-batch",
            self.events_batch as u64,
            self.events_queue as u64,
        )?;
        at_most_long("events-linger", self.events_linger, MAX_EVENTS_LINGER)?;
        Ok(())
    }

    /// What the publisher needs; `None` without `--events`.
    pub fn config(&self) -> Option<EventsConfig> {
        Some(EventsConfig {
            url: self.events.clone()?,
            subject: self.events_subject.clone(),
            sample: self.events_sample,
            queue: self.events_queue,
            batch: self.events_batch,
            linger: self.events_linger,
            region: self.events_region.clone(),
            tls_ca: self.events_tls_ca.clone(),
            // Checked by `validate`.
            auth: self.auth().unwrap_or(NatsAuth::None),
        })
    }

    /// The credentials given: a user with a password, a token, or none.
    fn auth(&self) -> Result<NatsAuth, ConfigError> {
        let refused = |reason| Err(ConfigError::EventsAuth { reason });
        match (&self.events_user, &self.events_password, &self.events_token) {
            (None, None, None) => Ok(NatsAuth::None),
            (Some(user), Some(password), None) => Ok(NatsAuth::UserPassword {
                user: user.clone(),
                password: password.clone(),
            }),
            (None, None, Some(token)) => Ok(NatsAuth::Token(token.clone())),
            (_, _, Some(_)) => {
                refused("give --events-token or --events-user with --events-password, not both")
            }
            (Some(_), None, _) => {
                refused("--events-user needs --events-password (or TOLLGATE_EVENTS_PASSWORD)")
            }
            (None, Some(_), _) => {
                refused("--events-password needs --events-user (or TOLLGATE_EVENTS_USER)")
            }
        }
    }
}
