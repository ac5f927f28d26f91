//! What the node's own tasks share ([`Core`]), and what a connection hands
//! them ([`Handover`]). Below everything else in the node: the role source,
//! the supervisor and replication read it; only [`Node`](super::Node) builds
//! it.

use super::role::RoleState;
use crate::clock::Clock;
use crate::config::ReplicationSettings;
use crate::store::Store;
use crate::tls::{Socket, Tls};
use bytes::BytesMut;
use std::net::SocketAddr;
use std::sync::Arc;
use tollgate_protocol::{RequestId, ServerLimits};

/// What the node's tasks share: the role state and what replication reads.
/// Node-internal; the server sees only [`Node`].
pub(crate) struct Core {
    pub role: RoleState,
    pub store: Arc<Store>,
    pub clock: Arc<dyn Clock>,
    pub settings: ReplicationSettings,
    /// What this node proves (or presents) in HELLO to other nodes.
    pub credentials: super::credentials::Credentials,
    /// TLS for this node's own connections (None: plain TCP).
    pub tls: Option<Arc<Tls>>,
    /// Frame limits for what a standby sends on its stream.
    pub limits: ServerLimits,
}

/// A REPLICATE request and its connection, handed from the connection that
/// received it to the replication task, which owns the socket from then on.
#[derive(Debug)]
pub(crate) struct Handover {
    pub stream: Socket,
    pub peer: SocketAddr,
    /// Bytes the connection had read past the REPLICATE (acks).
    pub leftover: BytesMut,
    pub request_id: RequestId,
    /// The stream the standby's copy comes from, and how far it got.
    pub replid: u64,
    pub offset: u64,
    /// Where the standby says it is reached.
    pub advertise: String,
}
