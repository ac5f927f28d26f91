//! Feeds arbitrary text to the rules file reader and checks its invariants
//! (accepted rules are valid and load back as shown; refusals say why and
//! where); see `rules::check_rules_file`.
#![no_main]

// Each target uses one half of the shared checks; the other half is
// dead code here, not a mistake.
#[allow(dead_code)]
#[path = "../src/rules.rs"]
mod rules;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rules::check_rules_file(data);
});
