//! Codec tests: every message whole, cut at every byte, invalid, pipelined;
//! proptest round-trips; the fuzz invariants replayed over the seed corpus;
//! and the worked examples of `PROTOCOL.md`.
//!
//! One test binary (modules below) to keep link time down.

mod check2;
mod cluster;
mod corpus;
mod framed;
mod invalid;
mod invalid_frames;
mod node_auth;
mod props;
mod regions;
mod replication;
mod roundtrip;
mod samples;
mod spec;

/// The fuzz targets' invariant checks, shared by path so CI runs them on
/// stable over the seed corpus and proptest inputs.
#[path = "../../../fuzz/src/lib.rs"]
mod invariants;
