//! The counter commands fixed-window Redis limiters send, as RESP sees
//! them: their arguments read, their replies written. The counters
//! themselves (a fixed window per key, read and written under one stripe
//! lock) are the engine's (`engine/counter.rs`, whose module docs give the
//! commands' meaning).

use super::context::{key_error, Ctx};
use super::parse::Args;
use super::reply::Reply;
use super::table::Cmd;
use crate::clock::Nanos;
use crate::engine::window_of;

/// INCR/INCRBY: the count after adding to `key`'s counter (created with
/// the window in sight of the commands `later` in the batch).
pub(super) fn incr(ctx: &Ctx, cmd: Cmd, args: &Args, later: &[Args], reply: &mut Reply) {
    let key = &args[1];
    if let Some(e) = key_error(ctx, key) {
        return reply.error(&e);
    }
    let amount = match cmd {
        Cmd::IncrBy => match std::str::from_utf8(&args[2])
            .ok()
            .and_then(|s| s.parse::<u32>().ok())
        {
            Some(n) if n > 0 => n,
            _ => {
                return reply
                    .error("ERR Tollgate counters only count up: INCRBY takes 1 to 4294967295")
            }
        },
        _ => 1,
    };
    match ctx
        .shared
        .engine
        .incr(key, amount, window_in_sight(ctx, key, later), ctx.now)
    {
        Ok(n) => reply.int(n as i64),
        Err(e) => reply.error(&e.to_string()),
    }
}

/// The counter commands but INCR/INCRBY: EXPIRE/PEXPIRE, GET, TTL/PTTL,
/// DEL, EXISTS (the engine's counters, `engine/counter.rs`).
pub(super) fn counter(ctx: &Ctx, cmd: Cmd, args: &Args, reply: &mut Reply) {
    let engine = &ctx.shared.engine;
    let arg = |i: usize| -> &[u8] { &args[i] };
    match cmd {
        Cmd::Expire | Cmd::PExpire => {
            let Some(ttl) = ttl_arg(arg(2), cmd == Cmd::Expire) else {
                return reply.error("ERR value is not an integer or out of range");
            };
            match engine.expire(arg(1), ttl, ctx.now) {
                Ok(n) => reply.int(n),
                Err(e) => reply.error(&e.to_string()),
            }
        }
        Cmd::Get => match engine.get(arg(1), ctx.now) {
            Ok(Some(n)) => reply.bulk(n.to_string().as_bytes()),
            Ok(None) => reply.null(),
            Err(e) => reply.error(&e.to_string()),
        },
        Cmd::Ttl => reply.int(engine.ttl(arg(1), ctx.now)),
        Cmd::PTtl => reply.int(engine.pttl(arg(1), ctx.now)),
        Cmd::Del => {
            let n = args[1..]
                .iter()
                .filter(|k| engine.remove(k, ctx.now))
                .count();
            reply.int(n as i64);
        }
        Cmd::Exists => {
            let n = args[1..]
                .iter()
                .filter(|k| engine.holds(k, ctx.now))
                .count();
            reply.int(n as i64);
        }
        _ => unreachable!("not a counter command: {cmd:?}"),
    }
}

/// The window a new counter of `key` gets: the TTL of the first EXPIRE or
/// PEXPIRE of `key` among the commands after it, else the default.
fn window_in_sight(ctx: &Ctx, key: &[u8], later: &[Args]) -> Nanos {
    later
        .iter()
        .filter(|a| a.len() >= 3 && &a[1][..] == key)
        .find_map(|a| {
            let seconds = a[0].eq_ignore_ascii_case(b"expire");
            if !seconds && !a[0].eq_ignore_ascii_case(b"pexpire") {
                return None;
            }
            ttl_arg(&a[2], seconds).filter(|&ms| ms > 0)
        })
        .map_or(
            ctx.shared.frontends.resp_counter_window.as_nanos() as Nanos,
            window_of,
        )
}

/// The TTL argument of EXPIRE (seconds) or PEXPIRE (milliseconds), in
/// milliseconds; None when it is not an integer.
fn ttl_arg(arg: &[u8], seconds: bool) -> Option<i64> {
    let n: i64 = std::str::from_utf8(arg).ok()?.parse().ok()?;
    Some(if seconds { n.saturating_mul(1000) } else { n })
}
