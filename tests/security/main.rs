//! Security over real sockets: node-to-node control only for nodes that
//! prove the cluster secret, checked epochs, the admin API's bearer token,
//! protected mode, and TLS on every port.

#[path = "../common/mod.rs"]
mod common;

mod admin;
mod certs;
mod cli;
mod process;
mod protected;
mod spec;
mod spoofing;
mod tls;

#[allow(dead_code)]
#[path = "../replication/harness.rs"]
mod harness;
