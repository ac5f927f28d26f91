//! Checks under global rules (README "Global limits"), on a node in a
//! region: what this region's clients use is recorded for the exchange,
//! and a cut-off region admits at most its ceiling.
//!
//! ```text
//!  frame's prefetch: each global pair's ceiling key built and located
//!    once (`Ceilings`), for its check to find
//!  CHECK (charge), pairs naming global rules:
//!    each pair whose rule is capped (the exchange stalled with a majority
//!    of the rule's peers, `Regions::capped`): PEEK its ceiling key -> one
//!    denies: denied
//!    the check as usual -> allowed: keep the units charged of each global
//!      pair for the peers its rule lists; charge its ceiling key
//!  REFUND: each global pair's ceiling key first, then the keys as one
//!    group, each global key giving back at most what its ceiling key did
//!    (never usage the peers charged); what they gave back is kept
//!  frame's end (`Evaluation` dropped): what was kept is recorded, in
//!    order, under one lock of the shared journal (`Regions::record_all`)
//! ```
//!
//! The ceiling key (the key and a suffix no protocol key is likely to end
//! with) counts this region's own admissions under the ceiling limit (the
//! region's share of the rule), always, so that when the exchange stalls
//! the region knows how much of its share it has used already. It holds
//! only local usage: remote usage is absorbed into the key itself.
//! Inline limits and PEEK never touch any of it.

use super::{Decided, Evaluation, Resolved, Verb};
use crate::engine::{Engine, Privilege};
use crate::node::regions::{Recorded, Regions};
use crate::rules::Rule;
use crate::slot::hash_tag;
use crate::store::{Mode, ResolvedPair, Returned, Spot};
use smallvec::SmallVec;
use tollgate_protocol::{CheckResult, Decision, LimitRef, Pair, RuleName};

/// Appended to a key to name its ceiling key: NUL, then 0xFF (a byte no
/// UTF-8 text holds, so no text key ends this way), then two letters:
/// short, so that the ceiling key of a key of up to 18 bytes is held
/// inline in its table entry like the key's own (`MAX_INLINE_KEY`).
/// The suffix was 15 bytes before, which sent the ceiling key of any key
/// over 7 bytes to the heap: its lookup compared through a pointer, a
/// third cache miss per global check (7% of the server's CPU with 1M
/// 17-byte keys), and a new one cost a `malloc`.
const CEILING_SUFFIX: &[u8] = b"\x00\xffrc";
const _: () = assert!(18 + CEILING_SUFFIX.len() <= crate::store::MAX_INLINE_KEY);

/// The pairs of a check naming a global rule: index, rule name, rule.
type GlobalPairs<'p, 'r> = SmallVec<[(usize, &'p RuleName, &'r Rule); 2]>;

/// The ceiling key of `key`, on the stack for keys of common length: the
/// store copies it only when it is new.
fn ceiling_key(key: &[u8]) -> SmallVec<[u8; 128]> {
    let mut k = SmallVec::with_capacity(key.len() + CEILING_SUFFIX.len());
    k.extend_from_slice(key);
    k.extend_from_slice(CEILING_SUFFIX);
    k
}

/// The ceiling keys a frame's prefetch built, and their spots, for the
/// frame's checks to use again: built and hashed once per check rather
/// than twice (the second build and hash were 3.6% of the server's CPU
/// under a global rule, in perf).
#[derive(Default)]
pub(super) struct Ceilings {
    /// The keys, one after another: inline, those of 16 checks of keys up
    /// to 28 bytes (no allocation per frame in the common case).
    keys: SmallVec<[u8; 512]>,
    /// Per pair whose ceiling key was built: the pair (its address in the
    /// frame, which no other pair of it shares), where its key ends in
    /// `keys`, and its spot. In the frame's order.
    built: SmallVec<[(*const Pair, usize, Spot); 16]>,
    /// Where the next check's pairs most likely are in `built` (checks
    /// come in the prefetch's order, though some are skipped: answered from
    /// the retry memory, say).
    next: usize,
}

impl Ceilings {
    /// Builds the ceiling key of `pair`, whose key is at `key_spot`, and
    /// finds its spot.
    fn push(&mut self, pair: &Pair, key_spot: Spot, store: &crate::store::Store) -> (usize, Spot) {
        let start = self.keys.len();
        self.keys.extend_from_slice(&pair.key);
        self.keys.extend_from_slice(CEILING_SUFFIX);
        let key = &self.keys[start..];
        // A key with a hash tag keeps it with the suffix after it: the
        // same slot, not computed again (1.6% of the server's CPU under a
        // global rule, in perf).
        let spot = if hash_tag(&pair.key).len() < pair.key.len() {
            store.spot_beside(key, key_spot)
        } else {
            store.spot(key)
        };
        self.built.push((pair, self.keys.len(), spot));
        (start, spot)
    }

    /// The ceiling key of `pair` and its spot, when the prefetch built it.
    /// Searched from the pair found last (a cut-off region asks for the
    /// same pair twice, PEEK then charge), then onwards: one or two
    /// compares per ask, never a walk of the frame's list per pair.
    fn find(&mut self, pair: &Pair) -> Option<(&[u8], Spot)> {
        let n = self.built.len();
        let from = self.next.saturating_sub(1);
        let at = (0..n)
            .map(|i| (from + i) % n)
            .find(|&i| std::ptr::eq(self.built[i].0, pair))?;
        self.next = at + 1;
        let start = at.checked_sub(1).map_or(0, |i| self.built[i].1);
        let (_, end, spot) = self.built[at];
        Some((&self.keys[start..end], spot))
    }
}

impl<'f> Evaluation<'_, 'f> {
    /// The pairs naming a global rule shared with this region, from the
    /// rules `pairs` resolved to (`rules[i]`: pair i's): no name looked up
    /// again (a lookup per pair was 1.6% of the server's CPU under a global
    /// rule). A global rule that does not list this region is regional
    /// here: no usage kept, no ceiling.
    fn global_pairs<'p, 'r>(
        &self,
        regions: &Regions,
        pairs: &'p [Pair],
        rules: &[Option<&'r Rule>],
    ) -> GlobalPairs<'p, 'r> {
        pairs
            .iter()
            .zip(rules)
            .enumerate()
            .filter_map(|(i, (p, rule))| match (&p.limit, rule) {
                (LimitRef::Rule(name), Some(rule))
                    if !rule.global().is_empty() && self.rules.in_region(rule, regions).shared =>
                {
                    Some((i, name, *rule))
                }
                _ => None,
            })
            .collect()
    }

    /// Starts fetching the ceiling key of `pair` when its `rule` is global
    /// on a node in a region (see `Evaluation::prefetch`): the check charges
    /// it after the key itself, and unfetched it was the costlier of the two
    /// lookups (17.5% of the server's CPU against 9% for the key's own, at
    /// one check per frame, in perf). And where its usage will be recorded
    /// (`Regions::prefetch_record`).
    pub(super) fn prefetch_ceiling(&self, pair: &Pair, key_spot: Spot, rule: &Rule) {
        if rule.global().is_empty() || self.verb == Verb::Check(Mode::Peek) {
            return;
        }
        let Some(regions) = self.engine.node.regions() else {
            return;
        };
        if !self.rules.in_region(rule, regions).shared {
            return;
        }
        let store = &self.engine.store;
        let mut ceilings = self.ceilings.borrow_mut();
        let (start, spot) = ceilings.push(pair, key_spot, store);
        store.prefetch(&ceilings.keys[start..], spot, rule.limit.algorithm);
        if let LimitRef::Rule(name) = &pair.limit {
            regions.prefetch_record(&pair.key, name);
        }
    }

    /// The units a pair takes (cost 0: the rule's default).
    fn units(pair: &Pair, rule: &Rule) -> u32 {
        if pair.cost == 0 {
            rule.default_cost()
        } else {
            pair.cost
        }
    }

    /// The check of `units` of the pair's ceiling key in `mode` (None: the
    /// store refused it, e.g. full; the ceiling then does not deny).
    fn ceiling(
        &self,
        regions: &Regions,
        (pair, rule): (&Pair, &Rule),
        units: u32,
        mode: Mode,
    ) -> Option<Decision> {
        let limit = self.rules.in_region(rule, regions).ceiling;
        let result = self.with_ceiling_key(pair, |key, spot| {
            let ceiling = [ResolvedPair::new(key, limit, units)];
            self.engine
                .store
                .check_at(&ceiling, &[spot], self.now, mode)
        });
        match result {
            CheckResult::Decision(d) => Some(d),
            CheckResult::Error(_) => None,
        }
    }

    /// Refunds `units` of the pair's ceiling key; the units it gave back.
    fn ceiling_refund(&self, regions: &Regions, pair: &Pair, rule: &Rule, units: u32) -> u64 {
        let limit = self.rules.in_region(rule, regions).ceiling;
        let mut returned = Returned::new();
        let result = self.with_ceiling_key(pair, |key, spot| {
            let ceiling = [ResolvedPair::new(key, limit, units)];
            (self.engine.store).refund_returning(&ceiling, &[spot], self.now, &mut returned)
        });
        match result {
            CheckResult::Decision(_) => returned.first().copied().unwrap_or(0),
            CheckResult::Error(_) => 0,
        }
    }

    /// Calls `f` with the pair's ceiling key and its spot: those the
    /// frame's prefetch built, or, for a check never prefetched (a front
    /// end's), built here.
    fn with_ceiling_key<R>(&self, pair: &Pair, f: impl FnOnce(&[u8], Spot) -> R) -> R {
        if let Some((key, spot)) = self.ceilings.borrow_mut().find(pair) {
            return f(key, spot);
        }
        let key = ceiling_key(&pair.key);
        f(&key, self.engine.store.spot(&key))
    }

    /// Keeps `pair`'s usage (units charged, refunded) under the global
    /// `rule` named `name`, for the frame's end (the `Evaluation` dropped).
    fn record(
        &self,
        regions: &Regions,
        pair: &'f Pair,
        name: &'f RuleName,
        rule: &Rule,
        (charged, refunded): (u64, u64),
    ) {
        self.usage.borrow_mut().push(Recorded {
            key: &pair.key,
            rule: name,
            peers: self.rules.in_region(rule, regions).peers,
            charged,
            refunded,
        });
    }

    /// A charging CHECK on a node in a region.
    pub(super) fn charge_regional(
        &self,
        regions: &Regions,
        pairs: &'f [Pair],
        spots: &[Spot],
    ) -> Decided<'_> {
        // Resolved once, here, for the global pairs and the check alike;
        // a name no rule has is refused before anything else (even a
        // ceiling's denial), as on any other node.
        let mut resolved = Resolved::default();
        if let Err(code) = self.resolve(pairs, &mut resolved) {
            return Decided::Error(code);
        }
        let globals = self.global_pairs(regions, pairs, &resolved.rules);
        if globals.is_empty() {
            return self.evaluate_resolved(&resolved, spots, Mode::Charge);
        }
        let capped = |rule: &Rule| regions.capped(self.rules.in_region(rule, regions).peers);
        if let ([pair], [(_, name, rule)]) = (pairs, globals.as_slice()) {
            if !rule.shadow() && !capped(rule) {
                let check = (&resolved.checks[0], spots[0]);
                if let Some(decided) = self.charge_with_ceiling(regions, (pair, name, rule), check)
                {
                    return decided;
                }
            }
        }
        for &(i, _, rule) in globals.iter().filter(|(_, _, rule)| capped(rule)) {
            let denied = self
                .ceiling(
                    regions,
                    (&pairs[i], rule),
                    Self::units(&pairs[i], rule),
                    Mode::Peek,
                )
                .filter(|d| !d.allowed);
            if let Some(mut d) = denied {
                regions.ceiling_denied();
                d.pair = i as u8;
                return Decided::decision(d, Some(rule));
            }
        }
        let decided = self.evaluate_resolved(&resolved, spots, Mode::Charge);
        if let Decided::Decision {
            decision,
            shadow_denied,
            ..
        } = &decided
        {
            if decision.allowed {
                for &(i, name, rule) in &globals {
                    // A shadow pair that would have denied was not charged.
                    if *shadow_denied && rule.shadow() {
                        continue;
                    }
                    let pair = &pairs[i];
                    let units = Self::units(pair, rule);
                    self.record(regions, pair, name, rule, (u64::from(units), 0));
                    self.ceiling(regions, (pair, rule), units, Mode::Charge);
                }
            }
        }
        decided
    }

    /// The common global check (one pair, not shadow, the region in touch
    /// with its peers): the key and its ceiling key charged under one lock
    /// (`Store::charge_with_companion`), the usage kept when allowed. None,
    /// nothing done, where the store cannot (the caller checks them one
    /// after the other).
    fn charge_with_ceiling<'s>(
        &'s self,
        regions: &Regions,
        (pair, name, rule): (&'f Pair, &'f RuleName, &'s Rule),
        check: (&ResolvedPair<'_>, Spot),
    ) -> Option<Decided<'s>> {
        let limit = self.rules.in_region(rule, regions).ceiling;
        let units = Self::units(pair, rule);
        let result = self.with_ceiling_key(pair, |key, spot| {
            let ceiling = ResolvedPair::new(key, limit, units);
            (self.engine.store).charge_with_companion(check, (&ceiling, spot), self.now)
        })?;
        Some(match result {
            CheckResult::Decision(decision) => {
                if decision.allowed {
                    self.record(regions, pair, name, rule, (u64::from(units), 0));
                }
                Decided::decision(decision, Some(rule))
            }
            CheckResult::Error(code) => Decided::Error(code),
        })
    }

    /// A REFUND on a node in a region: each global pair's ceiling key,
    /// which counts this region's own admissions alone, is refunded first,
    /// and the key itself then gives back at most what the ceiling key did
    /// (`Store::refund_within`); that is what is reported to the peers.
    /// The key also holds the usage absorbed from the peers: refunding the
    /// cost asked for would let a client here give back usage the peers
    /// charged (of an untouched key, or one only they used), admitting it
    /// again here and, reported, wiping it out there.
    pub(super) fn refund_regional(
        &self,
        regions: &Regions,
        pairs: &'f [Pair],
        spots: &[Spot],
    ) -> Decided<'_> {
        let mut resolved = Resolved::default();
        if let Err(code) = self.resolve(pairs, &mut resolved) {
            return Decided::Error(code);
        }
        let globals = self.global_pairs(regions, pairs, &resolved.rules);
        if globals.is_empty() {
            return self.refund_resolved(&resolved.checks, spots, None);
        }
        // Asked before any ceiling key gives anything back: a refusal after
        // would leave the ceilings short of what they gave, and a charge to
        // take it back could be denied once other checks took the room.
        if let Some(code) = (self.engine.store).refund_refusal(&resolved.checks, spots) {
            return Decided::Error(code);
        }
        // Pairs after the last global one keep their cost (no cap).
        let mut caps: SmallVec<[u64; 4]> = SmallVec::new();
        for &(i, _, rule) in &globals {
            caps.resize(i + 1, u64::MAX);
            caps[i] = self.ceiling_refund(regions, &pairs[i], rule, resolved.checks[i].cost);
        }
        let mut returned = Returned::new();
        let result = (self.engine.store).refund_within(
            &resolved.checks,
            spots,
            self.now,
            &caps,
            &mut returned,
        );
        match result {
            CheckResult::Decision(d) => {
                for &(i, name, rule) in &globals {
                    let units = returned.get(i).copied().unwrap_or(0);
                    if units > 0 {
                        self.record(regions, &pairs[i], name, rule, (0, units));
                    }
                }
                Decided::Refunded(d)
            }
            CheckResult::Error(code) => {
                // Not expected: the group was checked above, and a refund
                // writes no new key (so no full store). Should it come,
                // the ceiling keys take back what they gave, as far as their
                // room still allows.
                tracing::error!(%code, "a global REFUND refused after its ceilings gave back");
                for &(i, _, rule) in &globals {
                    if let Ok(units @ 1..) = u32::try_from(caps[i]) {
                        self.ceiling(regions, (&pairs[i], rule), units, Mode::Charge);
                    }
                }
                Decided::Error(code)
            }
        }
    }
}

/// Why a USAGE is not applied: a refusal of the node (a standby) or an
/// error with its code.
pub(crate) enum UsageError {
    Node(crate::node::Refusal),
    Error(tollgate_protocol::ErrorCode, String),
}

impl Engine {
    /// USAGE from another region (PROTOCOL.md §16): only on a node connection
    /// of a primary in a region. Each entry is charged under this node's own
    /// rule of that name when the rule is global and lists the sender.
    ///
    /// `bound` is the region the connection speaks for: the region whose own
    /// secret (`--region-peer-secret`) its HELLO proved, or else the first
    /// region whose USAGE it had applied; a USAGE naming another is refused
    /// (AuthFailed), so one link cannot pass for several regions. A region
    /// with a secret of its own is heard only over a connection bound to it
    /// by that secret: the shared secrets (cluster, `--region-secret`) do not
    /// name a region, so whoever holds them could claim any. `own_secret`:
    /// whether the report's region has such a secret here.
    pub fn receive_usage(
        &self,
        privilege: Privilege,
        own_secret: bool,
        bound: &mut Option<String>,
        report: &tollgate_protocol::UsageReport,
    ) -> Result<tollgate_protocol::UsageAck, UsageError> {
        use tollgate_protocol::ErrorCode;
        if privilege == Privilege::Client {
            return Err(UsageError::Error(
            ErrorCode::AuthFailed,
            "USAGE needs a node or region connection (HELLO proving the cluster or region secret)"
                .into(),
        ));
        }
        self.node
            .admit(crate::node::Access::Write)
            .map_err(UsageError::Node)?;
        let Some(regions) = self.node.regions() else {
            return Err(UsageError::Error(
                ErrorCode::Malformed,
                "this node is in no region: it takes no USAGE".into(),
            ));
        };
        let rules = self.rules.current();
        let own = regions.name().to_owned();
        let resolve = |name: &RuleName, sender: &str| {
            rules
                .get(name.as_bytes())
                .filter(|r| r.global().iter().any(|g| g == sender) && r.global().contains(&own))
                .map(|r| r.limit)
        };
        if bound.is_none() && own_secret {
            return Err(UsageError::Error(
            ErrorCode::AuthFailed,
            format!(
                "region {:?} has a secret of its own here (--region-peer-secret): its usage comes only over a connection that proved it",
                report.region
            ),
        ));
        }
        if let Some(region) = bound.as_deref().filter(|r| *r != report.region) {
            return Err(UsageError::Error(
                ErrorCode::AuthFailed,
                format!(
                    "this connection speaks for region {region:?}, not {:?}",
                    report.region
                ),
            ));
        }
        let ack = regions
            .receive(report, &resolve, self.clock.now())
            .map_err(|e| UsageError::Error(ErrorCode::Malformed, e.to_string()))?;
        bound.get_or_insert_with(|| report.region.clone());
        Ok(ack)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Store, StoreConfig};
    use bytes::Bytes;

    fn pair(key: &'static str) -> Pair {
        Pair::rule(
            Bytes::from_static(key.as_bytes()),
            "r".try_into().unwrap(),
            1,
        )
    }

    /// Each pair finds its own ceiling key and spot, in any order and with
    /// some never asked for (checks answered without being evaluated), and
    /// a pair the prefetch never saw finds none, even one with the same key.
    #[test]
    fn a_pair_finds_the_ceiling_key_the_prefetch_built_for_it() {
        let store = Store::new(StoreConfig::default());
        let long = "rl:{tenant}:a-key-over-the-inline-length-of-one-ceiling";
        let pairs = [pair("a"), pair(long), pair("rl:{t}:c"), pair("d")];
        let mut ceilings = Ceilings::default();
        for p in &pairs {
            ceilings.push(p, store.spot(&p.key), &store);
        }
        let expect = |p: &Pair| {
            let key = ceiling_key(&p.key).to_vec();
            let spot = store.spot(&key);
            (key, spot)
        };
        for i in [2, 0, 1, 1, 3, 0] {
            let (key, spot) = ceilings.find(&pairs[i]).expect("built by the prefetch");
            assert_eq!((key.to_vec(), spot), expect(&pairs[i]), "pair {i}");
        }
        assert!(ceilings.find(&pair("a")).is_none());
    }
}
