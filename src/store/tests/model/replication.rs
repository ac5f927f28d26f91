//! Replication against the primary: the model test's operations (and
//! merges, slots forgotten, releases of held leases) run on a primary
//! [`Store`] that captures its changes; at random points some or
//! all of its stripes are drained and applied to a standby `Store`, as
//! the replication sender and the standby do (`node/replication`), minus
//! the wire. Capture starts, stops and starts again (a full sync) at
//! random points, the standby holding stale states meanwhile.
//!
//! The property: after every drain of all stripes, the standby holds
//! exactly the primary's live states (every key, every table, compared at
//! the same `now`), and a check answered by the standby (a failover)
//! decides as the primary would. A change lost (a write not recorded, a
//! removal not sent, an overflow or an eviction without a resync) or
//! applied out of order shows as a state that differs. The primary's capped setups
//! (`setup`) and change logs of 1, 2 or 5 keys per stripe (or 1024, which
//! rarely overflows) make evictions and overflows send whole stripes; the standby's stripe count may differ.
//!
//! Not covered: `update` (the RESP counters), concurrent writers and
//! drains (the loom model's part), and the wire encoding of
//! `node/replication/records.rs`.
//!
//! Only live states are compared: an expired entry is absent wherever it
//! is held, and the primary drops expired ones (on access, by the sweeper)
//! without telling the standby, which is allowed to keep them. The
//! primary is the reference here; the parent module checks it against
//! its model. The conversions of drained states to standby writes are
//! written out below as `node/replication/records.rs` makes them (the
//! store may not depend on the node).

use super::*;
use crate::algorithm::State;
use crate::store::{Drained, KeyWrite, LogBuffer, TableWrite};

/// A step of a run: an operation on the primary, or replication.
#[derive(Debug, Clone)]
enum Step {
    Primary(Op),
    /// Drains every stripe whose bit is set (all of them when the mask
    /// covers the stripe count) and applies what came to the standby.
    Drain(u64),
    /// `start_capture`: (re)starts a full sync, as a standby connecting.
    StartCapture,
    /// `stop_capture`: the standby is gone; it keeps what it had.
    StopCapture,
    /// Drops the slots `s % 4 == rem` (they moved to another shard).
    Forget(u16),
    /// Merges a token bucket handed over by another node, `ahead` ns past
    /// now (a HANDOFF).
    Merge {
        key: Bytes,
        ahead: Nanos,
    },
    /// After a full drain, both answer these checks as peeks.
    Failover(Vec<Pair>),
    /// Releases a lease some key holds on the primary (the `pick`th key
    /// holding any): releases of random keys rarely find one.
    ReleaseHeld(u8),
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(128),
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_standby_holds_what_the_primary_holds(
        setup in setup(),
        change_cap in prop::sample::select(vec![1usize, 2, 5, 1024]),
        standby_stripes in prop::sample::select(vec![1usize, 4, 16, 64]),
        steps in prop::collection::vec(step_of_run(), 1..160),
    ) {
        let primary = Store::new(StoreConfig {
            change_buffer_cap: change_cap,
            ..setup.config()
        });
        let standby = Store::new(StoreConfig {
            stripes: standby_stripes,
            max_log_entries: MAX_LOG,
            ..StoreConfig::default()
        });
        let mut run = Replicated {
            primary,
            standby,
            now: T0,
            capturing: false,
            setup,
            spare: LogBuffer::default(),
        };
        for step in &steps {
            run.step(step)?;
        }
        // The last failover: capture on, everything shipped, and every key
        // checked on both under a limit of each algorithm.
        if !run.capturing {
            run.step(&Step::StartCapture)?;
        }
        run.step(&Step::Drain(u64::MAX))?;
        for key in keys::all() {
            for limit in last_checks() {
                run.failover(&[Pair::inline(key.clone(), limit, 1)])?;
            }
        }
    }
}

/// One limit of each algorithm, among the shapes `limit` draws.
fn last_checks() -> [Limit; 6] {
    use Algorithm::*;
    [
        (TokenBucket, 10, 1000, 10),
        (LeakyBucket, 5, 1000, 5),
        (FixedWindow, 3, 1000, 0),
        (SlidingWindow, 3, 1000, 0),
        (SlidingLog, 3, 1000, 0),
        (Concurrency, 2, 1000, 0),
    ]
    .map(|(algorithm, count, period_ms, burst)| Limit {
        algorithm,
        count,
        period_ms,
        burst,
    })
}

/// Mostly the primary's operations; drains about one step in five.
fn step_of_run() -> impl Strategy<Value = Step> {
    prop_oneof![
        20 => op().prop_map(Step::Primary),
        3 => Just(Step::Drain(u64::MAX)),
        2 => any::<u64>().prop_map(Step::Drain),
        1 => Just(Step::StartCapture),
        1 => Just(Step::StopCapture),
        1 => (0u16..4).prop_map(Step::Forget),
        1 => (
            prop::sample::select(keys::all()),
            prop::sample::select(vec![1, MS, S, 61 * S]),
        )
            .prop_map(|(key, ahead)| Step::Merge { key, ahead }),
        2 => pairs().prop_map(Step::Failover),
        1 => any::<u8>().prop_map(Step::ReleaseHeld),
    ]
}

struct Replicated {
    primary: Store,
    standby: Store,
    now: Nanos,
    /// Whether the primary captures (between `StartCapture` and
    /// `StopCapture`): only then must a full drain leave the two equal.
    capturing: bool,
    setup: Setup,
    /// The sender's recycled log list, handed from stripe to stripe.
    spare: LogBuffer,
}

impl Replicated {
    fn step(&mut self, step: &Step) -> Result<(), TestCaseError> {
        let now = self.now;
        match step {
            Step::Primary(op) => self.on_primary(op)?,
            Step::Drain(mask) => {
                let stripes = self.primary.stripe_count();
                let all = stripes >= 64 || mask & ((1 << stripes) - 1) == (1 << stripes) - 1;
                for index in (0..stripes).filter(|&i| all || mask & (1 << i) != 0) {
                    self.ship(index);
                }
                if all && self.capturing {
                    self.compare()?;
                }
            }
            Step::StartCapture => {
                self.primary.start_capture();
                self.capturing = true;
            }
            Step::StopCapture => {
                self.primary.stop_capture();
                self.capturing = false;
            }
            Step::Forget(rem) => {
                self.primary.forget_slots(|s| s.get() % 4 == *rem);
            }
            Step::Merge { key, ahead } => {
                let tat = now + ahead;
                let handed = KeyWrite {
                    key: key.clone(),
                    bucket: TableWrite::Put(Entry {
                        state: State::TokenBucket { tat },
                        expires_at: tat,
                    }),
                    other: TableWrite::Keep,
                };
                // A refusing cap may refuse a new key: nothing changes
                // then, and the standby must hold the same.
                let _ = self.primary.merge(&handed, now);
            }
            Step::ReleaseHeld(pick) => {
                let leased: Vec<Bytes> = keys::all()
                    .into_iter()
                    .filter(|key| {
                        let entries = self.primary.entries(key, now);
                        entries
                            .iter()
                            .any(|e| matches!(e.state, State::Concurrency(_)))
                    })
                    .collect();
                if !leased.is_empty() {
                    let key = &leased[usize::from(*pick) % leased.len()];
                    // The pick's high bits choose the lease.
                    let release = Op::Release {
                        key: key.clone(),
                        pick: pick >> 4,
                    };
                    self.on_primary(&release)?;
                }
            }
            Step::Failover(pairs) => {
                if self.capturing {
                    self.step(&Step::Drain(u64::MAX))?;
                    self.failover(pairs)?;
                }
            }
        }
        Ok(())
    }

    /// One of the model test's operations, on the primary only: its
    /// answers are the parent test's business.
    fn on_primary(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let now = self.now;
        let store = &self.primary;
        match op {
            Op::Check { pairs, mode, .. } => {
                store.check(&resolved(pairs), now, *mode);
            }
            Op::Refund { pairs, .. } => {
                store.refund(&resolved(pairs), now);
            }
            Op::Release { key, pick } => {
                let lease = lease_of(store, key, now, usize::from(*pick));
                store.release(key, lease, now);
            }
            Op::Remove { key } => {
                store.remove(key, now);
            }
            Op::Absorb { key, limit, sent } => {
                let _ = store.absorb(key, limit, sent.usage(now), now);
            }
            Op::Advance(step) => self.now += step,
            Op::Sweep(stripes) => {
                store.sweep(*stripes, now);
            }
            Op::Fill { fill, limit } => {
                for key in fill.keys() {
                    store.check(&[ResolvedPair::new(&key, *limit, 1)], now, Mode::Charge);
                }
            }
            Op::Audit => {
                if self.capturing {
                    self.step(&Step::Drain(u64::MAX))?;
                }
            }
        }
        Ok(())
    }

    /// Drains one stripe of the primary into the standby, as the sender
    /// frames it (onto the list the last drain left) and the standby
    /// applies it.
    fn ship(&mut self, index: usize) {
        match self
            .primary
            .drain_stripe_into(index, self.now, &mut self.spare)
        {
            Drained::Nothing => {}
            Drained::Changes(changes) => {
                // As the standby applies a frame: its keys fetched ahead.
                let writes: Vec<KeyWrite> = changes.keys().map(KeyWrite::from).collect();
                self.standby.apply_all(&writes);
                changes.recycle(&mut self.spare);
            }
            Drained::Whole(entries) => {
                let writes: Vec<KeyWrite> = entries
                    .iter()
                    .map(|(key, entry)| snapshot_write(key.as_bytes(), entry))
                    .collect();
                // Stripe counts are powers of two up to 16384.
                let stripes = self.primary.stripe_count() as u16;
                let skipped = self.standby.replace_slots(stripes, index as u16, &writes);
                assert_eq!(
                    skipped, 0,
                    "a whole stripe {index} with keys of other slots"
                );
            }
        }
    }

    /// Both hold the same live states: each key's, and in all (a key the
    /// standby kept after the primary forgot it shows in the totals).
    fn compare(&self) -> Result<(), TestCaseError> {
        let primary = live_states(&self.primary, self.now);
        let standby = live_states(&self.standby, self.now);
        if primary != standby {
            let only = |a: &[(Vec<u8>, Entry)], b: &[(Vec<u8>, Entry)]| -> Vec<_> {
                a.iter().filter(|e| !b.contains(e)).cloned().collect()
            };
            prop_assert!(
                false,
                "the standby differs at {}: only on the primary {:?}, only on the standby {:?}",
                self.now - T0,
                only(&primary, &standby),
                only(&standby, &primary)
            );
        }
        for key in keys::all() {
            prop_assert_eq!(
                self.standby.entries(&key, self.now),
                self.primary.entries(&key, self.now),
                "states of {:?}",
                key
            );
        }
        Ok(())
    }

    /// The standby, promoted, answers `pairs` as the primary does (as
    /// peeks: the primary's cap may refuse a new key the standby, with no
    /// cap, takes; then there is nothing to compare).
    fn failover(&self, pairs: &[Pair]) -> Result<(), TestCaseError> {
        let checks = resolved(pairs);
        let primary = self.primary.check(&checks, self.now, Mode::Peek);
        let standby = self.standby.check(&checks, self.now, Mode::Peek);
        let full = CheckResult::Error(ErrorCode::StoreFull);
        if !(self.setup.may_be_full() && primary == full) {
            prop_assert_eq!(standby, primary, "the standby's answer to {:?}", pairs);
        }
        Ok(())
    }
}

/// Every live state of `store`, sorted: key and entry, one per table.
fn live_states(store: &Store, now: Nanos) -> Vec<(Vec<u8>, Entry)> {
    let mut all: Vec<(Vec<u8>, Entry)> = (0..store.stripe_count())
        .flat_map(|i| store.live_states(i, now, |_| true))
        .map(|(key, entry)| (key.as_bytes().to_vec(), entry))
        .collect();
    // A key has one state per table: its key and table order it.
    let other = |e: &Entry| !matches!(e.state, State::TokenBucket { .. });
    all.sort_by(|a, b| (&a.0, other(&a.1)).cmp(&(&b.0, other(&b.1))));
    all
}

/// A lease `key` holds on the primary ([`pick_lease`]).
fn lease_of(store: &Store, key: &[u8], now: Nanos, pick: usize) -> u64 {
    let leases = store
        .entries(key, now)
        .into_iter()
        .map(|e| e.state)
        .find(|s| matches!(s, State::Concurrency(_)));
    pick_lease(leases.as_ref(), pick)
}

/// One entry of a whole stripe: its own table, the other left alone.
fn snapshot_write(key: &[u8], entry: &Entry) -> KeyWrite {
    let put = TableWrite::Put(entry.clone());
    let (bucket, other) = match entry.state {
        State::TokenBucket { .. } => (put, TableWrite::Keep),
        _ => (TableWrite::Keep, put),
    };
    KeyWrite {
        key: Bytes::copy_from_slice(key),
        bucket,
        other,
    }
}
