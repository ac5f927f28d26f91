//! The network server: accept loop, connection tasks, sweeper, shutdown.
//!
//! [`Server::run`] takes an already bound listener and a [`CancellationToken`],
//! so tests bind port 0 and drive shutdown themselves. Invariants:
//! - a connection permit is taken *before* `accept`, so at most
//!   `max_connections` are served and the rest wait in the kernel's queue;
//! - one task per connection; a bad client can only end its own task;
//! - on shutdown the listener closes first, then every connection answers
//!   what it has already received and closes; after `shutdown_grace` the
//!   stragglers are cut off.

mod connection;

use crate::clock::{Clock, MonotonicClock};
use crate::config::ServerConfig;
use crate::store::{Store, StoreConfig};
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What every connection task shares.
pub(crate) struct Shared {
    pub config: ServerConfig,
    pub store: Arc<Store>,
    pub clock: Arc<dyn Clock>,
    /// Cancelled when the server starts draining: connections stop reading
    /// new work after answering what they hold.
    pub draining: CancellationToken,
    /// Cancelled when the grace period is over: connections stop at once.
    pub abort: CancellationToken,
}

/// A configured server, ready to run on a listener.
pub struct Server {
    shared: Arc<Shared>,
}

impl Server {
    /// A server on the production clock.
    pub fn new(config: ServerConfig) -> Self {
        Self::with_clock(config, Arc::new(MonotonicClock::new()))
    }

    /// A server whose time comes from `clock` (tests pass a manual clock).
    pub fn with_clock(config: ServerConfig, clock: Arc<dyn Clock>) -> Self {
        let store = Arc::new(Store::new(StoreConfig {
            stripes: config.stripes,
            max_group: usize::from(config.max_group),
            max_log_entries: config.max_log_entries,
            max_memory: config.max_memory,
            on_full: config.on_full.into(),
        }));
        Self {
            shared: Arc::new(Shared {
                config,
                store,
                clock,
                draining: CancellationToken::new(),
                abort: CancellationToken::new(),
            }),
        }
    }

    /// The store, for inspection (tests, later the admin API).
    pub fn store(&self) -> Arc<Store> {
        self.shared.store.clone()
    }

    /// Serves `listener` until `shutdown` is cancelled, then drains.
    pub async fn run(self, listener: TcpListener, shutdown: CancellationToken) -> io::Result<()> {
        let shared = self.shared;
        let tracker = TaskTracker::new();
        tracker.spawn(sweep(shared.clone(), shutdown.clone()));

        let permits = Arc::new(Semaphore::new(shared.config.max_connections));
        let mut accept_backoff = Duration::from_millis(5);
        loop {
            let permit = tokio::select! {
                _ = shutdown.cancelled() => break,
                p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            };
            let (stream, peer) = tokio::select! {
                _ = shutdown.cancelled() => break,
                r = listener.accept() => match r {
                    Ok(conn) => conn,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning;
                        // the server stays up for the connections it has.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(accept_backoff).await;
                        accept_backoff = (accept_backoff * 2).min(Duration::from_secs(1));
                        continue;
                    }
                },
            };
            accept_backoff = Duration::from_millis(5);
            let shared = shared.clone();
            tracker.spawn(async move {
                let _permit = permit;
                connection::serve(stream, peer, shared).await;
            });
        }

        drop(listener);
        tracing::info!(connections = tracker.len().saturating_sub(1), "draining");
        shared.draining.cancel();
        tracker.close();
        if tokio::time::timeout(shared.config.shutdown_grace, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                remaining = tracker.len(),
                "shutdown grace period over, closing remaining connections"
            );
            shared.abort.cancel();
            tracker.wait().await;
        }
        tracing::info!("stopped");
        Ok(())
    }
}

/// Drops expired keys a few stripes per tick, so no tick holds locks long.
async fn sweep(shared: Arc<Shared>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(shared.config.sweep_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let removed = shared
            .store
            .sweep(shared.config.sweep_stripes, shared.clock.now());
        if removed > 0 {
            tracing::trace!(removed, "swept expired keys");
        }
    }
}
