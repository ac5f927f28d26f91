//! Cluster mode against real etcd members on loopback (feature
//! `cluster`): the control plane (`cluster init` and `status`, topology
//! changes conditioned on the version, the watch-fed routing table,
//! elections and their fencing epochs, a primary's lease deadline when it
//! is cut off from etcd, loses quorum or loses etcd's leader), then real
//! node processes: routing, the client crate's cluster mode, slot moves,
//! and issue 9's faults under load; etcd with client TLS and auth.
//!
//! No timing is asserted: waits are event-driven with generous deadlines.
//! The only comparisons of instants are safety properties (a node's
//! deadline passed before anyone else was elected), measured on one
//! monotonic clock.

mod access;
mod announce;
#[allow(dead_code)] // the security tests' certificates, for etcd's TLS
#[path = "../security/certs.rs"]
mod certs;
mod chaos;
mod checker;
mod client;
// certs.rs needs a few of its helpers (it allows dead code itself).
#[path = "../common/mod.rs"]
mod common;
mod control;
#[cfg(feature = "envoy")]
mod envoy;
mod etcd;
mod faults;
mod moves;
mod nodes;
#[allow(dead_code)] // some helpers are for the replication tests
#[path = "../replication/harness.rs"]
mod procs;
#[allow(dead_code)] // `sever` is for the replication tests
#[path = "../replication/proxy.rs"]
mod proxy;
mod resp;
#[cfg(feature = "envoy")]
#[allow(dead_code)] // some helpers are for the security tests
#[path = "../common/rls.rs"]
mod rls;
mod router;
mod routing;
mod support;

pub use support::*;
