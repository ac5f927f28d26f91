//! The rules fuzz targets' seed corpora (`fuzz/corpus/parse_rules`
//! and `put_rule`), replayed through the targets' own invariant checks on
//! stable, so CI runs them on every change; with whatever else a local
//! fuzz run left in those directories. Each named seed must also come to
//! the verdict its name says: `broken_*` refused, the others accepted.

#[allow(dead_code)]
#[path = "../fuzz/src/rules.rs"]
mod rules;

use rules::Verdict;
use std::path::{Path, PathBuf};

fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect()
}

/// Named seeds end in `.yaml` or `.bin`; fuzzer finds are hashes.
fn named(file: &str) -> bool {
    file.ends_with(".yaml") || file.ends_with(".bin")
}

fn replay(target: &str, check: fn(&[u8]) -> Verdict) {
    let files = corpus(target);
    assert!(files.iter().filter(|(f, _)| named(f)).count() >= 10);
    for (file, data) in files {
        let verdict = check(&data);
        if !named(&file) {
            continue;
        }
        match (&verdict, file.starts_with("broken_")) {
            (Verdict::Accepted(_), false) | (Verdict::Refused(_), true) => {}
            _ => panic!("{target}/{file}: {verdict:?}"),
        }
    }
}

#[test]
fn rules_file_seeds_keep_the_readers_invariants() {
    replay("parse_rules", rules::check_rules_file);
    let example = include_str!("../config/rules.example.yaml");
    let rules_in_it = example.matches("\n  - name:").count();
    assert_eq!(
        rules::check_rules_file(example.as_bytes()),
        Verdict::Accepted(rules_in_it)
    );
}

#[test]
fn put_rule_seeds_keep_the_admin_api_invariants() {
    replay("put_rule", rules::check_put_rule);
}
