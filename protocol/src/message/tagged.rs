//! What CHECK2 adds to each check: an idempotency key that makes the check
//! safe to retry, and a priority that says what to shed first.
//!
//! Invariants: a [`TaggedBatch`] holds exactly one [`CheckTag`] per check
//! (its fields are private and every way in pushes both together); the
//! all-zero key is [`IdempotencyKey::NONE`], "no de-duplication".

use super::{CheckBatch, Pair};

/// Bytes of an idempotency key on the wire.
pub const IDEMPOTENCY_KEY_LEN: usize = 16;

/// A client-chosen id for one check (PROTOCOL.md §5, CHECK2). A server that
/// has already charged a check under this key, within its de-duplication
/// window, answers a retry with the same result and charges nothing again.
/// All zeros ([`Self::NONE`]) means the check is not de-duplicated.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IdempotencyKey([u8; IDEMPOTENCY_KEY_LEN]);

impl IdempotencyKey {
    /// No key: the check is evaluated every time it is received.
    pub const NONE: Self = Self([0; IDEMPOTENCY_KEY_LEN]);

    pub const fn new(bytes: [u8; IDEMPOTENCY_KEY_LEN]) -> Self {
        Self(bytes)
    }

    /// A key from a 128-bit number (big-endian on the wire).
    pub const fn from_u128(n: u128) -> Self {
        Self(n.to_be_bytes())
    }

    pub fn is_none(&self) -> bool {
        *self == Self::NONE
    }

    pub fn as_bytes(&self) -> &[u8; IDEMPOTENCY_KEY_LEN] {
        &self.0
    }
}

impl std::fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IdempotencyKey({:032x})", u128::from_be_bytes(self.0))
    }
}

/// How much a check matters when the server is overloaded: it sheds `Low`
/// first, then `Normal`; `High` is never shed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(u8)]
pub enum Priority {
    Low = 0,
    #[default]
    Normal = 1,
    High = 2,
}

impl Priority {
    /// Every priority, in wire order.
    pub const ALL: [Priority; 3] = [Self::Low, Self::Normal, Self::High];

    pub fn from_wire(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Low),
            1 => Some(Self::Normal),
            2 => Some(Self::High),
            _ => None,
        }
    }

    /// As the metrics label it: `low`, `normal`, `high`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::Normal => "normal",
            Self::High => "high",
        }
    }
}

impl std::str::FromStr for Priority {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown priority {s:?} (low, normal or high)"))
    }
}

/// The idempotency key and priority of one check of a CHECK2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CheckTag {
    pub idempotency: IdempotencyKey,
    pub priority: Priority,
}

impl CheckTag {
    pub fn new(idempotency: IdempotencyKey, priority: Priority) -> Self {
        Self {
            idempotency,
            priority,
        }
    }
}

/// The checks of a CHECK2: a [`CheckBatch`] and one [`CheckTag`] per check.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaggedBatch {
    checks: CheckBatch,
    tags: Vec<CheckTag>,
}

impl TaggedBatch {
    pub fn with_capacity(checks: usize) -> Self {
        Self {
            checks: CheckBatch::with_capacity(checks),
            tags: Vec::with_capacity(checks),
        }
    }

    /// Appends one check (an atomic group when several pairs) with its tag.
    pub fn push_check<I: IntoIterator<Item = Pair>>(&mut self, tag: CheckTag, pairs: I) {
        self.checks.push_check(pairs);
        self.tags.push(tag);
    }

    /// Appends a single-pair check with its tag.
    pub fn push(&mut self, tag: CheckTag, pair: Pair) {
        self.push_check(tag, std::iter::once(pair));
    }

    /// For the decoder: records the tag of the next check and hands out
    /// the checks, to read that check's pairs into (see
    /// [`CheckBatch::push_pair`]).
    pub(crate) fn tagged(&mut self, tag: CheckTag) -> &mut CheckBatch {
        self.tags.push(tag);
        &mut self.checks
    }

    /// Number of checks.
    pub fn len(&self) -> usize {
        self.tags.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tags.is_empty()
    }

    /// The checks without their tags.
    pub fn checks(&self) -> &CheckBatch {
        &self.checks
    }

    /// The tags, one per check, in order.
    pub fn tags(&self) -> &[CheckTag] {
        &self.tags
    }

    /// The checks in order, each with its tag.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (CheckTag, &[Pair])> + '_ {
        self.tags.iter().copied().zip(self.checks.iter())
    }
}
