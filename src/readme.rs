//! The documentation's examples, for the tests that keep them valid (the
//! README and the operator manual in docs/ are a contract: people copy
//! their examples).

/// The operator manual's configuration page (docs/CONFIGURATION.md).
pub(crate) const CONFIGURATION: &str = include_str!("../docs/CONFIGURATION.md");

/// The operator manual's rules page (docs/RULES.md).
pub(crate) const RULES: &str = include_str!("../docs/RULES.md");

/// The first YAML block after the line `heading` (a whole line, so `# A`
/// does not match `## A`) in `doc`.
pub(crate) fn yaml_after(doc: &'static str, heading: &str) -> &'static str {
    let section = doc
        .match_indices(heading)
        .map(|(at, _)| at)
        .find(|&at| {
            (at == 0 || doc[..at].ends_with('\n')) && doc[at + heading.len()..].starts_with('\n')
        })
        .expect("the document has this heading");
    let start = section + doc[section..].find("```yaml\n").expect("a yaml block") + 8;
    let end = start + doc[start..].find("```").expect("its end");
    &doc[start..end]
}
