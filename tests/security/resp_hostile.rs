//! Hostile clients of the RESP front end (`--resp`), over raw sockets
//! against a real `tollgate serve` process: queued MULTI transactions stay
//! inside `--resp-max-multi-bytes` and `--max-connection-memory`, so do
//! half-sent long commands, and a connection guessing tokens is closed at
//! its third wrong one.

use crate::common::{http, RawConn, PATIENCE};
use crate::harness::{eventually, free_addr, BIN};
use crate::process::KillOnDrop;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// A `tollgate serve` process with a RESP front end.
struct Server {
    child: KillOnDrop,
    addr: SocketAddr,
    resp: SocketAddr,
    admin: SocketAddr,
}

impl Server {
    async fn start(args: &[&str]) -> Self {
        let (addr, admin, resp) = (free_addr(), free_addr(), free_addr());
        let child = Command::new(BIN)
            .args([
                "serve", "--listen", &addr, "--admin", &admin, "--resp", &resp,
            ])
            .args(args)
            .env_remove("TOLLGATE_CLUSTER_SECRET")
            .env_remove("TOLLGATE_AUTH_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let server = Server {
            child: KillOnDrop(child),
            addr: addr.parse().unwrap(),
            resp: resp.parse().unwrap(),
            admin: admin.parse().unwrap(),
        };
        let resp = server.resp;
        eventually("the RESP port listens", || async move {
            TcpStream::connect(resp).await.ok()
        })
        .await;
        server
    }

    /// The server process's resident set (VmRSS), in bytes.
    fn rss(&self) -> u64 {
        self.status_kib("VmRSS:") * KIB
    }

    /// The server process's peak resident set (VmHWM), in bytes.
    fn peak_rss(&self) -> u64 {
        self.status_kib("VmHWM:") * KIB
    }

    fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.0.id()))
            .expect("the server runs");
        let kib = status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .unwrap_or_else(|| panic!("{field} in /proc/PID/status"))
            .trim()
            .trim_end_matches("kB")
            .trim();
        kib.parse().unwrap()
    }

    async fn metric(&self, series: &str) -> f64 {
        let text = http(self.admin, "GET", "/metrics", None).await.text();
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("{series} missing"))
            .trim()
            .parse()
            .unwrap()
    }
}

/// A command as a RESP array of bulk strings.
fn command(words: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", words.len()).into_bytes();
    for w in words {
        out.extend_from_slice(format!("${}\r\n", w.len()).as_bytes());
        out.extend_from_slice(w);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// A raw RESP connection.
struct Resp {
    stream: TcpStream,
    pending: Vec<u8>,
}

impl Resp {
    async fn connect(addr: SocketAddr) -> Self {
        Self {
            stream: TcpStream::connect(addr).await.unwrap(),
            pending: Vec::new(),
        }
    }

    /// Sends `bytes` and reads `lines` CRLF-terminated reply lines (every
    /// reply these tests expect is one line, or an array of one-line
    /// elements counted in full).
    async fn exchange(&mut self, bytes: &[u8], lines: usize) -> Vec<String> {
        self.stream.write_all(bytes).await.unwrap();
        let mut out = Vec::with_capacity(lines);
        tokio::time::timeout(PATIENCE, async {
            while out.len() < lines {
                if let Some(at) = self.pending.windows(2).position(|w| w == b"\r\n") {
                    let line: Vec<u8> = self.pending.drain(..at + 2).collect();
                    out.push(String::from_utf8_lossy(&line[..at]).into_owned());
                    continue;
                }
                let mut buf = [0u8; 4096];
                let n = self.stream.read(&mut buf).await.unwrap();
                assert!(n > 0, "the server closed after {out:?}");
                self.pending.extend_from_slice(&buf[..n]);
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no reply within {PATIENCE:?}"));
        out
    }
}

/// A PING of 24 arguments of 512 bytes (the longest the defaults allow):
/// 12.2 KiB on the wire, so it fits a connection's own 16 KiB read buffer
/// (only the MULTI takes from the budget), queued whole by a MULTI.
fn big_ping() -> Vec<u8> {
    let arg = [b'x'; 512];
    let mut words: Vec<&[u8]> = vec![b"PING"];
    words.extend(std::iter::repeat_n(&arg[..], 24));
    command(&words)
}

/// 100 connections each open a MULTI and queue 40 commands of 12 KiB
/// (48 MiB in all, 4,000 commands). Each transaction may hold 1 MiB and
/// all of them together the 4 MiB budget: the first few queue theirs, the
/// others are answered -OOM and their EXEC -EXECABORT, the server's
/// resident memory grows by a bound set by those settings, another client
/// is still answered, and the budget is back to 0 once the transactions
/// are discarded or their connections closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_transactions_stay_within_the_connection_memory_budget() {
    const CONNS: usize = 100;
    const QUEUED: usize = 40;
    let server = Server::start(&[
        "--max-connection-memory",
        "4MiB",
        "--resp-max-multi-bytes",
        "1MiB",
    ])
    .await;
    let before = server.rss();
    let ping = big_ping();
    let mut pipeline = command(&[b"MULTI"]);
    for _ in 0..QUEUED {
        pipeline.extend_from_slice(&ping);
    }

    // One transaction past the per-transaction cap, alone: refused by
    // resp-max-multi-bytes, then EXECABORT, and nothing held after.
    let mut lone = Resp::connect(server.resp).await;
    let mut twice = pipeline.clone();
    for _ in 0..QUEUED {
        twice.extend_from_slice(&ping);
    }
    let replies = lone.exchange(&twice, 1 + 2 * QUEUED).await;
    let refused = replies
        .iter()
        .position(|r| r.starts_with("-OOM"))
        .unwrap_or_else(|| panic!("a 1 MiB transaction was not refused: {:?}", &replies[..3]));
    assert!(
        replies[refused].contains("resp-max-multi-bytes"),
        "{}",
        replies[refused]
    );
    assert!(
        (60..=79).contains(&refused),
        "{refused} queued before the cap"
    );
    let exec = lone.exchange(&command(&[b"EXEC"]), 1).await;
    assert_eq!(
        exec,
        ["-EXECABORT Transaction discarded because of previous errors."]
    );
    assert_eq!(server.metric("tollgate_connection_memory_bytes").await, 0.0);

    // Many transactions at once, each under the cap, held open.
    let mut conns = Vec::with_capacity(CONNS);
    // Commands held by transactions that were never refused (a refused
    // one holds nothing: its later commands are answered QUEUED, as Redis
    // does, but EXEC will only answer EXECABORT), and refusals.
    let (mut queued, mut oom) = (0, 0);
    for _ in 0..CONNS {
        let mut c = Resp::connect(server.resp).await;
        let replies = c.exchange(&pipeline, 1 + QUEUED).await;
        assert_eq!(replies[0], "+OK");
        let refused = replies[1..].iter().filter(|r| *r != "+QUEUED").count();
        for r in replies[1..].iter().filter(|r| *r != "+QUEUED") {
            assert!(
                r.starts_with("-OOM") && r.contains("max-connection-memory"),
                "unexpected reply {r}"
            );
        }
        match refused {
            0 => queued += QUEUED,
            _ => oom += refused,
        }
        conns.push((c, refused > 0));
    }
    let used = server.metric("tollgate_connection_memory_bytes").await;
    let grown = server.rss().saturating_sub(before);
    eprintln!(
        "{queued} commands queued, {oom} refused; budget used {used} bytes; \
         server RSS grew by {} KiB",
        grown / KIB
    );
    assert!(oom > 0, "no command was refused ({queued} queued)");
    assert!(used <= (4 * MIB) as f64 && used > 0.0, "budget used {used}");
    // Each queued command is about 13 KiB counted: no more than the
    // budget's worth were queued (48 MiB were sent).
    assert!(
        queued * 12 * KIB as usize <= 4 * MIB as usize,
        "{queued} queued"
    );
    // The budget, each connection's 16 KiB read buffer and what the
    // allocator keeps: far below the 48 MiB sent.
    assert!(grown < 24 * MIB, "server RSS grew by {} MiB", grown / MIB);

    // Another client is answered meanwhile.
    let mut other = Resp::connect(server.resp).await;
    let throttle = command(&[b"CL.THROTTLE", b"fresh", b"4", b"5", b"60"]);
    let answer = other.exchange(&throttle, 6).await;
    assert_eq!(answer, ["*5", ":0", ":5", ":4", ":-1", ":12"]);

    // A refused transaction's EXEC aborts (it held nothing already); of
    // those that hold memory, the first discards and the others close:
    // the budget is given back either way.
    let exec = command(&[b"EXEC"]);
    let (refused, mut holders): (Vec<_>, Vec<_>) = conns.into_iter().partition(|(_, r)| *r);
    for (mut c, _) in refused {
        let got = c.exchange(&exec, 1).await;
        assert_eq!(
            got,
            ["-EXECABORT Transaction discarded because of previous errors."]
        );
    }
    assert!(
        holders.len() >= 2,
        "{} transactions hold memory",
        holders.len()
    );
    let (mut first, _) = holders.remove(0);
    assert_eq!(first.exchange(&command(&[b"DISCARD"]), 1).await, ["+OK"]);
    let after_discard = server.metric("tollgate_connection_memory_bytes").await;
    assert!(
        after_discard < used,
        "DISCARD gave back nothing: {after_discard} of {used}"
    );
    drop(holders);
    eventually("the budget to be given back", || async {
        (server.metric("tollgate_connection_memory_bytes").await == 0.0).then_some(())
    })
    .await;
    assert_eq!(other.exchange(&command(&[b"PING"]), 1).await, ["+PONG"]);
}

/// Wrong tokens are answered WRONGPASS; the third on one connection
/// (RESET does not start the count again) closes it. Every refusal for a
/// missing or wrong token is counted by port, the protocol port's too; the
/// right token still gets in.
#[tokio::test]
async fn the_third_wrong_token_closes_the_connection_and_is_counted() {
    const TOKEN: &str = "resp-hostile-test-client-token-0123";
    let server = Server::start(&["--auth-token", TOKEN]).await;
    let wrongpass = "-WRONGPASS invalid username-password pair or user is disabled.";
    let mut c = Resp::connect(server.resp).await;
    assert_eq!(
        c.exchange(&command(&[b"AUTH", b"guess-1"]), 1).await,
        [wrongpass]
    );
    let hello = command(&[b"HELLO", b"3", b"AUTH", b"default", b"guess-2"]);
    assert_eq!(c.exchange(&hello, 1).await, [wrongpass]);
    assert_eq!(c.exchange(&command(&[b"RESET"]), 1).await, ["+RESET"]);
    // The third, with a PING behind it in the same write: the PING is not
    // answered, the connection closes.
    let mut third = command(&[b"AUTH", b"default", b"guess-3"]);
    third.extend_from_slice(&command(&[b"PING"]));
    assert_eq!(c.exchange(&third, 1).await, [wrongpass]);
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(PATIENCE, c.stream.read_to_end(&mut rest)).await;
    assert!(
        matches!(closed, Ok(Ok(_))) && rest.is_empty() && c.pending.is_empty(),
        "still open after the third wrong token: {closed:?} {rest:?}"
    );

    // A command before authenticating is refused for a missing token.
    let mut anonymous = Resp::connect(server.resp).await;
    let noauth = anonymous.exchange(&command(&[b"PING"]), 1).await;
    assert_eq!(noauth, ["-NOAUTH Authentication required."]);
    let mut node = RawConn::connect(server.addr).await;
    let refused = node.hello(Some("not-the-token")).await;
    assert!(
        matches!(refused, Some(tollgate_protocol::Response::Error { code, .. })
            if code == tollgate_protocol::ErrorCode::AuthFailed),
        "{refused:?}"
    );
    let resp = r#"tollgate_auth_failures_total{port="resp"}"#;
    let protocol = r#"tollgate_auth_failures_total{port="protocol"}"#;
    assert_eq!(server.metric(resp).await, 4.0);
    assert_eq!(server.metric(protocol).await, 1.0);

    // The right token gets in, after wrong ones on other connections.
    let mut good = Resp::connect(server.resp).await;
    let auth = command(&[b"AUTH", TOKEN.as_bytes()]);
    assert_eq!(good.exchange(&auth, 1).await, ["+OK"]);
    assert_eq!(good.exchange(&command(&[b"PING"]), 1).await, ["+PONG"]);
}

/// 64 connections each send the first 2 MiB of a 4 MiB command (2,048
/// arguments of 2 KiB, allowed by the settings) and stop: 128 MiB if each
/// were buffered. Beyond its own 16 KiB a connection's read buffer grows
/// only from the 1 MiB budget, and a connection that holds some and needs
/// more than is free is answered an error and closed: every one of them
/// ends so, the server's peak resident memory stays within a bound set by
/// those settings, another client is answered, and the budget is back to 0
/// with no client closing anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_long_commands_stay_within_the_connection_memory_budget() {
    const CONNS: usize = 64;
    let server = Server::start(&[
        "--resp-max-args",
        "2048",
        "--max-key-len",
        "2048",
        "--max-frame",
        "64KiB",
        "--max-connection-memory",
        "1MiB",
        "--frame-timeout",
        "5m",
    ])
    .await;
    let before = server.rss();
    let arg = vec![b'x'; 2048];
    let mut words: Vec<&[u8]> = vec![b"PING"];
    words.extend(std::iter::repeat_n(&arg[..], 2047));
    let mut start = command(&words);
    start.truncate(2 * MIB as usize);
    let start = std::sync::Arc::new(start);
    // Each connection writes in a task of its own (the write stops when
    // the server stops reading) and reads until the server closes.
    let mut conns = JoinSet::new();
    for _ in 0..CONNS {
        let s = TcpStream::connect(server.resp).await.unwrap();
        let start = start.clone();
        conns.spawn(async move {
            let (mut read, mut write) = s.into_split();
            let writer = tokio::spawn(async move {
                let _ = write.write_all(&start).await;
                write
            });
            let mut got = Vec::new();
            let _ = read.read_to_end(&mut got).await;
            writer.abort();
            String::from_utf8_lossy(&got).into_owned()
        });
    }
    let mut other = Resp::connect(server.resp).await;
    assert_eq!(other.exchange(&command(&[b"PING"]), 1).await, ["+PONG"]);
    let mut told = 0;
    let ended = tokio::time::timeout(PATIENCE, async {
        while let Some(got) = conns.join_next().await {
            let got = got.unwrap();
            assert!(got.is_empty() || got.starts_with("-ERR no memory"), "{got}");
            told += usize::from(got.contains("max-connection-memory"));
        }
    });
    ended
        .await
        .expect("the server ends every connection it has no memory for");
    let grown = server.peak_rss().saturating_sub(before);
    eprintln!(
        "{CONNS} half-sent 4 MiB commands: {told} told no memory, server peak RSS grew by {} KiB",
        grown / KIB
    );
    assert!(told > 0, "no connection was told why it closed");
    // The 1 MiB budget, 16 KiB of own buffer per connection and what the
    // allocator keeps: far below the 128 MiB sent.
    assert!(
        grown < 24 * MIB,
        "server peak RSS grew by {} MiB",
        grown / MIB
    );
    assert_eq!(server.metric("tollgate_connection_memory_bytes").await, 0.0);
    assert_eq!(other.exchange(&command(&[b"PING"]), 1).await, ["+PONG"]);
}
