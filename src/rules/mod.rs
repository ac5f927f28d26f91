//! Named rules: the set in force, how it is replaced, and what it counts.
//!
//! ```text
//!  rules file --(startup, file change, SIGHUP, POST /v1/rules/reload)--+
//!  PUT / DELETE /v1/rules/{name} ---------------------------------------+--> validate all
//!                                                                       |    build RuleSet
//!                       checks: rules.current() once per frame <--------+--  ArcSwap::store
//! ```
//!
//! Invariants:
//! - the set in force is an immutable [`RuleSet`] behind an `ArcSwap`; a
//!   frame loads it once, so every check of a frame sees one version, and a
//!   swap never blocks or drops a connection;
//! - a new set is built and validated completely before it is stored: an
//!   invalid reload changes nothing (it is logged, counted in
//!   `tollgate_rule_reloads_total{outcome="error"}`, and reported by the admin
//!   API);
//! - updates (reloads and API edits) are serialised by one async mutex, so
//!   two edits never lose one another;
//! - each rule owns its metric handles, resolved once when it is built, so a
//!   check bumps a counter without any lookup.
//!
//! Counters are per key, not per rule: a rule whose numbers change keeps
//! every key's state, and the new numbers apply to it from the next check
//! (see docs/RULES.md, "Changing a rule").

pub mod spec;
pub mod watch;

use arc_swap::{ArcSwap, Guard};
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use spec::{RuleSpec, SpecError, MAX_RULES, MAX_RULES_FILE_LEN};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tollgate_protocol::Limit;

/// The decisions a check is counted under.
pub const DECISIONS: [&str; 3] = ["allowed", "denied", "shadow_denied"];

/// `tollgate_checks_total` handles of one `rule` label, resolved once.
#[derive(Debug, Clone)]
pub struct DecisionCounters {
    pub allowed: IntCounter,
    pub denied: IntCounter,
    pub shadow_denied: IntCounter,
}

impl DecisionCounters {
    pub fn new(checks: &IntCounterVec, rule: &str) -> Self {
        let [a, d, s] = DECISIONS.map(|decision| checks.with_label_values(&[rule, decision]));
        Self {
            allowed: a,
            denied: d,
            shadow_denied: s,
        }
    }

    fn forget(checks: &IntCounterVec, rule: &str) {
        for decision in DECISIONS {
            // Absent when the series was never created: nothing to do.
            let _ = checks.remove_label_values(&[rule, decision]);
        }
    }
}

/// One rule, validated and ready for checks.
#[derive(Debug, Clone)]
pub struct Rule {
    /// As written (what the admin API shows).
    pub spec: RuleSpec,
    /// The inline limit it stands for.
    pub limit: Limit,
    pub counters: DecisionCounters,
}

impl Rule {
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    pub fn shadow(&self) -> bool {
        self.spec.shadow
    }

    pub fn default_cost(&self) -> u32 {
        self.spec.default_cost
    }

    /// The regions sharing this rule (empty: not global).
    pub fn global(&self) -> &[String] {
        &self.spec.global
    }
}

/// An immutable set of rules, looked up by the name bytes a pair carries.
#[derive(Debug, Clone, Default)]
pub struct RuleSet {
    by_name: HashMap<Box<[u8]>, Rule, ahash::RandomState>,
}

impl RuleSet {
    pub fn get(&self, name: &[u8]) -> Option<&Rule> {
        self.by_name.get(name)
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The rules sorted by name.
    pub fn sorted(&self) -> Vec<&Rule> {
        let mut rules: Vec<&Rule> = self.by_name.values().collect();
        rules.sort_by(|a, b| a.name().cmp(b.name()));
        rules
    }

    fn insert(&mut self, rule: Rule) {
        self.by_name
            .insert(rule.name().as_bytes().to_vec().into_boxed_slice(), rule);
    }
}

/// What started a reload (a label of `tollgate_rule_reloads_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadSource {
    Startup,
    FileChange,
    Signal,
    AdminApi,
}

impl ReloadSource {
    pub const ALL: [ReloadSource; 4] = [
        Self::Startup,
        Self::FileChange,
        Self::Signal,
        Self::AdminApi,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Startup => "startup",
            Self::FileChange => "file-change",
            Self::Signal => "signal",
            Self::AdminApi => "admin-api",
        }
    }
}

/// Why rules could not be (re)loaded. The rules in force stay as they were.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReloadError {
    #[error("no rules file is configured (--rules)")]
    NoFile,
    #[error("{path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{path}: larger than {MAX_RULES_FILE_LEN} bytes")]
    TooLarge { path: String },
    /// `{path}:{line}:{column}: {reason}`
    #[error("{path}:{error}")]
    Invalid { path: String, error: SpecError },
}

impl ReloadError {
    /// The line of the offending text, when there is one.
    pub fn line(&self) -> Option<usize> {
        match self {
            Self::Invalid { error, .. } => error.line,
            _ => None,
        }
    }
}

/// The last reload and how it went (for `GET /v1/rules`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReloadStatus {
    pub source: &'static str,
    pub ok: bool,
    /// Set when `ok` is false.
    pub error: Option<String>,
    /// Rules in force after it.
    pub rules: usize,
    pub at_unix_ms: u64,
}

/// Why an admin API edit was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    #[error("{0}")]
    Invalid(SpecError),
    #[error("more than {MAX_RULES} rules")]
    TooMany,
}

/// Reload counts and the size of the set in force.
#[derive(Debug, Clone)]
struct RuleMetrics {
    reloads: IntCounterVec,
    rules: IntGauge,
}

impl RuleMetrics {
    fn register(registry: &Registry) -> prometheus::Result<Self> {
        let reloads = IntCounterVec::new(
            Opts::new(
                "tollgate_rule_reloads_total",
                "Loads of the whole rule set, by what started them and how they ended.",
            ),
            &["source", "outcome"],
        )?;
        let rules = IntGauge::new("tollgate_rules", "Named rules in force.")?;
        // Every series exists from the start, so a first failure is a
        // change from 0 rather than a new series.
        for source in ReloadSource::ALL {
            for outcome in ["ok", "error"] {
                reloads.with_label_values(&[source.name(), outcome]);
            }
        }
        registry.register(Box::new(reloads.clone()))?;
        registry.register(Box::new(rules.clone()))?;
        Ok(Self { reloads, rules })
    }
}

/// The server's rules: the set in force and the ways to replace it.
pub struct Rules {
    current: ArcSwap<RuleSet>,
    path: Option<PathBuf>,
    /// The store's cap on a sliding log's or a concurrency limit's count;
    /// rules above it are refused when they are loaded.
    max_log_entries: u64,
    /// Serialises reloads and edits (held across the file read).
    update: tokio::sync::Mutex<()>,
    /// `tollgate_checks_total`, owned by the check path; rules take their
    /// handles from it.
    checks: IntCounterVec,
    metrics: RuleMetrics,
    status: parking_lot::Mutex<Option<ReloadStatus>>,
    /// Hash of the file text last loaded or tried, so the watcher reloads a
    /// changed file once, not every poll.
    last_text: parking_lot::Mutex<Option<u64>>,
}

impl std::fmt::Debug for Rules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rules")
            .field("path", &self.path)
            .field("rules", &self.current.load().len())
            .finish()
    }
}

impl Rules {
    /// Rules from `path` (checked and loaded now) or none. A file that does
    /// not load is an error: the server does not start on bad rules.
    /// `max_log_entries` is the store's (`--max-log-entries`): every rule,
    /// from the file or the admin API, is validated against it.
    pub fn load(
        path: Option<PathBuf>,
        max_log_entries: u64,
        checks: IntCounterVec,
        registry: &Registry,
    ) -> Result<Self, LoadError> {
        let rules = Self {
            current: ArcSwap::from_pointee(RuleSet::default()),
            path,
            max_log_entries,
            update: tokio::sync::Mutex::new(()),
            checks,
            metrics: RuleMetrics::register(registry)?,
            status: parking_lot::Mutex::new(None),
            last_text: parking_lot::Mutex::new(None),
        };
        if let Some(path) = &rules.path {
            let text = read_file(path)?;
            rules.apply_text(&text, ReloadSource::Startup)?;
        }
        Ok(rules)
    }

    /// The set in force. Hold it for one frame, not longer.
    pub fn current(&self) -> Guard<Arc<RuleSet>> {
        self.current.load()
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn status(&self) -> Option<ReloadStatus> {
        self.status.lock().clone()
    }

    /// Reads the rules file again and replaces every rule with its content
    /// (edits made through the admin API included). On error nothing changes.
    pub async fn reload(&self, source: ReloadSource) -> Result<usize, ReloadError> {
        let _serial = self.update.lock().await;
        // Without a file there is nothing to reload: refused, and not
        // recorded as a failed reload (a SIGHUP for the certificates, or a
        // caller of the admin API, would raise a false alarm).
        let Some(path) = &self.path else {
            return Err(ReloadError::NoFile);
        };
        let text = match read_file_async(path).await {
            Ok(t) => t,
            Err(e) => {
                self.record(source, Err(&e));
                return Err(e);
            }
        };
        self.apply_text(&text, source)
    }

    /// Reloads from `text`, the file's content as the watcher read it,
    /// unless that exact text was already loaded or tried.
    pub(crate) async fn reload_if_new(&self, text: &str) -> Option<Result<usize, ReloadError>> {
        let _serial = self.update.lock().await;
        if *self.last_text.lock() == Some(text_hash(text)) {
            return None;
        }
        Some(self.apply_text(text, ReloadSource::FileChange))
    }

    /// Whether `text` is what was last loaded or tried.
    pub(crate) fn is_last_text(&self, text: &str) -> bool {
        *self.last_text.lock() == Some(text_hash(text))
    }

    /// Parses, validates and swaps in a whole file's rules; records the
    /// outcome. Callers hold `update` (or run before the server starts).
    fn apply_text(&self, text: &str, source: ReloadSource) -> Result<usize, ReloadError> {
        *self.last_text.lock() = Some(text_hash(text));
        let path = self
            .path
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let specs = match spec::parse_yaml(text, self.max_log_entries) {
            Ok(specs) => specs,
            Err(error) => {
                let e = ReloadError::Invalid { path, error };
                self.record(source, Err(&e));
                return Err(e);
            }
        };
        let mut set = RuleSet::default();
        for spec in specs {
            // Validated by the parser already; validate() is cheap and pure.
            let limit = spec
                .validate(self.max_log_entries)
                .map_err(|e| ReloadError::Invalid {
                    path: path.clone(),
                    error: SpecError {
                        line: None,
                        column: None,
                        reason: e.to_string(),
                    },
                })?;
            set.insert(self.build(spec, limit));
        }
        let n = set.len();
        self.swap(set);
        self.record(source, Ok(n));
        Ok(n)
    }

    /// Adds or replaces one rule. Returns whether it is new.
    pub async fn put(&self, name: &str, body: &[u8]) -> Result<(bool, Rule), EditError> {
        let _serial = self.update.lock().await;
        let (spec, limit) =
            spec::parse_json(body, name, self.max_log_entries).map_err(EditError::Invalid)?;
        let current = self.current.load_full();
        let created = current.get(name.as_bytes()).is_none();
        if created && current.len() >= MAX_RULES {
            return Err(EditError::TooMany);
        }
        let mut set = (*current).clone();
        let rule = match current.get(name.as_bytes()) {
            // Keep the handles: the series goes on counting.
            Some(old) => Rule {
                spec,
                limit,
                counters: old.counters.clone(),
            },
            None => self.build(spec, limit),
        };
        set.insert(rule.clone());
        self.swap(set);
        tracing::info!(rule = name, created, "rule set through the admin API");
        Ok((created, rule))
    }

    /// Removes one rule. Returns whether it existed.
    pub async fn delete(&self, name: &str) -> bool {
        let _serial = self.update.lock().await;
        let current = self.current.load_full();
        if current.get(name.as_bytes()).is_none() {
            return false;
        }
        let mut set = (*current).clone();
        set.by_name.remove(name.as_bytes());
        self.swap(set);
        tracing::info!(rule = name, "rule deleted through the admin API");
        true
    }

    fn build(&self, spec: RuleSpec, limit: Limit) -> Rule {
        let counters = match self.current.load().get(spec.name.as_bytes()) {
            Some(old) => old.counters.clone(),
            None => DecisionCounters::new(&self.checks, &spec.name),
        };
        Rule {
            spec,
            limit,
            counters,
        }
    }

    /// Stores `set` and drops the metric series of rules it no longer has.
    fn swap(&self, set: RuleSet) {
        let old = self.current.swap(Arc::new(set));
        let new = self.current.load();
        for name in old.by_name.values().map(Rule::name) {
            if new.get(name.as_bytes()).is_none() {
                DecisionCounters::forget(&self.checks, name);
            }
        }
        self.metrics.rules.set(new.len() as i64);
    }

    fn record(&self, source: ReloadSource, outcome: Result<usize, &ReloadError>) {
        let ok = outcome.is_ok();
        self.metrics
            .reloads
            .with_label_values(&[source.name(), if ok { "ok" } else { "error" }])
            .inc();
        let rules = self.current.load().len();
        match outcome {
            Ok(n) => tracing::info!(source = source.name(), rules = n, "rules loaded"),
            // At start there are no previous rules: the error stops the
            // server, and its caller reports it (exit 2).
            Err(_) if source == ReloadSource::Startup => {}
            Err(e) => tracing::warn!(
                source = source.name(),
                error = %e,
                rules_in_force = rules,
                "rules not reloaded; the previous rules stay in force"
            ),
        }
        *self.status.lock() = Some(ReloadStatus {
            source: source.name(),
            ok,
            error: outcome.err().map(ToString::to_string),
            rules,
            at_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        });
    }
}

/// Why the server could not start with its rules.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Rules(#[from] ReloadError),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

fn text_hash(text: &str) -> u64 {
    // SipHash with fixed keys: stable for the life of the process, which is
    // all the watcher needs.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

pub(crate) fn read_file(path: &Path) -> Result<String, ReloadError> {
    use std::io::Read;
    let shown = || path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| ReloadError::Read {
        path: shown(),
        reason: e.to_string(),
    })?;
    let mut text = String::new();
    file.take(MAX_RULES_FILE_LEN + 1)
        .read_to_string(&mut text)
        .map_err(|e| ReloadError::Read {
            path: shown(),
            reason: e.to_string(),
        })?;
    if text.len() as u64 > MAX_RULES_FILE_LEN {
        return Err(ReloadError::TooLarge { path: shown() });
    }
    Ok(text)
}

pub(crate) async fn read_file_async(path: &Path) -> Result<String, ReloadError> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || read_file(&path))
        .await
        .unwrap_or_else(|e| {
            Err(ReloadError::Read {
                path: String::new(),
                reason: e.to_string(),
            })
        })
}
