//! What the dashboard and the alert rules ask of `/metrics`: every PromQL
//! expression in deploy/grafana/*.json and deploy/prometheus/*.yml, the
//! `tollgate_*` metric names each uses and the label names it matches on;
//! and what a server's `/metrics` text actually exports. Shared by the
//! dashboard test and the cluster tests (cluster metrics exist only on a
//! node running cluster mode).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// One PromQL expression and where it was found.
#[derive(Debug, Clone)]
pub struct Expr {
    pub origin: String,
    pub text: String,
}

/// A metric an expression names, with the label names it matches on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Use {
    pub metric: String,
    pub labels: BTreeSet<String>,
}

/// Every expression of the dashboards and alert rules under `root/deploy`.
pub fn expressions(root: &Path) -> Vec<Expr> {
    let mut out = Vec::new();
    for file in files(&root.join("deploy/grafana"), "json") {
        let text = std::fs::read_to_string(&file).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{}: not JSON: {e}", file.display()));
        json_exprs(&json, &file.display().to_string(), &mut out);
    }
    for file in files(&root.join("deploy/prometheus"), "yml") {
        let text = std::fs::read_to_string(&file).unwrap();
        let doc: serde_json::Value = serde_norway::from_str(&text)
            .unwrap_or_else(|e| panic!("{}: not YAML: {e}", file.display()));
        for group in doc["groups"].as_array().expect("rule groups") {
            for rule in group["rules"].as_array().expect("rules") {
                let name = rule["alert"].as_str().or(rule["record"].as_str());
                out.push(Expr {
                    origin: format!("{}: {}", file.display(), name.expect("a named rule")),
                    text: rule["expr"].as_str().expect("an expr").to_owned(),
                });
            }
        }
    }
    out
}

fn files(dir: &Path, ext: &str) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .{ext} file in {}", dir.display());
    files
}

/// Panel targets (`expr`) and template variable queries (`definition`),
/// wherever they sit in the dashboard.
fn json_exprs(v: &serde_json::Value, origin: &str, out: &mut Vec<Expr>) {
    match v {
        serde_json::Value::Object(map) => {
            let here = map
                .get("title")
                .or(map.get("name"))
                .and_then(|t| t.as_str())
                .map_or(origin.to_owned(), |t| format!("{origin}: {t}"));
            for key in ["expr", "definition"] {
                if let Some(text) = map.get(key).and_then(|e| e.as_str()) {
                    out.push(Expr {
                        origin: here.clone(),
                        text: text.to_owned(),
                    });
                }
            }
            for value in map.values() {
                json_exprs(value, &here, out);
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|i| json_exprs(i, origin, out)),
        _ => {}
    }
}

/// The `tollgate_*` metrics `expr` names, each with the label names of its
/// `{...}` selector. String literals are skipped, so a label value is
/// never taken for a metric.
pub fn uses(expr: &str) -> Vec<Use> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' {
            i = skip_string(&chars, i);
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            if word.starts_with("tollgate_") {
                let mut labels = BTreeSet::new();
                if chars.get(i) == Some(&'{') {
                    i = selector_labels(&chars, i + 1, &mut labels);
                }
                out.push(Use {
                    metric: word,
                    labels,
                });
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Index just past the string literal opening at `i`.
fn skip_string(chars: &[char], i: usize) -> usize {
    let quote = chars[i];
    let mut j = i + 1;
    while j < chars.len() && chars[j] != quote {
        j += if chars[j] == '\\' { 2 } else { 1 };
    }
    j + 1
}

/// Collects the label names of a selector whose body starts at `i`;
/// returns the index past its `}`.
fn selector_labels(chars: &[char], mut i: usize, labels: &mut BTreeSet<String>) -> usize {
    loop {
        while i < chars.len() && (chars[i].is_whitespace() || chars[i] == ',') {
            i += 1;
        }
        if i >= chars.len() || chars[i] == '}' {
            return i + 1;
        }
        let start = i;
        while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
            i += 1;
        }
        labels.insert(chars[start..i].iter().collect());
        while i < chars.len() && chars[i] != '"' && chars[i] != '\'' {
            i += 1;
        }
        i = skip_string(chars, i);
    }
}

/// Each metric name in a `/metrics` text (histograms as their `_bucket`,
/// `_sum` and `_count` series) with every label name its samples carry.
pub fn exported(metrics_text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in metrics_text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = out.entry(line[..end].to_owned()).or_default();
        if line[end..].starts_with('{') {
            let chars: Vec<char> = line[end + 1..].chars().collect();
            selector_labels(&chars, 0, labels);
        }
    }
    out
}

/// Every use of a metric in `exprs` that `exported` lacks (the metric, or
/// a label it matches on), as readable lines; `only` picks which metrics
/// to check.
pub fn missing(
    exprs: &[Expr],
    exported: &BTreeMap<String, BTreeSet<String>>,
    only: impl Fn(&str) -> bool,
) -> Vec<String> {
    let mut problems = Vec::new();
    for expr in exprs {
        for u in uses(&expr.text).into_iter().filter(|u| only(&u.metric)) {
            match exported.get(&u.metric) {
                None => problems.push(format!(
                    "{}: `{}` is not in /metrics ({})",
                    expr.origin, u.metric, expr.text
                )),
                Some(labels) => {
                    for label in u.labels.difference(labels) {
                        // The scrape adds these; the server does not.
                        if !["instance", "job"].contains(&label.as_str()) {
                            problems.push(format!(
                                "{}: `{}` has no label `{label}`",
                                expr.origin, u.metric
                            ));
                        }
                    }
                }
            }
        }
    }
    problems
}
