//! Pair mode's settings: replication to a hot standby and failover between
//! the two nodes of a pair.

use super::{at_least, human, human_opt, longer, ConfigError};
use crate::addr::{advertised, host_port, names_this_node};
use crate::units::{parse_bytes, parse_duration};
use clap::Args;
use serde::Serialize;
use std::net::SocketAddr;
use std::time::Duration;

pub const DEFAULT_HEARTBEAT: &str = "100ms";
pub const DEFAULT_REPL_FLUSH: &str = "10ms";
/// The store's own default (a test in node/store_settings.rs holds them equal).
pub const DEFAULT_REPL_BUFFER_CAP: usize = 1024;
pub const DEFAULT_REPL_BACKLOG: &str = "16MiB";
pub const DEFAULT_REPL_TIMEOUT: &str = "3s";
pub const DEFAULT_MAX_EPOCH_GAP: u64 = 1 << 20;

/// Replication and failover of a pair of nodes.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Replication")]
#[serde(rename_all = "kebab-case")]
pub struct ReplicationSettings {
    /// Start as a standby of the primary at HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    pub replica_of: Option<String>,

    /// The other node of the pair. A primary probes it every heartbeat and
    /// steps down if it is primary at a higher epoch; at start, a node with a
    /// peer asks it first, so a restarted ex-primary comes back as standby.
    #[arg(long, value_name = "HOST:PORT")]
    pub peer: Option<String>,

    /// Address other nodes and clients reach this node at (default: the
    /// address it listens on).
    #[arg(long, value_name = "HOST:PORT")]
    pub advertise: Option<String>,

    /// A standby that has been in sync promotes itself after this long
    /// without hearing from its primary. Off unless set.
    #[arg(long, value_parser = parse_duration)]
    #[serde(serialize_with = "human_opt")]
    pub failover_after: Option<Duration>,

    /// A standby answers PEEK from its replicated (possibly stale) state
    /// instead of NotPrimary.
    #[arg(long)]
    pub serve_stale_reads: bool,

    /// Primary -> standby heartbeat interval; also how often a primary
    /// probes its peer and a standby acknowledges.
    #[arg(long, default_value = DEFAULT_HEARTBEAT, value_parser = parse_duration)]
    #[serde(serialize_with = "human")]
    pub heartbeat: Duration,

    /// How often the primary sends the changes of the last interval: at most
    /// this much of the newest updates is lost when it dies.
    #[arg(long, default_value = DEFAULT_REPL_FLUSH, value_parser = parse_duration)]
    #[serde(serialize_with = "human")]
    pub repl_flush: Duration,

    /// Changed keys one stripe buffers for the standby; past it the buffer is
    /// dropped and the stripe is sent whole (bounds the primary's memory).
    #[arg(long, default_value_t = DEFAULT_REPL_BUFFER_CAP)]
    pub repl_buffer_cap: usize,

    /// Bytes of recent stream frames kept so a standby that reconnects can
    /// resume instead of syncing everything again; also the most a standby
    /// may leave unacknowledged before the primary holds its changes.
    #[arg(long, default_value = DEFAULT_REPL_BACKLOG, value_parser = parse_bytes)]
    pub repl_backlog: usize,

    /// A replication connection that cannot be written to, or from which
    /// nothing arrives, for this long is dropped (and reconnected).
    #[arg(long, default_value = DEFAULT_REPL_TIMEOUT, value_parser = parse_duration)]
    #[serde(serialize_with = "human")]
    pub repl_timeout: Duration,

    /// Largest step above the highest epoch this node knows that it
    /// believes from another node; a higher epoch is refused as absurd (a
    /// promotion adds one, so real epochs never jump far).
    #[arg(long, default_value_t = DEFAULT_MAX_EPOCH_GAP)]
    pub max_epoch_gap: u64,
}

impl ReplicationSettings {
    /// Pair mode: this node talks to another (`--peer` or `--replica-of`).
    pub fn pair_mode(&self) -> bool {
        self.peer.is_some() || self.replica_of.is_some()
    }

    /// `listen`: the address the node listens on, which its
    /// `--replica-of` and `--peer` must not name.
    pub(super) fn validate(&self, listen: SocketAddr) -> Result<(), ConfigError> {
        self.validate_addresses(listen)?;
        for (name, d) in [
            ("heartbeat", self.heartbeat),
            ("repl-flush", self.repl_flush),
            ("repl-timeout", self.repl_timeout),
        ] {
            if d.is_zero() {
                return Err(ConfigError::ZeroDuration { name });
            }
        }
        at_least("repl-buffer-cap", self.repl_buffer_cap as u64, 1)?;
        at_least("max-epoch-gap", self.max_epoch_gap, 1)?;
        // Heartbeats must be able to arrive before either timeout fires.
        longer(
            "repl-timeout",
            self.repl_timeout,
            "heartbeat",
            self.heartbeat,
        )?;
        if let Some(after) = self.failover_after {
            longer("failover-after", after, "heartbeat", self.heartbeat)?;
        }
        Ok(())
    }

    /// The addresses other nodes are dialled at, or told to dial.
    fn validate_addresses(&self, listen: SocketAddr) -> Result<(), ConfigError> {
        let bad = |flag: &'static str, value: &str, reason| ConfigError::Address {
            flag,
            value: value.to_owned(),
            reason,
        };
        if let Some(advertise) = &self.advertise {
            advertised(advertise).map_err(|why| bad("advertise", advertise, why))?;
        }
        for (flag, target) in [("replica-of", &self.replica_of), ("peer", &self.peer)] {
            let Some(target) = target else { continue };
            host_port(target).map_err(|why| bad(flag, target, why))?;
            // A node following (or probing) itself loops forever.
            if names_this_node(target, listen, self.advertise.as_deref()) {
                return Err(ConfigError::ItsOwnPeer {
                    flag,
                    value: target.clone(),
                });
            }
        }
        Ok(())
    }
}
