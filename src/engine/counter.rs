//! The counters behind the commands fixed-window Redis limiters send (the
//! RESP front end's), on Tollgate's fixed window counter: `INCR`/`INCRBY` with `EXPIRE`/`PEXPIRE` (in a MULTI, a
//! pipeline, or one after the other), `GET`, `TTL`/`PTTL`, `DEL`,
//! `EXISTS`.
//!
//! ```text
//!  INCRBY k n   -> fixed window of W on k, limit 2^48 (never denies: the
//!                  client compares the count with its own limit), cost n;
//!                  answers the count. W: the window k's counter has; else
//!                  the TTL of an EXPIRE/PEXPIRE of k later in the same MULTI
//!                  or pipelined batch; else --resp-counter-window
//!  EXPIRE k s   -> k's counter moves into windows of s seconds (its count
//!                  kept); 1, or 0 when k has no counter
//!  GET k        -> the count in the current window (nil: none)
//!  TTL/PTTL k   -> time until k's state expires (the window's end); -2: none
//!  DEL/EXISTS   -> every state of the key (as RESET)
//! ```
//!
//! Windows are the fixed window algorithm's: aligned on the server's clock
//! (UNIX time), so a 60 s window ends on the minute, not 60 s after the
//! first INCR; keys that carry their window's start in their name (Redis's
//! `INCR ip:<second>` pattern) line up with them. Each operation is one
//! [`Store::update`](crate::store::Store::update): the counter is read, the
//! window picked from it, evaluated by the algorithm and written under one
//! stripe lock, so concurrent INCRs and EXPIREs never lose a count.

use super::Engine;
use crate::algorithm::{FixedWindow, FixedWindowState, State, MAX_COUNT, MAX_PERIOD_MS};
use crate::clock::{Nanos, NANOS_PER_MS};
use crate::store::{Entry, Update};
use tollgate_protocol::ErrorCode;

/// Why a counter command failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CounterError {
    /// The key holds another algorithm's state (a sliding window, ...).
    #[error("WRONGTYPE Operation against a key holding the wrong kind of value")]
    WrongType,
    #[error("ERR increment or decrement would overflow")]
    Overflow,
    #[error("ERR {0}")]
    Store(ErrorCode),
}

/// A live fixed-window counter and its window length.
fn counter(entry: Option<&Entry>) -> Result<Option<(FixedWindowState, Nanos)>, CounterError> {
    match entry {
        None => Ok(None),
        Some(Entry {
            state: State::FixedWindow(s),
            expires_at,
        }) => s
            .window(*expires_at)
            .map(|w| Some((*s, w)))
            .ok_or(CounterError::WrongType),
        Some(_) => Err(CounterError::WrongType),
    }
}

impl Engine {
    /// INCRBY: adds `amount` to `key`'s counter and answers the count.
    /// `window` is the one to create the counter with if it has none.
    pub fn incr(
        &self,
        key: &[u8],
        amount: u32,
        window: Nanos,
        now: Nanos,
    ) -> Result<u64, CounterError> {
        let answer = self.store.update(key, now, |entry| {
            let (state, window) = match counter(entry) {
                Err(e) => return Update::Keep(Err(e)),
                Ok(Some((state, w))) => (Some(state), w),
                Ok(None) => (None, window),
            };
            let verdict = FixedWindow::new(MAX_COUNT, window).evaluate(state, now, amount.into());
            match verdict.state {
                Some(State::FixedWindow(s)) if verdict.decision.allowed => Update::Write(
                    Entry {
                        state: State::FixedWindow(s),
                        expires_at: verdict.expires_at,
                    },
                    Ok(s.count),
                ),
                _ => Update::Keep(Err(CounterError::Overflow)),
            }
        });
        answer.map_err(CounterError::Store)?
    }

    /// EXPIRE/PEXPIRE with a TTL of `ttl_ms` (<= 0 deletes the counter, as
    /// Redis does): 1 when `key` has a counter, else 0.
    pub fn expire(&self, key: &[u8], ttl_ms: i64, now: Nanos) -> Result<i64, CounterError> {
        let window = (ttl_ms > 0).then(|| window_of(ttl_ms));
        let answer = self.store.update(key, now, |entry| {
            let (state, current) = match counter(entry) {
                Err(e) => return Update::Keep(Err(e)),
                Ok(None) => return Update::Keep(Ok(0)),
                Ok(Some(c)) => c,
            };
            let Some(window) = window else {
                // Expired at once: removed.
                let gone = Entry {
                    state: State::FixedWindow(state),
                    expires_at: now,
                };
                return Update::Write(gone, Ok(1));
            };
            if window == current {
                return Update::Keep(Ok(1));
            }
            let (moved, end) = FixedWindow::new(MAX_COUNT, window).rewindow(state, now);
            let entry = Entry {
                state: State::FixedWindow(moved),
                expires_at: end,
            };
            Update::Write(entry, Ok(1))
        });
        answer.map_err(CounterError::Store)?
    }

    /// GET: the count of `key`'s counter in its current window.
    pub fn get(&self, key: &[u8], now: Nanos) -> Result<Option<u64>, CounterError> {
        let answer = self
            .store
            .update(key, now, |entry| Update::Keep(counter(entry)));
        Ok(answer.map_err(CounterError::Store)??.map(|(s, _)| s.count))
    }

    /// PTTL: milliseconds until every state of `key` has expired (rounded
    /// up), or -2 when it has none.
    pub fn pttl(&self, key: &[u8], now: Nanos) -> i64 {
        self.store
            .entries(key, now)
            .iter()
            .map(|e| e.expires_at.saturating_sub(now).div_ceil(NANOS_PER_MS) as i64)
            .max()
            .unwrap_or(-2)
    }

    /// TTL: [`Engine::pttl`] in seconds, rounded to the nearest as Redis does.
    pub fn ttl(&self, key: &[u8], now: Nanos) -> i64 {
        match self.pttl(key, now) {
            ms if ms < 0 => ms,
            ms => (ms + 500) / 1000,
        }
    }
}

/// A TTL in milliseconds as a window, capped at the longest window the
/// store accepts.
pub(crate) fn window_of(ttl_ms: i64) -> Nanos {
    (ttl_ms.max(1) as u64).min(MAX_PERIOD_MS) * NANOS_PER_MS
}
