//! A minimal routing client for the cluster tests, on raw protocol frames
//! (PROTOCOL.md §14 "What a client does"): the map from any seed node,
//! each check sent to its slot's primary, a MOVED followed once (then the
//! map fetched again), TryAgain and unreachable nodes retried within a
//! deadline. It says which node answered each check and at which epoch
//! (from that connection's HELLO_OK), for the checker of the fault tests.

use std::collections::HashMap;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tollgate::slot::Slot;
use tollgate_protocol::{
    decode_response, encode_request, CheckBatch, CheckResult, ClusterTopology, Decision, ErrorCode,
    Limit, LimitRef, Pair, Request, Response, DEFAULT_CLIENT_MAX_FRAME, PROTOCOL_VERSION,
};

/// Pause before asking again after TryAgain or an unreachable node.
const RETRY: Duration = Duration::from_millis(20);

/// One connection: its node, the epoch that node said in HELLO_OK.
struct Conn {
    socket: TcpStream,
    rbuf: BytesMut,
    epoch: u64,
    next_id: u32,
}

impl Conn {
    async fn open(addr: &str, timeout: Duration) -> Option<Conn> {
        let socket = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .ok()?
            .ok()?;
        socket.set_nodelay(true).ok()?;
        let mut conn = Conn {
            socket,
            rbuf: BytesMut::with_capacity(16 * 1024),
            epoch: 0,
            next_id: 1,
        };
        let hello = Request::Hello {
            version: PROTOCOL_VERSION,
            client_name: "cluster-test".into(),
            auth_token: None,
        };
        match conn.call(&hello, timeout).await? {
            Response::HelloOk { epoch, .. } => {
                conn.epoch = epoch;
                Some(conn)
            }
            _ => None,
        }
    }

    async fn call(&mut self, request: &Request, timeout: Duration) -> Option<Response> {
        let id = self.next_id;
        self.next_id += 1;
        let mut out = BytesMut::new();
        encode_request(id, request, &mut out).ok()?;
        let exchange = async {
            self.socket.write_all(&out).await.ok()?;
            loop {
                match decode_response(&mut self.rbuf, DEFAULT_CLIENT_MAX_FRAME) {
                    Ok(Some((got, response))) if got == id => return Some(response),
                    Ok(Some(_)) => continue,
                    Ok(None) => {}
                    Err(_) => return None,
                }
                if self.socket.read_buf(&mut self.rbuf).await.ok()? == 0 {
                    return None;
                }
            }
        };
        tokio::time::timeout(timeout, exchange).await.ok()?
    }
}

/// How a check ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    Decided(Decision),
    /// A per-check error other than TryAgain.
    #[allow(dead_code)] // read through Debug
    Refused(ErrorCode),
    /// No node decided it within the deadline.
    Undecided,
}

/// A check's answer, and who gave it.
#[derive(Debug, Clone)]
pub struct Answer {
    pub outcome: Outcome,
    /// The node that answered last, and its epoch when the connection
    /// opened.
    pub node: String,
    pub epoch: u64,
    /// MOVED answers followed on the way.
    pub moved: u32,
    /// TryAgain answers (and unreachable nodes) on the way.
    pub retries: u32,
}

impl Answer {
    pub fn allowed(&self) -> bool {
        matches!(&self.outcome, Outcome::Decided(d) if d.allowed)
    }
}

/// A routing client over a cluster's seed nodes.
pub struct Router {
    seeds: Vec<String>,
    map: Option<ClusterTopology>,
    conns: HashMap<String, Conn>,
    /// Longest a check may take, retries included.
    pub deadline: Duration,
    /// Longest one request may take.
    pub attempt: Duration,
}

impl Router {
    pub fn new(seeds: Vec<String>) -> Router {
        Router {
            seeds,
            map: None,
            conns: HashMap::new(),
            deadline: Duration::from_secs(10),
            attempt: Duration::from_millis(500),
        }
    }

    /// The map last fetched.
    pub fn map(&self) -> Option<&ClusterTopology> {
        self.map.as_ref()
    }

    /// Fetches the map from the first seed (or node of the old map) that
    /// answers.
    pub async fn refresh(&mut self) -> bool {
        let mut candidates = self.seeds.clone();
        if let Some(map) = &self.map {
            for shard in &map.shards {
                candidates.push(shard.primary.clone());
                candidates.extend(shard.standbys.iter().cloned());
            }
        }
        for addr in candidates.into_iter().filter(|a| !a.is_empty()) {
            if let Some(Response::Topology(t)) = self.call(&addr, &Request::Topology).await {
                self.map = Some(t);
                return true;
            }
        }
        false
    }

    /// Refreshes the map until it names each of `primaries` as a shard's
    /// primary (a node learns the other shards' primaries from etcd a
    /// moment after the shards have settled); panics past `patience`.
    pub async fn refresh_until_primaries(&mut self, primaries: &[&str], patience: Duration) {
        let deadline = Instant::now() + patience;
        loop {
            assert!(self.refresh().await);
            let named = |p: &&str| {
                self.map
                    .as_ref()
                    .is_some_and(|m| m.shards.iter().any(|s| s.primary == *p))
            };
            if primaries.iter().all(named) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the topology never named the primaries {primaries:?}"
            );
            tokio::time::sleep(RETRY).await;
        }
    }

    /// Sends `request` to `addr` on a connection of its own; None when the
    /// node cannot be reached or does not answer in time.
    pub async fn call(&mut self, addr: &str, request: &Request) -> Option<Response> {
        if !self.conns.contains_key(addr) {
            let conn = Conn::open(addr, self.attempt).await?;
            self.conns.insert(addr.to_owned(), conn);
        }
        let conn = self.conns.get_mut(addr).expect("just opened");
        let answer = conn.call(request, self.attempt).await;
        if answer.is_none() {
            self.conns.remove(addr);
        }
        answer
    }

    fn epoch_of(&self, addr: &str) -> u64 {
        self.conns.get(addr).map_or(0, |c| c.epoch)
    }

    /// The primary the map names for `key`'s slot (None: no map, no
    /// primary, or the slot is moving).
    pub fn owner(&self, key: &[u8]) -> Option<String> {
        let slot = Slot::of(key).get();
        let map = self.map.as_ref()?;
        if map.moving.iter().any(|m| m.slots.contains(slot)) {
            return None;
        }
        map.owner(slot)
            .map(|s| s.primary.clone())
            .filter(|p| !p.is_empty())
    }

    /// One CHECK of `cost` units of `key`, routed and retried.
    pub async fn check(&mut self, key: &str, limit: Limit, cost: u32) -> Answer {
        let mut batch = CheckBatch::default();
        batch.push(Pair {
            key: key.as_bytes().to_vec().into(),
            limit: LimitRef::Inline(limit),
            cost,
        });
        self.send_check(key, Request::Check(batch)).await
    }

    /// Sends a one-check CHECK or PEEK for `key`, following the map.
    pub async fn send_check(&mut self, key: &str, request: Request) -> Answer {
        let deadline = Instant::now() + self.deadline;
        let mut answer = Answer {
            outcome: Outcome::Undecided,
            node: String::new(),
            epoch: 0,
            moved: 0,
            retries: 0,
        };
        if self.map.is_none() {
            self.refresh().await;
        }
        let mut redirect: Option<String> = None;
        while Instant::now() < deadline {
            let Some(addr) = redirect.take().or_else(|| self.owner(key.as_bytes())) else {
                answer.retries += 1;
                tokio::time::sleep(RETRY).await;
                self.refresh().await;
                continue;
            };
            let response = self.call(&addr, &request).await;
            answer.node = addr.clone();
            answer.epoch = self.epoch_of(&addr);
            match response {
                Some(Response::Checked(results)) => match results.into_iter().next() {
                    Some(CheckResult::Decision(d)) => {
                        answer.outcome = Outcome::Decided(d);
                        return answer;
                    }
                    Some(CheckResult::Error(ErrorCode::TryAgain)) => {}
                    Some(CheckResult::Error(code)) => {
                        answer.outcome = Outcome::Refused(code);
                        return answer;
                    }
                    None => {}
                },
                Some(Response::Moved(m)) => {
                    answer.moved += 1;
                    let newer = self.map.as_ref().is_none_or(|map| m.version > map.version);
                    if newer {
                        self.refresh().await;
                    }
                    // Followed once; after that the (fresh) map decides.
                    if answer.moved == 1 {
                        redirect = Some(m.addr);
                    }
                    continue;
                }
                _ => {}
            }
            answer.retries += 1;
            tokio::time::sleep(RETRY).await;
            self.refresh().await;
        }
        answer
    }
}
