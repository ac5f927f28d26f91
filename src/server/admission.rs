//! Who gets a connection: the limits in all (`--max-connections`) and per
//! client address (`--max-connections-per-ip`), shedding the connection
//! quiet longest when the server is full, and the answer a connection
//! gets when it cannot be served.
//!
//! Every connection is accepted, then admitted or refused here, so a
//! client is never left hanging in the kernel's queue: a refused one gets
//! ERROR TooManyConnections (request id 0) and is closed.
//!
//! Invariants:
//! - at most `max` connections hold a [`Ticket`], at most `per_ip` of them
//!   from one address (IPv4, or one IPv6 /64: an IPv6 client gets a whole
//!   /64 for free);
//! - when full, a newcomer takes the place of the connection that has sent
//!   nothing for longest, if that is at least `--shed-idle-after`; the shed
//!   connection is told TooManyConnections and closes, and its place is
//!   counted free at once;
//! - a scan that finds nothing to shed remembers when the quietest
//!   connection could first be shed (connections only get fresher), so a
//!   flood of newcomers costs one scan per that much time, not one each;
//! - refusals are written by a bounded number of tasks
//!   ([`MAX_REFUSING`]); past it a refused socket is just closed;
//! - the drop-in front ends (RESP, Envoy) are admitted here too, so their
//!   connections count toward both limits; an Envoy connection may be shed
//!   like a protocol one (it counts as active when it makes an authorized
//!   call), a RESP one is never shed (it ends on its idle timeout); each
//!   is refused in its own words ([`Answer`]).

use super::handshake::secure;
use super::stop::Stop;
use super::Shared;
use bytes::BytesMut;
use parking_lot::Mutex;
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tollgate_protocol::{encode_response, ErrorCode, Response};

/// Refusals being written at once; past this a refused socket is closed
/// without an answer (a flood must not buy itself unbounded tasks).
pub(crate) const MAX_REFUSING: usize = 256;
/// How long a refused connection may take to read its answer and close.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// The connection limits and the connections holding a place.
pub(crate) struct Admission {
    max: usize,
    per_ip: usize,
    /// Zero: never shed.
    shed_after: Duration,
    start: Instant,
    table: Mutex<Table>,
    refused: [IntCounter; 2],
    shed: IntCounter,
    refusing: Arc<tokio::sync::Semaphore>,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    live: HashMap<u64, Arc<Live>>,
    by_ip: HashMap<IpAddr, usize>,
    /// Milliseconds since start before which nothing can be shed.
    no_shed_before: u64,
}

/// One admitted connection, as the table sees it.
struct Live {
    ip: IpAddr,
    /// False for a front end's connection: never chosen to make room.
    sheddable: bool,
    /// When it last sent something, in milliseconds since start.
    last_active: AtomicU64,
    shed: Stop,
}

/// Why a connection is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("too many connections: this server serves {max} at once (--max-connections) and none has been quiet long enough to make room (--shed-idle-after)")]
    Full { max: usize },
    #[error("too many connections from {ip}: at most {max} at once (--max-connections-per-ip)")]
    PerIp { ip: IpAddr, max: usize },
}

/// How a refused connection is told, in its port's protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// ERROR TooManyConnections (request id 0), after TLS if configured.
    Protocol,
    /// `-ERR max number of clients reached` (Redis's words, which Redis
    /// clients know), after TLS if configured.
    Resp,
    /// Closed at once (Envoy: the gRPC client sees the connection fail
    /// and retries or applies its failure mode).
    Close,
}

impl Refusal {
    fn index(&self) -> usize {
        match self {
            Self::Full { .. } => 0,
            Self::PerIp { .. } => 1,
        }
    }
}

impl Admission {
    pub fn register(
        max: usize,
        per_ip: usize,
        shed_after: Duration,
        registry: &Registry,
    ) -> prometheus::Result<Self> {
        let refused = IntCounterVec::new(
            Opts::new(
                "tollgate_connections_refused_total",
                "Connections refused on arrival (any port), by the limit they met.",
            ),
            &["reason"],
        )?;
        let shed = IntCounter::new(
            "tollgate_connections_shed_total",
            "Quiet connections closed to make room for a new one while the server was full.",
        )?;
        registry.register(Box::new(refused.clone()))?;
        registry.register(Box::new(shed.clone()))?;
        Ok(Self {
            max,
            per_ip,
            shed_after,
            start: Instant::now(),
            table: Mutex::new(Table::default()),
            refused: ["max_connections", "max_connections_per_ip"]
                .map(|reason| refused.with_label_values(&[reason])),
            shed,
            refusing: Arc::new(tokio::sync::Semaphore::new(MAX_REFUSING)),
        })
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// A place for a protocol connection from `peer`, or why not.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Ticket, Refusal> {
        self.admit_with(peer, true)
    }

    /// A place for a front end's connection from `peer`, never shed.
    pub fn admit_unshed(self: &Arc<Self>, peer: IpAddr) -> Result<Ticket, Refusal> {
        self.admit_with(peer, false)
    }

    fn admit_with(self: &Arc<Self>, peer: IpAddr, sheddable: bool) -> Result<Ticket, Refusal> {
        let ip = address_key(peer);
        let now = self.now_ms();
        let mut t = self.table.lock();
        if t.by_ip.get(&ip).copied().unwrap_or(0) >= self.per_ip {
            return Err(self.count(Refusal::PerIp {
                ip,
                max: self.per_ip,
            }));
        }
        if t.live.len() >= self.max && !self.shed_one(&mut t, now) {
            return Err(self.count(Refusal::Full { max: self.max }));
        }
        let id = t.next_id;
        t.next_id += 1;
        let live = Arc::new(Live {
            ip,
            sheddable,
            last_active: AtomicU64::new(now),
            shed: Stop::default(),
        });
        t.live.insert(id, live.clone());
        *t.by_ip.entry(ip).or_default() += 1;
        Ok(Ticket {
            admission: self.clone(),
            id,
            live,
        })
    }

    fn count(&self, refusal: Refusal) -> Refusal {
        self.refused[refusal.index()].inc();
        refusal
    }

    /// Frees the place of the connection quiet longest, if it has been
    /// quiet at least `shed_after`, and tells it to go.
    fn shed_one(&self, t: &mut Table, now: u64) -> bool {
        let after = self.shed_after.as_millis() as u64;
        if self.shed_after.is_zero() || now < t.no_shed_before {
            return false;
        }
        let quietest = t
            .live
            .iter()
            .filter(|(_, live)| live.sheddable)
            .map(|(id, live)| (*id, live.last_active.load(Ordering::Relaxed)))
            .min_by_key(|&(_, last)| last);
        let Some((id, last)) = quietest else {
            return false;
        };
        if now.saturating_sub(last) < after {
            t.no_shed_before = last.saturating_add(after);
            return false;
        }
        if let Some(live) = t.remove(id) {
            live.shed.cancel();
            self.shed.inc();
        }
        true
    }

    /// Answers a connection that cannot be served, in a task of its own
    /// (bounded), and closes it.
    pub fn refuse(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        why: Refusal,
        answer: Answer,
        shared: Arc<Shared>,
    ) {
        tracing::debug!(%peer, reason = %why, "connection refused");
        if answer == Answer::Close {
            return;
        }
        let Ok(permit) = self.refusing.clone().try_acquire_owned() else {
            return;
        };
        tokio::spawn(async move {
            let _permit = permit;
            answer_and_close(stream, peer, &why, answer, &shared).await;
        });
    }
}

impl Table {
    fn remove(&mut self, id: u64) -> Option<Arc<Live>> {
        let live = self.live.remove(&id)?;
        if let Some(n) = self.by_ip.get_mut(&live.ip) {
            *n -= 1;
            if *n == 0 {
                self.by_ip.remove(&live.ip);
            }
        }
        Some(live)
    }
}

/// A connection's place; dropping it frees the place.
pub(crate) struct Ticket {
    admission: Arc<Admission>,
    id: u64,
    live: Arc<Live>,
}

impl Ticket {
    /// The connection sent something.
    pub fn touch(&self) {
        let now = self.admission.now_ms();
        self.live.last_active.store(now, Ordering::Relaxed);
    }

    /// Cancelled when the connection is shed to make room.
    pub fn shed(&self) -> &Stop {
        &self.live.shed
    }

    /// What a shed connection is told.
    pub fn shed_message(&self) -> String {
        let quiet = self
            .admission
            .now_ms()
            .saturating_sub(self.live.last_active.load(Ordering::Relaxed));
        format!(
            "closed to make room for a new connection: quiet for {} ms while the server was full (--max-connections, --shed-idle-after)",
            quiet
        )
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.admission.table.lock().remove(self.id);
    }
}

/// Where a client's connections are counted: its IPv4 address, or the
/// /64 of an IPv6 one (an IPv4-mapped address counts as IPv4).
fn address_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(Ipv6Addr::from(prefix))
            }
        },
    }
}

/// The refusal in the port's protocol, then an orderly close: the
/// client's bytes are read until it closes (or [`REFUSAL_LINGER`]), so the
/// close is not a reset that could discard the answer before the client
/// reads it.
async fn answer_and_close(
    stream: TcpStream,
    peer: SocketAddr,
    why: &Refusal,
    answer: Answer,
    shared: &Shared,
) {
    let Some(mut socket) = secure(stream, peer, shared).await else {
        return;
    };
    let mut frame = BytesMut::new();
    match answer {
        Answer::Protocol => {
            shared.engine.errors().count(ErrorCode::TooManyConnections);
            let error = Response::Error {
                code: ErrorCode::TooManyConnections,
                message: why.to_string(),
            };
            if encode_response(0, &error, &mut frame).is_err() {
                return;
            }
        }
        // The reason holds no CR or LF (numbers, an address and flags).
        Answer::Resp => frame.extend_from_slice(
            format!("-ERR max number of clients reached ({why})\r\n").as_bytes(),
        ),
        Answer::Close => return,
    }
    let _ = tokio::time::timeout(REFUSAL_LINGER, async {
        socket.write_all(&frame).await?;
        socket.flush().await?;
        socket.shutdown().await?;
        let mut sink = [0u8; 1024];
        while socket.read(&mut sink).await? > 0 {}
        std::io::Result::Ok(())
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(max: usize, per_ip: usize, shed_after: Duration) -> Arc<Admission> {
        Arc::new(Admission::register(max, per_ip, shed_after, &Registry::new()).unwrap())
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn places_are_counted_in_all_and_per_address_and_freed_on_drop() {
        let a = admission(3, 2, Duration::ZERO);
        let one = a.admit(ip("10.0.0.1")).unwrap();
        let _two = a.admit(ip("10.0.0.1")).unwrap();
        assert_eq!(
            a.admit(ip("10.0.0.1")).err(),
            Some(Refusal::PerIp {
                ip: ip("10.0.0.1"),
                max: 2
            })
        );
        let _three = a.admit(ip("10.0.0.2")).unwrap();
        assert_eq!(
            a.admit(ip("10.0.0.3")).err(),
            Some(Refusal::Full { max: 3 })
        );
        drop(one);
        assert!(a.admit(ip("10.0.0.1")).is_ok());
    }

    #[test]
    fn ipv6_clients_are_counted_per_64_and_mapped_ipv4_as_ipv4() {
        assert_eq!(
            address_key(ip("2001:db8:1:2:aaaa::1")),
            ip("2001:db8:1:2::")
        );
        assert_eq!(address_key(ip("::ffff:10.0.0.1")), ip("10.0.0.1"));
        let a = admission(10, 1, Duration::ZERO);
        let _first = a.admit(ip("2001:db8:1:2::1")).unwrap();
        assert!(a.admit(ip("2001:db8:1:2::ffff")).is_err());
        assert!(a.admit(ip("2001:db8:1:3::1")).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn when_full_the_quietest_connection_makes_room_once_quiet_long_enough() {
        let a = admission(2, 10, Duration::from_secs(5));
        let old = a.admit(ip("10.0.0.1")).unwrap();
        tokio::time::advance(Duration::from_secs(2)).await;
        let busy = a.admit(ip("10.0.0.2")).unwrap();
        // Nobody has been quiet for 5 s yet.
        assert_eq!(
            a.admit(ip("10.0.0.3")).err(),
            Some(Refusal::Full { max: 2 })
        );
        tokio::time::advance(Duration::from_secs(4)).await;
        busy.touch();
        let newcomer = a.admit(ip("10.0.0.3")).expect("the quiet one makes room");
        assert!(old.shed().is_cancelled());
        assert!(!busy.shed().is_cancelled());
        assert!(old.shed_message().contains("6000 ms"));
        // The shed connection's place went to the newcomer: its drop
        // frees nothing more.
        drop(old);
        assert_eq!(
            a.admit(ip("10.0.0.4")).err(),
            Some(Refusal::Full { max: 2 })
        );
        drop(newcomer);
        assert!(a.admit(ip("10.0.0.4")).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_front_end_connection_is_counted_but_never_shed() {
        let a = admission(2, 10, Duration::from_secs(5));
        let front = a.admit_unshed(ip("10.0.0.1")).unwrap();
        tokio::time::advance(Duration::from_secs(2)).await;
        let protocol = a.admit(ip("10.0.0.2")).unwrap();
        tokio::time::advance(Duration::from_secs(10)).await;
        // The front end's connection is quiet longest, the protocol one goes.
        let newcomer = a.admit(ip("10.0.0.3")).expect("room is made");
        assert!(protocol.shed().is_cancelled());
        assert!(!front.shed().is_cancelled());
        // With nothing sheddable left but the newcomer (fresh), refused;
        // once the newcomer is quiet long enough it makes room in turn:
        // the front end's place never blocks shedding for good.
        assert_eq!(
            a.admit(ip("10.0.0.4")).err(),
            Some(Refusal::Full { max: 2 })
        );
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(a.admit(ip("10.0.0.4")).is_ok());
        assert!(newcomer.shed().is_cancelled());
        assert!(!front.shed().is_cancelled());
    }
}
