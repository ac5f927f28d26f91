//! Hash tags and slots: the protocol crate's definition (one copy, shared
//! with the client's cluster routing), re-exported for the server's modules.

pub use tollgate_protocol::slot::{hash_tag, Slot, SlotRuns, SLOT_COUNT};
