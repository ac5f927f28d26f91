//! A key as the admin API shows it (`GET /v1/limits/{key}`): its states,
//! and what each rule of their algorithm would allow of it now, read from
//! the stored state without charging anything.

use super::Engine;
use crate::algorithm::Policy;
use crate::clock::Nanos;
use crate::rules::{Rule, RuleSet};
use tollgate_protocol::{Algorithm, Decision};

/// One state a key holds.
pub(crate) struct Inspected {
    pub algorithm: Algorithm,
    pub expires_at: Nanos,
}

/// What one rule would allow of a key now (cost 0: nothing taken).
pub(crate) struct Usage<'r> {
    pub rule: &'r Rule,
    pub decision: Decision,
}

impl Engine {
    /// The states of `key` (the token bucket first, when there is one) and
    /// its usage under every rule of `rules` whose algorithm one of them
    /// belongs to (only the rule named `only`, if given).
    pub fn inspect<'r>(
        &self,
        key: &[u8],
        rules: &'r RuleSet,
        only: Option<&str>,
        max_log_entries: u64,
        now: Nanos,
    ) -> (Vec<Inspected>, Vec<Usage<'r>>) {
        // A key holds at most a token bucket and one state of another
        // algorithm; each is read as every rule of its algorithm would see
        // it.
        let entries = self.store.entries(key, now);
        let mut usage = Vec::new();
        for entry in &entries {
            let algorithm = entry.state.algorithm();
            for rule in rules.sorted() {
                if rule.limit.algorithm != algorithm || only.is_some_and(|n| n != rule.name()) {
                    continue;
                }
                // Rules are validated at load; an error here cannot happen.
                let Ok(policy) = Policy::from_limit_with(&rule.limit, max_log_entries) else {
                    continue;
                };
                // Cost 0: what is available now, nothing taken, nothing
                // stored.
                let decision = policy
                    .evaluate(Some(&entry.state), now, 0)
                    .decision
                    .to_wire(0);
                usage.push(Usage { rule, decision });
            }
        }
        let states = entries
            .iter()
            .map(|e| Inspected {
                algorithm: e.state.algorithm(),
                expires_at: e.expires_at,
            })
            .collect();
        (states, usage)
    }
}
