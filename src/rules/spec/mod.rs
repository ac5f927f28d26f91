//! Rules as written: the YAML rules file and the admin API's JSON bodies.
//!
//! One [`RuleSpec`] per rule, in kebab-case with `deny_unknown_fields`, so a
//! misspelt field is an error rather than a silently ignored setting. Every
//! rule is validated while it is read ([`RuleSpec::validate`]), which is what
//! lets a semantic error carry the line of the rule it is about: the YAML
//! reader attaches the position of the mapping being read to any error raised
//! inside it. Field-level errors (`rate: 0/s`) point at the field's value.
//!
//! The admin API's `PUT /v1/rules/{name}` takes the same fields as JSON and
//! runs the same [`RuleSpec::validate`], so a rule is accepted by one exactly
//! when it is accepted by the other.

use crate::algorithm::{why_not_global, Policy};
use crate::units::{parse_millis, Rate};
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::HashSet;
use std::fmt;
use tollgate_protocol::{valid_region_name, Algorithm, Limit, RuleFieldError, MAX_RULE_NAME_LEN};

/// Most rules one server holds. Rule names become metric labels, so their
/// number is bounded whatever the file says.
pub const MAX_RULES: usize = 1024;

/// The `rule` label of checks with inline limits; no rule may take it.
pub const INLINE_LABEL: &str = "inline";

/// Names no rule may take.
const RESERVED_NAMES: [&str; 2] = [INLINE_LABEL, "reload"];

/// Largest rules file read, in bytes.
pub const MAX_RULES_FILE_LEN: u64 = 1 << 20;

/// `algorithm` in rules files and PUT bodies: the wire algorithm by its
/// name ([`Algorithm::name`], the CLI's `--algorithm` names), token-bucket
/// when left out.
mod algorithm_name {
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serializer};
    use tollgate_protocol::Algorithm;

    /// Every name, in the order an unknown one's error lists them.
    pub(super) const NAMES: &[&str] = &[
        "token-bucket",
        "sliding-window",
        "fixed-window",
        "sliding-log",
        "leaky-bucket",
        "concurrency",
    ];

    pub fn serialize<S: Serializer>(algorithm: &Algorithm, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(algorithm.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Algorithm, D::Error> {
        let name = String::deserialize(d)?;
        Algorithm::from_name(&name).ok_or_else(|| D::Error::unknown_variant(&name, NAMES))
    }

    pub fn token_bucket() -> Algorithm {
        Algorithm::TokenBucket
    }
}

/// What a client does with a rule's checks when the server cannot be
/// reached. The server only stores and reports it (`GET /v1/rules`); the
/// client applies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureMode {
    /// Let requests through (the default: the limiter must never be the
    /// reason the API is down).
    #[default]
    Open,
    /// Refuse requests.
    Closed,
}

/// A rate as written (`100/s`), kept verbatim for display.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateText {
    pub text: String,
    pub rate: Rate,
}

/// A duration as written (`60s`), in whole milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurationText {
    pub text: String,
    pub ms: u64,
}

/// One named rule, as written in the rules file or a PUT body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct RuleSpec {
    /// 1 to 64 characters out of `A-Z a-z 0-9 _ - . :`; what checks send.
    /// Optional in a PUT body (the path names the rule).
    #[serde(default)]
    pub name: String,
    /// `token-bucket` (default), `sliding-window`, `fixed-window`,
    /// `sliding-log`, `leaky-bucket` or `concurrency`.
    #[serde(default = "algorithm_name::token_bucket", with = "algorithm_name")]
    pub algorithm: Algorithm,
    /// Sustained rate, `COUNT/PERIOD`: `100/s`, `5000/min`, `50/10s`. For
    /// `concurrency`, `N/TTL`: at most N in flight, each lease living TTL
    /// unless released (`8/30s`).
    pub rate: RateText,
    /// Bucket capacity (`token-bucket`; default: the rate's count) or
    /// tolerance (`leaky-bucket`; default 1). Those two only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// Window length (default: the rate's period). `sliding-window`,
    /// `fixed-window` and `sliding-log` only; the rate scaled to it must be
    /// a whole count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<DurationText>,
    /// Units a check takes when it sends cost 0 (>= 1).
    #[serde(default = "default_cost")]
    pub default_cost: u32,
    /// `open` (default) or `closed`: what clients do when the server is
    /// unreachable.
    #[serde(default)]
    pub failure_mode: FailureMode,
    /// Evaluate and count, never deny: a would-be denial is answered as
    /// allowed with the shadow flag.
    #[serde(default)]
    pub shadow: bool,
    /// The regions that share this limit (docs/GLOBAL-LIMITS.md): each
    /// enforces it on its own counters and reports its usage to the others
    /// listed. Empty (the default): the limit is this region's alone.
    /// `token-bucket`, `sliding-window` and `fixed-window` only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub global: Vec<String>,
}

fn default_cost() -> u32 {
    1
}

/// Why a rule is refused (the position is added by the reader).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("rule name is missing")]
    MissingName,
    #[error(
        "rule name {0:?} must be 1 to {MAX_RULE_NAME_LEN} characters out of A-Z a-z 0-9 _ - . :"
    )]
    BadName(String),
    #[error("rule name {0:?} is reserved (\"inline\" labels inline limits in metrics, \"reload\" is an admin API path)")]
    Reserved(String),
    #[error("rule {name:?}: default-cost must be at least 1")]
    ZeroCost { name: String },
    /// `burst` or `window` on an algorithm without one.
    #[error("rule {name:?}: {field} does not apply to {algorithm}")]
    FieldNotFor {
        name: String,
        field: &'static str,
        algorithm: &'static str,
    },
    #[error("rule {name:?}: rate {rate} over a {window_ms} ms window is not a whole count of at least 1")]
    UnevenWindow {
        name: String,
        rate: String,
        window_ms: u64,
    },
    #[error("rule {name:?}: {reason}")]
    Impossible { name: String, reason: String },
    #[error("rule {name:?}: global region name {region:?} must be 1 to 64 characters out of A-Z a-z 0-9 _ - .")]
    BadRegion { name: String, region: String },
    #[error("rule {name:?}: global names region {region:?} twice")]
    RegionTwice { name: String, region: String },
    #[error("rule {name:?}: {reason}")]
    NotGlobal { name: String, reason: String },
    #[error("duplicate rule name {0:?}")]
    Duplicate(String),
    #[error("more than {MAX_RULES} rules")]
    TooMany,
}

impl RuleSpec {
    /// Checks the rule and returns the wire limit it stands for, with the
    /// server's cap on a sliding log's or a concurrency limit's count. Only
    /// checks: nothing is loaded.
    pub fn validate(&self, max_log_entries: u64) -> Result<Limit, RuleError> {
        let name = || self.name.clone();
        if self.name.is_empty() {
            return Err(RuleError::MissingName);
        }
        if !valid_name(&self.name) {
            return Err(RuleError::BadName(self.name.clone()));
        }
        if RESERVED_NAMES.contains(&self.name.as_str()) {
            return Err(RuleError::Reserved(self.name.clone()));
        }
        if self.default_cost == 0 {
            return Err(RuleError::ZeroCost { name: name() });
        }
        let algorithm = self.algorithm;
        // The one reading of rule fields, shared with clients that fetch
        // the rule table (PROTOCOL.md §5 numbers, as `tollgate check` builds
        // them from the same flags).
        let limit = Limit::from_rule_fields(
            algorithm,
            self.rate.rate,
            self.burst,
            self.window.as_ref().map(|w| w.ms),
        )
        .map_err(|e| match e {
            RuleFieldError::NotFor { field, algorithm } => RuleError::FieldNotFor {
                name: name(),
                field,
                algorithm,
            },
            RuleFieldError::UnevenWindow { window_ms, .. } => RuleError::UnevenWindow {
                name: name(),
                rate: self.rate.text.clone(),
                window_ms,
            },
        })?;
        // The same bounds as an inline limit (zero, overflow, rate too high,
        // a log or a concurrency count above the server's cap).
        Policy::from_limit_with(&limit, max_log_entries).map_err(|e| RuleError::Impossible {
            name: name(),
            reason: e.to_string(),
        })?;
        if !self.global.is_empty() {
            if let Some(region) = self.global.iter().find(|r| !valid_region_name(r)) {
                return Err(RuleError::BadRegion {
                    name: name(),
                    region: region.clone(),
                });
            }
            // Each region once: the default ceiling is an equal share of
            // the regions listed.
            let twice =
                (self.global.iter().enumerate()).find(|(i, r)| self.global[..*i].contains(r));
            if let Some((_, region)) = twice {
                return Err(RuleError::RegionTwice {
                    name: name(),
                    region: region.clone(),
                });
            }
            if let Some(why) = why_not_global(algorithm) {
                return Err(RuleError::NotGlobal {
                    name: name(),
                    reason: format!("{} cannot be global: {why}", algorithm.name()),
                });
            }
        }
        Ok(limit)
    }
}

/// Rule names: short, and safe in a URL path, a metric label and a log line.
pub fn valid_name(name: &str) -> bool {
    (1..=MAX_RULE_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
}

/// Where a rules text went wrong: 1-based line and column when known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    pub line: Option<usize>,
    pub column: Option<usize>,
    pub reason: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, "{l}:{c}: {}", self.reason),
            _ => f.write_str(&self.reason),
        }
    }
}

/// Reads a rules file's text: `rules:` and a list of rules, every rule
/// validated (with the server's `max_log_entries`) and names unique.
pub fn parse_yaml(text: &str, max_log_entries: u64) -> Result<Vec<RuleSpec>, SpecError> {
    if text.trim().is_empty() {
        return Err(SpecError {
            line: None,
            column: None,
            reason: "the file is empty: expected `rules:` and a list of rules".into(),
        });
    }
    let de = serde_norway::Deserializer::from_str(text);
    FileSeed { max_log_entries }.deserialize(de).map_err(|e| {
        let location = e.location();
        let mut reason = e.to_string();
        if let Some(loc) = &location {
            let suffix = format!(" at line {} column {}", loc.line(), loc.column());
            if let Some(stripped) = reason.strip_suffix(&suffix) {
                reason = stripped.to_owned();
            }
        }
        SpecError {
            line: location.as_ref().map(|l| l.line()),
            column: location.as_ref().map(|l| l.column()),
            reason,
        }
    })
}

/// Reads one rule from a JSON body (the admin API's PUT), with the same
/// validation as the file. `name` comes from the path; a body naming
/// another rule is refused.
pub fn parse_json(
    body: &[u8],
    name: &str,
    max_log_entries: u64,
) -> Result<(RuleSpec, Limit), SpecError> {
    let mut spec: RuleSpec = serde_json::from_slice(body).map_err(|e| SpecError {
        line: Some(e.line()),
        column: Some(e.column()),
        reason: strip_json_location(&e),
    })?;
    if spec.name.is_empty() {
        spec.name = name.to_owned();
    } else if spec.name != name {
        return Err(SpecError {
            line: None,
            column: None,
            reason: format!(
                "the body names rule {:?} but the path names {name:?}",
                spec.name
            ),
        });
    }
    let limit = spec.validate(max_log_entries).map_err(|e| SpecError {
        line: None,
        column: None,
        reason: e.to_string(),
    })?;
    Ok((spec, limit))
}

fn strip_json_location(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    text.strip_suffix(&suffix).unwrap_or(&text).to_owned()
}

/// The top level of the file: a mapping with `rules` only.
struct FileSeed {
    max_log_entries: u64,
}

impl<'de> DeserializeSeed<'de> for FileSeed {
    type Value = Vec<RuleSpec>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for FileSeed {
    type Value = Vec<RuleSpec>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a mapping with `rules:` and a list of rules")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut rules = None;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "rules" if rules.is_some() => return Err(de::Error::duplicate_field("rules")),
                "rules" => {
                    rules = Some(map.next_value_seed(RulesSeed {
                        max_log_entries: self.max_log_entries,
                    })?)
                }
                other => return Err(de::Error::unknown_field(other, &["rules"])),
            }
        }
        rules.ok_or_else(|| de::Error::missing_field("rules"))
    }
}

/// The list of rules; names must be unique.
struct RulesSeed {
    max_log_entries: u64,
}

impl<'de> DeserializeSeed<'de> for RulesSeed {
    type Value = Vec<RuleSpec>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for RulesSeed {
    type Value = Vec<RuleSpec>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of rules")
    }

    /// `rules:` with nothing after it: no rules.
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut names = HashSet::new();
        let mut rules = Vec::new();
        while let Some(rule) = seq.next_element_seed(RuleSeed {
            names: &mut names,
            max_log_entries: self.max_log_entries,
        })? {
            if rules.len() == MAX_RULES {
                return Err(de::Error::custom(RuleError::TooMany));
            }
            rules.push(rule);
        }
        Ok(rules)
    }
}

/// One rule, validated inside its own mapping so that an error carries the
/// mapping's position.
struct RuleSeed<'a> {
    names: &'a mut HashSet<String>,
    max_log_entries: u64,
}

impl<'de> DeserializeSeed<'de> for RuleSeed<'_> {
    type Value = RuleSpec;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RuleSeed<'_> {
    type Value = RuleSpec;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a rule (a mapping with name, rate, ...)")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let spec = RuleSpec::deserialize(de::value::MapAccessDeserializer::new(map))?;
        spec.validate(self.max_log_entries)
            .map_err(de::Error::custom)?;
        if !self.names.insert(spec.name.clone()) {
            return Err(de::Error::custom(RuleError::Duplicate(spec.name)));
        }
        Ok(spec)
    }
}

impl Serialize for RateText {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

/// Parses a string scalar inside the deserializer's visit, so that a parse
/// error carries the scalar's own position (not its rule's).
struct ParsedStr<T>(fn(&str) -> Result<T, String>, &'static str);

impl<T> Visitor<'_> for ParsedStr<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.1)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        (self.0)(v).map_err(E::custom)
    }
}

impl<'de> Deserialize<'de> for RateText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(ParsedStr(
            |text| {
                let rate: Rate = text
                    .parse()
                    .map_err(|e: crate::units::UnitError| e.to_string())?;
                Ok(RateText {
                    text: text.to_owned(),
                    rate,
                })
            },
            "a rate such as 100/s",
        ))
    }
}

impl Serialize for DurationText {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for DurationText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(ParsedStr(
            |text| {
                let ms = parse_millis(text).map_err(|e| e.to_string())?;
                Ok(DurationText {
                    text: text.to_owned(),
                    ms,
                })
            },
            "a duration such as 60s",
        ))
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod example;
