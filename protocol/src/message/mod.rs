//! The messages of protocol v1, as Rust values.
//!
//! These types are what the codec produces and consumes; they carry no I/O.
//! Every message travels in one frame whose header holds an opcode and a
//! request id (see `PROTOCOL.md`). Requests flow client -> server, responses
//! server -> client, and a response carries the id of the request it answers,
//! so a client may pipeline requests and match answers in any order.
//!
//! Keys are [`Bytes`] sliced out of the received frame (no copy); anything that
//! stores a key beyond the life of the request must copy it.
//!
//! Here: [`Request`], [`Response`], the [`Decision`] of a check and the
//! handshake's [`ServerLimits`]; in `limit`: what a check names (limits,
//! rules, pairs, batches, leases); in `tagged`: the idempotency key and
//! priority CHECK2 adds to each check; in `error_code`: [`ErrorCode`]. The
//! replication messages (and the node [`Role`]) are in
//! [`replication`](crate::replication).

mod error_code;
pub(crate) mod limit;
mod tagged;

pub use error_code::ErrorCode;
pub use limit::*;
pub use tagged::*;

use crate::replication::Role;
use bytes::Bytes;

/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u16 = 1;

/// A request id chosen by the client; echoed in the response.
pub type RequestId = u32;

/// `retry_after_ms` value meaning "never": the cost can never be admitted
/// under this limit (for example a cost larger than the burst).
pub const RETRY_NEVER: u64 = u64::MAX;

/// Client -> server messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Must be the first frame of a connection.
    Hello {
        version: u16,
        /// Free-form client name for logs (<= 255 bytes, UTF-8).
        client_name: String,
        /// Shared secret when the server requires one (<= 255 bytes).
        auth_token: Option<Bytes>,
    },
    Ping,
    /// Charge each check that passes.
    Check(CheckBatch),
    /// CHECK2: a CHECK whose checks each carry an idempotency key (a retry
    /// is answered from the server's memory, not charged again) and a
    /// priority (what the server sheds first when overloaded).
    Check2(TaggedBatch),
    /// Answer as `Check` would, without charging anything.
    Peek(CheckBatch),
    /// Forget the state of these keys.
    Reset(Vec<Bytes>),
    /// Give back units already charged: each pair's `cost` is the amount
    /// returned. Answered with CHECKED (the decisions after the refund).
    Refund(CheckBatch),
    /// Free concurrency leases before they expire.
    Release(Vec<LeaseRef>),
    /// Replication and operations: REPLICATE, REPL_ACK, PROMOTE, STATUS.
    Repl(crate::replication::ReplRequest),
    /// The cluster's slot map (answered by TOPOLOGY_OK).
    Topology,
    /// One region's usage of global keys (answered by USAGE_OK); node
    /// connections only.
    Usage(crate::regions::UsageReport),
    /// NODE_CHALLENGE: before HELLO, a node asks for a nonce to prove its
    /// secret over (answered by CHALLENGE; [`crate::node_auth`]).
    NodeChallenge,
}

/// Default largest frame body a server accepts: 1 MiB.
pub const DEFAULT_MAX_FRAME: u32 = 1024 * 1024;
/// Default most checks in one CHECK/PEEK/REFUND, or keys in one RESET or
/// RELEASE.
pub const DEFAULT_MAX_BATCH: u16 = 1024;
/// Default most pairs in one atomic group.
pub const DEFAULT_MAX_GROUP: u8 = 16;
/// Default longest key, in bytes.
pub const DEFAULT_MAX_KEY_LEN: u16 = 256;

/// The server's limits, told to the client in the handshake so a client can
/// size its batches without trial and error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Largest frame body (opcode + request id + payload), in bytes.
    pub max_frame: u32,
    /// Most checks in one CHECK/PEEK/REFUND, or keys in one RESET or
    /// RELEASE.
    pub max_batch: u16,
    /// Most pairs in one check (atomic group).
    pub max_group: u8,
    /// Longest key, in bytes.
    pub max_key_len: u16,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_frame: DEFAULT_MAX_FRAME,
            max_batch: DEFAULT_MAX_BATCH,
            max_group: DEFAULT_MAX_GROUP,
            max_key_len: DEFAULT_MAX_KEY_LEN,
        }
    }
}

/// The answer to one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckResult {
    Decision(Decision),
    /// This check was not evaluated; nothing was charged for it.
    Error(ErrorCode),
}

/// A rate-limit decision, as the gateway needs it for its headers.
///
/// For a group this reports one pair: when allowed, the pair with the least
/// remaining; when denied, the denying pair with the longest retry-after.
/// When a rule in shadow mode would have denied, the check is allowed
/// (`allowed` and `shadow_denied` both true) and the other fields describe
/// that would-be denial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// Allowed only because the denying rule is in shadow mode (wire status
    /// 4). Meaningful only with `allowed`: a denial is encoded as a denial
    /// whatever this says. Never set together with a `lease`: the wire has
    /// no status for both, and the encoder writes such a decision as status
    /// 3. A check whose enforced pairs acquired a lease while a shadow rule
    /// would have denied is answered with the enforced decision and its
    /// lease; the server counts the shadow denial in its metrics only.
    pub shadow_denied: bool,
    /// Index, within the check, of the pair this decision describes.
    pub pair: u8,
    /// The limit of that pair (burst for a token bucket, count for a window).
    pub limit: u64,
    /// Units still available after this request.
    pub remaining: u64,
    /// Milliseconds until the pair's state is back to full.
    pub reset_after_ms: u64,
    /// When denied, milliseconds until the same request could pass
    /// ([`RETRY_NEVER`] when it never can); 0 when allowed.
    pub retry_after_ms: u64,
    /// The lease an allowed CHECK acquired on the group's concurrency pair,
    /// to RELEASE when done; `None` otherwise. Only an allowed decision
    /// carries one (status 3 on the wire): the encoder drops it from a
    /// denied decision.
    pub lease: Option<u64>,
}

/// Server -> client messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    HelloOk {
        version: u16,
        role: Role,
        epoch: u64,
        /// Replication offset of the node (0 when replication is off).
        offset: u64,
        limits: ServerLimits,
    },
    Pong,
    /// One result per check, in the order of the request.
    Checked(Vec<CheckResult>),
    /// Number of keys that held state and were removed.
    ResetDone(u32),
    /// Number of leases that were live and have been freed.
    Released(u32),
    /// The whole request failed (or the connection is about to close).
    Error {
        code: ErrorCode,
        message: String,
    },
    /// Replication and operations: REPL_STREAM and the stream's frames,
    /// STATUS_OK, PROMOTED.
    Repl(crate::replication::ReplResponse),
    /// TOPOLOGY_OK: the cluster's slot map.
    Topology(crate::cluster::ClusterTopology),
    /// MOVED: the request's slot is served elsewhere; nothing was
    /// evaluated or charged.
    Moved(crate::cluster::Moved),
    /// USAGE_OK: a USAGE was taken in.
    UsageOk(crate::regions::UsageAck),
    /// CHALLENGE: the nonce the node's HELLO must prove its secret over.
    Challenge {
        nonce: [u8; crate::node_auth::NONCE_LEN],
    },
}
