//! How the CLI prints answers: a decision, a node's status.

use tollgate_protocol::{Decision, NodeStatus, Role, RETRY_NEVER};

/// One decision as a line of text or a JSON object. A concurrency
/// acquire's lease is shown (`lease=ID`, `"lease": ID`) when there is one.
pub fn render(d: &Decision, json: bool) -> String {
    let retry = (d.retry_after_ms != RETRY_NEVER).then_some(d.retry_after_ms);
    if json {
        let mut v = serde_json::json!({
            "allowed": d.allowed,
            "limit": d.limit,
            "remaining": d.remaining,
            "reset_after_ms": d.reset_after_ms,
            "retry_after_ms": retry,
        });
        if let Some(lease) = d.lease {
            v["lease"] = lease.into();
        }
        v.to_string()
    } else {
        let verdict = if d.allowed { "allowed" } else { "denied " };
        let retry = retry.map_or("never".to_owned(), |ms| format!("{ms}ms"));
        let lease = d.lease.map_or(String::new(), |id| format!(" lease={id}"));
        format!(
            "{verdict} limit={} remaining={} reset_after={}ms retry_after={retry}{lease}",
            d.limit, d.remaining, d.reset_after_ms
        )
    }
}

/// A STATUS answer as `key: value` lines or one JSON object.
pub fn render_status(s: &NodeStatus, json: bool) -> String {
    let role = match s.role {
        Role::Primary => "primary",
        Role::Standby => "standby",
    };
    if json {
        crate::node::status::to_json(s).to_string()
    } else {
        let mut out = format!(
            "role: {role}\nepoch: {}\noffset: {}\naddr: {}\nprimary: {}",
            s.epoch,
            s.offset,
            s.addr,
            if s.primary.is_empty() {
                "-"
            } else {
                &s.primary
            }
        );
        if let Some(lag) = s.field("lag_ms") {
            out.push_str(&format!("\nlag: {lag}ms"));
        }
        for (name, value) in &s.fields {
            out.push_str(&format!("\n{name}: {value}"));
        }
        out
    }
}
