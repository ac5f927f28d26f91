//! A policy: named limits checked together, per caller, in one atomic
//! group.
//!
//! `Policy::new("search")?.limit("per-second", ..)?.limit("per-day", ..)?`
//! checks, for an identifier `id`, the keys `rl:{id}:search:per-second` and
//! `rl:{id}:search:per-day` (identifier made safe by the [`KeyBuilder`]):
//! same tag, same slot, so both are checked and charged all-or-nothing, and
//! the decision names the limit that bound (`per-day`), ready for the
//! `RateLimit-Policy` header.

use std::sync::Arc;

use bytes::Bytes;
use tollgate_protocol::{LimitRef, Pair, DEFAULT_MAX_GROUP};

use crate::key::{check_part, KeyBuilder, KeyError};

/// Default key prefix of a policy's keys.
pub const DEFAULT_POLICY_PREFIX: &str = "rl";

/// Named limits over one identifier (see the module docs).
#[derive(Debug, Clone)]
pub struct Policy {
    name: Arc<str>,
    keys: KeyBuilder,
    limits: Vec<PolicyLimit>,
}

/// One limit of a policy.
#[derive(Debug, Clone)]
pub struct PolicyLimit {
    pub name: Arc<str>,
    pub limit: LimitRef,
    /// The suffix of the limit's key: `policy:limit`.
    suffix: String,
}

/// Why a policy cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("policy {policy:?} already has a limit named {limit:?}")]
    DuplicateLimit { policy: String, limit: String },
    #[error("policy {policy:?} has more than {max} limits (the server's max_group)")]
    TooManyLimits { policy: String, max: u8 },
}

impl Policy {
    /// An empty policy named `name` (`A-Z a-z 0-9 _ - . :`), keys prefixed
    /// `rl`.
    pub fn new(name: &str) -> Result<Self, PolicyError> {
        Self::with_keys(name, KeyBuilder::new(DEFAULT_POLICY_PREFIX)?)
    }

    /// An empty policy whose keys come from `keys` (its prefix and bounds).
    pub fn with_keys(name: &str, keys: KeyBuilder) -> Result<Self, PolicyError> {
        check_part("policy name", name)?;
        Ok(Self {
            name: Arc::from(name),
            keys,
            limits: Vec::new(),
        })
    }

    /// Adds a limit named `name`: an inline [`Limit`](crate::Limit) or a
    /// [`RuleName`](crate::RuleName) configured on the server.
    pub fn limit(mut self, name: &str, limit: impl Into<LimitRef>) -> Result<Self, PolicyError> {
        check_part("limit name", name)?;
        if self.limits.iter().any(|l| &*l.name == name) {
            return Err(PolicyError::DuplicateLimit {
                policy: self.name.to_string(),
                limit: name.to_owned(),
            });
        }
        if self.limits.len() >= usize::from(DEFAULT_MAX_GROUP) {
            return Err(PolicyError::TooManyLimits {
                policy: self.name.to_string(),
                max: DEFAULT_MAX_GROUP,
            });
        }
        self.limits.push(PolicyLimit {
            suffix: format!("{}:{name}", self.name),
            name: Arc::from(name),
            limit: limit.into(),
        });
        Ok(self)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn limits(&self) -> &[PolicyLimit] {
        &self.limits
    }

    pub fn keys(&self) -> &KeyBuilder {
        &self.keys
    }

    /// The pairs to check for `identifier` at `cost`, one per limit, all
    /// under the identifier's tag.
    pub fn pairs(&self, identifier: &[u8], cost: u32) -> Result<Vec<Pair>, KeyError> {
        let tag = self.keys.tag(identifier)?;
        self.limits
            .iter()
            .map(|l| {
                Ok(Pair {
                    key: self.keys.assemble(&tag, &l.suffix)?,
                    limit: l.limit.clone(),
                    cost,
                })
            })
            .collect()
    }

    /// The key of limit `limit` for `identifier` (what the admin API's
    /// `/v1/limits/{key}` shows).
    pub fn key(&self, identifier: &[u8], limit: &str) -> Result<Bytes, KeyError> {
        let tag = self.keys.tag(identifier)?;
        let suffix = format!("{}:{limit}", self.name);
        self.keys.assemble(&tag, &suffix)
    }

    /// The limits' names, in pair order.
    pub(crate) fn names(&self) -> Vec<Arc<str>> {
        self.limits.iter().map(|l| Arc::clone(&l.name)).collect()
    }
}

#[cfg(test)]
mod tests {
    use tollgate_protocol::units::Rate;
    use tollgate_protocol::Limit;

    use super::*;

    #[test]
    fn a_policy_checks_its_limits_under_one_tag() {
        let policy = Policy::new("search")
            .unwrap()
            .limit("per-second", Limit::token_bucket(Rate::per_second(10), 10))
            .unwrap()
            .limit("per-day", Limit::fixed_window(Rate::per_day(1000)))
            .unwrap();
        let pairs = policy.pairs(b"k}ey", 1).unwrap();
        assert_eq!(&pairs[0].key[..], b"rl:{k%7Dey}:search:per-second");
        assert_eq!(&pairs[1].key[..], b"rl:{k%7Dey}:search:per-day");
        assert_eq!(policy.key(b"k}ey", "per-day").unwrap(), pairs[1].key);
        assert_eq!(policy.pairs(b"", 1), Err(KeyError::EmptyIdentifier));
        assert!(matches!(
            policy
                .clone()
                .limit("per-day", Limit::fixed_window(Rate::per_day(1))),
            Err(PolicyError::DuplicateLimit { .. })
        ));
        assert!(Policy::new("a{b").is_err());
    }
}
