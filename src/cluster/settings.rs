//! How a node talks to etcd and how long its lease lives. Every number is a
//! setting with a named default; [`EtcdSettings::validate`] only checks.

use std::time::Duration;

use super::{ClusterError, EtcdAccess};
use crate::addr::etcd_endpoint;

/// etcd's own ceiling on a lease's TTL (`MaxLeaseTTL`, 9e9 s): a longer
/// one is refused here rather than sent, since past 2^63 s it would not
/// even fit the signed number etcd's request carries (etcd then granted
/// its 2 s minimum).
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(9_000_000_000);

/// TTL of a node's etcd lease: how long after its last renewal etcd keeps
/// the node's registration and primary key. A failover takes about this
/// long. etcd grants whole seconds, and never less than its own minimum
/// (1.5 x the election timeout, 2 s with etcd's defaults).
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(5);
/// Taken off the lease's expiry when computing the node's deadline: covers
/// the rate difference between the node's clock and the etcd leader's over
/// one TTL, with room to spare.
pub const DEFAULT_LEASE_MARGIN: Duration = Duration::from_millis(500);
/// How often the lease is renewed while renewals succeed.
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// Below this much [`EtcdSettings::election_slack`] a node warns at start:
/// etcd elects a new leader in one to two election timeouts (1-2 s at its
/// defaults, more on a loaded host), and a primary whose renewals wait
/// longer than its slack answers TryAgain meanwhile.
pub const SHORT_ELECTION_SLACK: Duration = Duration::from_secs(2);
/// Longest wait for one etcd request (a keepalive's answer included).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait for a TCP connection to an etcd member.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The etcd side of cluster mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdSettings {
    /// etcd members, `HOST:PORT` (or full `http://` URLs).
    pub endpoints: Vec<String>,
    pub lease_ttl: Duration,
    pub lease_margin: Duration,
    pub keepalive_interval: Duration,
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    /// TLS and the etcd user (none by default).
    pub access: EtcdAccess,
}

impl EtcdSettings {
    /// The defaults, talking to `endpoints`.
    pub fn new(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            lease_ttl: DEFAULT_LEASE_TTL,
            lease_margin: DEFAULT_LEASE_MARGIN,
            keepalive_interval: DEFAULT_KEEPALIVE_INTERVAL,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            access: EtcdAccess::default(),
        }
    }

    /// Parses `HOST:PORT[,HOST:PORT...]` (the CLI's `--etcd`; an endpoint
    /// may also be `http://HOST:PORT` or `https://HOST:PORT`).
    pub fn parse_endpoints(list: &str) -> Result<Vec<String>, ClusterError> {
        let endpoints: Vec<String> = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        if endpoints.is_empty() {
            return Err(ClusterError::Settings("no etcd endpoint given".into()));
        }
        // Unchecked, a port out of range was dialled as port 80.
        for endpoint in &endpoints {
            etcd_endpoint(endpoint).map_err(|why| {
                ClusterError::Settings(format!("etcd endpoint {endpoint:?}: {why}"))
            })?;
        }
        Ok(endpoints)
    }

    pub fn validate(&self) -> Result<(), ClusterError> {
        let bad = |why: String| Err(ClusterError::Settings(why));
        if self.endpoints.is_empty() {
            return bad("no etcd endpoint given".into());
        }
        if self.lease_ttl < Duration::from_secs(1) || self.lease_ttl.subsec_nanos() != 0 {
            return bad(format!(
                "lease TTL {:?}: etcd grants whole seconds, at least 1",
                self.lease_ttl
            ));
        }
        if self.lease_ttl > MAX_LEASE_TTL {
            return bad(format!(
                "lease TTL {:?}: etcd grants at most {:?}",
                self.lease_ttl, MAX_LEASE_TTL
            ));
        }
        if self.lease_margin >= self.lease_ttl {
            return bad(format!(
                "lease margin {:?} must be below the TTL {:?}",
                self.lease_margin, self.lease_ttl
            ));
        }
        // A renewal must be able to land before the deadline it extends.
        if self.keepalive_interval.is_zero()
            || self.keepalive_interval.saturating_add(self.lease_margin) >= self.lease_ttl
        {
            return bad(format!(
                "keepalive interval {:?} plus margin {:?} must be below the TTL {:?}",
                self.keepalive_interval, self.lease_margin, self.lease_ttl
            ));
        }
        if self.request_timeout.is_zero() || self.connect_timeout.is_zero() {
            return bad("etcd timeouts must be above zero".into());
        }
        self.access.validate(&self.urls())?;
        Ok(())
    }

    /// How long a renewal may wait (an etcd leader election, say) before
    /// the node's deadline passes: the TTL less the margin and one renewal
    /// interval (3.5 s at the defaults).
    pub fn election_slack(&self) -> Duration {
        self.lease_ttl
            .saturating_sub(self.lease_margin)
            .saturating_sub(self.keepalive_interval)
    }

    /// A warning to log at start when [`Self::election_slack`] is shorter
    /// than an etcd election may take (`SHORT_ELECTION_SLACK`); valid
    /// settings, but losing the etcd leader would then cost TryAgain.
    pub fn slack_warning(&self) -> Option<String> {
        let slack = self.election_slack();
        (slack < SHORT_ELECTION_SLACK).then(|| {
            format!(
                "--lease-ttl {:?} less --lease-margin {:?} and --lease-renew {:?} leaves {slack:?} for an etcd leader election (1-2 s at etcd's defaults): losing the etcd leader may cost this node TryAgain answers; a longer --lease-ttl avoids it",
                self.lease_ttl, self.lease_margin, self.keepalive_interval
            )
        })
    }

    /// The endpoints as URLs etcd-client accepts: a bare `HOST:PORT` is
    /// `https://` when TLS is configured (`--etcd-tls-ca`), else `http://`.
    pub(crate) fn urls(&self) -> Vec<String> {
        let scheme = if self.access.tls() { "https" } else { "http" };
        self.endpoints
            .iter()
            .map(|e| {
                if e.starts_with("http://") || e.starts_with("https://") {
                    e.clone()
                } else {
                    format!("{scheme}://{e}")
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_numbers_are_named() {
        let s = EtcdSettings::new(vec!["127.0.0.1:2379".into()]);
        s.validate().unwrap();
        assert_eq!(s.urls(), ["http://127.0.0.1:2379"]);
        let ttl = EtcdSettings {
            lease_ttl: Duration::from_millis(2500),
            ..s.clone()
        };
        assert!(ttl
            .validate()
            .unwrap_err()
            .to_string()
            .contains("whole seconds"));
        let interval = EtcdSettings {
            keepalive_interval: Duration::from_secs(5),
            ..s.clone()
        };
        assert!(interval.validate().is_err());
        assert_eq!(
            EtcdSettings::parse_endpoints("a:1, b:2,").unwrap(),
            ["a:1", "b:2"]
        );
        assert!(EtcdSettings::parse_endpoints(" ,").is_err());
        let tls = EtcdSettings {
            endpoints: vec!["a:1".into(), "https://b:2".into()],
            access: EtcdAccess {
                tls_ca: Some("ca.pem".into()),
                ..EtcdAccess::default()
            },
            ..s.clone()
        };
        assert_eq!(tls.urls(), ["https://a:1", "https://b:2"]);
        tls.validate().unwrap();
    }

    #[test]
    fn durations_past_etcds_range_are_refused_not_overflowed() {
        let s = EtcdSettings::new(vec!["127.0.0.1:2379".into()]);
        let ttl = EtcdSettings {
            lease_ttl: Duration::from_secs(1 << 63),
            ..s.clone()
        };
        let err = ttl.validate().unwrap_err().to_string();
        assert!(err.contains("at most"), "{err}");
        // The renewal plus the margin used to be added unchecked: a panic.
        let renew = EtcdSettings {
            keepalive_interval: Duration::MAX,
            ..s.clone()
        };
        assert!(renew.validate().is_err());
        let at_ceiling = EtcdSettings {
            lease_ttl: MAX_LEASE_TTL,
            ..s
        };
        at_ceiling.validate().unwrap();
    }

    #[test]
    fn endpoints_need_a_port_in_range() {
        for bad in ["127.0.0.1:99999", "notahost", "http://127.0.0.1"] {
            let err = EtcdSettings::parse_endpoints(bad).unwrap_err().to_string();
            assert!(err.contains(bad), "{err}");
        }
        assert_eq!(
            EtcdSettings::parse_endpoints("https://a:1,b:2").unwrap(),
            ["https://a:1", "b:2"]
        );
    }

    #[test]
    fn a_short_election_slack_is_warned_about() {
        let s = EtcdSettings::new(vec!["127.0.0.1:2379".into()]);
        assert_eq!(s.election_slack(), Duration::from_millis(3500));
        assert_eq!(s.slack_warning(), None);
        let short = EtcdSettings {
            lease_ttl: Duration::from_secs(3),
            ..s
        };
        short.validate().unwrap();
        assert_eq!(short.election_slack(), Duration::from_millis(1500));
        let warning = short.slack_warning().expect("1.5 s is short");
        assert!(warning.contains("1.5s"), "{warning}");
    }
}
