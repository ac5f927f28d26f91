//! What every RESP command of one batch sees ([`Ctx`]: the server, the
//! rules in force, the clock, the port), and the checks every key-taking
//! command makes of its key. The command table (commands.rs) and the
//! commands in files of their own (counter.rs, throttle.rs, cluster.rs)
//! all read it.

use crate::clock::Nanos;
use crate::rules::RuleSet;
use crate::server::Shared;

/// What every command of one batch sees.
pub(super) struct Ctx<'a> {
    pub shared: &'a Shared,
    /// The rules in force, loaded once per batch.
    pub rules: &'a RuleSet,
    /// The server clock, read once per batch.
    pub now: Nanos,
    /// This front end's port (other nodes' front ends are on it too).
    pub port: u16,
}

/// The checks every key-taking command makes of its key.
pub(super) fn key_error(ctx: &Ctx, key: &[u8]) -> Option<String> {
    let max = usize::from(ctx.shared.limits.max_key_len);
    if key.is_empty() {
        Some("ERR empty key: Tollgate keys are 1 or more bytes".to_owned())
    } else if key.len() > max {
        Some(format!(
            "ERR key of {} bytes is longer than max-key-len ({max})",
            key.len()
        ))
    } else {
        None
    }
}
