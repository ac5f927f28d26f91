//! Tollgate: an in-memory rate-limit counter server.
//!
//! # Layout
//!
//! ```text
//!  socket -> codec (tollgate-protocol) -> server::connection
//!         -> store: Slot -> Stripe lock -> algorithm (pure) -> Decision
//!         -> codec -> socket (responses coalesced into one write)
//! ```
//!
//! - [`sync`]: the only source of locks and atomics (loom under `tollgate_loom`);
//! - [`clock`]: server time (wall-clock anchored, monotonic), injected everywhere;
//! - [`slot`]: hash tags and Redis Cluster slots;
//! - [`algorithm`]: token bucket, sliding window, fixed window, sliding log,
//!   leaky bucket and concurrency leases, pure functions;
//! - [`store`]: lock-striped per-key state, atomic groups, expiry;
//! - `repl`: replication to a standby, roles and epochs, failover;
//! - `server`, `config`, `cli`: the network server and the binary's commands.

pub mod algorithm;
pub mod cli;
pub mod clock;
pub mod config;
mod repl;
pub mod server;
pub mod slot;
pub mod store;
pub mod sync;
pub mod units;
