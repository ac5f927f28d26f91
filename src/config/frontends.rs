//! The drop-in front ends ([`FrontendSettings`]): a RESP port for clients
//! written for Redis (redis-cell's `CL.THROTTLE`, INCR/EXPIRE counters)
//! and an Envoy RLS v3 gRPC port. Both are off unless given an address,
//! both take the protocol port's credentials (client tokens, mTLS) and
//! pass protected mode like every other port.

use super::{at_least, at_most, human, ConfigError, ServerConfig};
use crate::config::security::{protected_mode, Exposure};
use crate::units::{parse_bytes, parse_duration};
use clap::Args;
use serde::Serialize;
use std::net::SocketAddr;
use std::time::Duration;

/// Default `--resp-counter-window`.
pub const DEFAULT_RESP_COUNTER_WINDOW: &str = "1h";
/// Default `--resp-max-args`.
pub const DEFAULT_RESP_MAX_ARGS: u32 = 64;
/// Most `--resp-max-args` may be: a command of more arguments is surely
/// not one of those the front end answers.
pub const MAX_RESP_ARGS_CEILING: u32 = 4096;
/// Default `--resp-max-multi-bytes`.
pub const DEFAULT_RESP_MAX_MULTI_BYTES: &str = "1MiB";
/// Least `--resp-max-multi-bytes`: room for a few commands of the usual
/// size (a CL.THROTTLE, an INCR and its EXPIRE).
pub const MIN_RESP_MULTI_BYTES: usize = 4 * 1024;
/// Shortest longest-argument a RESP command may always carry, whatever
/// `--max-key-len` says: an AUTH password (255 bytes), a client name.
pub const MIN_RESP_ARG_LEN: usize = 512;
/// Default `--envoy-max-message`: a ShouldRateLimit request is a domain
/// and a few descriptors, hundreds of bytes; 64 KiB leaves room for
/// `--max-batch` descriptors of long values.
pub const DEFAULT_ENVOY_MAX_MESSAGE: &str = "64KiB";
/// Bounds of `--envoy-max-message`: at least one HTTP/2 frame (16 KiB, the
/// smallest window that lets a frame through), at most 4 MiB (tonic's own
/// default, the size this bound replaces).
pub const ENVOY_MAX_MESSAGE_RANGE: (usize, usize) = (16 << 10, 4 << 20);
/// Default `--envoy-max-streams`: calls in flight on one Envoy connection
/// (Envoy opens another connection when a server's limit is reached).
pub const DEFAULT_ENVOY_MAX_STREAMS: u32 = 256;

/// The drop-in front ends.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Drop-in front ends")]
#[serde(rename_all = "kebab-case")]
pub struct FrontendSettings {
    /// Address of the RESP (Redis protocol) front end: CL.THROTTLE,
    /// INCR/EXPIRE counters, CLUSTER SLOTS (off unless set).
    #[arg(long, value_name = "ADDR")]
    pub resp: Option<SocketAddr>,

    /// Window of a counter that INCR/INCRBY creates with no EXPIRE or
    /// PEXPIRE of its key in the same MULTI or pipeline (a later EXPIRE
    /// sets it).
    #[arg(long, default_value = DEFAULT_RESP_COUNTER_WINDOW, value_parser = parse_duration)]
    #[serde(serialize_with = "human")]
    pub resp_counter_window: Duration,

    /// Most arguments one RESP command may carry, its name included.
    #[arg(long, default_value_t = DEFAULT_RESP_MAX_ARGS)]
    pub resp_max_args: u32,

    /// Most bytes one RESP MULTI may hold queued (its commands' arguments
    /// plus a small fixed cost each), e.g. `1MiB`; drawn from
    /// --max-connection-memory too. A command past either is answered
    /// -OOM and the transaction's EXEC -EXECABORT.
    #[arg(long, default_value = DEFAULT_RESP_MAX_MULTI_BYTES, value_parser = parse_bytes)]
    pub resp_max_multi_bytes: usize,

    /// Address of the Envoy rate limit service (RLS v3 gRPC) front end
    /// (off unless set; needs a build with the cargo feature `envoy`).
    #[arg(long, value_name = "ADDR")]
    pub envoy_rls: Option<SocketAddr>,

    /// Largest ShouldRateLimit request the Envoy front end reads, e.g.
    /// `64KiB` (16 KiB to 4 MiB). It is also the HTTP/2 flow-control window
    /// of each call and of each connection: a connection holds at most this
    /// much request data the server has not read.
    #[arg(long, default_value = DEFAULT_ENVOY_MAX_MESSAGE, value_parser = parse_bytes)]
    pub envoy_max_message: usize,

    /// Most calls in flight at once on one Envoy connection (HTTP/2
    /// SETTINGS_MAX_CONCURRENT_STREAMS).
    #[arg(long, default_value_t = DEFAULT_ENVOY_MAX_STREAMS)]
    pub envoy_max_streams: u32,
}

impl FrontendSettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        at_least("resp-max-args", self.resp_max_args.into(), 6)?;
        at_most(
            "resp-max-args",
            self.resp_max_args.into(),
            MAX_RESP_ARGS_CEILING.into(),
        )?;
        at_least(
            "resp-max-multi-bytes",
            self.resp_max_multi_bytes as u64,
            MIN_RESP_MULTI_BYTES as u64,
        )?;
        let window = self.resp_counter_window;
        if window < Duration::from_millis(1) {
            return Err(ConfigError::ZeroDuration {
                name: "resp-counter-window",
            });
        }
        at_most(
            "resp-counter-window (ms)",
            window.as_millis() as u64,
            crate::algorithm::MAX_PERIOD_MS,
        )?;
        let (min, max) = ENVOY_MAX_MESSAGE_RANGE;
        at_least(
            "envoy-max-message",
            self.envoy_max_message as u64,
            min as u64,
        )?;
        at_most(
            "envoy-max-message",
            self.envoy_max_message as u64,
            max as u64,
        )?;
        at_least("envoy-max-streams", self.envoy_max_streams.into(), 1)?;
        if self.envoy_rls.is_some() && !cfg!(feature = "envoy") {
            return Err(ConfigError::NotBuiltIn {
                flag: "envoy-rls",
                feature: "envoy",
            });
        }
        Ok(())
    }
}

impl ServerConfig {
    /// The longest argument a RESP command may carry.
    pub fn resp_max_arg_len(&self) -> usize {
        usize::from(self.limits.max_key_len).max(MIN_RESP_ARG_LEN)
    }

    /// The RESP port, for protected mode: client tokens (AUTH, HELLO
    /// AUTH) or mTLS authenticate it.
    pub fn resp_exposure(&self, addr: SocketAddr) -> Exposure {
        Exposure {
            port: "the RESP front end (--resp)",
            addr,
            risk: "charge, reset and exhaust any key",
            authenticated: self.auth.auth_token.is_some() || self.tls.tls_client_ca.is_some(),
            fix: "--auth-token (or TOLLGATE_AUTH_TOKEN), or --tls-client-ca for mTLS",
        }
    }

    /// The Envoy RLS port, for protected mode: client tokens (gRPC
    /// `authorization: Bearer` metadata) or mTLS authenticate it.
    pub fn envoy_exposure(&self, addr: SocketAddr) -> Exposure {
        Exposure {
            port: "the Envoy rate limit service (--envoy-rls)",
            addr,
            risk: "charge and exhaust any key",
            authenticated: self.auth.auth_token.is_some() || self.tls.tls_client_ca.is_some(),
            fix: "--auth-token (or TOLLGATE_AUTH_TOKEN), or --tls-client-ca for mTLS",
        }
    }

    /// Protected mode on the front ends' configured addresses.
    pub(super) fn validate_frontends(&self) -> Result<(), ConfigError> {
        self.frontends.validate()?;
        let insecure = self.auth.insecure;
        if let Some(addr) = self.frontends.resp {
            protected_mode(&self.resp_exposure(addr), insecure)?;
        }
        if let Some(addr) = self.frontends.envoy_rls {
            protected_mode(&self.envoy_exposure(addr), insecure)?;
        }
        Ok(())
    }
}
