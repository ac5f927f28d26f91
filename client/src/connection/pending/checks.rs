//! What a call sends: the kind of a check request and the checks of one
//! call, with what the writer needs to merge and encode them (their count,
//! encoded size, pairs in order).

use tollgate_protocol::{
    opcode, CheckBatch, CheckTag, Pair, Request, TaggedBatch, IDEMPOTENCY_KEY_LEN,
};

use super::Shape;

/// CHECK, CHECK2, PEEK or REFUND: requests of one kind can share a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BatchKind {
    Check,
    /// A CHECK whose checks carry an idempotency key and a priority
    /// ([`Checks::Tagged`]); safe to send again after a lost connection.
    Check2,
    Peek,
    Refund,
}

impl BatchKind {
    /// The frame carrying `calls`' checks (`n` in all), in order.
    pub(crate) fn request(self, n: usize, calls: impl IntoIterator<Item = Checks>) -> Request {
        if self == Self::Check2 {
            let mut batch = TaggedBatch::with_capacity(n);
            for checks in calls {
                checks.append_tagged(&mut batch);
            }
            return Request::Check2(batch);
        }
        let mut batch = CheckBatch::with_capacity(n);
        for checks in calls {
            checks.append_to(&mut batch);
        }
        match self {
            Self::Check | Self::Check2 => Request::Check(batch),
            Self::Peek => Request::Peek(batch),
            Self::Refund => Request::Refund(batch),
        }
    }

    /// The frame's opcode.
    pub(crate) fn opcode(self) -> u8 {
        match self {
            Self::Check => opcode::CHECK,
            Self::Check2 => opcode::CHECK2,
            Self::Peek => opcode::PEEK,
            Self::Refund => opcode::REFUND,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Check => "CHECK",
            Self::Check2 => "CHECK2",
            Self::Peek => "PEEK",
            Self::Refund => "REFUND",
        }
    }
}

/// The checks of one call.
#[derive(Debug, Clone)]
pub(crate) enum Checks {
    /// One single-pair check: answered with [`Answer::One`].
    One(Pair),
    /// One check of several pairs (an atomic group): [`Answer::One`].
    Group(Vec<Pair>),
    /// Many independent checks: [`Answer::Results`].
    Batch(CheckBatch),
    /// One check (a group when several pairs) with its idempotency key and
    /// priority, for CHECK2: [`Answer::One`].
    Tagged(CheckTag, Vec<Pair>),
}

impl Checks {
    /// Number of checks.
    pub(crate) fn len(&self) -> usize {
        match self {
            Self::One(_) | Self::Group(_) | Self::Tagged(..) => 1,
            Self::Batch(b) => b.len(),
        }
    }

    /// Encoded size of the checks in a CHECK (or CHECK2) payload
    /// (PROTOCOL.md §5).
    pub(crate) fn wire_len(&self) -> usize {
        fn check(pairs: &[Pair]) -> usize {
            1 + pairs.iter().map(pair_len).sum::<usize>()
        }
        match self {
            Self::One(p) => 1 + pair_len(p),
            Self::Group(g) => check(g),
            Self::Batch(b) => b.iter().map(check).sum(),
            Self::Tagged(_, g) => IDEMPOTENCY_KEY_LEN + 1 + check(g),
        }
    }

    /// Moves (or, for a batch, clones the cheap handles of) the checks into
    /// `into`.
    pub(crate) fn append_to(self, into: &mut CheckBatch) {
        match self {
            Self::One(p) => into.push(p),
            Self::Group(g) | Self::Tagged(_, g) => into.push_check(g),
            Self::Batch(b) => {
                for check in b.iter() {
                    into.push_check(check.iter().cloned());
                }
            }
        }
    }

    /// Like [`append_to`](Self::append_to), for a CHECK2: untagged checks
    /// go without a key, at normal priority.
    pub(crate) fn append_tagged(self, into: &mut TaggedBatch) {
        match self {
            Self::Tagged(tag, g) => into.push_check(tag, g),
            Self::One(p) => into.push(CheckTag::default(), p),
            Self::Group(g) => into.push_check(CheckTag::default(), g),
            Self::Batch(b) => {
                for check in b.iter() {
                    into.push_check(CheckTag::default(), check.iter().cloned());
                }
            }
        }
    }

    /// The checks, each as its pairs, in order (what a CHECK frame
    /// encodes).
    pub(crate) fn groups(&self) -> impl Iterator<Item = &[Pair]> {
        let (one, batch) = match self {
            Self::One(p) => (Some(std::slice::from_ref(p)), None),
            Self::Group(g) | Self::Tagged(_, g) => (Some(g.as_slice()), None),
            Self::Batch(b) => (None, Some(b.iter())),
        };
        one.into_iter().chain(batch.into_iter().flatten())
    }

    pub(crate) fn shape(&self) -> Shape {
        match self {
            Self::One(_) | Self::Group(_) | Self::Tagged(..) => Shape::One,
            Self::Batch(b) => Shape::Results(b.len()),
        }
    }
}

/// Encoded size of one pair: key length and key, the limit (inline: kind
/// and three u64; rule: kind, length and name), the cost.
fn pair_len(p: &Pair) -> usize {
    let limit = match &p.limit {
        tollgate_protocol::LimitRef::Inline(_) => 1 + 24,
        tollgate_protocol::LimitRef::Rule(name) => 2 + name.len(),
    };
    2 + p.key.len() + limit + 4
}
