//! Refunds: a check's shape, giving units back, run as a group
//! (group.rs) that never denies. A region's global keys give back at most
//! what their ceiling keys did (`refund_within`), and what a refund would
//! be refused for can be asked before anything is given back
//! (`refund_refusal`).

use super::group::{Op, ResolvedPair, Returned};
use super::{Spot, Store};
use crate::clock::Nanos;
use tollgate_protocol::{CheckResult, ErrorCode};

impl Store {
    /// Gives each pair's `cost` back to its key, atomically for the group,
    /// and answers with the decision after the refund (always allowed).
    /// Never beyond a full bucket or empty windows; a key without state is
    /// left alone (answered as full). A concurrency pair is refused with
    /// InvalidLimit: leases are given back with [`Store::release`].
    pub fn refund(&self, pairs: &[ResolvedPair<'_>], now: Nanos) -> CheckResult {
        let spots = self.spots(pairs);
        self.run_group(pairs, &spots, now, Op::Refund, None, &[])
    }

    /// [`Store::refund`] of pairs whose spots the caller already has (as
    /// for [`Store::check_at`]).
    pub fn refund_at(&self, pairs: &[ResolvedPair<'_>], spots: &[Spot], now: Nanos) -> CheckResult {
        self.run_group(pairs, spots, now, Op::Refund, None, &[])
    }

    /// [`Store::refund_at`] that also fills `returned` with the units each
    /// pair actually gave back (what a region reports to its peers: a
    /// refund beyond what a key holds returns only what it holds).
    pub fn refund_returning(
        &self,
        pairs: &[ResolvedPair<'_>],
        spots: &[Spot],
        now: Nanos,
        returned: &mut Returned,
    ) -> CheckResult {
        returned.clear();
        self.run_group(pairs, spots, now, Op::Refund, Some(returned), &[])
    }

    /// [`Store::refund_returning`] where pair `i` gives back at most
    /// `caps[i]` units (0: none; a pair past the end of `caps`: its cost):
    /// a global rule's key gives back no more than its ceiling key did,
    /// which counts this region's own admissions (`engine/check/global.rs`).
    pub fn refund_within(
        &self,
        pairs: &[ResolvedPair<'_>],
        spots: &[Spot],
        now: Nanos,
        caps: &[u64],
        returned: &mut Returned,
    ) -> CheckResult {
        returned.clear();
        self.run_group(pairs, spots, now, Op::Refund, Some(returned), caps)
    }

    /// Why a refund of `pairs` would be refused (CrossSlot, InvalidLimit,
    /// ...), found without a lock and without giving anything back: a
    /// caller that refunds other keys first (a global rule's ceiling keys)
    /// asks this before, so that no refusal comes after.
    pub fn refund_refusal(&self, pairs: &[ResolvedPair<'_>], spots: &[Spot]) -> Option<ErrorCode> {
        self.refusal(pairs, spots, Op::Refund).err()
    }
}
