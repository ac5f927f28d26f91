//! A frame's rules, as its checks look them up: the rule set the frame
//! took, and the last rule found and what the last global rule is in this
//! region (its peers and its ceiling), kept for the next check.
//!
//! A frame's checks mostly name one rule, and each check looked its rule
//! up twice (the prefetch, then the resolve) and, under a global rule,
//! matched the rule's regions against the peers by name and worked out
//! its ceiling: 3.6%, 1.1% and 1.0% of the server's CPU under the global
//! setup of `benches/feature-cost.sh`. Comparing a name with the last
//! rule's takes one short compare, no hash and no probe; a global rule's
//! peers and ceiling are worked out once per frame.

use crate::node::regions::Regions;
use crate::rules::{Rule, RuleSet};
use std::cell::Cell;
use tollgate_protocol::Limit;

/// What a global rule is in this region.
#[derive(Debug, Clone, Copy)]
pub(super) struct InRegion {
    /// Whether it lists this region and a peer of it: a rule that does
    /// not is regional here.
    pub shared: bool,
    /// The peers it is shared with, as bits ([`Regions::peers_of`]).
    pub peers: u64,
    /// The limit its ceiling keys are checked against
    /// ([`Regions::ceiling`]).
    pub ceiling: Limit,
}

impl InRegion {
    /// What the global `rule` is in this region.
    pub fn of(rule: &Rule, regions: &Regions) -> Self {
        let peers = regions.peers_of(rule.global());
        InRegion {
            // Lists this region and one it exchanges with: otherwise no
            // usage goes anywhere and nothing is ever capped, so the rule
            // is regional here.
            shared: peers != 0 && rule.global().iter().any(|r| r == regions.name()),
            peers,
            // Distinct names: a rule's list names each region once.
            ceiling: regions.ceiling(&rule.limit, rule.global().len()),
        }
    }
}

/// The rules one frame is evaluated under (see the module docs).
pub(super) struct FrameRules<'a> {
    rules: &'a RuleSet,
    /// The rule the last lookup found.
    last: Cell<Option<&'a Rule>>,
    /// A global rule (its address, compared only) and what it is in this
    /// region.
    in_region: Cell<Option<(*const Rule, InRegion)>>,
}

impl<'a> FrameRules<'a> {
    pub fn new(rules: &'a RuleSet) -> Self {
        Self {
            rules,
            last: Cell::new(None),
            in_region: Cell::new(None),
        }
    }

    /// The rule named `name`, if the frame's rules have one.
    #[inline]
    pub fn get(&self, name: &[u8]) -> Option<&'a Rule> {
        if let Some(rule) = self.last.get().filter(|r| r.name().as_bytes() == name) {
            return Some(rule);
        }
        let rule = self.rules.get(name)?;
        self.last.set(Some(rule));
        Some(rule)
    }

    /// What `rule` (one of these rules, a global one) is in this region.
    #[inline]
    pub fn in_region(&self, rule: &Rule, regions: &Regions) -> InRegion {
        if let Some((known, in_region)) = self.in_region.get() {
            if std::ptr::eq(known, rule) {
                return in_region;
            }
        }
        let in_region = InRegion::of(rule, regions);
        self.in_region
            .set(Some((std::ptr::from_ref(rule), in_region)));
        in_region
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Rules;

    const RULES: &str =
        "rules:\n  - name: api\n    rate: 100/s\n  - name: login\n    rate: 5/min\n";

    /// The rules above, loaded as the server loads a rules file.
    fn rules() -> Rules {
        let path = std::env::temp_dir().join(format!("frame-rules-{}.yaml", std::process::id()));
        std::fs::write(&path, RULES).unwrap();
        let registry = prometheus::Registry::new();
        let checks = prometheus::IntCounterVec::new(
            prometheus::Opts::new("checks", "checks"),
            &["rule", "decision"],
        )
        .unwrap();
        let rules = Rules::load(Some(path.clone()), 1000, checks, &registry).unwrap();
        std::fs::remove_file(path).unwrap();
        rules
    }

    #[test]
    fn a_lookup_finds_each_rule_by_its_own_name_whatever_came_before() {
        let rules = rules();
        let set = rules.current();
        let frame = FrameRules::new(&set);
        for name in [
            "api", "api", "login", "api", "login", "login", "nope", "api",
        ] {
            let found = frame.get(name.as_bytes()).map(Rule::name);
            let expected = set.get(name.as_bytes()).map(Rule::name);
            assert_eq!(found, expected, "{name}");
        }
        assert_eq!(frame.get(b"api").map(Rule::name), Some("api"));
        // A name that is a prefix of the last rule's is another name.
        assert!(frame.get(b"ap").is_none());
        assert!(frame.get(b"").is_none());
    }
}
