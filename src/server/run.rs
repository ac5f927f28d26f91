//! [`Server::run`]: the tasks beside the listener (sweeper, node
//! supervisor, region exchange, rules and certificate watches, decision
//! events, the admin API, the drop-in front ends), the protocol port's
//! accept loop, then the drain (see the module docs of `server` for the
//! order things stop in).

use super::admin::AdminState;
use super::admin_guard::RequestGuard;
use super::admission::{Admission, Answer};
use super::auth::AdminAuth;
#[cfg(feature = "envoy")]
use super::envoy;
use super::frontend::accept_loop;
use super::resp;
use super::{admin_listener, connection, Server, Shared};
use crate::config::ServerConfig;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A task that outlives the connections, with its own stop signal, given
/// after the drain: the events publisher (the last decisions are sent)
/// and the admin server (readyz says "draining" meanwhile).
struct Outliving {
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Outliving {
    /// Stops the task and waits for it at most `limit`; `what` names it in
    /// the warning when it does not stop in time.
    async fn stop(self, limit: Duration, what: &str) {
        self.stop.cancel();
        if let Some(task) = self.task {
            if tokio::time::timeout(limit, task).await.is_err() {
                tracing::warn!("{what} did not stop in time");
            }
        }
    }
}

impl Server {
    /// Serves `listener` until `shutdown` is cancelled, then drains.
    pub async fn run(self, listener: TcpListener, shutdown: CancellationToken) -> io::Result<()> {
        self.check_exposure(&listener)?;
        let Self {
            config,
            shared,
            supervisor,
            sweeper,
            registry,
            admin,
            admission,
            resp,
            envoy,
            tls,
            publisher,
        } = self;
        let node = shared.engine.node();
        if let Ok(addr) = listener.local_addr() {
            node.set_advertise(addr.to_string());
        }
        let grace = config.network.shutdown_grace;
        let events_stop = CancellationToken::new();
        let events = Outliving {
            task: publisher
                .map(|p| tokio::spawn(p.run(node.status().addr, events_stop.clone(), grace))),
            stop: events_stop,
        };
        let tracker = TaskTracker::new();
        tracker.spawn(sweeper.run(shutdown.clone()));
        tracker.spawn(supervisor.run(shutdown.clone()));
        if let Some(exchange) = node.exchange(shutdown.clone()) {
            tracker.spawn(exchange);
        }
        if !config.rules.poll.is_zero() {
            tracker.spawn(crate::rules::watch::watch(
                shared.engine.rules().clone(),
                config.rules.poll,
                shutdown.clone(),
            ));
        }
        if let Some(tls) = tls.filter(|_| !config.tls.tls_poll.is_zero()) {
            tracker.spawn(tls.watch(config.tls.tls_poll, shutdown.clone()));
        }
        let admin = serve_admin(&config, &shared, registry, admin)?;
        let ports = Ports {
            shared: &shared,
            admission: &admission,
            tracker: &tracker,
            shutdown: &shutdown,
        };
        ports.front_ends(resp, envoy);
        ports.protocol(listener).await;
        drain(&shared, &tracker, grace).await;
        // The publisher bounds its own drain by the grace period.
        events.stop(grace * 2, "decision events publisher").await;
        admin.stop(grace, "admin server").await;
        tracing::info!("stopped");
        Ok(())
    }
}

/// Starts the admin HTTP server on `listener`, if given; it reports ready
/// from here on.
fn serve_admin(
    config: &ServerConfig,
    shared: &Arc<Shared>,
    registry: prometheus::Registry,
    listener: Option<TcpListener>,
) -> io::Result<Outliving> {
    let stop = CancellationToken::new();
    let guard = RequestGuard::new(config.admin.admin_allowed_hosts.clone(), &registry)
        .map_err(io::Error::other)?;
    let state = Arc::new(AdminState {
        shared: shared.clone(),
        registry,
        serving: AtomicBool::new(false),
        max_log_entries: config.store.max_log_entries,
        auth: AdminAuth::new(&config.auth),
        guard,
        max_memory: config.store.max_memory,
        status_refresh: config.admin.status_refresh,
    });
    let task = listener.map(|l| {
        let acceptor = shared.tls.clone();
        tokio::spawn(admin_listener::serve(
            l,
            acceptor,
            state.clone(),
            stop.clone(),
        ))
    });
    // Release: pairs with the Acquire in readyz, after the set-up above.
    state.serving.store(true, Ordering::Release);
    Ok(Outliving { stop, task })
}

/// What the ports' accept loops share: connections, admission, their tasks
/// and the shutdown signal.
struct Ports<'a> {
    shared: &'a Arc<Shared>,
    admission: &'a Arc<Admission>,
    tracker: &'a TaskTracker,
    shutdown: &'a CancellationToken,
}

impl Ports<'_> {
    /// Starts the drop-in front ends given listeners. They are admitted
    /// with the protocol port's connections: one `--max-connections` and
    /// per-address cap for all.
    fn front_ends(&self, resp: Option<TcpListener>, envoy: Option<TcpListener>) {
        if let Some(l) = resp {
            self.tracker.spawn(resp::serve(
                l,
                self.shared.clone(),
                self.admission.clone(),
                self.tracker.clone(),
                self.shutdown.clone(),
            ));
        }
        #[cfg(feature = "envoy")]
        if let Some(l) = envoy {
            self.tracker.spawn(envoy::serve(
                l,
                self.shared.clone(),
                self.admission.clone(),
                self.shutdown.clone(),
            ));
        }
        #[cfg(not(feature = "envoy"))]
        drop(envoy);
    }

    /// The protocol port's accept loop, until shutdown.
    async fn protocol(&self, listener: TcpListener) {
        let tracker = self.tracker;
        let serving = self.shared.clone();
        accept_loop(
            listener,
            self.admission.clone(),
            self.shared.clone(),
            Answer::Protocol,
            self.shutdown.clone(),
            |stream, peer, ticket| {
                tracker.spawn(connection::serve(stream, peer, serving.clone(), ticket));
                std::future::ready(())
            },
        )
        .await;
    }
}

/// Lets every connection answer what it holds and close, cutting off the
/// stragglers after `grace`; then the node leaves (a cluster node gives up
/// its lease now, so a standby takes over without waiting for it to
/// expire).
async fn drain(shared: &Shared, tracker: &TaskTracker, grace: Duration) {
    tracing::info!(connections = shared.metrics.conns.open.get(), "draining");
    let lifecycle = &shared.lifecycle;
    lifecycle.draining.cancel();
    tracker.close();
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        tracing::warn!(
            remaining = tracker.len(),
            "shutdown grace period over, closing remaining connections"
        );
        lifecycle.abort.cancel();
        tracker.wait().await;
    }
    shared.engine.node().leave().await;
}
