//! The client against a misbehaving or hostile *server* (docs/CLIENT.md,
//! "Failure behaviour"): one fake server on 127.0.0.1 whose behaviour each
//! test picks (silent after HELLO, half a frame, no HELLO, wrong or
//! duplicate ids, unknown opcodes, frames over the client's limit, length
//! 0 or 2^32-1, too few or too many results, bad statuses, garbage,
//! unsolicited answers, impossible HELLO limits, unknown error codes,
//! closing, RSTs, accept-and-close loops, one byte per 100 ms).
//!
//! Why: the limiter sits on every API request. Whatever the server does,
//! a call must end within its deadline (plus a margin) with the outcome
//! CLIENT.md documents, never a panic, a hang or unbounded memory, tasks
//! or reconnects, and never take garbage for the server's "allowed"; and
//! once the server behaves again, calls must be decided by it again.
//!
//! Timing is asserted only as generous bounds a correct client always
//! meets (a 200 ms deadline ends within 2 s); the checks are which outcome
//! and how many connections the server saw.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate_client::{
    BreakerConfig, CheckResult, Client, ClientConfig, ErrorCode, FailMode, Limit, Outcome, Rate,
    Role, ServerLimits, Source, Undecided, WireDecision,
};
use tollgate_protocol::{decode_request, encode_response, Request, Response, PROTOCOL_VERSION};

const DEADLINE: Duration = Duration::from_millis(200);
/// A call with [`DEADLINE`] must have ended by then, whatever the server.
const BOUND: Duration = Duration::from_secs(2);
/// What the behaving server answers as `remaining`: only it says 42.
const SERVER_REMAINING: u64 = 42;

/// What the fake server does with each connection it accepts.
#[derive(Clone)]
enum Behave {
    /// Handshakes and answers every request well.
    Good,
    /// Reads and holds the connection, never answers HELLO (SIGSTOP).
    NoHello,
    /// Closes each connection at once after accepting it.
    AcceptClose,
    /// Closes each connection at once after its HELLO_OK.
    HelloClose,
    /// Answers HELLO with these bytes (one per `delay` when given), then
    /// behaves.
    Hello(Vec<u8>, Option<Duration>),
    /// Handshakes, then answers each request `(id, request)` with the
    /// bytes the function gives (none: silence), `delay` between bytes.
    Reply(fn(u32, &Request) -> Vec<u8>, Option<Duration>),
    /// Handshakes, then closes after `n` requests (0: at once); RSTs
    /// instead of a clean close with `rst`.
    Close { after: usize, rst: bool },
}

struct Fake {
    addr: String,
    behave: Arc<Mutex<Behave>>,
    accepted: Arc<AtomicUsize>,
}

impl Fake {
    async fn start(behave: Behave) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let behave = Arc::new(Mutex::new(behave));
        let accepted = Arc::new(AtomicUsize::new(0));
        let (b, n) = (Arc::clone(&behave), Arc::clone(&accepted));
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                n.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(stream, Arc::clone(&b)));
            }
        });
        Self {
            addr,
            behave,
            accepted,
        }
    }

    fn set(&self, behave: Behave) {
        *self.behave.lock() = behave;
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// Reads one request frame; `None` at end of stream.
async fn read_request(s: &mut TcpStream, buf: &mut BytesMut) -> Option<(u32, Request)> {
    loop {
        let limits = ServerLimits::default();
        if let Some(r) = decode_request(buf, &limits).expect("the client sends valid frames") {
            return Some(r);
        }
        if s.read_buf(buf).await.ok()? == 0 {
            return None;
        }
    }
}

fn frame(response: &Response, id: u32) -> Vec<u8> {
    let mut out = BytesMut::new();
    encode_response(id, response, &mut out).expect("encodable");
    out.to_vec()
}

fn hello_ok(limits: ServerLimits) -> Vec<u8> {
    let hello = Response::HelloOk {
        version: PROTOCOL_VERSION,
        role: Role::Primary,
        epoch: 1,
        offset: 0,
        limits,
    };
    frame(&hello, 0)
}

fn decision(allowed: bool) -> CheckResult {
    CheckResult::Decision(WireDecision {
        allowed,
        shadow_denied: false,
        pair: 0,
        limit: 100,
        remaining: SERVER_REMAINING,
        reset_after_ms: 10,
        retry_after_ms: 0,
        lease: None,
    })
}

/// The well-behaved answer.
fn good(id: u32, request: &Request) -> Vec<u8> {
    let response = match request {
        Request::Check(b) | Request::Peek(b) => {
            Response::Checked(b.iter().map(|_| decision(true)).collect())
        }
        _ => Response::Pong,
    };
    frame(&response, id)
}

/// A raw frame: `len` header as given, then opcode, id and payload.
fn raw(len: u32, opcode: u8, id: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    out.put_u32(len);
    out.put_u8(opcode);
    out.put_u32(id);
    out.put_slice(payload);
    out.to_vec()
}

/// A CHECKED frame of `n` allowed results (whatever was asked).
fn checked(id: u32, n: usize) -> Vec<u8> {
    frame(&Response::Checked(vec![decision(true); n]), id)
}

async fn send(s: &mut TcpStream, bytes: &[u8], delay: Option<Duration>) {
    let chunk = if delay.is_some() {
        1
    } else {
        bytes.len().max(1)
    };
    for part in bytes.chunks(chunk) {
        if s.write_all(part).await.is_err() {
            return;
        }
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
    }
}

/// One connection: the handshake as the behaviour at accept says, each
/// request as the behaviour of the moment says (so a connection that
/// misbehaved can behave again).
async fn serve(mut s: TcpStream, now: Arc<Mutex<Behave>>) {
    let mut buf = BytesMut::new();
    let behave = now.lock().clone();
    if let Behave::AcceptClose = behave {
        return;
    }
    let Some((_, hello)) = read_request(&mut s, &mut buf).await else {
        return;
    };
    assert!(matches!(hello, Request::Hello { .. }), "{hello:?}");
    match &behave {
        Behave::NoHello => {
            // Holds the socket (and reads, so nothing backs up) forever.
            while s.read_buf(&mut buf).await.is_ok_and(|n| n > 0) {}
            return;
        }
        Behave::Hello(bytes, delay) => send(&mut s, bytes, *delay).await,
        Behave::HelloClose => {
            send(&mut s, &hello_ok(ServerLimits::default()), None).await;
            return;
        }
        _ => send(&mut s, &hello_ok(ServerLimits::default()), None).await,
    }
    let mut served = 0;
    while let Some((id, request)) = read_request(&mut s, &mut buf).await {
        let behave = now.lock().clone();
        match &behave {
            Behave::Reply(f, delay) => {
                let bytes = f(id, &request);
                // Answered as it dribbles out, the next request waits.
                send(&mut s, &bytes, *delay).await;
            }
            Behave::Close { after, rst } => {
                if served == *after {
                    if *rst {
                        let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
                    }
                    return;
                }
                served += 1;
                send(&mut s, &good(id, &request), None).await;
            }
            Behave::NoHello => {}
            _ => send(&mut s, &good(id, &request), None).await,
        }
    }
}

fn config() -> ClientConfig {
    ClientConfig {
        deadline: DEADLINE,
        connect_timeout: Duration::from_millis(500),
        backoff_min: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        probe_timeout: Duration::from_millis(100),
        breaker: BreakerConfig {
            open_for: Duration::from_millis(50),
            open_max: Duration::from_millis(200),
            ..BreakerConfig::default()
        },
        ..ClientConfig::default()
    }
}

fn limit() -> Limit {
    Limit::token_bucket(Rate::per_second(100), 100)
}

/// One check, timed: it must end within [`BOUND`] and must not be the
/// server's decision (the server misbehaves).
async fn check_undecided(client: &Client) -> Outcome {
    let started = Instant::now();
    let outcome = tokio::time::timeout(BOUND, client.check("rl:{k}:s", limit(), 1))
        .await
        .expect("the call outlived its deadline by far");
    assert!(started.elapsed() < BOUND, "took {:?}", started.elapsed());
    if let Outcome::Decided(d) = &outcome {
        assert!(
            d.source != Source::Server,
            "garbage taken for a decision: {outcome:?}"
        );
    }
    outcome
}

fn why(outcome: &Outcome) -> Option<Undecided> {
    match outcome {
        Outcome::Fallback { why, .. } | Outcome::Undecided { why, .. } => Some(*why),
        _ => None,
    }
}

/// Undecided for one of the reasons a broken server or connection gives.
fn assert_down(outcome: &Outcome) {
    let down = [Late, Lost, Down, Breaker, Garbled];
    assert!(
        why(outcome).is_some_and(|w| down.contains(&w)),
        "{outcome:?}"
    );
}

/// The behaving server's own decision.
fn served(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Decided(d) if d.remaining == SERVER_REMAINING)
}

fn client(fake: &Fake) -> Client {
    Client::new(fake.addr.clone(), config()).expect("config")
}

/// The server behaves again: within a few seconds (backoff, breaker) the
/// server decides once more, and nothing is left waiting.
async fn recovers(fake: &Fake, client: &Client) {
    fake.set(Behave::Good);
    let started = Instant::now();
    loop {
        let outcome = client.check("rl:{k}:s", limit(), 1).await;
        if served(&outcome) {
            break;
        }
        let waited = started.elapsed();
        assert!(waited < Duration::from_secs(10), "no recovery: {outcome:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(client.in_flight(), 0);
}

/// A client against `behave`: `calls` checks, each ending within the
/// bound, undecided and (the default config fails open) decided by the
/// local fallback; then recovery.
async fn hostile(behave: Behave, calls: usize) -> Fake {
    let fake = Fake::start(behave).await;
    let client = client(&fake);
    for _ in 0..calls {
        let outcome = check_undecided(&client).await;
        assert_down(&outcome);
        assert!(matches!(outcome, Outcome::Fallback { .. }), "{outcome:?}");
    }
    recovers(&fake, &client).await;
    fake
}

use Undecided::{
    BreakerOpen as Breaker, ConnectionLost as Lost, DeadlineExceeded as Late, Protocol as Garbled,
    Unavailable as Down,
};

#[tokio::test]
async fn silent_after_hello_and_half_a_frame_end_at_the_deadline() {
    hostile(Behave::Reply(|_, _| Vec::new(), None), 8).await;
    let half = |id, _: &Request| checked(id, 1)[..20].to_vec();
    hostile(Behave::Reply(half, None), 8).await;
}

#[tokio::test]
async fn a_server_that_never_answers_hello_costs_at_most_the_deadline() {
    let fake = hostile(Behave::NoHello, 12).await;
    // One attempt at a time, each bounded by connect_timeout, then backoff.
    assert!(fake.accepted() <= 12, "{} connections", fake.accepted());
}

#[tokio::test]
async fn wrong_duplicate_and_unsolicited_ids_decide_nothing() {
    // The answer under another id: the call times out.
    hostile(Behave::Reply(|id, _| checked(id ^ 0x5555, 1), None), 3).await;
    // An answer to a request never sent, then the real one twice: the
    // stray one and the duplicate are dropped, the connection kept.
    let dup = |id, request: &Request| {
        let mut out = checked(0x7fff_0001, 1);
        out.extend(good(id, request));
        out.extend(good(id, request));
        out
    };
    let fake = Fake::start(Behave::Reply(dup, None)).await;
    let client = client(&fake);
    for _ in 0..5 {
        assert!(served(&client.check("rl:{k}:s", limit(), 1).await));
    }
    assert_eq!(client.in_flight(), 0);
    assert_eq!(fake.accepted(), 1, "a duplicate cost the connection");
}

#[tokio::test]
async fn undecodable_frames_are_protocol_errors_or_lost_connections() {
    type Case = (fn(u32, &Request) -> Vec<u8>, Undecided);
    let cases: [Case; 10] = [
        // Unknown opcode (a frame that is whole: only this call fails).
        (|id, _| raw(5, 0xEE, id, &[]), Garbled),
        // A frame longer than the client accepts (2,752,477 by default):
        // the stream cannot be framed any more, the connection closes.
        (|id, _| raw(3_000_000, 0x83, id, &[0, 1]), Lost),
        // Length fields of 0 and 2^32 - 1.
        (|id, _| raw(0, 0x83, id, &[]), Lost),
        (|id, _| raw(u32::MAX, 0x83, id, &[]), Lost),
        // CHECKED with fewer and with more results than checks asked.
        (|id, _| checked(id, 0), Garbled),
        (|id, _| checked(id, 3), Garbled),
        // A status byte out of range (7), in an otherwise whole result.
        (
            |id, _| raw(41, 0x83, id, &[&[0, 1, 7][..], &[0; 33]].concat()),
            Garbled,
        ),
        // Garbage: its first 4 bytes read as a length of 1.2 GB.
        (|_, _| b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec(), Lost),
        // A PONG, and a HELLO_OK, where CHECKED was due.
        (|id, _| frame(&Response::Pong, id), Garbled),
        (
            |id, _| {
                [
                    &hello_ok(ServerLimits::default())[..5],
                    &id.to_be_bytes(),
                    &hello_ok(ServerLimits::default())[9..],
                ]
                .concat()
            },
            Garbled,
        ),
    ];
    for (case, first) in cases {
        let fake = Fake::start(Behave::Reply(case, None)).await;
        let client = client(&fake);
        let outcome = check_undecided(&client).await;
        assert_eq!(why(&outcome), Some(first), "{outcome:?}");
        for _ in 0..3 {
            assert_down(&check_undecided(&client).await);
        }
        recovers(&fake, &client).await;
    }
}

#[tokio::test]
async fn unknown_error_codes_are_server_errors_never_rejections() {
    fn error(id: u32) -> Vec<u8> {
        let code = ErrorCode::from_wire(0x7777);
        frame(
            &Response::Error {
                code,
                message: "?".into(),
            },
            id,
        )
    }
    let fake = Fake::start(Behave::Reply(|id, _| error(id), None)).await;
    let client = client(&fake);
    let closed = client.with_fail_mode(FailMode::Closed);
    for (client, open) in [(&client, true), (&closed, false)] {
        let outcome = check_undecided(client).await;
        let code = ErrorCode::from_wire(0x7777);
        assert_eq!(why(&outcome), Some(Undecided::ServerError(code)));
        assert_eq!(outcome.is_allowed(), open, "{outcome:?}");
    }
    recovers(&fake, &client).await;
    // The same code refusing the handshake: undecided, the fallback decides.
    let fake = Fake::start(Behave::Hello(error(0), None)).await;
    let client = self::client(&fake);
    for _ in 0..3 {
        let outcome = check_undecided(&client).await;
        assert!(matches!(outcome, Outcome::Fallback { .. }), "{outcome:?}");
        let code = ErrorCode::from_wire(0x7777);
        assert_eq!(why(&outcome), Some(Undecided::ServerError(code)));
    }
    recovers(&fake, &client).await;
}

#[tokio::test]
async fn impossible_hello_limits_are_refused_not_obeyed() {
    let limits = |max_frame, max_batch, max_group, max_key_len| ServerLimits {
        max_frame,
        max_batch,
        max_group,
        max_key_len,
    };
    for bad in [
        limits(4096, 64, 16, 0),
        limits(4096, 64, 0, 512),
        limits(4096, 0, 16, 512),
        limits(0, 64, 16, 512),
        limits(39, 64, 16, 512),
    ] {
        // Obeyed, these would reject every check (KeyTooLong, BatchTooLarge,
        // FrameTooLarge: a 400 on every route), and keep rejecting after
        // the server is gone, since announced limits are kept.
        hostile(Behave::Hello(hello_ok(bad), None), 3).await;
    }
    // Enormous limits are the server's business: it decides.
    let huge = limits(u32::MAX, u16::MAX, u8::MAX, u16::MAX);
    let fake = Fake::start(Behave::Hello(hello_ok(huge), None)).await;
    assert!(served(&client(&fake).check("rl:{k}:s", limit(), 1).await));
}

#[tokio::test]
async fn closing_and_resetting_after_each_request_reconnect_without_a_storm() {
    for rst in [false, true] {
        let fake = hostile(Behave::Close { after: 0, rst }, 20).await;
        assert!(fake.accepted() <= 21, "{} connections", fake.accepted());
    }
    // One answer per connection, then a close: every call is decided.
    let fake = Fake::start(Behave::Close {
        after: 1,
        rst: false,
    })
    .await;
    let client = client(&fake);
    for _ in 0..10 {
        let outcome = tokio::time::timeout(BOUND, client.check("rl:{k}:s", limit(), 1)).await;
        assert!(outcome.expect("within the bound").decision().is_some());
    }
}

/// Calls as fast as a busy gateway makes them, for 2 s; returns the
/// connections the server saw.
async fn hammer(fake: &Fake) -> usize {
    let client = client(fake);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(2) {
        assert_down(&check_undecided(&client).await);
        tokio::task::yield_now().await;
    }
    assert_eq!(client.in_flight(), 0);
    fake.accepted()
}

/// Accepting and closing at once fails the attempt: backoff from 20 ms
/// doubling to 200 ms (and the breaker), a few dozen attempts in 2 s.
#[tokio::test]
async fn accept_then_close_in_a_loop_backs_off() {
    let seen = hammer(&Fake::start(Behave::AcceptClose).await).await;
    assert!(seen <= 40, "{seen} connections in 2 s");
}

/// A server that accepts HELLO and then drops the connection, at once or
/// at the first request: before the fix, one connection per call (over
/// 5,000 in 2 s), since a handshake reset the backoff and closed the
/// breaker's probe.
#[tokio::test]
async fn hello_then_close_in_a_loop_backs_off() {
    let close = Behave::Close {
        after: 0,
        rst: false,
    };
    for behave in [Behave::HelloClose, close] {
        let fake = Fake::start(behave).await;
        let seen = hammer(&fake).await;
        assert!(seen <= 40, "{seen} connections in 2 s");
        recovers(&fake, &client(&fake)).await;
    }
}

#[tokio::test]
async fn a_slowloris_answer_ends_at_the_deadline_and_drops_the_connection() {
    let dribble = Some(Duration::from_millis(100));
    let fake = hostile(Behave::Reply(good, dribble), 6).await;
    // Each suspect connection is dropped at its probe's timeout.
    assert!(fake.accepted() >= 2, "{} connections", fake.accepted());
    // A dribbled HELLO_OK (37 bytes, 3.7 s): the attempt ends at
    // connect_timeout (500 ms), calls meanwhile at their deadline.
    hostile(Behave::Hello(hello_ok(ServerLimits::default()), dribble), 6).await;
}

/// A server that served, then stopped (SIGSTOP: connections stay open,
/// nothing is answered, new ones get no HELLO_OK): each call ends within
/// its deadline and only the first few wait it out; then the breaker and
/// the backoff fail calls at once. (The calls waiting for a first, merely
/// slow, connection end at their deadline; its attempt counts once.)
#[tokio::test]
async fn a_stopped_server_costs_a_few_deadlines_then_calls_fail_fast() {
    let fake = Fake::start(Behave::Good).await;
    let client = client(&fake);
    assert!(served(&client.check("rl:{k}:s", limit(), 1).await));
    fake.set(Behave::NoHello);
    let mut waited = 0;
    for _ in 0..40 {
        let outcome = check_undecided(&client).await;
        assert_down(&outcome);
        waited += usize::from(why(&outcome) == Some(Late));
    }
    assert!(
        waited <= 10,
        "{waited} of 40 calls waited out their deadline"
    );
    recovers(&fake, &client).await;
}
