//! Replication and failover messages, as Rust values (`PROTOCOL.md` §13).
//!
//! They travel in ordinary frames on the ordinary port, with the request
//! opcodes `0x08..=0x0B` and the response opcodes `0x88..=0x8D`, and are
//! wrapped in [`Request::Repl`](crate::Request::Repl) and
//! [`Response::Repl`](crate::Response::Repl) so that code handling client
//! traffic matches on one variant for all of them.
//!
//! A standby opens a connection, sends HELLO, then REPLICATE. From then on
//! the connection carries the primary's *stream*: one [`ReplResponse::Stream`]
//! (the answer), then data frames ([`SnapshotPart`], [`ChangeBatch`]), each
//! numbered by the next **offset**, and heartbeats; the standby sends
//! [`ReplRequest::Ack`] frames back. Data frames carry *resulting* state
//! ([`Record`]), never operations, so applying a frame twice is harmless.

use bytes::Bytes;

/// Role of the answering node (replication fills in `Standby`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Role {
    Primary = 1,
    Standby = 2,
}

impl Role {
    /// Decodes a wire value.
    pub fn from_wire(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::Primary),
            2 => Some(Self::Standby),
            _ => None,
        }
    }
}

/// Requests of replication and operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplRequest {
    /// `0x08`: a standby asks to follow this node. `replid` and `offset` say
    /// where its copy stands (`replid` 0: it holds nothing it can resume
    /// from); `epoch` is the highest epoch it knows; `advertise` is the
    /// address other nodes reach it at (for logs and status).
    Replicate {
        replid: u64,
        offset: u64,
        epoch: u64,
        advertise: String,
    },
    /// `0x09`: a standby has applied the stream up to `offset`. Sent on the
    /// replication connection; never answered.
    Ack { offset: u64 },
    /// `0x0A`: become primary (answered by PROMOTED).
    Promote,
    /// `0x0B`: report role, epoch and replication state (answered by
    /// STATUS_OK). A node probing its peer describes itself in `announce`,
    /// so the peer learns about a newer primary even if it never probes.
    Status { announce: Option<Announce> },
}

/// What a node says about itself when it probes its peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announce {
    pub role: Role,
    pub epoch: u64,
    /// Where the announcing node serves (its `--advertise` address).
    pub addr: String,
}

/// Responses of replication and operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplResponse {
    /// `0x88` REPL_STREAM: REPLICATE accepted. Data frames follow, numbered
    /// from `offset + 1`. `full`: every slot will be sent again as a
    /// snapshot (the standby is out of sync until a heartbeat says the
    /// full sync is over); otherwise the stream resumes exactly after the
    /// standby's `offset`.
    Stream {
        replid: u64,
        epoch: u64,
        offset: u64,
        full: bool,
    },
    /// `0x89` REPL_SNAPSHOT: part of the live content of a set of slots.
    Snapshot(SnapshotPart),
    /// `0x8A` REPL_CHANGES: the current state of keys that changed.
    Changes(ChangeBatch),
    /// `0x8B` REPL_HEARTBEAT: the primary is alive. `offset` is the last
    /// offset it has numbered, `now` its clock (nanoseconds since the UNIX
    /// epoch); `syncing` while a full sync is still being sent.
    Heartbeat {
        epoch: u64,
        offset: u64,
        now: u64,
        syncing: bool,
    },
    /// `0x8C` STATUS_OK.
    Status(NodeStatus),
    /// `0x8D` PROMOTED: the node is primary at `epoch`; `was_primary` when
    /// it already was (PROMOTE is idempotent).
    Promoted { epoch: u64, was_primary: bool },
}

/// One frame of a snapshot of the slots `s` with `s % slot_mod ==
/// slot_rem` (the slots of one primary stripe). A unit of several parts
/// ends with `last`; the receiver then replaces whatever it holds for those
/// slots by the records of all the parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotPart {
    pub offset: u64,
    /// A power of two, `1..=16384`.
    pub slot_mod: u16,
    /// `< slot_mod`.
    pub slot_rem: u16,
    pub last: bool,
    pub records: Vec<Record>,
}

/// Changed keys, each with its state after the change, in stream order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeBatch {
    pub offset: u64,
    /// The primary's clock when it read these states (nanoseconds since the
    /// UNIX epoch); the standby's lag is measured from it.
    pub sent_at: u64,
    pub records: Vec<Record>,
}

/// The state of one key, per table. A key holds at most one token-bucket
/// state and one state of another algorithm (see the store); a record says
/// what each of them is now, or leaves one alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub key: Bytes,
    /// The key's token-bucket state.
    pub token_bucket: TableState,
    /// The key's state of any other algorithm.
    pub other: TableState,
}

/// What a record says about one of a key's states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableState {
    /// Not described by this record: leave it as it is.
    Unchanged,
    /// The key holds no such state (deleted, reset, refunded to nothing).
    Absent,
    Present(StateEntry),
}

/// A stored state and the instant it stops carrying information.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateEntry {
    /// Nanoseconds since the UNIX epoch.
    pub expires_at: u64,
    pub state: StateValue,
}

/// Per-algorithm state, as the reference server keeps it. Times are
/// nanoseconds since the UNIX epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateValue {
    TokenBucket {
        tat: u64,
    },
    SlidingWindow {
        index: u64,
        prev: u64,
        cur: u64,
    },
    FixedWindow {
        index: u64,
        count: u64,
    },
    /// Oldest first.
    SlidingLog {
        entries: Vec<u64>,
    },
    LeakyBucket {
        tat: u64,
    },
    Concurrency {
        last_id: u64,
        leases: Vec<LeaseState>,
    },
}

impl StateValue {
    /// The wire value of this state's algorithm (as in a CHECK pair).
    pub fn algorithm(&self) -> u8 {
        match self {
            Self::TokenBucket { .. } => 1,
            Self::SlidingWindow { .. } => 2,
            Self::FixedWindow { .. } => 3,
            Self::SlidingLog { .. } => 4,
            Self::LeakyBucket { .. } => 5,
            Self::Concurrency { .. } => 6,
        }
    }
}

/// One concurrency lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseState {
    pub id: u64,
    pub expires_at: u64,
    pub units: u64,
}

/// A node's answer to STATUS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    pub role: Role,
    pub epoch: u64,
    /// Primary: the last offset numbered. Standby: the last offset applied.
    pub offset: u64,
    /// The node's own address (`--advertise`).
    pub addr: String,
    /// Standby: the primary it follows. Primary: empty.
    pub primary: String,
    /// Named numbers (lag, counters, flags as 0/1), in the order the node
    /// sends them; PROTOCOL.md §13 lists the names the reference server
    /// uses. Receivers ignore names they do not know.
    pub fields: Vec<(String, u64)>,
}

impl NodeStatus {
    /// The value of field `name`, if the node sent it.
    pub fn field(&self, name: &str) -> Option<u64> {
        self.fields.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }
}
