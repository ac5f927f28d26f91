//! Security over real sockets: node-to-node control only for nodes that
//! prove the cluster secret, checked epochs, the admin API's bearer token,
//! protected mode, TLS on every port, and hostile clients (connection
//! exhaustion, half-sent frames, log injection).

#[path = "../common/mod.rs"]
mod common;

mod admin;
mod at_scale;
mod certs;
mod cli;
mod client_tls;
mod connections;
#[cfg(feature = "envoy")]
mod envoy;
#[cfg(feature = "events")]
mod events;
mod handoff_cap;
mod hostile_io;
mod node_auth;
mod process;
mod protected;
mod resp_hostile;
#[cfg(feature = "envoy")]
#[allow(dead_code)] // some helpers are for the cluster tests
#[path = "../common/rls.rs"]
mod rls;
mod spec;
mod spoofing;
mod tls;

#[allow(dead_code)]
#[path = "../replication/harness.rs"]
mod harness;
