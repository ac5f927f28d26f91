//! Global limits across regions: this node's region, the regions it
//! exchanges usage with, how often, and what it admits when the exchange
//! stalls (docs/GLOBAL-LIMITS.md, PROTOCOL.md §16).
//!
//! Invariants checked here: a region name is 1 to 64 bytes out of
//! `A-Z a-z 0-9 _ - .`; peers need a region of their own, are named once
//! each and never after this node's region; the ceiling share is in
//! `(0, 1]`.

use super::{at_least, human, ConfigError};
use crate::units::{parse_bytes, parse_duration};
use clap::Args;
use serde::Serialize;
use std::time::Duration;
use tollgate_protocol::valid_region_name;

pub const DEFAULT_EXCHANGE_INTERVAL: &str = "500ms";
pub const DEFAULT_REGION_STALL_INTERVALS: u32 = 4;
pub const DEFAULT_EXCHANGE_MAX_BYTES: &str = "1MiB";
pub const DEFAULT_REGION_JOURNAL_MAX_BYTES: &str = "64MiB";
/// The most peer regions one node exchanges usage with: the usage a check
/// records names its rule's peers as the bits of a u64.
pub const MAX_REGION_PEERS: usize = 64;

/// Regions and the usage exchange between them.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Regions (global limits)")]
#[serde(rename_all = "kebab-case")]
pub struct RegionSettings {
    /// This node's region. Rules marked `global` that list it are shared
    /// with the other regions they list.
    #[arg(long, value_name = "NAME")]
    pub region: Option<String>,

    /// Another region and the address of its node, NAME=HOST:PORT
    /// (repeatable, or comma-separated). Usage is exchanged with each over a
    /// node connection (the cluster secret).
    #[arg(long, value_name = "NAME=HOST:PORT", value_delimiter = ',')]
    #[serde(serialize_with = "comma_separated")]
    pub region_peer: Vec<String>,

    /// How often usage is sent to each peer region.
    #[arg(long, default_value = DEFAULT_EXCHANGE_INTERVAL, value_parser = parse_duration)]
    #[serde(serialize_with = "human")]
    pub exchange_interval: Duration,

    /// Largest USAGE message sent; keys that do not fit go in the next one
    /// (counted by tollgate_region_messages_capped_total).
    #[arg(long, default_value = DEFAULT_EXCHANGE_MAX_BYTES, value_parser = parse_bytes)]
    pub exchange_max_bytes: usize,

    /// The exchange is stalled once a majority of the peer regions has not
    /// been heard from (or answered) for this many intervals; the region
    /// then admits at most its ceiling of each global rule.
    #[arg(long, default_value_t = DEFAULT_REGION_STALL_INTERVALS)]
    pub region_stall_intervals: u32,

    /// The share of a global rule's limit this region admits while the
    /// exchange is stalled, in (0, 1] (default: 1 / the number of regions
    /// the rule lists).
    #[arg(long, value_name = "SHARE")]
    pub region_ceiling: Option<f64>,

    /// When a global rule is capped at this region's ceiling: once the
    /// exchange is stalled with a majority of the peer regions the rule
    /// lists (majority), or with any one of them (any: also caps two
    /// regions that lost each other while both still reach a third, at the
    /// price of capping every region while one is down).
    #[arg(long, value_enum, default_value_t = CutOff::Majority)]
    pub region_cut_off: CutOff,

    /// Most memory the usage not yet sent to one peer region may take
    /// (while it is down, say); usage of keys new to it is dropped past
    /// that (counted by tollgate_region_usage_dropped_total).
    #[arg(long, default_value = DEFAULT_REGION_JOURNAL_MAX_BYTES, value_parser = parse_bytes)]
    pub region_journal_max_bytes: usize,
}

/// The peers as a config file takes them (one scalar, comma-separated;
/// null when there are none), so `--print-config` loads back.
fn comma_separated<S: serde::Serializer>(peers: &[String], s: S) -> Result<S::Ok, S::Error> {
    if peers.is_empty() {
        s.serialize_none()
    } else {
        s.serialize_str(&peers.join(","))
    }
}

/// When a global rule is capped at the region's ceiling
/// (`--region-cut-off`): stalled with a majority of the rule's peer
/// regions, or with any of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CutOff {
    Majority,
    Any,
}

impl CutOff {
    /// Whether a rule shared with `peers` peer regions, `stalled` of them
    /// stalled, is capped at the ceiling.
    pub fn applies(self, stalled: u32, peers: u32) -> bool {
        match self {
            CutOff::Majority => stalled * 2 > peers,
            CutOff::Any => stalled > 0,
        }
    }
}

/// The share of a global limit a region admits while the rule is capped:
/// `set` (`--region-ceiling`), or else an equal share of the `regions`
/// the rule lists.
pub fn ceiling_share(set: Option<f64>, regions: usize) -> f64 {
    set.unwrap_or(1.0 / regions.max(1) as f64)
}

/// A peer region as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionPeer {
    pub name: String,
    pub addr: String,
}

impl RegionSettings {
    /// The peer regions, parsed (call after `validate`).
    pub fn peers(&self) -> Result<Vec<RegionPeer>, ConfigError> {
        let mut peers: Vec<RegionPeer> = Vec::with_capacity(self.region_peer.len());
        for text in &self.region_peer {
            let bad = |reason: &str| ConfigError::RegionPeer {
                value: text.clone(),
                reason: reason.to_owned(),
            };
            let (name, addr) = text
                .split_once('=')
                .ok_or_else(|| bad("expected NAME=HOST:PORT"))?;
            if !valid_region_name(name) {
                return Err(bad("a region name is 1 to 64 of A-Z a-z 0-9 _ - ."));
            }
            if addr.is_empty() {
                return Err(bad("the address is empty"));
            }
            if Some(name) == self.region.as_deref() {
                return Err(bad("this node's own region"));
            }
            if peers.iter().any(|p| p.name == name) {
                return Err(bad("the region is named twice"));
            }
            if peers.len() == MAX_REGION_PEERS {
                return Err(bad("more than 64 peer regions"));
            }
            peers.push(RegionPeer {
                name: name.to_owned(),
                addr: addr.to_owned(),
            });
        }
        Ok(peers)
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if let Some(region) = &self.region {
            if !valid_region_name(region) {
                return Err(ConfigError::RegionName(region.clone()));
            }
        } else if !self.region_peer.is_empty() {
            return Err(ConfigError::PeersWithoutRegion);
        }
        self.peers()?;
        if self.exchange_interval.is_zero() {
            return Err(ConfigError::ZeroDuration {
                name: "exchange-interval",
            });
        }
        at_least(
            "region-stall-intervals",
            self.region_stall_intervals.into(),
            1,
        )?;
        // Room for the header and one entry with a long key.
        at_least("exchange-max-bytes", self.exchange_max_bytes as u64, 4096)?;
        // Room for a few entries with long keys.
        at_least(
            "region-journal-max-bytes",
            self.region_journal_max_bytes as u64,
            64 << 10,
        )?;
        if let Some(share) = self.region_ceiling {
            if !(share > 0.0 && share <= 1.0) {
                return Err(ConfigError::CeilingShare(share.to_string()));
            }
        }
        Ok(())
    }
}
