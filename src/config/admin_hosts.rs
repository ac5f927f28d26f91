//! `--admin-allowed-hosts`: the host names, beside IP addresses and
//! `localhost`, the admin API answers for.
//!
//! The admin API refuses a request whose `Host` names anything else
//! (DNS rebinding: a page of `evil.example` whose name is made to resolve
//! to the admin address reaches it with `Host: evil.example`). IP addresses
//! and `localhost` need no entry: a browser sends the name it resolved, and
//! it never resolves an address or `localhost` through the attacker's DNS.
//! Names (a proxy's, a DNS name gateways or scrapers use) are listed here.
//!
//! Invariants: entries are lower-case host names without a port or a
//! trailing dot (a port never matters: the name is what rebinding forges),
//! or `*`, which turns the check off (behind a proxy that checks `Host`
//! itself). A malformed entry is refused at start, naming it.

use crate::addr::is_host_name;
use serde::{Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// The longest DNS name (RFC 1035), and so the longest entry.
const MAX_HOST_LEN: usize = 253;

/// The names the admin API answers for beside IP addresses and `localhost`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedHosts {
    /// `*`: any `Host` is answered.
    any: bool,
    /// Lower-case, no port, no trailing dot.
    names: Vec<String>,
}

/// Why an `--admin-allowed-hosts` entry cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllowedHostError {
    #[error("empty entry: give host names separated by commas")]
    Empty,
    #[error("{entry:?} is {len} bytes long, over the {max} of a DNS name")]
    TooLong {
        entry: String,
        len: usize,
        max: usize,
    },
    #[error("{entry:?} is not a host name (letters, digits, `-`, `_` and dots, no port, no scheme), nor `*`")]
    NotAHostName { entry: String },
}

impl AllowedHosts {
    /// Whether `*` was given: every `Host` is answered.
    pub fn any(&self) -> bool {
        self.any
    }

    /// Whether `name` (lower-case, no port, no trailing dot) is listed.
    pub fn lists(&self, name: &str) -> bool {
        self.any || self.names.iter().any(|n| n == name)
    }
}

impl FromStr for AllowedHosts {
    type Err = AllowedHostError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut hosts = Self::default();
        for entry in s.split(',').map(str::trim) {
            if entry == "*" {
                hosts.any = true;
                continue;
            }
            let name = entry.strip_suffix('.').unwrap_or(entry);
            if name.is_empty() {
                return Err(AllowedHostError::Empty);
            }
            if name.len() > MAX_HOST_LEN {
                return Err(AllowedHostError::TooLong {
                    entry: entry.to_owned(),
                    len: name.len(),
                    max: MAX_HOST_LEN,
                });
            }
            if !is_host_name(name) {
                return Err(AllowedHostError::NotAHostName {
                    entry: entry.to_owned(),
                });
            }
            let name = name.to_ascii_lowercase();
            if !hosts.names.contains(&name) {
                hosts.names.push(name);
            }
        }
        Ok(hosts)
    }
}

impl fmt::Display for AllowedHosts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let any = self.any.then_some("*");
        let all: Vec<&str> = any
            .into_iter()
            .chain(self.names.iter().map(String::as_str))
            .collect();
        f.write_str(&all.join(","))
    }
}

/// One scalar, as the config file takes it, so `--print-config` loads back.
impl Serialize for AllowedHosts {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_names_or_a_star() {
        let h: AllowedHosts = "Admin.Example.com., tollgate-0.tollgate_svc,admin.example.com"
            .parse()
            .unwrap();
        assert!(h.lists("admin.example.com"));
        assert!(h.lists("tollgate-0.tollgate_svc"));
        assert!(!h.lists("evil.example"));
        assert!(!h.any());
        assert_eq!(h.to_string(), "admin.example.com,tollgate-0.tollgate_svc");
        let any: AllowedHosts = "*".parse().unwrap();
        assert!(any.any() && any.lists("evil.example"));
        assert_eq!(any.to_string(), "*");
        for bad in [
            "",
            "a,,b",
            "admin.example.com:7701",
            "http://admin",
            "a..b",
            "a b",
        ] {
            assert!(bad.parse::<AllowedHosts>().is_err(), "{bad:?}");
        }
        let long = "a".repeat(254);
        assert!(matches!(
            long.parse::<AllowedHosts>(),
            Err(AllowedHostError::TooLong { len: 254, .. })
        ));
    }
}
