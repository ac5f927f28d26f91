//! The node's one long-running task: settle the starting role, then run the
//! current role's duties, restarting them whenever the role changes.
//!
//! ```text
//!  source.start()  ──>  loop per role (a `watch` generation wakes it):
//!     primary: replication feed (serves handed-over standbys) + source duties
//!     standby: follower of the primary + source duties; handovers dropped
//! ```
//!
//! A role's duties are dropped whole on a role change (their sockets close,
//! the feed stops capturing), so no task of the old role outlives it.

use super::replication::{primary::Feed, standby};
use super::shared::{Core, Handover};
use super::source::RoleSource;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tollgate_protocol::Role;

/// Runs the node's duties for the server's whole life.
pub(crate) struct Supervisor {
    core: Arc<Core>,
    source: Arc<dyn RoleSource>,
    /// REPLICATE connections handed over by the server.
    inbox: mpsc::Receiver<Handover>,
}

impl Supervisor {
    pub(super) fn new(
        core: Arc<Core>,
        source: Arc<dyn RoleSource>,
        inbox: mpsc::Receiver<Handover>,
    ) -> Self {
        Self {
            core,
            source,
            inbox,
        }
    }

    /// Runs until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = self.source.start() => {}
        }
        let mut generation = self.core.role.subscribe();
        loop {
            generation.borrow_and_update();
            let role = self.core.role.role();
            let duties = async {
                match role {
                    Role::Primary => self.primary_duties().await,
                    Role::Standby => self.standby_duties().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                changed = generation.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                _ = duties => {}
            }
        }
    }

    async fn primary_duties(&mut self) {
        let feed = Feed::new(self.core.clone());
        tokio::select! {
            _ = feed.run(&mut self.inbox) => {}
            _ = self.source.duties(Role::Primary) => {}
        }
        // A step-down ends the source's duties; wait for the role switch.
        std::future::pending::<()>().await
    }

    async fn standby_duties(&mut self) {
        // Connections that asked to replicate while this node was primary.
        let inbox = &mut self.inbox;
        let refuse = async {
            while let Some(h) = inbox.recv().await {
                tracing::info!(peer = %h.peer, "dropping a replication connection: no longer primary");
            }
        };
        tokio::select! {
            _ = standby::follow(&self.core) => {}
            _ = self.source.duties(Role::Standby) => {}
            _ = refuse => {}
        }
        std::future::pending::<()>().await
    }
}
