//! Feeds arbitrary names and bodies to the admin API's `PUT
//! /v1/rules/{name}` (the real `Rules::put`) and checks its invariants
//! (accepted exactly when the JSON reader accepts; the set changes only as
//! a PUT says; what GET shows PUTs back); see `rules::check_put_rule`.
#![no_main]

// Each target uses one half of the shared checks; the other half is
// dead code here, not a mistake.
#[allow(dead_code)]
#[path = "../src/rules.rs"]
mod rules;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rules::check_put_rule(data);
});
