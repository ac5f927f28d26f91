//! A node's own connection to another node (its primary, its peer, another
//! region): TCP, or TLS verified against `--tls-ca` when the node runs TLS;
//! NODE_CHALLENGE, then HELLO proving the cluster secret (or, to another
//! region, the region secret) over the other node's nonce, so the secret
//! never crosses the wire (PROTOCOL.md §15); then either one request at a
//! time (the pair's probes, STATUS and PROMOTE) or the replication stream
//! (the follower, which drives [`Link::send`] and [`Link::next`] itself).
//!
//! Invariants: every read and write is bounded by the link's timeout, and
//! a read times out only when the kernel holds nothing unread for it;
//! frames are decoded under the server's frame ceiling, never more.

use super::shared::Core;
use crate::tls::{self, Socket};
use bytes::BytesMut;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate_protocol::{
    decode_response, encode_request, node_proof, ErrorCode, NodeScope, Request, RequestId,
    Response, Role, UsageFrame, PROTOCOL_VERSION,
};

/// Largest frame a node accepts from another (the server's frame
/// ceiling): a snapshot part is one chunk plus one record, and one record
/// is at most a key and `max_log_entries` timestamps.
const MAX_FRAME: u32 = crate::config::MAX_FRAME_CEILING;

/// Request id of the HELLO; [`Link::call`] numbers from the next one.
pub(crate) const HELLO_ID: RequestId = 1;

/// Why a link failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LinkError {
    #[error("cannot connect: {0}")]
    Connect(std::io::Error),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("nothing from the other node for {0:?}")]
    Silent(Duration),
    #[error("the other node closed the connection")]
    Closed,
    // The other node's text, escaped wherever this is shown or logged.
    #[error("refused: {code}: {}", crate::log_text::Escaped(.message))]
    Refused { code: ErrorCode, message: String },
    #[error("protocol: {0}")]
    Protocol(String),
}

/// What the other node said of itself in HELLO_OK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hello {
    pub role: Role,
    pub epoch: u64,
    /// The largest frame it accepts (HELLO_OK's limits).
    pub max_frame: u32,
}

/// An open, authenticated connection to another node.
pub(crate) struct Link {
    socket: Socket,
    rbuf: BytesMut,
    wbuf: BytesMut,
    timeout: Duration,
    next_id: RequestId,
}

impl Link {
    /// Connects to `addr` and says HELLO as `role_name` (for the other
    /// node's logs), proving the cluster secret; every step within
    /// `timeout`.
    pub async fn open(
        core: &Core,
        addr: &str,
        role_name: &str,
        timeout: Duration,
    ) -> Result<(Self, Hello), LinkError> {
        Self::open_as(core, addr, role_name, timeout, NodeScope::Cluster, None).await
    }

    /// [`Link::open`] proving the secret of `scope` (the region exchange to
    /// region `peer`: the secret shared with it, or the region secret, when
    /// this node has one).
    pub async fn open_as(
        core: &Core,
        addr: &str,
        role_name: &str,
        timeout: Duration,
        scope: NodeScope,
        peer: Option<&str>,
    ) -> Result<(Self, Hello), LinkError> {
        let connector = core.tls.as_ref().and_then(|t| t.connector());
        let socket = tls::connect(addr, connector.as_ref(), timeout)
            .await
            .map_err(LinkError::Connect)?;
        let mut link = Self {
            socket,
            rbuf: BytesMut::with_capacity(64 * 1024),
            wbuf: BytesMut::new(),
            timeout,
            next_id: HELLO_ID + 1,
        };
        let token = match core.credentials.secret_for(scope, peer) {
            Some((secret, scope)) => Some(link.prove(secret, scope).await?),
            None => core.credentials.token.clone().map(|t| t.into_bytes()),
        };
        let hello = Request::Hello {
            version: PROTOCOL_VERSION,
            client_name: format!("{role_name} {}", core.role.advertise()),
            auth_token: token.map(Into::into),
        };
        link.send(HELLO_ID, &hello).await?;
        match link.answer(HELLO_ID).await? {
            Response::HelloOk {
                role,
                epoch,
                limits,
                ..
            } => Ok((
                link,
                Hello {
                    role,
                    epoch,
                    max_frame: limits.max_frame,
                },
            )),
            other => Err(unexpected("HELLO", &other)),
        }
    }

    /// NODE_CHALLENGE, and the proof of `secret` over the nonce that
    /// answers it: HELLO's token.
    async fn prove(&mut self, secret: &str, scope: NodeScope) -> Result<Vec<u8>, LinkError> {
        self.send(HELLO_ID, &Request::NodeChallenge).await?;
        match self.answer(HELLO_ID).await? {
            Response::Challenge { nonce } => {
                Ok(node_proof(secret.as_bytes(), &nonce, scope).to_vec())
            }
            other => Err(unexpected("NODE_CHALLENGE", &other)),
        }
    }

    /// Every later read and write is bounded by `timeout` instead.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// One request and its answer (an ERROR comes back as
    /// [`LinkError::Refused`]).
    pub async fn call(&mut self, request: &Request) -> Result<Response, LinkError> {
        let id = self.take_id();
        self.send(id, request).await?;
        self.answer(id).await
    }

    /// [`Link::call`] of a USAGE built entry by entry: sent as it is, with
    /// no copy into the link's buffer.
    pub async fn call_usage(&mut self, usage: &mut UsageFrame) -> Result<Response, LinkError> {
        let id = self.take_id();
        let frame = usage
            .frame(id)
            .map_err(|e| LinkError::Protocol(e.to_string()))?;
        write_within(&mut self.socket, self.timeout, frame).await?;
        self.answer(id).await
    }

    /// The id of the next request.
    fn take_id(&mut self) -> RequestId {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(HELLO_ID + 1);
        id
    }

    /// The answer to request `id`, the next frame on a link used one
    /// request at a time.
    async fn answer(&mut self, id: RequestId) -> Result<Response, LinkError> {
        match self.next().await? {
            (_, Response::Error { code, message }) => Err(LinkError::Refused { code, message }),
            (got, response) if got == id => Ok(response),
            (got, _) => Err(LinkError::Protocol(format!(
                "an answer to request {got} where {id} was due"
            ))),
        }
    }

    /// Sends one request within the timeout.
    pub async fn send(&mut self, id: RequestId, request: &Request) -> Result<(), LinkError> {
        self.wbuf.clear();
        encode_request(id, request, &mut self.wbuf)
            .map_err(|e| LinkError::Protocol(e.to_string()))?;
        write_within(&mut self.socket, self.timeout, &self.wbuf).await
    }

    /// The next frame, within the timeout.
    pub async fn next(&mut self) -> Result<(RequestId, Response), LinkError> {
        loop {
            match decode_response(&mut self.rbuf, MAX_FRAME) {
                Ok(Some(frame)) => return Ok(frame),
                Ok(None) => {}
                Err(e) => return Err(LinkError::Protocol(e.to_string())),
            }
            if self.rbuf.capacity() - self.rbuf.len() < 16 * 1024 {
                self.rbuf.reserve(64 * 1024);
            }
            match tokio::time::timeout(self.timeout, self.socket.read_buf(&mut self.rbuf)).await {
                Ok(Ok(0)) => return Err(LinkError::Closed),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(e.into()),
                // The runtime may fire the timer before it has seen the
                // socket become readable (a process resumed after SIGSTOP
                // finds both due at once): ask the kernel itself.
                Err(_) if self.bytes_waiting() => {}
                Err(_) => return Err(LinkError::Silent(self.timeout)),
            }
        }
    }

    /// Whether the kernel holds received bytes not read yet (or the end of
    /// the stream), asked without blocking.
    fn bytes_waiting(&self) -> bool {
        let mut probe = [std::mem::MaybeUninit::<u8>::uninit(); 1];
        match socket2::SockRef::from(self.socket.tcp()).peek(&mut probe) {
            Ok(_) => true,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        }
    }
}

/// An answer that does not fit the request.
pub(crate) fn unexpected(request: &str, response: &Response) -> LinkError {
    LinkError::Protocol(format!("{response:?} in answer to {request}"))
}

/// Writes `frame` to `socket` and flushes it (TLS may keep the tail of a
/// write in its buffer), within `timeout`.
async fn write_within(
    socket: &mut Socket,
    timeout: Duration,
    frame: &[u8],
) -> Result<(), LinkError> {
    let write = async {
        socket.write_all(frame).await?;
        socket.flush().await
    };
    match tokio::time::timeout(timeout, write).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(LinkError::Silent(timeout)),
    }
}
