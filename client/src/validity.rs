//! What the server would refuse as invalid, found by the client before
//! anything else happens to a check: before a lease is spent, before the
//! server is asked, and so before the fail mode or the local fallback
//! could decide it (docs/CLIENT.md, "Outcomes"). Whether the server can be
//! reached must not matter: were these checks made only on a live
//! connection, a caller who can make a request invalid (a key too long or
//! empty, a group over two slots, a cost of 0) would get a free pass from
//! fail-open whenever the server is down, hung or behind an open breaker.
//!
//! The sizes are checked against the limits the server announced in its
//! last handshake, or before any handshake against what the protocol's
//! fields can carry (a key's u16 length, a group's u8 count): a client
//! that has never reached its server cannot know its settings, and
//! refusing a key the server would take turns an outage of the limiter
//! into an outage of the route. An inline limit's numbers are checked as
//! PROTOCOL.md §8 says every server checks them, with the reference
//! server's bounds; the bounds that depend on a server setting
//! (`max_log_entries`) or on the algorithm's arithmetic (a rate above one
//! per nanosecond, a burst spanning more than 2^62 ns) stay the server's,
//! and so do the rules between a group's named pairs (the rule table may
//! be older than the server's rules, and a shadow rule's pairs are a group
//! apart on the server).

use tollgate_protocol::slot::Slot;
use tollgate_protocol::{Algorithm, Limit, LimitRef, Pair, ServerLimits};

use crate::calls;
use crate::error::Error;

/// Largest `count` and `burst` the reference server takes (PROTOCOL.md §8).
const MAX_COUNT: u64 = 1 << 48;
/// Longest `period_ms` the reference server takes: 400 days.
const MAX_PERIOD_MS: u64 = 400 * 24 * 3600 * 1000;

/// What a request is checked against before any handshake: the most the
/// protocol's fields carry, no server's own limits.
pub(crate) const PROTOCOL_BOUNDS: ServerLimits = ServerLimits {
    max_frame: u32::MAX,
    max_batch: u16::MAX,
    max_group: u8::MAX,
    max_key_len: u16::MAX,
};

/// Checks one check's pairs (a pair, or an atomic group) as the server
/// would, in its order: sizes and keys (the frame), then slots
/// (CrossSlot), then limits (InvalidLimit).
pub(crate) fn check_pairs(pairs: &[Pair], limits: &ServerLimits) -> Result<(), Error> {
    calls::check_group(0, pairs, limits)?;
    if let [first, rest @ ..] = pairs {
        if !rest.is_empty() {
            let slot = Slot::of(&first.key);
            if let Some(other) = rest.iter().map(|p| Slot::of(&p.key)).find(|s| *s != slot) {
                return Err(Error::CrossSlot {
                    first: slot.get(),
                    other: other.get(),
                });
            }
        }
    }
    for (index, pair) in pairs.iter().enumerate() {
        // A rule's numbers were checked when the server loaded it, and a
        // cost of 0 takes its default cost; only inline pairs can be wrong.
        if let LimitRef::Inline(limit) = &pair.limit {
            let invalid = |reason| Error::InvalidLimit {
                pair: index,
                reason,
            };
            if pair.cost == 0 {
                return Err(invalid("an inline limit's cost must be at least 1"));
            }
            limit_numbers(limit).map_err(invalid)?;
        }
    }
    if pairs.len() > 1 {
        group_rules(pairs)?;
    }
    Ok(())
}

/// Whether a limit's numbers are possible (PROTOCOL.md §8, "InvalidLimit").
fn limit_numbers(limit: &Limit) -> Result<(), &'static str> {
    if limit.count == 0 || limit.count > MAX_COUNT {
        return Err("count must be between 1 and 2^48");
    }
    if limit.period_ms == 0 || limit.period_ms > MAX_PERIOD_MS {
        return Err("period must be between 1 ms and 400 days");
    }
    match limit.algorithm {
        Algorithm::TokenBucket | Algorithm::LeakyBucket
            if limit.burst == 0 || limit.burst > MAX_COUNT =>
        {
            Err("a bucket's burst must be between 1 and 2^48")
        }
        Algorithm::TokenBucket | Algorithm::LeakyBucket => Ok(()),
        _ if limit.burst != 0 => Err("only buckets take a burst (it must be 0)"),
        _ => Ok(()),
    }
}

/// The rules between a group's inline pairs (PROTOCOL.md §7): at most one
/// concurrency pair, and no key with two states of algorithms other than
/// the token bucket. Pairs naming a rule are left to the server (see the
/// module docs).
fn group_rules(pairs: &[Pair]) -> Result<(), Error> {
    let algorithms: Vec<Option<Algorithm>> = pairs
        .iter()
        .map(|p| match &p.limit {
            LimitRef::Inline(limit) => Some(limit.algorithm),
            LimitRef::Rule(_) => None,
        })
        .collect();
    let concurrency = algorithms
        .iter()
        .filter(|a| **a == Some(Algorithm::Concurrency))
        .count();
    if concurrency > 1 {
        return Err(Error::InvalidLimit {
            pair: pairs.len() - 1,
            reason: "a group holds at most one concurrency pair",
        });
    }
    let other_state = |a: &Option<Algorithm>| a.filter(|a| *a != Algorithm::TokenBucket);
    for (i, (pair, algorithm)) in pairs.iter().zip(&algorithms).enumerate() {
        let Some(algorithm) = other_state(algorithm) else {
            continue;
        };
        let clash = pairs[..i]
            .iter()
            .zip(&algorithms)
            .any(|(p, a)| p.key == pair.key && other_state(a).is_some_and(|a| a != algorithm));
        if clash {
            return Err(Error::InvalidLimit {
                pair: i,
                reason: "a key holds one state besides its token bucket: two other algorithms on one key",
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use tollgate_protocol::units::Rate;

    use super::*;

    fn pair(key: &'static str, limit: Limit, cost: u32) -> Pair {
        Pair::inline(Bytes::from_static(key.as_bytes()), limit, cost)
    }

    fn bucket() -> Limit {
        Limit::token_bucket(Rate::per_second(5), 10)
    }

    fn check(pairs: &[Pair]) -> Result<(), Error> {
        check_pairs(pairs, &ServerLimits::default())
    }

    #[test]
    fn valid_pairs_and_groups_pass() {
        assert!(check(&[pair("rl:{a}:s", bucket(), 1)]).is_ok());
        let day = Limit::fixed_window(Rate::per_day(1000));
        assert!(check(&[pair("rl:{a}:s", bucket(), 1), pair("rl:{a}:d", day, 2)]).is_ok());
        // One key: its token bucket and one other state.
        assert!(check(&[pair("rl:{a}", bucket(), 1), pair("rl:{a}", day, 1)]).is_ok());
    }

    #[test]
    fn what_the_server_refuses_is_refused_without_it() {
        let long: &'static str = "k".repeat(257).leak();
        assert!(matches!(
            check(&[pair(long, bucket(), 1)]),
            Err(Error::KeyTooLong { len: 257, max: 256 })
        ));
        assert!(matches!(
            check(&[pair("", bucket(), 1)]),
            Err(Error::EmptyKey)
        ));
        assert!(matches!(check(&[]), Err(Error::EmptyGroup { .. })));
        let seventeen: Vec<Pair> = (0..17).map(|_| pair("rl:{a}", bucket(), 1)).collect();
        assert!(matches!(
            check(&seventeen),
            Err(Error::GroupTooLarge { pairs: 17, .. })
        ));
        assert!(matches!(
            check(&[pair("rl:{a}:1", bucket(), 1), pair("rl:{b}:2", bucket(), 1)]),
            Err(Error::CrossSlot { .. })
        ));
        assert!(matches!(
            check(&[pair("rl:{a}", bucket(), 0)]),
            Err(Error::InvalidLimit { pair: 0, .. })
        ));
        let zero_count = Limit {
            count: 0,
            ..bucket()
        };
        let no_burst = Limit {
            burst: 0,
            ..bucket()
        };
        let window_burst = Limit {
            burst: 3,
            ..Limit::sliding_window(Rate::per_second(5))
        };
        let long_period = Limit {
            period_ms: MAX_PERIOD_MS + 1,
            ..bucket()
        };
        for limit in [zero_count, no_burst, window_burst, long_period] {
            assert!(
                matches!(
                    check(&[pair("rl:{a}", limit, 1)]),
                    Err(Error::InvalidLimit { .. })
                ),
                "{limit:?}"
            );
        }
        let lease = Limit::concurrency(5, std::time::Duration::from_secs(10));
        assert!(matches!(
            check(&[pair("rl:{a}:1", lease, 1), pair("rl:{a}:2", lease, 1)]),
            Err(Error::InvalidLimit { pair: 1, .. })
        ));
        let (day, log) = (
            Limit::fixed_window(Rate::per_day(1000)),
            Limit::sliding_log(Rate::per_second(5)),
        );
        assert!(matches!(
            check(&[pair("rl:{a}", day, 1), pair("rl:{a}", log, 1)]),
            Err(Error::InvalidLimit { pair: 1, .. })
        ));
    }

    #[test]
    fn announced_limits_are_the_ones_checked() {
        let larger = ServerLimits {
            max_key_len: 1024,
            ..ServerLimits::default()
        };
        let long: &'static str = "k".repeat(300).leak();
        assert!(check_pairs(&[pair(long, bucket(), 1)], &larger).is_ok());
    }
}
