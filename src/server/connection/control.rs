//! HELLO and node-to-node control on a client port: who may do what.
//!
//! HELLO's token sets the connection's privilege (`auth.rs`): a client
//! token makes a client, the cluster secret a node. REPLICATE, PROMOTE,
//! HANDOFF and a STATUS that announces a role change a node's role or its
//! counters, so a client connection gets AuthFailed for them and nothing
//! changes; operators promote through the admin API instead. A plain
//! STATUS and REPL_ACK's misuse are answered like any other request.

use super::{Connection, Flow, Replicate};
use crate::server::auth::Privilege;
use tollgate_protocol::{
    ErrorCode, ReplRequest, ReplResponse, Request, RequestId, Response, PROTOCOL_VERSION,
};

impl Connection {
    /// REPLICATE, REPL_ACK, PROMOTE, STATUS, HANDOFF.
    pub(super) fn replication(&mut self, id: RequestId, request: ReplRequest) -> Flow {
        let shared = self.shared.clone();
        let node = &shared.node;
        let control = match &request {
            ReplRequest::Replicate { .. } => Some("REPLICATE"),
            ReplRequest::Promote => Some("PROMOTE"),
            ReplRequest::Handoff { .. } => Some("HANDOFF"),
            ReplRequest::Status { announce: Some(_) } => Some("a STATUS announce"),
            ReplRequest::Status { announce: None } | ReplRequest::Ack { .. } => None,
        };
        if let (Some(what), Privilege::Client) = (control, self.privilege) {
            tracing::warn!(
                peer = %self.peer, client = %self.client_name, request = what,
                "node-to-node request from a client connection refused"
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
        let Request::Hello {
            version,
            client_name,
            auth_token,
        } = request
        else {
            self.error(
                id,
                ErrorCode::HandshakeRequired,
                "the first request must be HELLO",
            );
            return Flow::Close;
        };
        if version != PROTOCOL_VERSION {
            let msg = format!(
                "server speaks protocol version {PROTOCOL_VERSION}, client asked for {version}"
            );
            self.error(id, ErrorCode::UnsupportedVersion, &msg);
            return Flow::Close;
        }
        let given = auth_token.as_deref().unwrap_or_default();
        let Some(privilege) = self.shared.auth.hello(given) else {
            let failures = &self.shared.metrics.frontends.auth_failures;
            failures.with_label_values(&["protocol"]).inc();
            self.error(id, ErrorCode::AuthFailed, "missing or wrong auth token");
            return Flow::Close;
        };
        // The name goes into log lines: a newline in it must not start one.
        let client_name = crate::log_text::escape(&client_name).into_owned();
        tracing::debug!(peer = %self.peer, client = %client_name, ?privilege, "handshake done");
        self.ready = true;
        self.privilege = privilege;
        self.client_name = client_name;
        let greeting = self.shared.node.greeting();
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
}
