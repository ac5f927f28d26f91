//! The workload every target gets: which keys, how they are picked, the
//! limit and cost of each check, how many checks travel in one request, and
//! (open loop) when each request is due.
//!
//! Invariants:
//! - every target sees the same key names (`rl:{000000000042}`, the 12-digit
//!   hash-tagged form `benches/redis/redis-baseline.sh` uses), the same
//!   distribution and the same limit, so their figures compare;
//! - key picking allocates nothing and reads no table: a key's name is
//!   formatted from its index when the request is built ([`KeySpace`]);
//! - an open-loop [`Schedule`] is a pure function of its start instant,
//!   the rate and the connection count: request `k` is due at
//!   `start + k * interval` and goes to connection `k % connections`, so
//!   each connection can compute its own due times and latency is measured
//!   from them (no coordinated omission).

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Zipf};

/// Width of the zero-padded key number, as redis-benchmark's `__rand_int__`.
const KEY_DIGITS: usize = 12;

/// Bytes of key names a [`KeyPicker`] carves its `Bytes` from before it
/// takes a new buffer (about 240 keys). Small on purpose: a buffer is
/// freed only when its last key is, and 64 KiB buffers turning over went
/// back to the OS and were faulted in (zeroed) again, 2-3% of the
/// generator's CPU; 4 KiB ones are reused by the allocator as they are.
const KEY_ARENA: usize = 4 * 1024;

/// "00" to "99", back to back.
const DIGIT_PAIRS: &[u8; 200] = b"\
    0001020304050607080910111213141516171819\
    2021222324252627282930313233343536373839\
    4041424344454647484950515253545556575859\
    6061626364656667686970717273747576777879\
    8081828384858687888990919293949596979899";

/// A rate as `COUNT/PERIOD` (`100/min`, `1000000/s`, `50/10s`); the same
/// syntax as `tollgate check --rate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitRate {
    pub count: u64,
    pub period_ms: u64,
}

impl LimitRate {
    /// Tokens per second, as the seeds' Lua script takes its refill rate.
    pub fn per_second(&self) -> f64 {
        self.count as f64 * 1000.0 / self.period_ms as f64
    }
}

impl FromStr for LimitRate {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (count, period) = s
            .trim()
            .split_once('/')
            .ok_or_else(|| format!("rate {s:?} must look like COUNT/PERIOD, e.g. 100/min"))?;
        let count: u64 = count
            .trim()
            .parse()
            .ok()
            .filter(|&c| c >= 1)
            .ok_or_else(|| format!("rate count {count:?} must be a whole number >= 1"))?;
        let period_ms = match period.trim() {
            "ms" => 1,
            "s" | "sec" | "second" => 1_000,
            "m" | "min" | "minute" => 60_000,
            "h" | "hour" => 3_600_000,
            "d" | "day" => 86_400_000,
            other => {
                let d = humantime::parse_duration(other)
                    .map_err(|e| format!("rate period {other:?}: {e}"))?;
                u64::try_from(d.as_millis())
                    .ok()
                    .filter(|&ms| ms >= 1 && d.subsec_nanos() % 1_000_000 == 0)
                    .ok_or_else(|| format!("rate period {other:?} must be whole milliseconds"))?
            }
        };
        Ok(Self { count, period_ms })
    }
}

impl fmt::Display for LimitRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.period_ms {
            1_000 => write!(f, "{}/s", self.count),
            60_000 => write!(f, "{}/min", self.count),
            3_600_000 => write!(f, "{}/h", self.count),
            86_400_000 => write!(f, "{}/day", self.count),
            ms => write!(f, "{}/{}ms", self.count, ms),
        }
    }
}

/// The token-bucket rule every check carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub rate: LimitRate,
    /// Bucket capacity.
    pub burst: u64,
    /// Tokens each check takes.
    pub cost: u32,
}

/// How keys are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeyDistribution {
    Uniform,
    /// Rank `r` (1-based) is drawn with probability proportional to
    /// `1 / r^skew`; rank 1 is key 0.
    Zipf {
        skew: f64,
    },
}

impl fmt::Display for KeyDistribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Uniform => f.write_str("uniform"),
            Self::Zipf { skew } => write!(f, "zipf({skew})"),
        }
    }
}

/// Key names: key `i` is `rl:{` + `i` as 12 zero-padded digits + `}`.
///
/// Formatted when a request is built rather than read from a table: with a
/// million keys a table is 17 MB, and reading a random entry of it costs a
/// cache miss per check (it showed as 9% of the generator's profile),
/// while formatting twelve digits costs a few nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeySpace {
    count: u32,
}

impl KeySpace {
    /// Bytes in every key name.
    pub const KEY_LEN: usize = "rl:{}".len() + KEY_DIGITS;

    pub fn new(count: u32) -> Self {
        assert!(count >= 1, "at least one key");
        Self { count }
    }

    /// Writes the name of key `index` into `out`.
    pub fn write_key(&self, index: u32, out: &mut [u8; Self::KEY_LEN]) {
        debug_assert!(index < self.count);
        out[..4].copy_from_slice(b"rl:{");
        // Two digits at a time, from a table: half the divisions.
        let mut n = index;
        for pair in out[4..4 + KEY_DIGITS].rchunks_exact_mut(2) {
            let d = (n % 100) as usize * 2;
            pair.copy_from_slice(&DIGIT_PAIRS[d..d + 2]);
            n /= 100;
        }
        out[Self::KEY_LEN - 1] = b'}';
    }

    /// The name of key `index`, in a fresh array.
    pub fn key(&self, index: u32) -> [u8; Self::KEY_LEN] {
        let mut out = [0; Self::KEY_LEN];
        self.write_key(index, &mut out);
        out
    }
}

/// Draws key indices in `0..keys` following a [`KeyDistribution`]. One per
/// connection, each with its own seed.
pub struct KeyPicker {
    rng: SmallRng,
    keys: u32,
    zipf: Option<Zipf<f64>>,
    /// Where [`next_keys`](Self::next_keys) writes key names.
    arena: BytesMut,
}

impl KeyPicker {
    pub fn new(distribution: KeyDistribution, keys: u32, seed: u64) -> Result<Self, String> {
        let zipf = match distribution {
            KeyDistribution::Uniform => None,
            KeyDistribution::Zipf { skew } => Some(
                Zipf::new(f64::from(keys), skew).map_err(|e| format!("zipf skew {skew}: {e}"))?,
            ),
        };
        Ok(Self {
            rng: SmallRng::seed_from_u64(seed),
            keys,
            zipf,
            arena: BytesMut::new(),
        })
    }

    /// The next key index, in `0..keys`.
    pub fn next_index(&mut self) -> u32 {
        match &self.zipf {
            None => self.rng.random_range(0..self.keys),
            // Zipf draws a rank in 1..=keys as a float; the clamp only guards
            // against rounding at the top end.
            Some(zipf) => (zipf.sample(&mut self.rng) as u32).clamp(1, self.keys) - 1,
        }
    }

    /// The names of the next `n` keys of `space`, back to back in one
    /// `Bytes` (key `i` at `i * KEY_LEN`).
    ///
    /// Carved from a per-connection buffer rather than allocated per
    /// request: a `Bytes` of its own per key cost a `malloc` and a `free`,
    /// plus a second pair when the client first cloned it (a `Vec`-backed
    /// `Bytes` is promoted to a shared one), about a tenth of the
    /// generator's CPU per check at batch 1. A slice of a shared buffer is
    /// reference counted from the start; a buffer is replaced only when
    /// full, and freed when the last key cut from it is dropped.
    pub fn next_keys(&mut self, space: &KeySpace, n: usize) -> Bytes {
        let len = n * KeySpace::KEY_LEN;
        if self.arena.capacity() < len {
            self.arena.reserve(len.max(KEY_ARENA));
        }
        let mut key = [0; KeySpace::KEY_LEN];
        for _ in 0..n {
            space.write_key(self.next_index(), &mut key);
            self.arena.extend_from_slice(&key);
        }
        self.arena.split().freeze()
    }
}

/// Open-loop arrival schedule: `rate` checks per second across all
/// connections, in requests of `batch` checks.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    pub start: Instant,
    /// Nanoseconds between two requests (over all connections).
    interval_ns: f64,
    connections: u64,
}

impl Schedule {
    /// `rate` checks/s, `batch` checks per request, spread round-robin over
    /// `connections`.
    pub fn new(start: Instant, rate: f64, batch: u32, connections: u32) -> Self {
        assert!(rate > 0.0 && batch >= 1 && connections >= 1);
        Self {
            start,
            interval_ns: 1e9 * f64::from(batch) / rate,
            connections: u64::from(connections),
        }
    }

    /// When request `k` (global index) is due.
    pub fn due(&self, k: u64) -> Instant {
        self.start + Duration::from_nanos((k as f64 * self.interval_ns) as u64)
    }

    /// How many requests are due at `now`: those with `due(k) <= now`.
    pub fn due_count(&self, now: Instant) -> u64 {
        let Some(elapsed) = now.checked_duration_since(self.start) else {
            return 0;
        };
        let n = (elapsed.as_nanos() as f64 / self.interval_ns).floor() as u64 + 1;
        // Guard the float rounding at the boundary: never count a request
        // whose due time is still ahead.
        if self.due(n - 1) > now {
            n - 1
        } else {
            n
        }
    }

    /// How many requests are due before `end` (the end of the run).
    pub fn count_before(&self, end: Instant) -> u64 {
        let n = self.due_count(end);
        if n > 0 && self.due(n - 1) >= end {
            n - 1
        } else {
            n
        }
    }

    /// The connection that sends request `k`.
    pub fn connection_of(&self, k: u64) -> u32 {
        (k % self.connections) as u32
    }

    /// The global index of connection `conn`'s `j`-th request.
    pub fn request_of(&self, conn: u32, j: u64) -> u64 {
        j * self.connections + u64::from(conn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_fixed_width_and_hash_tagged() {
        let space = KeySpace::new(u32::MAX);
        assert_eq!(&space.key(0), b"rl:{000000000000}");
        assert_eq!(&space.key(42), b"rl:{000000000042}");
        assert_eq!(&space.key(999), b"rl:{000000000999}");
        assert_eq!(&space.key(1_234_567), b"rl:{000001234567}");
        assert_eq!(&space.key(90_807_060), b"rl:{000090807060}");
        assert_eq!(&space.key(u32::MAX - 1), b"rl:{004294967294}");
    }

    /// Keys carved from the arena are the picks' names, and stay intact
    /// while later keys fill (and replace) the buffer.
    #[test]
    fn arena_keys_follow_the_picks_across_buffers() {
        let space = KeySpace::new(1_000_000);
        let mut indices = KeyPicker::new(KeyDistribution::Uniform, 1_000_000, 9).unwrap();
        let mut names = KeyPicker::new(KeyDistribution::Uniform, 1_000_000, 9).unwrap();
        // Over two buffers' worth, in requests of 1 and of 7 keys.
        let held: Vec<(usize, Bytes)> = (0..2 * KEY_ARENA / KeySpace::KEY_LEN / 4)
            .map(|i| {
                let n = if i % 2 == 0 { 1 } else { 7 };
                (n, names.next_keys(&space, n))
            })
            .collect();
        for (n, keys) in held {
            assert_eq!(keys.len(), n * KeySpace::KEY_LEN);
            for key in keys.chunks(KeySpace::KEY_LEN) {
                assert_eq!(key, space.key(indices.next_index()));
            }
        }
    }

    #[test]
    fn uniform_stays_in_range_and_covers_it() {
        let mut picker = KeyPicker::new(KeyDistribution::Uniform, 10, 1).unwrap();
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            let i = picker.next_index();
            assert!(i < 10);
            seen[i as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 0), "{seen:?}");
    }

    #[test]
    fn zipf_stays_in_range_and_is_skewed() {
        const KEYS: u32 = 1000;
        const DRAWS: u32 = 100_000;
        let mut picker = KeyPicker::new(KeyDistribution::Zipf { skew: 1.0 }, KEYS, 7).unwrap();
        let mut counts = vec![0u32; KEYS as usize];
        for _ in 0..DRAWS {
            let i = picker.next_index();
            assert!(i < KEYS);
            counts[i as usize] += 1;
        }
        let top = *counts.iter().max().unwrap();
        let uniform = DRAWS / KEYS;
        // With skew 1 over 1000 keys, key 0 takes ~1/H(1000) = 13% of draws.
        assert!(top > 10 * uniform, "top {top} vs uniform {uniform}");
        assert_eq!(
            counts.iter().position(|&c| c == top),
            Some(0),
            "rank 1 is key 0"
        );
    }

    #[test]
    fn zipf_with_one_key_and_bad_skew() {
        let mut picker = KeyPicker::new(KeyDistribution::Zipf { skew: 1.2 }, 1, 3).unwrap();
        for _ in 0..100 {
            assert_eq!(picker.next_index(), 0);
        }
        assert!(KeyPicker::new(KeyDistribution::Zipf { skew: -1.0 }, 10, 3).is_err());
    }

    #[test]
    fn limit_rates_parse_like_the_server_cli() {
        let r: LimitRate = "100/min".parse().unwrap();
        assert_eq!((r.count, r.period_ms), (100, 60_000));
        assert!((r.per_second() - 100.0 / 60.0).abs() < 1e-12);
        let r: LimitRate = "1000000/s".parse().unwrap();
        assert_eq!(r.per_second(), 1e6);
        let r: LimitRate = "50/10s".parse().unwrap();
        assert_eq!((r.count, r.period_ms), (50, 10_000));
        assert_eq!(r.to_string(), "50/10000ms");
        assert!("0/s".parse::<LimitRate>().is_err());
        assert!("5".parse::<LimitRate>().is_err());
        assert!("5/1.5ms".parse::<LimitRate>().is_err());
    }

    #[test]
    fn schedule_spaces_requests_by_batch_over_rate() {
        let start = Instant::now();
        // 200k checks/s in requests of 4: 50k requests/s, one every 20 us.
        let s = Schedule::new(start, 200_000.0, 4, 3);
        assert_eq!(s.due(1) - s.due(0), Duration::from_micros(20));
        assert_eq!(s.due(0), start);
        assert_eq!(s.due(50_000), start + Duration::from_secs(1));
        // Round robin over 3 connections.
        assert_eq!(
            (0..6).map(|k| s.connection_of(k)).collect::<Vec<_>>(),
            [0, 1, 2, 0, 1, 2]
        );
        assert_eq!(s.request_of(2, 0), 2);
        assert_eq!(s.request_of(1, 4), 13);
        assert_eq!(s.connection_of(s.request_of(1, 4)), 1);
    }

    #[test]
    fn due_count_includes_exactly_the_requests_whose_time_has_come() {
        let start = Instant::now();
        let s = Schedule::new(start, 1000.0, 1, 1); // one per ms
        assert_eq!(s.due_count(start), 1, "request 0 is due at start");
        assert_eq!(s.due_count(start + Duration::from_micros(999)), 1);
        assert_eq!(s.due_count(start + Duration::from_millis(1)), 2);
        assert_eq!(s.due_count(start + Duration::from_millis(10)), 11);
        // Over a run of 10 ms, requests 0..=9 are due before the end.
        assert_eq!(s.count_before(start + Duration::from_millis(10)), 10);
        assert_eq!(s.count_before(start + Duration::from_micros(10_500)), 11);
        for k in 0..10_000u64 {
            let due = s.due(k);
            assert_eq!(s.due_count(due), k + 1, "k={k}");
        }
    }

    #[test]
    fn due_count_before_start_is_zero() {
        let now = Instant::now();
        let s = Schedule::new(now + Duration::from_secs(1), 10.0, 1, 1);
        assert_eq!(s.due_count(now), 0);
    }
}
