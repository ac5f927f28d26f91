//! The server clock follows the wall clock: a real server whose wall clock
//! the test steps (as NTP would), checked over the protocol and `/metrics`.

mod common;

use common::*;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tollgate::clock::{MonotonicClock, Nanos, TimeSources};
use tollgate::config::ServerConfig;
use tollgate::server::Server;

/// The system's clocks, with the wall clock shifted by the test.
struct Shifted {
    origin: Instant,
    shift: AtomicI64,
}

#[derive(Clone)]
struct Sources(Arc<Shifted>);

impl TimeSources for Sources {
    fn wall(&self) -> Nanos {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as Nanos;
        wall.saturating_add_signed(self.0.shift.load(Ordering::Relaxed))
    }

    fn monotonic(&self) -> Nanos {
        self.0.origin.elapsed().as_nanos() as Nanos
    }
}

/// A server (protocol and admin on port 0) on a clock over `sources`.
async fn start(
    sources: Sources,
) -> (
    std::net::SocketAddr,
    std::net::SocketAddr,
    CancellationToken,
) {
    let config = ServerConfig::with_listen("127.0.0.1:0".parse().unwrap());
    config.validate().unwrap();
    let listener = TcpListener::bind(config.network.listen).await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (addr, admin_addr) = (listener.local_addr().unwrap(), admin.local_addr().unwrap());
    let clock = Arc::new(MonotonicClock::with_sources(sources));
    let server = Server::with_clock(config, clock).unwrap().with_admin(admin);
    let shutdown = CancellationToken::new();
    tokio::spawn(server.run(listener, shutdown.clone()));
    (addr, admin_addr, shutdown)
}

fn shifted() -> Sources {
    Sources(Arc::new(Shifted {
        origin: Instant::now(),
        shift: AtomicI64::new(0),
    }))
}

async fn clock_offset(admin: std::net::SocketAddr) -> f64 {
    let text = http(admin, "GET", "/metrics", None).await.text();
    text.lines()
        .find_map(|l| l.strip_prefix("tollgate_clock_offset_seconds "))
        .expect("the gauge is exported")
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn a_wall_clock_step_forward_refills_buckets() {
    let sources = shifted();
    let (addr, _admin, shutdown) = start(sources.clone()).await;
    let mut conn = RawConn::ready(addr).await;
    // One per hour: the second check is denied for an hour.
    let hourly = || batch_of(vec![vec![tb("k", 1, 3_600_000, 1, 1)]]);
    assert!(allowed(&conn.check(1, hourly()).await[0]));
    assert!(!allowed(&conn.check(2, hourly()).await[0]));
    // The wall clock is stepped two hours forward: within a sweeper tick
    // the server clock follows, and the bucket is full again.
    sources
        .0
        .shift
        .store(2 * 3600 * S as i64, Ordering::Relaxed);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    for id in 3.. {
        if allowed(&conn.check(id, hourly()).await[0]) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server clock never followed the step"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    shutdown.cancel();
}

#[tokio::test]
async fn a_wall_clock_step_back_shows_in_the_offset_gauge() {
    let sources = shifted();
    let (_addr, admin, shutdown) = start(sources.clone()).await;
    assert!(clock_offset(admin).await.abs() < 1.0);
    // NTP steps the wall clock 5 s back: the server clock does not follow
    // at once (it never steps back); the gauge shows how far ahead it is.
    sources.0.shift.store(-5 * S as i64, Ordering::Relaxed);
    let offset = eventually("the gauge to show the step back", || async {
        let offset = clock_offset(admin).await;
        (offset < -4.0).then_some(offset)
    })
    .await;
    assert!(offset > -5.1, "{offset}");
    shutdown.cancel();
}
