//! Tollgate: an in-memory rate-limit counter server.
//!
//! # Layout
//!
//! A CHECK goes socket -> server (a port) -> engine (rules, once per frame)
//! -> store -> algorithm, and imports point the same way
//! (`scripts/check-layers.sh` keeps them so). The diagrams of both, each
//! step named by its module, are in docs/ARCHITECTURE.md (the one copy).
//!
//! - [`sync`]: the only source of locks and atomics (loom under `tollgate_loom`);
//! - [`clock`]: server time (wall-clock anchored, monotonic), injected everywhere;
//! - [`slot`]: hash tags and Redis Cluster slots;
//! - [`algorithm`]: token bucket, sliding window, fixed window, sliding log,
//!   leaky bucket and concurrency leases, pure functions;
//! - [`store`]: lock-striped per-key state, atomic groups, expiry; a
//!   frame's keys prefetched before its checks (`store/tables/hint.rs`);
//! - [`rules`]: named rules from the rules file, hot reload;
//! - [`throttled`]: the most denied keys, in bounded memory;
//! - [`log_text`]: text a peer chose, escaped for log lines;
//! - [`events`]: decision events, queued without waiting and published to
//!   NATS (feature `events`);
//! - [`huge_pages`]: `--huge-pages`, transparent huge pages for the
//!   binary's heap (mimalloc); one of the crate's two `unsafe` modules;
//! - `prefetch`: cache-line prefetch hints, the other one;
//! - [`tls`]: rustls configs of every port and of a node's own connections,
//!   reloadable, and the one socket type for plain TCP and TLS;
//! - [`config`]: the settings by section, flags and the config file;
//! - `node`: who is primary (roles and epochs behind a role source; pair
//!   mode today) and the replication to a standby;
//! - `engine`: the check engine (rule resolution, shadow rules, global
//!   limits, retries, shedding, decision events, check metrics) behind one
//!   `Engine` the ports call;
//! - [`server`] (with its admin HTTP API) and [`cli`]: the network server
//!   and the binary's commands; [`admin_client`] for the CLI.
//! - `cluster` (feature `cluster`): the etcd control plane of cluster
//!   mode: registrations, elections and epochs, lease deadlines, the
//!   watch-fed routing table (docs/CLUSTER.md);
//!
//! A check naming a rule is resolved against the rule set in force (loaded
//! once per frame) before it reaches the store:
//!
//! ```text
//!  pair {key, rule name} -> RuleSet (ArcSwap) -> inline limit -> store
//! ```

// One FFI call is allowed, in `huge_pages` (its SAFETY comment says why).
#![deny(unsafe_code)]

mod addr;
pub mod admin_client;
pub mod algorithm;
pub mod cli;
pub mod clock;
#[cfg(feature = "cluster")]
pub mod cluster;
pub mod config;
mod engine;
pub mod events;
pub mod huge_pages;
pub mod log_text;
mod node;
mod prefetch;
#[cfg(test)]
mod readme;
pub mod rules;
pub mod server;
pub mod slot;
pub mod store;
pub mod sync;
pub mod throttled;
pub mod tls;
pub mod units;
