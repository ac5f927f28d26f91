//! The README's examples, for the tests that keep them valid (the README
//! is a contract: people copy its examples).

/// The first YAML block after `heading` in the README.
pub(crate) fn yaml_after(heading: &str) -> &'static str {
    let readme = include_str!("../README.md");
    let section = readme.find(heading).expect("the README has this heading");
    let start = section + readme[section..].find("```yaml\n").expect("a yaml block") + 8;
    let end = start + readme[start..].find("```").expect("its end");
    &readme[start..end]
}
