//! RESP targets through the `redis` crate: Redis running the seeds'
//! token-bucket Lua script, redis-cell's `CL.THROTTLE` (a Redis module), and
//! throttlecrab-server's `THROTTLE`.
//!
//! One multiplexed connection per `--connections`. A request is a
//! pipeline of `batch` commands, encoded and written at once and answered
//! in order; this is the RESP equivalent of one Tollgate CHECK frame of
//! `batch` checks. `--pipeline` such pipelines are in flight at once per
//! connection, so `--pipeline P --batch B` puts `P * B` commands in flight
//! per connection on both sides (`redis-benchmark -P N` is `--pipeline 1
//! --batch N`, or `--pipeline N --batch 1` up to when answers are read).
//!
//! Redis (`benches/redis/token_bucket.lua`, the script the Redis baseline
//! loads too):
//! `EVALSHA sha 1 KEY burst rate_per_s now_ms cost`, the script loaded with
//! SCRIPT LOAD when the first connection opens. The script takes the
//! client's clock: each request passes the generator's wall clock in ms.
//!
//! throttlecrab: `THROTTLE KEY burst count period_s cost`; its periods are
//! whole seconds, so a rule like `50/250ms` is refused at connect.
//!
//! redis-cell: `CL.THROTTLE KEY burst-1 count period_s cost` (its
//! `max_burst` is the bucket's capacity less one, so the same bucket as the
//! others); whole-second periods too.

use std::borrow::Cow;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Pipeline, RedisError, RedisResult, Value};
use tokio::sync::OnceCell;

use super::{Answer, Connection, RequestShape, Target, TargetError, TargetKind};
use crate::workload::KeyPicker;

/// The seeds' token-bucket script (HMGET tokens/ts, lazy refill, take, HSET,
/// PEXPIRE): the very file `benches/redis/redis-baseline.sh` loads, embedded
/// so the binary runs from anywhere.
pub const TOKEN_BUCKET_LUA: &str = include_str!("../../../redis/token_bucket.lua");

/// What to send for each check.
#[derive(Debug, Clone)]
enum Command {
    /// `EVALSHA sha 1 key capacity rate now cost`.
    Lua {
        sha: String,
        capacity: String,
        rate_per_s: String,
        cost: String,
    },
    /// `THROTTLE key max_burst count_per_period period_s quantity`, or
    /// redis-cell's `CL.THROTTLE` with the same arguments.
    Throttle {
        verb: &'static str,
        burst: String,
        count: String,
        period_s: String,
        cost: String,
    },
}

pub struct RespTarget {
    kind: TargetKind,
    addr: String,
    shape: RequestShape,
    client: redis::Client,
    /// Set up once, by the first connection (SCRIPT LOAD for Redis).
    command: OnceCell<Command>,
    info: Mutex<Option<String>>,
}

impl RespTarget {
    /// A target of `kind` (Redis or throttlecrab) at `addr`.
    pub fn new(kind: TargetKind, addr: String, shape: RequestShape) -> Result<Self, TargetError> {
        debug_assert!(matches!(
            kind,
            TargetKind::Redis | TargetKind::Throttlecrab | TargetKind::RedisCell
        ));
        let client =
            redis::Client::open(format!("redis://{addr}/")).map_err(|e| TargetError::Connect {
                target: kind.name(),
                addr: addr.clone(),
                reason: e.to_string(),
            })?;
        Ok(Self {
            kind,
            addr,
            shape,
            client,
            command: OnceCell::new(),
            info: Mutex::new(None),
        })
    }

    fn setup_error(&self, reason: impl ToString) -> TargetError {
        TargetError::Setup {
            target: self.kind.name(),
            addr: self.addr.clone(),
            reason: reason.to_string(),
        }
    }

    /// Loads the script (Redis) or checks the rule fits (throttlecrab).
    async fn prepare(&self, conn: &mut MultiplexedConnection) -> Result<Command, TargetError> {
        let rule = self.shape.rule;
        match self.kind {
            TargetKind::Redis => {
                let sha: String = redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(TOKEN_BUCKET_LUA)
                    .query_async(conn)
                    .await
                    .map_err(|e| self.setup_error(format!("SCRIPT LOAD: {e}")))?;
                let version = server_version(conn).await.unwrap_or_default();
                self.set_info(format!("redis {version}, token_bucket.lua sha {sha}"));
                Ok(Command::Lua {
                    sha,
                    capacity: rule.burst.to_string(),
                    // Rust prints the shortest string that reads back to the
                    // same f64, which Lua's tonumber parses exactly.
                    rate_per_s: rule.rate.per_second().to_string(),
                    cost: rule.cost.to_string(),
                })
            }
            TargetKind::Throttlecrab | TargetKind::RedisCell => {
                let cell = self.kind == TargetKind::RedisCell;
                let verb = if cell { "CL.THROTTLE" } else { "THROTTLE" };
                if rule.rate.period_ms % 1000 != 0 {
                    return Err(self.setup_error(format!(
                        "{verb} takes whole-second periods; {} is not",
                        rule.rate
                    )));
                }
                let info = if cell {
                    let version = server_version(conn).await.unwrap_or_default();
                    format!("redis {version} with redis-cell, CL.THROTTLE (GCRA)")
                } else {
                    "throttlecrab THROTTLE (GCRA)".to_owned()
                };
                self.set_info(info);
                // redis-cell admits max_burst + 1 at once.
                let burst = if cell { rule.burst - 1 } else { rule.burst };
                Ok(Command::Throttle {
                    verb,
                    burst: burst.to_string(),
                    count: rule.rate.count.to_string(),
                    period_s: (rule.rate.period_ms / 1000).to_string(),
                    cost: rule.cost.to_string(),
                })
            }
            TargetKind::Tollgate | TargetKind::TollgateCluster => {
                unreachable!("Tollgate has its own target")
            }
        }
    }

    fn set_info(&self, info: String) {
        *self.info.lock().expect("not poisoned") = Some(info);
    }
}

/// `redis_version` from INFO server, when the server answers INFO.
async fn server_version(conn: &mut MultiplexedConnection) -> Option<String> {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(conn)
        .await
        .ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map(|v| v.trim().to_owned())
}

impl Target for RespTarget {
    type Conn = RespConn;

    fn name(&self) -> &'static str {
        self.kind.name()
    }

    async fn connect(&self) -> Result<RespConn, TargetError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(std::time::Duration::from_secs(5)))
            .set_response_timeout(Some(self.shape.deadline));
        let conn = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| TargetError::Connect {
                target: self.kind.name(),
                addr: self.addr.clone(),
                reason: e.to_string(),
            })?;
        let command = self
            .command
            .get_or_try_init(|| {
                let mut setup = conn.clone();
                async move { self.prepare(&mut setup).await }
            })
            .await?
            .clone();
        Ok(RespConn {
            conn,
            command,
            shape: self.shape,
        })
    }

    fn server_info(&self) -> String {
        self.info
            .lock()
            .expect("not poisoned")
            .clone()
            .unwrap_or_default()
    }
}

pub struct RespConn {
    /// Cloned per request (an `Arc` and a few words): the crate's
    /// multiplexed connection takes `&mut self` per query.
    conn: MultiplexedConnection,
    command: Command,
    shape: RequestShape,
}

impl Connection for RespConn {
    type Request = Pipeline;

    fn build(&self, picker: &mut KeyPicker) -> Pipeline {
        let mut pipe = redis::pipe();
        // Per-command errors come back as values, so one bad answer does not
        // hide the others.
        pipe.ignore_errors();
        let keys = self.shape.keys;
        let now_ms = wall_clock_ms();
        for _ in 0..self.shape.batch {
            push_check(
                &mut pipe,
                &self.command,
                &keys.key(picker.next_index()),
                now_ms,
            );
        }
        pipe
    }

    async fn send(&self, request: Pipeline) -> Answer {
        let checks = request.len() as u32;
        let mut conn = self.conn.clone();
        match request
            .query_async::<Vec<RedisResult<Value>>>(&mut conn)
            .await
        {
            Ok(replies) => fold(checks, replies),
            Err(e) => Answer::failed(checks, transport_reason(&e)),
        }
    }
}

/// Appends the command checking `key` to `pipe`.
fn push_check(pipe: &mut Pipeline, command: &Command, key: &[u8], now_ms: u64) {
    match command {
        Command::Lua {
            sha,
            capacity,
            rate_per_s,
            cost,
        } => {
            pipe.cmd("EVALSHA")
                .arg(sha)
                .arg(1)
                .arg(key)
                .arg(capacity)
                .arg(rate_per_s)
                .arg(now_ms)
                .arg(cost);
        }
        Command::Throttle {
            verb,
            burst,
            count,
            period_s,
            cost,
        } => {
            pipe.cmd(verb)
                .arg(key)
                .arg(burst)
                .arg(count)
                .arg(period_s)
                .arg(cost);
        }
    }
}

/// Milliseconds since the Unix epoch: the clock the Lua script expects.
fn wall_clock_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Why a whole pipeline failed, in the words the Tollgate target uses for
/// the same situations.
fn transport_reason(e: &RedisError) -> Cow<'static, str> {
    if e.is_timeout() {
        "deadline exceeded".into()
    } else if e.is_connection_dropped() || e.is_io_error() {
        "connection lost".into()
    } else {
        format!("redis: {e}").into()
    }
}

/// Counts the answers of one pipeline. A check is allowed when its reply is
/// an array whose first element is the integer 1 (both the Lua script and
/// THROTTLE answer that way), denied when it is 0.
fn fold(checks: u32, replies: Vec<RedisResult<Value>>) -> Answer {
    let mut answer = Answer::default();
    let got = replies.len() as u32;
    for reply in replies {
        match reply {
            Ok(Value::Array(items)) => match items.first() {
                Some(Value::Int(1)) => answer.allowed += 1,
                Some(Value::Int(0)) => answer.denied += 1,
                _ => answer.add_error("unexpected reply shape"),
            },
            Ok(Value::ServerError(e)) => answer.add_error(format!("redis error: {}", e.code())),
            Ok(_) => answer.add_error("unexpected reply shape"),
            Err(e) => answer.add_error(match e.code() {
                Some(code) => Cow::Owned(format!("redis error: {code}")),
                None => transport_reason(&e),
            }),
        }
    }
    for _ in got..checks {
        answer.add_error("missing reply");
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_script_is_the_token_bucket() {
        for needle in ["HMGET", "HSET", "PEXPIRE", "ARGV[3]"] {
            assert!(TOKEN_BUCKET_LUA.contains(needle), "{needle}");
        }
    }

    /// The words of each command, as RESP puts them on the wire.
    fn packed_words(pipe: &Pipeline) -> Vec<String> {
        let packed = String::from_utf8(pipe.get_packed_pipeline()).unwrap();
        // Bulk strings only: "*N", "$len" and the words alternate.
        packed
            .split("\r\n")
            .filter(|w| !w.is_empty() && !w.starts_with('*') && !w.starts_with('$'))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn commands_carry_the_rule_in_each_servers_units() {
        let lua = Command::Lua {
            sha: "abc".into(),
            capacity: "100".into(),
            rate_per_s: (100.0f64 / 60.0).to_string(),
            cost: "1".into(),
        };
        let mut pipe = redis::pipe();
        push_check(&mut pipe, &lua, b"rl:{000000000007}", 1_700_000_000_123);
        assert_eq!(
            packed_words(&pipe),
            [
                "EVALSHA",
                "abc",
                "1",
                "rl:{000000000007}",
                "100",
                "1.6666666666666667",
                "1700000000123",
                "1"
            ]
        );
        let throttle = Command::Throttle {
            verb: "THROTTLE",
            burst: "100".into(),
            count: "100".into(),
            period_s: "60".into(),
            cost: "2".into(),
        };
        let mut pipe = redis::pipe();
        push_check(&mut pipe, &throttle, b"rl:{000000000008}", 0);
        push_check(&mut pipe, &throttle, b"rl:{000000000009}", 0);
        assert_eq!(pipe.len(), 2);
        assert_eq!(
            packed_words(&pipe)[..6],
            ["THROTTLE", "rl:{000000000008}", "100", "100", "60", "2"]
        );
        let cell = Command::Throttle {
            verb: "CL.THROTTLE",
            burst: "99".into(),
            count: "100".into(),
            period_s: "60".into(),
            cost: "1".into(),
        };
        let mut pipe = redis::pipe();
        push_check(&mut pipe, &cell, b"rl:{000000000010}", 0);
        assert_eq!(
            packed_words(&pipe)[..6],
            ["CL.THROTTLE", "rl:{000000000010}", "99", "100", "60", "1"]
        );
    }

    #[test]
    fn replies_are_counted_one_by_one() {
        let lua = |allowed| {
            Ok(Value::Array(vec![
                Value::Int(allowed),
                Value::BulkString(b"99".to_vec()),
            ]))
        };
        let a = fold(4, vec![lua(1), lua(0), lua(1), Ok(Value::Okay)]);
        assert_eq!((a.allowed, a.denied, a.errors), (2, 1, 1));
        assert_eq!(a.error.as_deref(), Some("unexpected reply shape"));
        let short = fold(3, vec![lua(1)]);
        assert_eq!((short.allowed, short.errors), (1, 2));
    }
}
