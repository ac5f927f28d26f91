//! Invariants of the rules readers, checked by the `parse_rules` and
//! `put_rule` fuzz targets on every input, beyond "no panic".
//!
//! Not part of the fuzz crate's library (which the protocol crate's tests
//! include and which must not need the server): the targets and the
//! server's corpus replay (`tests/rules_corpus.rs`) include this file by
//! path.
//!
//! The rules file (`check_rules_file`):
//! - an accepted file holds at most `MAX_RULES` rules, with valid, unique
//!   names, each of which validates on its own;
//! - what the server shows of it (each rule serialized, as `GET /v1/rules`
//!   and `--print-config` do) loads back to the same rules, through the
//!   file reader and through the admin API's JSON reader alike;
//! - a refused file says why, and a line or column it names lies inside
//!   the text.
//!
//! The admin API's `PUT /v1/rules/{name}` body (`check_put_rule`), driven
//! through the real `Rules::put` on a set already holding one rule:
//! - it is accepted exactly when the JSON reader accepts it;
//! - an accepted rule carries the path's name, the limit its fields
//!   validate to, is what the set then holds under that name, and the set
//!   grew by one exactly when the name was new; the other rule is untouched;
//! - the rule as `GET` shows it can be PUT again, idempotently (same spec,
//!   not "created"), and loads from a rules file too;
//! - a refused body changes nothing, and says why.

use std::sync::OnceLock;

use prometheus::{IntCounterVec, Opts, Registry};
use tollgate::rules::spec::{parse_json, parse_yaml, valid_name, RuleSpec, SpecError, MAX_RULES};
use tollgate::rules::{EditError, Rules};

/// The server's default `--max-log-entries`.
pub const MAX_LOG_ENTRIES: u64 = tollgate::config::DEFAULT_MAX_LOG_ENTRIES;

/// The rule already in force when a PUT body is tried.
const EXISTING: &str = "existing";
const EXISTING_BODY: &str = r#"{"rate": "10/s", "burst": 20}"#;

/// What an input came to, for tests that expect a given outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Accepted, with this many rules.
    Accepted(usize),
    /// Refused, with this reason.
    Refused(String),
}

/// Checks the rules file reader on `data`; panics on a violation.
pub fn check_rules_file(data: &[u8]) -> Verdict {
    let Ok(text) = std::str::from_utf8(data) else {
        // The server reads the file as UTF-8 first and reports that itself.
        return Verdict::Refused("not UTF-8".into());
    };
    match parse_yaml(text, MAX_LOG_ENTRIES) {
        Ok(specs) => {
            assert!(specs.len() <= MAX_RULES, "{} rules accepted", specs.len());
            let mut names = std::collections::HashSet::new();
            for spec in &specs {
                assert!(valid_name(&spec.name), "invalid name accepted: {spec:?}");
                assert!(names.insert(spec.name.clone()), "duplicate {:?}", spec.name);
                let limit = spec
                    .validate(MAX_LOG_ENTRIES)
                    .unwrap_or_else(|e| panic!("an accepted rule fails validate: {e}"));
                check_shown_rule_loads(spec, limit);
            }
            let shown = shown_file(&specs);
            let again = parse_yaml(&shown, MAX_LOG_ENTRIES)
                .unwrap_or_else(|e| panic!("the rules as shown do not load back: {e}\n{shown}"));
            assert_eq!(again, specs, "the rules as shown load back the same");
            Verdict::Accepted(specs.len())
        }
        Err(e) => {
            check_error_position(&e, text);
            Verdict::Refused(e.reason)
        }
    }
}

/// Checks `PUT /v1/rules/{name}` on `data` (the name's length in the first
/// byte, the name, then the body); panics on a violation.
pub fn check_put_rule(data: &[u8]) -> Verdict {
    let Some((&len, rest)) = data.split_first() else {
        return Verdict::Refused("empty input".into());
    };
    let len = usize::from(len % 72).min(rest.len());
    let (name, body) = rest.split_at(len);
    // The path is percent-decoded into a String by the router: not UTF-8
    // never reaches the rules.
    let Ok(name) = std::str::from_utf8(name) else {
        return Verdict::Refused("name not UTF-8".into());
    };
    runtime().block_on(put(name, body))
}

async fn put(name: &str, body: &[u8]) -> Verdict {
    let rules = fresh_rules();
    rules
        .put(EXISTING, EXISTING_BODY.as_bytes())
        .await
        .expect("the existing rule loads");
    let existing = rules.current().get(EXISTING.as_bytes()).cloned().unwrap();
    let parsed = parse_json(body, name, MAX_LOG_ENTRIES);
    match rules.put(name, body).await {
        Ok((created, rule)) => {
            let (spec, limit) = parsed.expect("PUT accepted a body the JSON reader refuses");
            assert_eq!(rule.name(), name, "the rule takes the path's name");
            assert!(valid_name(name));
            assert_eq!(rule.spec, spec);
            assert_eq!(rule.limit, limit);
            assert_eq!(created, name != EXISTING);
            let set = rules.current();
            assert_eq!(set.len(), 1 + usize::from(created));
            let held = set.get(name.as_bytes()).expect("the set holds the rule");
            assert_eq!(held.spec, rule.spec);
            if created {
                let other = set.get(EXISTING.as_bytes()).expect("the other rule stays");
                assert_eq!(other.spec, existing.spec);
            }
            drop(set);
            // GET shows the spec as JSON; PUT it back: the same rule.
            let shown = serde_json::to_vec(&rule.spec).expect("a spec serializes");
            let (again_created, again) = rules
                .put(name, &shown)
                .await
                .unwrap_or_else(|e| panic!("the rule as shown does not PUT back: {e}"));
            assert!(!again_created);
            assert_eq!(again.spec, rule.spec);
            assert_eq!(again.limit, rule.limit);
            check_shown_rule_loads(&rule.spec, rule.limit);
            Verdict::Accepted(1)
        }
        Err(EditError::Invalid(e)) => {
            let refused = parsed.expect_err("PUT refused a body the JSON reader accepts");
            assert_eq!(refused, e);
            assert!(!e.reason.is_empty(), "a refusal says why");
            let set = rules.current();
            assert_eq!(set.len(), 1, "a refused PUT changes nothing");
            assert_eq!(set.get(EXISTING.as_bytes()).unwrap().spec, existing.spec);
            Verdict::Refused(e.reason)
        }
        Err(EditError::TooMany) => panic!("two rules are not too many"),
    }
}

/// A rule as the server shows it (JSON) loads back through both readers
/// to the same rule and limit.
fn check_shown_rule_loads(spec: &RuleSpec, limit: tollgate_protocol::Limit) {
    let json = serde_json::to_vec(spec).expect("a spec serializes");
    let (again, again_limit) = parse_json(&json, &spec.name, MAX_LOG_ENTRIES)
        .unwrap_or_else(|e| panic!("the rule as shown is refused by PUT: {e}"));
    assert_eq!(&again, spec);
    assert_eq!(again_limit, limit);
    let file = shown_file(std::slice::from_ref(spec));
    let from_file = parse_yaml(&file, MAX_LOG_ENTRIES)
        .unwrap_or_else(|e| panic!("the rule as shown is refused in a file: {e}\n{file}"));
    assert_eq!(from_file, vec![spec.clone()]);
}

/// A rules file holding `specs` as the server serializes them.
fn shown_file(specs: &[RuleSpec]) -> String {
    #[derive(serde::Serialize)]
    struct File<'a> {
        rules: &'a [RuleSpec],
    }
    serde_norway::to_string(&File { rules: specs }).expect("rules serialize")
}

/// A refusal says why, and any position it names is inside the text.
fn check_error_position(e: &SpecError, text: &str) {
    assert!(!e.reason.is_empty(), "a refusal says why");
    if let Some(line) = e.line {
        // Lines as the YAML reader counts them: "\r\n", a lone "\r" and
        // "\n" each end one, and so do NEL, LS and PS (U+0085, U+2028,
        // U+2029: YAML 1.1 line breaks), which an editor may show as none.
        let lines = text
            .replace("\r\n", "\n")
            .split(['\n', '\r', '\u{85}', '\u{2028}', '\u{2029}'])
            .count();
        assert!(
            (1..=lines + 1).contains(&line),
            "line {line} of a {lines}-line text: {e}"
        );
    }
    if let Some(column) = e.column {
        assert!(column >= 1, "column {column}: {e}");
    }
}

fn fresh_rules() -> Rules {
    let registry = Registry::new();
    let checks = IntCounterVec::new(Opts::new("checks", "checks"), &["rule", "decision"])
        .expect("a counter vec");
    Rules::load(None, MAX_LOG_ENTRIES, checks, &registry).expect("no file: no error")
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
    })
}
