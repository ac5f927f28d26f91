//! The rules examples of the docs load (docs/RULES.md, config/rules.example.yaml).

/// The checked-in example file is valid and shows every field.
#[test]
fn the_example_rules_file_loads() {
    let text = include_str!("../../../config/rules.example.yaml");
    let rules = super::parse_yaml(text, crate::algorithm::DEFAULT_MAX_LOG_ENTRIES)
        .expect("config/rules.example.yaml is valid");
    assert_eq!(rules.len(), 9);
    for algorithm in tollgate_protocol::Algorithm::ALL {
        assert!(
            rules.iter().any(|r| r.algorithm == algorithm),
            "no {} rule",
            algorithm.name()
        );
    }
    assert!(rules.iter().any(|r| r.shadow));
    assert!(rules.iter().any(|r| r.window.is_some()));
    assert!(rules.iter().any(|r| r.default_cost > 1));
}

/// So is the example of the operator manual (docs/RULES.md).
#[test]
fn the_documented_rules_example_loads() {
    let rules = super::parse_yaml(
        crate::readme::yaml_after(crate::readme::RULES, "# Named rules"),
        crate::algorithm::DEFAULT_MAX_LOG_ENTRIES,
    )
    .expect("docs/RULES.md example is valid");
    assert_eq!(rules.len(), 2);
    assert_eq!(rules[1].window.as_ref().map(|w| w.ms), Some(86_400_000));
}
