//! The store against a model: random sequences of checks (single keys and
//! atomic groups), peeks, refunds, lease releases, removals, remote usage,
//! time steps and sweeps run on a real [`Store`] and on a plain map from a
//! key to its two states, and every answer and every state must agree.
//!
//! The store's tables are optimised in ways a hand-written example rarely
//! reaches: compact tables split by key width (a 16-byte slot whose length
//! is read back from its zero padding, or a 24-byte inline-or-heap key),
//! inline keys compared as fixed-width words, token buckets updated in
//! place, fixed and sliding windows packed into 16 bytes with a fallback to
//! the general table when a count or a window does not fit, growth,
//! tombstones, the memory cap's scans and rebuilds, and prefetch hints. A
//! key lost, confused with a neighbour or stored with a corrupted count
//! shows here as an answer or a state the model does not have.
//!
//! What the model trusts: the algorithms' pure functions for one key's
//! arithmetic ([`Policy::evaluate`], `refund`, `absorb`, [`release_lease`]),
//! [`Policy::from_limit_with`] for which limits are valid, [`Slot::of`]
//! for hash tags, and [`crate::algorithm::Decision::to_wire`]. The rest is
//! the model's own, from the store's documented semantics: a key holds a
//! token bucket and one state of any other algorithm; a state is live while
//! `expires_at > now` and absent otherwise; a group is refused whole (cross
//! slot, invalid limit, two leases, a lease refunded, two other algorithms
//! on one key), evaluated pair by pair against the state the earlier pairs
//! left, and written only when every pair passes and the mode charges; its
//! decision names the pair with the least remaining, or the denial that
//! waits longest. Under a small memory cap, a check that would add an
//! entry may be answered `StoreFull` instead, changing nothing; and which
//! entries a cap that evicts drops is the store's choice: the model lets
//! them go once the store has counted an eviction for each, provided that
//! what the store keeps is still what the model has.
//!
//! Not checked here: the memory accounting itself (`memory_bytes`, only
//! through what the cap decides), the statistics counters but evictions,
//! time going back (an expired state dropped on access would come back in
//! the model), merges and `update`. The replication log is checked in
//! `replication`, a standby against this test's primary.
//!
//! Keys are picked to be adversarial for the split tables (`keys`): empty,
//! one byte, around 16 and 22 bytes, ending or not in a 0 byte, differing
//! only in their last byte or by a trailing 0 byte, not UTF-8; and runs of
//! filler keys make the tables grow.

mod keys;
mod oracle;
mod replication;

use super::*;
use crate::algorithm::{release_lease, Policy};
use crate::clock::Nanos;
use crate::slot::Slot;
use keys::{Fill, Width};
use oracle::{Expect, GroupOp, Model};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tollgate_protocol::{LimitRef, Pair};

/// Inline pairs (the model's, generated as the wire's) as the store takes
/// them.
fn resolved(pairs: &[Pair]) -> Vec<ResolvedPair<'_>> {
    pairs
        .iter()
        .map(|p| match &p.limit {
            LimitRef::Inline(limit) => ResolvedPair::new(&p.key, *limit, p.cost),
            LimitRef::Rule(_) => unreachable!("the store takes no rule names"),
        })
        .collect()
}

/// Most timestamps a key may hold (small: the model's logs stay cheap).
const MAX_LOG: u64 = 16;
/// Where time starts: the wall clock of 2027, as the server's `now` is.
const T0: Nanos = 1_800_000_000 * S;
const HOUR: Nanos = 3_600 * S;
const DAY: Nanos = 24 * HOUR;

/// The store under test: how many stripes, and its memory cap.
#[derive(Debug, Clone, Copy)]
enum Setup {
    /// No cap: a single token bucket takes the in-place path.
    Uncapped { stripes: usize },
    /// A cap never reached: every check takes the general path and the
    /// memory accounting runs, but nothing is refused.
    Roomy { stripes: usize },
    /// A small cap that refuses new keys: scans for expired entries and
    /// rebuilds at the cap, `StoreFull` answers.
    Refusing { stripes: usize, per_stripe: usize },
    /// A small cap that evicts: the entries evicted leave the model (see
    /// [`Run::settle_evictions`]).
    Evicting { stripes: usize, per_stripe: usize },
}

impl Setup {
    fn store(self) -> Store {
        Store::new(self.config())
    }

    fn config(self) -> StoreConfig {
        let (stripes, max_memory, on_full) = match self {
            Setup::Uncapped { stripes } => (stripes, None, Full::Evict),
            Setup::Roomy { stripes } => (stripes, Some(stripes << 40), Full::Refuse),
            Setup::Refusing {
                stripes,
                per_stripe,
            } => (stripes, Some(stripes * per_stripe), Full::Refuse),
            Setup::Evicting {
                stripes,
                per_stripe,
            } => (stripes, Some(stripes * per_stripe), Full::Evict),
        };
        StoreConfig {
            stripes,
            max_log_entries: MAX_LOG,
            max_memory,
            on_full,
            ..StoreConfig::default()
        }
    }

    /// Whether a new key may be answered StoreFull (with a small cap
    /// that evicts, when even an emptied stripe has no room for it).
    fn may_be_full(self) -> bool {
        matches!(self, Setup::Refusing { .. } | Setup::Evicting { .. })
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// A check or a peek; `spotted` goes through `spot`, `prefetch` and
    /// `check_at` as the server's frames do.
    Check {
        pairs: Vec<Pair>,
        mode: Mode,
        spotted: bool,
    },
    Refund {
        pairs: Vec<Pair>,
        spotted: bool,
    },
    /// Releases the `pick`th lease the key holds (an unknown id if none).
    Release {
        key: Bytes,
        pick: u8,
    },
    Remove {
        key: Bytes,
    },
    /// Usage from another region.
    Absorb {
        key: Bytes,
        limit: Limit,
        sent: Sent,
    },
    Advance(Nanos),
    /// Sweeps that many stripes (all of them: the count of entries left
    /// must be the model's).
    Sweep(usize),
    /// Charges `n` filler keys one check each: the tables grow.
    Fill {
        fill: Fill,
        limit: Limit,
    },
    /// Compares every key the model knows, and the stripes' hints.
    Audit,
}

/// What another region reports of a key: usage made `ago` ns before the
/// receiver's now (negative: a sender whose clock is ahead).
#[derive(Debug, Clone, Copy)]
struct Sent {
    charged: u64,
    refunded: u64,
    ago: i64,
}

impl Sent {
    fn usage(self, now: Nanos) -> RemoteUsage {
        RemoteUsage {
            charged: self.charged,
            refunded: self.refunded,
            at: now.saturating_add_signed(-self.ago),
        }
    }
}

/// The `pick`th lease of a key's lease set; one pick in eight, or when
/// it holds none, an id it does not hold (a release that must fail).
fn pick_lease(leases: Option<&State>, pick: usize) -> u64 {
    match leases {
        Some(State::Concurrency(set)) if !set.leases().is_empty() && pick % 8 != 7 => {
            set.leases()[pick % set.leases().len()].id
        }
        Some(State::Concurrency(set)) => set.last_id() + 1,
        _ => 1,
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(128),
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_store_answers_as_the_model(setup in setup(), ops in prop::collection::vec(op(), 1..160)) {
        let mut run = Run {
            store: setup.store(),
            model: Model::new(T0, MAX_LOG),
            setup,
            evicted: 0,
        };
        for op in &ops {
            run.apply(op)?;
        }
        run.audit_all()?;
    }
}

/// `default` cases unless `PROPTEST_CASES` asks for another number (a
/// longer hunt: `PROPTEST_CASES=5000 cargo nextest run -p tollgate model`).
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Run {
    store: Store,
    model: Model,
    setup: Setup,
    /// `store.evicted()` when last settled.
    evicted: u64,
}

impl Run {
    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let now = self.model.now;
        match op {
            Op::Check {
                pairs,
                mode,
                spotted,
            } => self.group(pairs, GroupOp::Check(*mode), *spotted)?,
            Op::Refund { pairs, spotted } => self.group(pairs, GroupOp::Refund, *spotted)?,
            Op::Release { key, pick } => {
                let lease = self.model.lease_of(key, usize::from(*pick));
                let expected = self.model.release(key, lease);
                let got = self.store.release(key, lease, now);
                prop_assert_eq!(got, expected, "release of {:?} lease {}", key, lease);
                self.audit(key)?;
            }
            Op::Remove { key } => {
                let expected = self.model.remove(key);
                prop_assert_eq!(self.store.remove(key, now), expected, "remove {:?}", key);
                self.audit(key)?;
            }
            Op::Absorb { key, limit, sent } => {
                let usage = sent.usage(now);
                let (expected, write) = self.model.absorb(key, limit, usage);
                let got = self.store.absorb(key, limit, usage, now);
                let adds = write.as_ref().is_some_and(|&(_, adds)| adds);
                if !(self.setup.may_be_full() && adds && got == Err(AbsorbError::StoreFull)) {
                    prop_assert_eq!(got, expected, "absorb {:?} {:?}", key, usage);
                    if let Some((write, _)) = write {
                        self.model.write(write);
                    }
                }
                self.settle_evictions()?;
                self.audit(key)?;
            }
            Op::Advance(step) => self.model.advance(*step),
            Op::Sweep(stripes) => {
                self.store.sweep(*stripes, now);
                if *stripes >= self.store.stripe_count() {
                    // Every expired entry is gone: the entries left are
                    // the model's live states, no more (a key stored
                    // twice, or a state left behind by a move, would
                    // count), no fewer.
                    let live = self.model.live_count();
                    prop_assert_eq!(self.store.len(), live, "entries after a full sweep");
                    prop_assert_eq!(self.store.sweep(*stripes, now), 0, "a second sweep");
                }
            }
            Op::Fill { fill, limit } => {
                for key in fill.keys() {
                    let pair = Pair::inline(key, *limit, 1);
                    self.group(&[pair], GroupOp::Check(Mode::Charge), false)?;
                }
            }
            Op::Audit => self.audit_all()?,
        }
        Ok(())
    }

    /// Runs one check or refund on both, compares the answers and the
    /// states of its keys.
    fn group(&mut self, pairs: &[Pair], op: GroupOp, spotted: bool) -> Result<(), TestCaseError> {
        let now = self.model.now;
        let Expect {
            result,
            writes,
            may_add,
        } = self.model.group(pairs, op);
        let spots: Vec<Spot> = pairs.iter().map(|p| self.store.spot(&p.key)).collect();
        if spotted {
            for (pair, &spot) in pairs.iter().zip(&spots) {
                if let LimitRef::Inline(limit) = &pair.limit {
                    self.store.prefetch(&pair.key, spot, limit.algorithm);
                }
            }
        }
        let checks = resolved(pairs);
        let got = match (op, spotted) {
            (GroupOp::Check(mode), true) => self.store.check_at(&checks, &spots, now, mode),
            (GroupOp::Check(mode), false) => self.store.check(&checks, now, mode),
            (GroupOp::Refund, true) => self.store.refund_at(&checks, &spots, now),
            (GroupOp::Refund, false) => self.store.refund(&checks, now),
        };
        let full = CheckResult::Error(ErrorCode::StoreFull);
        if !(self.setup.may_be_full() && may_add && got == full) {
            prop_assert_eq!(got, result, "{:?} of {:?}", op, pairs);
            for write in writes {
                self.model.write(write);
            }
        }
        self.settle_evictions()?;
        for pair in pairs {
            self.audit(&pair.key)?;
        }
        Ok(())
    }

    /// Under a cap that evicts, the entries the store evicted leave the
    /// model: what the store keeps must still be the model's, and no live
    /// entry may be gone without an eviction counted. Elsewhere nothing is
    /// evicted.
    fn settle_evictions(&mut self) -> Result<(), TestCaseError> {
        let evicted = self.store.evicted();
        if evicted == self.evicted {
            return Ok(());
        }
        prop_assert!(
            matches!(self.setup, Setup::Evicting { .. }),
            "{} evicted by {:?}",
            evicted,
            self.setup
        );
        let now = self.model.now;
        let mut lost = 0;
        let keys: Vec<Bytes> = self.model.keys().cloned().collect();
        for key in keys {
            let held = self.store.entries(&key, now);
            match self.model.keep_only(&key, &held) {
                Ok(n) => lost += n,
                Err(e) => prop_assert!(false, "{:?}: {}", key, e),
            }
        }
        prop_assert!(
            lost as u64 <= evicted - self.evicted,
            "{} entries lost, {} evicted",
            lost,
            evicted - self.evicted
        );
        self.evicted = evicted;
        Ok(())
    }

    /// The store holds for `key` the live states the model does.
    fn audit(&self, key: &[u8]) -> Result<(), TestCaseError> {
        let now = self.model.now;
        let expected = self.model.entries(key);
        let key_shown = Bytes::copy_from_slice(key);
        prop_assert_eq!(
            &self.store.entries(key, now),
            &expected,
            "states of {:?}",
            key_shown
        );
        prop_assert_eq!(
            self.store.get(key, now),
            expected.first().cloned(),
            "get {:?}",
            key_shown
        );
        Ok(())
    }

    /// Every key the model has ever seen, and the stripes' prefetch hints
    /// (each names where its table is, after every growth and rebuild).
    fn audit_all(&self) -> Result<(), TestCaseError> {
        for key in self.model.keys() {
            self.audit(key)?;
        }
        for stripe in self.store.stripes.iter() {
            let guard = stripe.lock();
            guard.tables.assert_hints(&stripe.hints, &self.store.hasher);
        }
        Ok(())
    }
}

fn setup() -> impl Strategy<Value = Setup> {
    let stripes = prop::sample::select(vec![1usize, 4, 16]);
    prop_oneof![
        stripes
            .clone()
            .prop_map(|stripes| Setup::Uncapped { stripes }),
        stripes.clone().prop_map(|stripes| Setup::Roomy { stripes }),
        (stripes.clone(), 1usize..8).prop_map(|(stripes, k)| Setup::Refusing {
            stripes,
            per_stripe: k * 1024,
        }),
        (stripes, 1usize..8).prop_map(|(stripes, k)| Setup::Evicting {
            stripes,
            per_stripe: k * 1024,
        }),
    ]
}

/// A limit: mostly the shapes rules have, including counts the packed
/// windows cannot hold (with a large cost) and a window past `u32` ms;
/// sometimes any combination (invalid ones too).
fn limit() -> impl Strategy<Value = Limit> {
    use Algorithm::*;
    let shaped = prop::sample::select(vec![
        (TokenBucket, 10, 1000, 10),
        (TokenBucket, 1, 60_000, 3),
        (TokenBucket, 1 << 20, 1, 1 << 30),
        (LeakyBucket, 5, 1000, 5),
        (LeakyBucket, 1, 7, 1),
        (FixedWindow, 3, 1000, 0),
        (FixedWindow, 10, 7, 0),
        (FixedWindow, 1 << 40, 60_000, 0),
        (FixedWindow, 10, 60 * DAY / MS, 0),
        (SlidingWindow, 3, 1000, 0),
        (SlidingWindow, 5, 7, 0),
        (SlidingWindow, 1 << 40, 60_000, 0),
        (SlidingWindow, 10, 60 * DAY / MS, 0),
        (SlidingLog, 3, 1000, 0),
        (Concurrency, 2, 1000, 0),
    ]);
    let any = (
        prop::sample::select(Algorithm::ALL.to_vec()),
        prop::sample::select(vec![1u64, 2, 3, 10, 1 << 25, 1 << 40]),
        prop::sample::select(vec![1u64, 7, 1000, 60_000, DAY / MS, 60 * DAY / MS]),
        prop::sample::select(vec![0u64, 1, 4, 1 << 30]),
    );
    prop_oneof![4 => shaped, 1 => any].prop_map(|(algorithm, count, period_ms, burst)| Limit {
        algorithm,
        count,
        period_ms,
        burst,
    })
}

/// Costs: mostly small; large enough to pass what a packed window holds
/// (24 bits of a sliding window, 32 of a fixed one, over two charges);
/// rarely 0 (refused).
fn cost() -> impl Strategy<Value = u32> {
    prop_oneof![
        12 => Just(1u32),
        4 => 2u32..6,
        1 => Just(1 << 25),
        1 => Just(u32::MAX),
        1 => Just(0),
    ]
}

fn pair_of(keys: Vec<Bytes>) -> impl Strategy<Value = Pair> {
    (prop::sample::select(keys), limit(), cost())
        .prop_map(|(key, limit, cost)| Pair::inline(key, limit, cost))
}

/// One pair on any key, or a group of 2 to 4 on the keys of one hash tag
/// (where one key often comes twice), or rarely across tags (CrossSlot).
fn pairs() -> impl Strategy<Value = Vec<Pair>> {
    let tagged = prop::sample::select(vec![keys::TAGS[1], keys::TAGS[2]]);
    prop_oneof![
        3 => pair_of(keys::all()).prop_map(|p| vec![p]),
        2 => tagged.prop_flat_map(|tag| prop::collection::vec(pair_of(keys::of(tag)), 2..=4)),
        1 => prop::collection::vec(pair_of(keys::all()), 2..=3),
    ]
}

/// Mostly small steps (a window of 7 ms turns over, a bucket refills),
/// sometimes past every expiry of the limits above.
fn step() -> impl Strategy<Value = Nanos> {
    prop_oneof![
        2 => Just(1),
        4 => Just(MS),
        6 => (1..2_000u64).prop_map(|ms| ms * MS),
        2 => Just(S),
        1 => Just(61 * S),
        1 => Just(HOUR + 1),
        1 => Just(DAY),
        1 => Just(61 * DAY),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let key = || prop::sample::select(keys::all());
    let fill = (
        prop::sample::select(keys::TAGS.to_vec()),
        prop::sample::select(Width::ALL.to_vec()),
        0u16..200,
        1u16..64,
    )
        .prop_map(|(tag, width, start, n)| Fill {
            tag: Bytes::from_static(tag),
            width,
            start,
            n,
        });
    prop_oneof![
        10 => (pairs(), any::<bool>()).prop_map(|(pairs, spotted)| Op::Check {
            pairs,
            mode: Mode::Charge,
            spotted,
        }),
        2 => (pairs(), any::<bool>()).prop_map(|(pairs, spotted)| Op::Check {
            pairs,
            mode: Mode::Peek,
            spotted,
        }),
        3 => (pairs(), any::<bool>()).prop_map(|(pairs, spotted)| Op::Refund { pairs, spotted }),
        1 => (key(), any::<u8>()).prop_map(|(key, pick)| Op::Release { key, pick }),
        1 => key().prop_map(|key| Op::Remove { key }),
        1 => (
            key(),
            limit(),
            prop::sample::select(vec![0u64, 1, 3, 1 << 25, u64::from(u32::MAX) + 7]),
            prop::sample::select(vec![0u64, 1, 2, u64::from(u32::MAX) + 2]),
            prop::sample::select(vec![0i64, 1_000_000, 1_000_000_000, 3_600_000_000_000, -5]),
        )
            .prop_map(|(key, limit, charged, refunded, ago)| Op::Absorb {
                key,
                limit,
                sent: Sent {
                    charged,
                    refunded,
                    ago,
                },
            }),
        5 => step().prop_map(Op::Advance),
        1 => prop::sample::select(vec![1usize, 3, usize::MAX]).prop_map(Op::Sweep),
        2 => (fill, limit()).prop_map(|(fill, limit)| Op::Fill { fill, limit }),
        1 => Just(Op::Audit),
    ]
}
