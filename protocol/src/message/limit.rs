//! What a check names: the limits, rules and pairs of CHECK, PEEK and
//! REFUND, the batch that carries them, and the leases of RELEASE.
//!
//! Keys are [`Bytes`] sliced out of the received frame (no copy).

use bytes::Bytes;

/// Limiting algorithm named by a [`Limit`]. Wire values are stable.
///
/// How each reads the limit's numbers (see `PROTOCOL.md` §8):
///
/// | algorithm | `count` | `period_ms` | `burst` |
/// |---|---|---|---|
/// | token bucket | tokens refilled per period | refill period | capacity, >= 1 |
/// | sliding window | requests per window | window | 0 |
/// | fixed window | requests per window | window | 0 |
/// | sliding log | requests per window | window | 0 |
/// | leaky bucket | requests per period (spacing `period / count`) | period | tolerance, >= 1 |
/// | concurrency | most in flight | lease time to live | 0 |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Algorithm {
    /// Token bucket (GCRA): `count` tokens per `period_ms` refill, up to `burst`.
    TokenBucket = 1,
    /// Sliding window counter: at most `count` per `period_ms` window,
    /// previous window weighted by its overlap. `burst` must be 0.
    SlidingWindow = 2,
    /// Fixed window counter: at most `count` per window of `period_ms`
    /// aligned on the server clock (2x across a boundary). `burst` must be 0.
    FixedWindow = 3,
    /// Sliding log: exactly at most `count` in any `period_ms`, for small
    /// counts (server cap `max_log_entries`). `burst` must be 0.
    SlidingLog = 4,
    /// Leaky bucket as a meter: one unit per `period_ms / count`, up to
    /// `burst` (>= 1) early.
    LeakyBucket = 5,
    /// Concurrency: at most `count` in flight, each allowed check holding a
    /// lease that lives `period_ms` unless released first. `burst` must be 0.
    Concurrency = 6,
}

impl Algorithm {
    /// Every algorithm, in wire order.
    pub const ALL: [Algorithm; 6] = [
        Self::TokenBucket,
        Self::SlidingWindow,
        Self::FixedWindow,
        Self::SlidingLog,
        Self::LeakyBucket,
        Self::Concurrency,
    ];

    /// Decodes a wire value.
    pub fn from_wire(v: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|a| *a as u8 == v)
    }

    /// The name used on the command line, in rules files and in logs.
    pub fn name(self) -> &'static str {
        match self {
            Self::TokenBucket => "token-bucket",
            Self::SlidingWindow => "sliding-window",
            Self::FixedWindow => "fixed-window",
            Self::SlidingLog => "sliding-log",
            Self::LeakyBucket => "leaky-bucket",
            Self::Concurrency => "concurrency",
        }
    }

    /// The algorithm of a [`name`](Self::name) (exact, lowercase).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }
}

/// An inline limit, as carried by one (key, limit) pair.
///
/// The codec checks only its shape; whether the numbers make sense
/// (non-zero rate, no overflow) is checked by the server, which answers a bad
/// limit with a per-check [`ErrorCode::InvalidLimit`](super::ErrorCode::InvalidLimit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    pub algorithm: Algorithm,
    /// Tokens (token bucket), requests (windows, log, leaky bucket) per
    /// `period_ms`, or units in flight (concurrency).
    pub count: u64,
    /// The refill period, window length or lease time to live, in
    /// milliseconds.
    pub period_ms: u64,
    /// Bucket capacity (token bucket) or tolerance (leaky bucket); 0 for
    /// the others.
    pub burst: u64,
}

/// Longest rule name, in bytes (the wire's `name_len` is 1..=64).
pub const MAX_RULE_NAME_LEN: usize = 64;

/// `limit_kind` wire value of a pair that names a rule; values 1..=127 are
/// inline algorithm codes.
pub const LIMIT_KIND_RULE: u8 = 0x80;

/// The name of a rule configured on the server: 1..=64 bytes of UTF-8.
///
/// A name of up to 23 bytes (most) is held inline, copied; a longer one
/// holds a slice of the received frame when decoded (no copy). Decoded as
/// a slice, each pair's name took a reference on the frame's buffer and
/// gave it back when dropped: two atomic operations per check naming a
/// rule, where a copy of 23 bytes is a few moves. Decoding a frame and
/// dropping its pairs went from 6.4% to 5.0% of the server's CPU under a
/// rule (perf); `benches/codec.rs` `decode_check_rule`, 13-29% faster.
/// The invariant (length and UTF-8) is checked by every constructor, so a
/// `RuleName` always encodes.
#[derive(Clone)]
pub struct RuleName(Name);

/// How a [`RuleName`] holds its bytes.
#[derive(Clone)]
enum Name {
    /// `bytes[..len]`; the bytes after them are unspecified (copied with
    /// the name, as one fixed-length copy, from whatever followed it).
    Inline {
        len: u8,
        bytes: [u8; RuleName::INLINE_LEN],
    },
    Shared(Bytes),
}

#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<RuleName>() == std::mem::size_of::<Bytes>());

/// Why a string is not a rule name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRuleName {
    #[error("rule name must be 1 to {MAX_RULE_NAME_LEN} bytes, got {0}")]
    Length(usize),
    #[error("rule name is not valid UTF-8")]
    Utf8,
}

impl RuleName {
    /// Longest rule name held inline (a longer one is decoded as a slice
    /// of the frame): what fits, with its length byte, in the room a
    /// `Bytes` takes beside its vtable pointer, whose null value tells the
    /// two kinds apart (on 64-bit targets a `RuleName` is no larger than a
    /// `Bytes`; on 32-bit ones, 8 bytes larger).
    pub(crate) const INLINE_LEN: usize = 23;

    /// Checks `name` (1..=64 bytes of UTF-8) and wraps it: copied when
    /// short, else without copying.
    pub fn new(name: impl Into<Bytes>) -> Result<Self, InvalidRuleName> {
        let name = name.into();
        Self::check(&name)?;
        if name.len() <= Self::INLINE_LEN {
            return Ok(Self::inline(name.len(), Self::padded(&name)));
        }
        Ok(Self(Name::Shared(name)))
    }

    /// The name of the first `len` bytes of `window` (at most
    /// [`Self::INLINE_LEN`]), copied: a frame's name as it is decoded,
    /// `window` the rest of the frame from it.
    pub(crate) fn copied(window: &[u8], len: usize) -> Result<Self, InvalidRuleName> {
        let name = (window.get(..len))
            .filter(|_| len <= Self::INLINE_LEN)
            .ok_or(InvalidRuleName::Length(len))?;
        Self::check(name)?;
        let bytes = match window.first_chunk::<{ Self::INLINE_LEN }>() {
            // A copy of a known length: no call to `memcpy` (a copy of the
            // name's own length was one, with a `memset` for the rest).
            Some(ahead) => *ahead,
            None => Self::padded(name),
        };
        Ok(Self::inline(len, bytes))
    }

    /// `name` (at most `INLINE_LEN` bytes) and zeros after it: for a name
    /// near the end of a frame, apart so that the common path stays one
    /// copy of a known length.
    #[cold]
    #[inline(never)]
    fn padded(name: &[u8]) -> [u8; Self::INLINE_LEN] {
        let mut bytes = [0; Self::INLINE_LEN];
        bytes[..name.len()].copy_from_slice(name);
        bytes
    }

    fn inline(len: usize, bytes: [u8; Self::INLINE_LEN]) -> Self {
        // At most INLINE_LEN: fits a u8.
        Self(Name::Inline {
            len: len as u8,
            bytes,
        })
    }

    /// The constructors' invariant: 1..=64 bytes of UTF-8.
    fn check(name: &[u8]) -> Result<(), InvalidRuleName> {
        if name.is_empty() || name.len() > MAX_RULE_NAME_LEN {
            return Err(InvalidRuleName::Length(name.len()));
        }
        if std::str::from_utf8(name).is_err() {
            return Err(InvalidRuleName::Utf8);
        }
        Ok(())
    }

    /// A rule name from a static string; panics if it is not one (for
    /// constants in code and tests).
    pub fn from_static(name: &'static str) -> Self {
        match Self::new(Bytes::from_static(name.as_bytes())) {
            Ok(n) => n,
            Err(e) => panic!("{name:?}: {e}"),
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Name::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Name::Shared(bytes) => bytes,
        }
    }

    pub fn as_str(&self) -> &str {
        // Checked by every constructor; the fallback is unreachable.
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }

    pub fn len(&self) -> usize {
        self.as_bytes().len()
    }

    /// Always false: a rule name has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.as_bytes().is_empty()
    }
}

// By the name's bytes, however they are held.
impl PartialEq for RuleName {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for RuleName {}

impl std::hash::Hash for RuleName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl std::fmt::Debug for RuleName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::fmt::Display for RuleName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TryFrom<&str> for RuleName {
    type Error = InvalidRuleName;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        Self::new(Bytes::copy_from_slice(s.as_bytes()))
    }
}

impl TryFrom<String> for RuleName {
    type Error = InvalidRuleName;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(Bytes::from(s))
    }
}

/// The limit of a pair: carried inline, or a rule configured on the server.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LimitRef {
    Inline(Limit),
    /// Resolved by the server against its current rules; an unknown name is
    /// a per-check [`ErrorCode::UnknownRule`](super::ErrorCode::UnknownRule).
    Rule(RuleName),
}

impl From<Limit> for LimitRef {
    fn from(limit: Limit) -> Self {
        Self::Inline(limit)
    }
}

impl From<RuleName> for LimitRef {
    fn from(name: RuleName) -> Self {
        Self::Rule(name)
    }
}

/// One (key, limit, cost) pair of a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    pub key: Bytes,
    pub limit: LimitRef,
    /// How many units this request takes (in a REFUND, how many units to
    /// give back). Inline limits: >= 1 (validated by the server). Rule
    /// references: 0 means the rule's default cost.
    pub cost: u32,
}

impl Pair {
    /// A pair with an inline limit.
    pub fn inline(key: impl Into<Bytes>, limit: Limit, cost: u32) -> Self {
        Self {
            key: key.into(),
            limit: LimitRef::Inline(limit),
            cost,
        }
    }

    /// A pair naming a rule; `cost` 0 takes the rule's default cost.
    pub fn rule(key: impl Into<Bytes>, rule: RuleName, cost: u32) -> Self {
        Self {
            key: key.into(),
            limit: LimitRef::Rule(rule),
            cost,
        }
    }
}

/// One lease to release: the key it was acquired on and its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRef {
    pub key: Bytes,
    /// The id from the allowed decision that acquired it.
    pub lease: u64,
}

/// A batch of independent checks, each an atomic group of one or more pairs.
///
/// Stored flat (all pairs in one vector, each check a range of it) so that a
/// decoded frame costs two allocations whatever its size.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CheckBatch {
    pairs: Vec<Pair>,
    /// End index (exclusive) into `pairs` of each check, ascending.
    ends: Vec<u32>,
}

impl CheckBatch {
    /// An empty batch with room for `checks` checks of about one pair each.
    pub fn with_capacity(checks: usize) -> Self {
        Self {
            pairs: Vec::with_capacity(checks),
            ends: Vec::with_capacity(checks),
        }
    }

    /// Appends one check made of `pairs` (an atomic group when more than one).
    pub fn push_check<I: IntoIterator<Item = Pair>>(&mut self, pairs: I) {
        self.pairs.extend(pairs);
        self.ends.push(self.pairs.len() as u32);
    }

    /// Appends a single-pair check.
    pub fn push(&mut self, pair: Pair) {
        self.push_check(std::iter::once(pair));
    }

    /// For the decoder: appends a pair to the check being read, which
    /// [`CheckBatch::end_check`] closes. A batch left with pairs after its
    /// last end is never handed out: the decoder drops it with its error.
    pub(crate) fn push_pair(&mut self, pair: Pair) {
        self.pairs.push(pair);
    }

    /// For the decoder: the pairs pushed since the last end form a check.
    pub(crate) fn end_check(&mut self) {
        self.ends.push(self.pairs.len() as u32);
    }

    /// Number of checks.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Total number of pairs over all checks.
    pub fn pair_count(&self) -> usize {
        self.pairs.len()
    }

    /// The checks in order, each as the slice of its pairs.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[Pair]> + '_ {
        let mut start = 0usize;
        self.ends.iter().map(move |&end| {
            let s = &self.pairs[start..end as usize];
            start = end as usize;
            s
        })
    }

    /// Empties the batch, keeping its allocations.
    pub fn clear(&mut self) {
        self.pairs.clear();
        self.ends.clear();
    }
}
