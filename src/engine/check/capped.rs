//! The global rules as this region holds them now, for the operator
//! (`GET /v1/regions`'s `rules`, `tollgate_region_rule_capped`): the
//! regions each lists, whether it is shared here, its ceiling, and whether
//! that ceiling is in force.
//!
//! Judged as a check judges them ([`InRegion::of`], `Regions::capped`), so
//! what the operator reads is what the next check sees. The cut-off flag
//! and its metric speak of rules listing every region; a rule listing
//! fewer is capped by its own peers, which only this view names.

use super::frame_rules::InRegion;
use crate::engine::Engine;
use serde::Serialize;

/// One global rule in this region.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct GlobalRuleState {
    pub rule: String,
    /// The regions it lists, as written.
    pub regions: Vec<String>,
    /// Whether it lists this region and a peer it exchanges with; a rule
    /// that does not is regional here (never capped, no ceiling).
    pub shared: bool,
    /// Whether its ceiling is in force now: the exchange is stalled with a
    /// majority (`--region-cut-off any`: any) of the peers it lists.
    pub capped: bool,
    /// This region's ceiling: the count (and burst, 0 where the algorithm
    /// has none) its own admissions are held to while capped.
    pub ceiling_count: u64,
    pub ceiling_burst: u64,
}

impl Engine {
    /// Every global rule in force, by name (none on a node in no region).
    pub fn global_rules(&self) -> Vec<GlobalRuleState> {
        let Some(regions) = self.node.regions() else {
            return Vec::new();
        };
        let rules = self.rules.current();
        (rules.sorted().into_iter())
            .filter(|rule| !rule.global().is_empty())
            .map(|rule| {
                let here = InRegion::of(rule, regions);
                GlobalRuleState {
                    rule: rule.name().to_owned(),
                    regions: rule.global().to_vec(),
                    shared: here.shared,
                    capped: here.shared && regions.capped(here.peers),
                    ceiling_count: here.ceiling.count,
                    ceiling_burst: here.ceiling.burst,
                }
            })
            .collect()
    }
}
