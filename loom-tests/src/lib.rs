//! loom models of Tollgate's concurrent parts.
//!
//! Everything here is compiled only under `--cfg tollgate_loom`, where
//! `tollgate::sync` hands out loom's mutexes and atomics, so the models drive
//! the real `Store`, not a copy. Run them with `scripts/loom.sh` (release
//! build, `LOOM_MAX_PREEMPTIONS=2`, its own target directory).
//!
//! The client's models are not here: they need the client crate's private
//! connection types, so they are its own unit tests
//! (`client/src/connection/loom_models.rs`, under the same cfg, where
//! `tollgate_client`'s `sync` module hands out loom's types). scripts/loom.sh
//! runs both.
