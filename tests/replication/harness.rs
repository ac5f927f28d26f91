//! Real `tollgate serve` processes on fixed local ports (so a node can be
//! killed with SIGKILL and started again with the same flags), and the
//! helpers the scenarios share.

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tollgate_client::{
    Algorithm, Client, ClientConfig, Decision, Limit, LimitRef, NodeStatus, Outcome, Pair, Role,
};

pub const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

/// The pair's cluster secret: every node of these tests gets it (through
/// the environment, as a deployment would pass it).
pub const CLUSTER_SECRET: &str = "replication-tests-cluster-secret";

/// Generous bound for anything that should take well under a second, so a
/// broken build fails instead of hanging; never a pass/fail timing.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// A free `127.0.0.1:port` for a node to listen on ([`free_port`]).
pub fn free_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// A port on 127.0.0.1 for a process these tests start, picked so that no
/// one else is given it while it is not bound: at random *below* the
/// kernel's ephemeral range. A port-0 bind (another test's in-process
/// server, an admin listener) and every outgoing connection's source port
/// draw from that range, so with a port from it a node's peer could be
/// answered by a stranger while the node is not yet started, or be taken
/// between a SIGKILL and the restart on the same flags. Checked free by
/// binding it, and never handed out twice by one test process (two test
/// processes would have to draw the same port out of thousands while it
/// is unbound). Where the range leaves too little room below it, the
/// kernel's port 0 as before.
pub fn free_port() -> u16 {
    use std::collections::BTreeSet;
    use std::hash::{BuildHasher, RandomState};
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    const LOWEST: u16 = 10_000;

    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(LOWEST);
    let room = ephemeral_low.saturating_sub(LOWEST);
    if room >= 1_000 {
        let random = RandomState::new();
        let mut given = GIVEN.lock().unwrap();
        for attempt in 0u64..10_000 {
            let port = LOWEST + (random.hash_one(attempt) % u64::from(room)) as u16;
            if !given.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                given.insert(port);
                return port;
            }
        }
    }
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().unwrap().port()
}

/// One `tollgate serve` process.
pub struct Node {
    pub addr: String,
    pub admin: String,
    args: Vec<String>,
    child: Option<Child>,
    /// Stopped with SIGSTOP and not resumed.
    paused: std::sync::atomic::AtomicBool,
    /// Every JSON log line so far.
    logs: Arc<Mutex<Vec<serde_json::Value>>>,
}

impl Node {
    /// Starts `serve --listen addr` with `extra` flags; returns once it
    /// logs that it serves.
    pub fn start(addr: &str, extra: &[&str]) -> Node {
        let mut node = Node {
            addr: addr.to_owned(),
            admin: String::new(),
            args: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
            paused: Default::default(),
            logs: Arc::default(),
        };
        node.spawn();
        node
    }

    /// Whether the process runs (started, not killed, not paused).
    #[allow(dead_code)] // for the cluster tests, which share this harness
    pub fn running(&self) -> bool {
        self.child.is_some() && !self.paused.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn spawn(&mut self) {
        let mut child = Command::new(BIN)
            .args([
                "serve",
                "--listen",
                &self.addr,
                "--admin",
                "127.0.0.1:0",
                "--log-format",
                "json",
            ])
            .args(&self.args)
            .env("RUST_LOG", "info")
            .env("TOLLGATE_CLUSTER_SECRET", CLUSTER_SECRET)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tollgate serve");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let logs = self.logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue;
                };
                if v["fields"]["message"] == "tollgate serving" {
                    let _ = tx.send(v["fields"]["admin"].as_str().unwrap_or("").to_owned());
                }
                logs.lock().unwrap().push(v);
            }
        });
        self.admin = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the server logs that it serves");
        self.child = Some(child);
    }

    /// The process id (to send it signals; the security tests do).
    #[allow(dead_code)]
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGKILL: no drain, no goodbye.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL");
            child.wait().expect("reaped");
        }
        self.paused
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// SIGSTOP: the process keeps its sockets and answers nothing (its
    /// peers' frames queue up unread) until [`resume`](Self::resume).
    pub fn pause(&self) {
        self.signal("-STOP");
        self.paused
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// SIGCONT after [`pause`](Self::pause).
    pub fn resume(&self) {
        self.signal("-CONT");
        self.paused
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("node running").id();
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// Starts the process again with exactly the same flags.
    pub fn restart(&mut self) {
        self.kill();
        self.logs = Arc::default();
        self.spawn();
    }

    /// Log lines (their `fields`) of the current process whose message is
    /// `message`.
    pub fn logged(&self, message: &str) -> Vec<serde_json::Value> {
        self.logs
            .lock()
            .unwrap()
            .iter()
            .filter(|v| v["fields"]["message"] == message)
            .map(|v| v["fields"].clone())
            .collect()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A failed scenario shows what each of its nodes said last
            // (nextest prints a failing test's stderr); the whole log goes
            // to TOLLGATE_TEST_LOGS when that names a file.
            const TAIL: usize = 40;
            let logs = self.logs.lock().unwrap();
            let from = logs.len().saturating_sub(TAIL);
            eprintln!("--- {}: log lines {}-{}", self.addr, from + 1, logs.len());
            for v in &logs[from..] {
                eprintln!("{} {}", self.addr, v);
            }
            drop(logs);
            if let Ok(path) = std::env::var("TOLLGATE_TEST_LOGS") {
                use std::io::Write;
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .unwrap();
                for v in self.logs.lock().unwrap().iter() {
                    let _ = writeln!(f, "{} {}", self.addr, v);
                }
            }
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn config(deadline: Duration) -> ClientConfig {
    ClientConfig {
        deadline,
        connect_timeout: Duration::from_millis(500),
        backoff_min: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        client_name: "replication-test".into(),
        fallback: None,
        ..ClientConfig::default()
    }
}

/// A client for one node.
pub fn client(addr: &str) -> Client {
    Client::new(addr.to_owned(), config(Duration::from_secs(2))).expect("valid config")
}

/// A STATUS announce sent as another node would: NODE_CHALLENGE, HELLO
/// proving the cluster secret over the nonce (PROTOCOL.md §15), then the
/// announce; the node's STATUS_OK (or the ERROR it answered).
pub async fn announce_as_node(
    addr: &str,
    announce: tollgate_protocol::Announce,
) -> tollgate_protocol::Response {
    use bytes::BytesMut;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tollgate_protocol::{
        decode_response, encode_request, node_proof, NodeScope, ReplRequest, Request, Response,
        PROTOCOL_VERSION,
    };
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut rbuf = BytesMut::new();
    let mut call = async |id: u32, request: Request| -> Response {
        let mut w = BytesMut::new();
        encode_request(id, &request, &mut w).unwrap();
        stream.write_all(&w).await.unwrap();
        loop {
            if let Some((got, r)) = decode_response(&mut rbuf, 1 << 24).unwrap() {
                assert_eq!(got, id, "{r:?}");
                return r;
            }
            assert!(stream.read_buf(&mut rbuf).await.unwrap() > 0, "closed");
        }
    };
    let nonce = match call(1, Request::NodeChallenge).await {
        Response::Challenge { nonce } => nonce,
        other => panic!("NODE_CHALLENGE: {other:?}"),
    };
    let proof = node_proof(CLUSTER_SECRET.as_bytes(), &nonce, NodeScope::Cluster);
    let hello = Request::Hello {
        version: PROTOCOL_VERSION,
        client_name: "test node".into(),
        auth_token: Some(bytes::Bytes::copy_from_slice(&proof)),
    };
    match call(2, hello).await {
        Response::HelloOk { .. } => {}
        other => panic!("HELLO: {other:?}"),
    }
    let status = ReplRequest::Status {
        announce: Some(announce),
    };
    call(3, Request::Repl(status)).await
}

/// The node's STATUS, or None while it cannot be reached.
pub async fn status(addr: &str) -> Option<NodeStatus> {
    let c = client(addr);
    let s = c.status().await.ok();
    c.close();
    s
}

/// Polls `probe` until it returns `Some`, every 20 ms, for up to
/// [`PATIENCE`]; panics with `what` otherwise.
pub async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < deadline, "gave up waiting: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the node at `addr` reports `role` (and returns its status).
pub async fn role_is(addr: &str, role: Role) -> NodeStatus {
    eventually(&format!("{addr} becomes {role:?}"), || async {
        status(addr).await.filter(|s| s.role == role)
    })
    .await
}

/// Starts a pair as docs/REPLICATION.md says: A primary, B its standby, each the
/// other's peer, failover after `failover_after`; returns once B holds a
/// complete copy (only a standby that has been in sync promotes itself).
pub async fn start_pair(failover_after: &str) -> (Node, Node) {
    let (a_addr, b_addr) = (free_addr(), free_addr());
    let common = ["--failover-after", failover_after];
    let a = Node::start(&a_addr, &[&["--peer", &b_addr][..], &common].concat());
    role_is(&a_addr, Role::Primary).await;
    let b = Node::start(
        &b_addr,
        &[&["--replica-of", &a_addr, "--peer", &a_addr][..], &common].concat(),
    );
    caught_up(&a_addr, &b_addr).await;
    (a, b)
}

/// Waits until the standby at `standby` is in sync and holds every change
/// the primary at `primary` made before this was called: two drain passes
/// later every such change has been numbered (a pass started after it
/// ended), and the standby applies up to that offset.
pub async fn caught_up(primary: &str, standby: &str) {
    let passes = |s: &NodeStatus| s.field("passes").unwrap_or(0);
    let start = passes(&status(primary).await.expect("primary answers"));
    let numbered = eventually(&format!("{primary} drains its changes"), || async {
        status(primary).await.filter(|s| passes(s) >= start + 2)
    })
    .await;
    let target = numbered.offset;
    eventually(&format!("{standby} catches up with {primary}"), || async {
        let s = status(standby).await?;
        (s.field("synced") == Some(1) && s.offset >= target).then_some(())
    })
    .await
}

/// The limits the scenarios use: slow refills, so no state changes by
/// itself while a test compares two nodes.
pub fn limit_of(kind: usize) -> Limit {
    let (algorithm, count, period_ms, burst) = match kind % 5 {
        0 => (Algorithm::TokenBucket, 1, 60_000, 50),
        1 => (Algorithm::FixedWindow, 50, 3_600_000, 0),
        2 => (Algorithm::SlidingWindow, 50, 3_600_000, 0),
        3 => (Algorithm::SlidingLog, 50, 3_600_000, 0),
        _ => (Algorithm::Concurrency, 50, 3_600_000, 0),
    };
    Limit {
        algorithm,
        count,
        period_ms,
        burst,
    }
}

pub fn pair(key: &str, limit: Limit, cost: u32) -> Pair {
    Pair {
        key: key.as_bytes().to_vec().into(),
        limit: LimitRef::Inline(limit),
        cost,
    }
}

/// The decision a PEEK of `key` gets from `client`.
pub async fn peek(client: &Client, key: &str, limit: Limit) -> Decision {
    match client.peek(key.to_owned(), limit, 1).await {
        Outcome::Decided(d) => d,
        other => panic!("PEEK {key} on {}: {other:?}", client.addr()),
    }
}
