//! HELLO and node-to-node control on a client port: who may do what.
//!
//! HELLO's token sets the connection's privilege (`auth.rs`): a client
//! token makes a client; after a NODE_CHALLENGE, a proof of the cluster
//! secret over its nonce makes a node, a proof of the region secret a
//! region peer. REPLICATE, PROMOTE, HANDOFF and a STATUS that announces a
//! role change a node's role or its counters, so a client or region
//! connection gets AuthFailed for them and nothing changes; operators
//! promote through the admin API instead. A region connection may send
//! only USAGE and PING; USAGE itself is answered here too. A plain STATUS and REPL_ACK's misuse are answered
//! like any other request.

use super::{Connection, Flow, Replicate};
use crate::engine::{Privilege, UsageError};
use tollgate_protocol::{
    ErrorCode, ReplRequest, ReplResponse, Request, RequestId, Response, UsageReport, NONCE_LEN,
    PROTOCOL_VERSION,
};

impl Connection {
    /// REPLICATE, REPL_ACK, PROMOTE, STATUS, HANDOFF.
    pub(super) fn replication(&mut self, id: RequestId, request: ReplRequest) -> Flow {
        let shared = self.shared.clone();
        let node = shared.engine.node();
        if let (Some(what), false) = (node_only(&request), self.privilege == Privilege::Node) {
            tracing::warn!(
                peer = %self.peer, client = %self.client_name, request = what, privilege = ?self.privilege,
                "node-to-node request from a client or region connection refused"
            );
            // Operators promote through the admin API (POST /v1/promote).
            let msg = format!("{what} needs a node connection (HELLO with the cluster secret)");
            self.error(id, ErrorCode::AuthFailed, &msg);
            return Flow::Continue;
        }
        match request {
            ReplRequest::Replicate {
                replid,
                offset,
                epoch,
                advertise,
            } => {
                if let Err(refusal) = node.accept_replica(epoch) {
                    self.refuse(id, &refusal);
                    return Flow::Continue;
                }
                self.replicate = Some(Replicate {
                    request_id: id,
                    replid,
                    offset,
                    advertise,
                });
                Flow::HandOver
            }
            ReplRequest::Ack { .. } => {
                self.error(
                    id,
                    ErrorCode::Malformed,
                    "REPL_ACK is only sent on a replication stream",
                );
                Flow::Continue
            }
            ReplRequest::Promote => {
                tracing::info!(peer = %self.peer, client = %self.client_name, "PROMOTE requested");
                match node.promote() {
                    Ok((epoch, was_primary)) => self.respond(
                        id,
                        &Response::Repl(ReplResponse::Promoted { epoch, was_primary }),
                    ),
                    Err(refusal) => self.refuse(id, &refusal),
                }
                Flow::Continue
            }
            ReplRequest::Handoff { epoch, records } => {
                tracing::debug!(peer = %self.peer, client = %self.client_name, records = records.len(), "HANDOFF");
                match node.take_handoff(epoch, &records) {
                    Ok(merged) => {
                        self.respond(id, &Response::Repl(ReplResponse::HandedOff { merged }))
                    }
                    Err(refusal) => self.refuse(id, &refusal),
                }
                Flow::Continue
            }
            ReplRequest::Status { announce } => {
                let status = match &announce {
                    Some(announce) => node.announced(announce),
                    None => Ok(node.status()),
                };
                match status {
                    Ok(s) => self.respond(id, &Response::Repl(ReplResponse::Status(s))),
                    Err(refusal) => self.refuse(id, &refusal),
                }
                Flow::Continue
            }
        }
    }

    pub(super) fn handshake(&mut self, id: RequestId, request: Request) -> Flow {
        let (version, client_name, auth_token) = match request {
            Request::Hello {
                version,
                client_name,
                auth_token,
            } => (version, client_name, auth_token),
            Request::NodeChallenge if self.challenge.is_none() => return self.challenge(id),
            Request::NodeChallenge => {
                self.error(
                    id,
                    ErrorCode::HandshakeRequired,
                    "one NODE_CHALLENGE per connection, then HELLO",
                );
                return Flow::Close;
            }
            _ => {
                self.error(
                    id,
                    ErrorCode::HandshakeRequired,
                    "the first request must be HELLO (or NODE_CHALLENGE, then HELLO)",
                );
                return Flow::Close;
            }
        };
        if version != PROTOCOL_VERSION {
            let msg = format!(
                "server speaks protocol version {PROTOCOL_VERSION}, client asked for {version}"
            );
            self.error(id, ErrorCode::UnsupportedVersion, &msg);
            return Flow::Close;
        }
        let given = auth_token.as_deref().unwrap_or_default();
        let (privilege, region) = match self.shared.auth.handshake(given, self.challenge.as_ref()) {
            Ok((privilege, region)) => (privilege, region.map(str::to_owned)),
            Err(refusal) => {
                let failures = &self.shared.metrics.frontends.auth_failures;
                failures.with_label_values(&["protocol"]).inc();
                // Debug, not info: a stream of bad HELLOs must not flood the log.
                tracing::debug!(peer = %self.peer, %refusal, "HELLO refused");
                self.error(id, ErrorCode::AuthFailed, &refusal.to_string());
                return Flow::Close;
            }
        };
        // The name goes into log lines: a newline in it must not start one.
        let client_name = crate::log_text::escape(&client_name).into_owned();
        tracing::debug!(peer = %self.peer, client = %client_name, ?privilege, "handshake done");
        self.ready = true;
        self.privilege = privilege;
        // A peer region's own secret: the connection speaks for it alone.
        self.usage_region = region;
        let identity = self.shared.auth.identity(given);
        self.owner = self.shared.engine.owner(privilege, identity);
        self.client_name = client_name;
        let greeting = self.shared.engine.node().greeting();
        let hello = Response::HelloOk {
            version: PROTOCOL_VERSION,
            role: greeting.role,
            epoch: greeting.epoch,
            offset: greeting.offset,
            limits: self.shared.limits,
        };
        self.respond(id, &hello);
        Flow::Continue
    }

    /// NODE_CHALLENGE: a fresh nonce from the OS, which this connection's
    /// HELLO must prove a node secret over (PROTOCOL.md §15). The
    /// handshake timeout still runs from the connection's start.
    fn challenge(&mut self, id: RequestId) -> Flow {
        let mut nonce = [0u8; NONCE_LEN];
        if let Err(e) = getrandom::fill(&mut nonce) {
            tracing::error!(peer = %self.peer, error = %e, "no randomness for a challenge");
            self.error(id, ErrorCode::Internal, "no randomness for a challenge");
            return Flow::Close;
        }
        self.challenge = Some(nonce);
        self.respond(id, &Response::Challenge { nonce });
        Flow::Continue
    }

    /// USAGE from another region (PROTOCOL.md §16), answered USAGE_OK or
    /// refused.
    pub(super) fn usage(&mut self, id: RequestId, report: &UsageReport) -> Flow {
        let shared = &*self.shared;
        let own_secret = shared.auth.region_has_own_secret(&report.region);
        let engine = &shared.engine;
        match engine.receive_usage(self.privilege, own_secret, &mut self.usage_region, report) {
            Ok(ack) => self.respond(id, &Response::UsageOk(ack)),
            Err(UsageError::Node(refusal)) => self.refuse(id, &refusal),
            Err(UsageError::Error(code, message)) => self.error(id, code, &message),
        }
        Flow::Continue
    }

    /// Whether a region connection may send `request`: USAGE and PING
    /// only (a second HELLO or a NODE_CHALLENGE after HELLO is answered
    /// as on any connection).
    pub(super) fn region_may(request: &Request) -> bool {
        matches!(
            request,
            Request::Usage(_) | Request::Ping | Request::Hello { .. } | Request::NodeChallenge
        )
    }
}

/// The name of a request only another node of the cluster may send (None:
/// any connection may).
fn node_only(request: &ReplRequest) -> Option<&'static str> {
    match request {
        ReplRequest::Replicate { .. } => Some("REPLICATE"),
        ReplRequest::Promote => Some("PROMOTE"),
        ReplRequest::Handoff { .. } => Some("HANDOFF"),
        ReplRequest::Status { announce: Some(_) } => Some("a STATUS announce"),
        ReplRequest::Status { announce: None } | ReplRequest::Ack { .. } => None,
    }
}
