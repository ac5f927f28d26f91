//! The status page: `GET /` on the admin port, one server-rendered HTML
//! page for people (the JSON endpoints are for programs).
//!
//! It shows what `tollgate status`, `GET /v1/rules`, `GET /v1/throttled`
//! and the memory gauges show, in tables: the node's role, epoch and
//! replication state, the cluster's shards (in cluster mode), the rules in
//! force with their decision counts, the most throttled keys, and keys and
//! memory against the cap. It reloads itself every `--status-refresh`
//! (a `<meta http-equiv="refresh">`: no script, no build step).
//!
//! Invariants:
//! - every value from outside (keys, rule names, addresses) goes through
//!   `maud`'s escaping; nothing is inserted as raw HTML, so a key such as
//!   `<script>` shows as text;
//! - reading it charges nothing and takes no lock longer than a scrape of
//!   `/metrics` does (memory and key counts visit each stripe once);
//! - it is behind the admin token like every endpoint but the probes.

use super::Shared;
use crate::clock::NANOS_PER_MS;
use crate::node::status;
use crate::rules::DecisionCounters;
use maud::{html, Markup, DOCTYPE};
use std::time::Duration;
use tollgate_protocol::{ClusterTopology, NodeStatus, Role};

/// Throttled keys the page lists (the JSON endpoint takes `?top=`).
pub const STATUS_TOP_KEYS: usize = 20;

/// Bytes in a MiB, for the memory table.
const MIB: f64 = (1u64 << 20) as f64;

/// Everything the page shows, read once per request.
struct Snapshot {
    node: NodeStatus,
    cluster: Option<ClusterTopology>,
    rules: Vec<RuleRow>,
    throttled: Vec<(String, u64)>,
    throttled_window_ms: u64,
    keys: usize,
    memory: usize,
    max_memory: Option<usize>,
    evicted: u64,
    refused: u64,
}

/// One row of the rules table.
struct RuleRow {
    name: String,
    algorithm: &'static str,
    rate: String,
    shadow: bool,
    allowed: u64,
    denied: u64,
    shadow_denied: u64,
}

impl RuleRow {
    fn new(name: String, algorithm: &'static str, rate: String, shadow: bool) -> Self {
        Self {
            name,
            algorithm,
            rate,
            shadow,
            allowed: 0,
            denied: 0,
            shadow_denied: 0,
        }
    }

    fn counted(mut self, c: &DecisionCounters) -> Self {
        self.allowed = c.allowed.get();
        self.denied = c.denied.get();
        self.shadow_denied = c.shadow_denied.get();
        self
    }
}

/// **Cluster mode hook.** The topology the status page shows in its
/// "Cluster" section: `None` outside cluster mode (the section is left
/// out); in cluster mode the routing table's [`ClusterTopology`], the same
/// map a TOPOLOGY request is answered with, so the page renders its shards
/// and moving slots.
fn cluster_topology(shared: &Shared) -> Option<ClusterTopology> {
    shared
        .engine
        .node()
        .cluster_json()
        .is_some()
        .then(|| shared.engine.node().topology())
}

fn snapshot(shared: &Shared, max_memory: Option<usize>) -> Snapshot {
    let now = shared.engine.now();
    let rules = shared.engine.rules().current();
    let mut rows: Vec<RuleRow> = rules
        .sorted()
        .into_iter()
        .map(|r| {
            RuleRow::new(
                r.name().to_owned(),
                r.limit.algorithm.name(),
                r.spec.rate.text.clone(),
                r.shadow(),
            )
            .counted(&r.counters)
        })
        .collect();
    rows.push(
        RuleRow::new(
            crate::rules::spec::INLINE_LABEL.to_owned(),
            "(any)",
            "(in the request)".to_owned(),
            false,
        )
        .counted(shared.engine.metrics().inline()),
    );
    let sketch = shared.engine.throttled();
    let throttled = sketch
        .top(STATUS_TOP_KEYS.min(sketch.capacity()), now)
        .into_iter()
        .map(|t| (printable_key(&t.key), t.denied))
        .collect();
    let store = shared.engine.store_figures();
    Snapshot {
        node: shared.engine.node().status(),
        cluster: cluster_topology(shared),
        rules: rows,
        throttled,
        throttled_window_ms: sketch.window() / NANOS_PER_MS,
        keys: store.keys,
        memory: store.memory,
        max_memory,
        evicted: store.evicted,
        refused: store.refused,
    }
}

/// A key as text: UTF-8 as is (escaped when rendered), other bytes as
/// `\xNN`.
fn printable_key(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(s) => s.to_owned(),
        Err(_) => key.escape_ascii().to_string(),
    }
}

/// The page, as sent: `max_memory` is `--max-memory` (None: no cap),
/// `refresh` `--status-refresh`.
pub(super) fn render(shared: &Shared, max_memory: Option<usize>, refresh: Duration) -> String {
    page(&snapshot(shared, max_memory), refresh).into_string()
}

fn page(s: &Snapshot, refresh: Duration) -> Markup {
    let role = match s.node.role {
        Role::Primary => "primary",
        Role::Standby => "standby",
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta http-equiv="refresh" content=(refresh.as_secs().max(1));
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "Tollgate " (role) " " (s.node.addr) }
                style { (STYLE) }
            }
            body {
                h1 { "Tollgate " span.role { (role) } " " code { (s.node.addr) } }
                p.note { "Refreshes every " (refresh.as_secs().max(1)) " s." }
                (node_section(&s.node, role))
                @if let Some(topology) = &s.cluster { (cluster_section(topology)) }
                (rules_section(&s.rules))
                (throttled_section(&s.throttled, s.throttled_window_ms))
                (memory_section(s))
            }
        }
    }
}

fn node_section(node: &NodeStatus, role: &str) -> Markup {
    let json = status::to_json(node);
    html! {
        section {
            h2 { "Node" }
            table #node {
                tr { th { "role" } td { (role) } }
                tr { th { "epoch" } td { (node.epoch) } }
                tr { th { "offset" } td { (node.offset) } }
                tr { th { "address" } td { (node.addr) } }
                @if !node.primary.is_empty() {
                    tr { th { "primary" } td { (node.primary) } }
                }
                @for (name, _) in &node.fields {
                    tr { th { (name) } td { (json[name.as_str()]) } }
                }
            }
        }
    }
}

fn cluster_section(t: &ClusterTopology) -> Markup {
    html! {
        section {
            h2 { "Cluster (topology version " (t.version) ")" }
            table #cluster {
                tr { th { "shard" } th { "slots" } th { "primary" } th { "epoch" } th { "standbys" } }
                @for shard in &t.shards {
                    tr {
                        td { (shard.id) }
                        td { @for (i, span) in shard.slots.iter().enumerate() {
                            @if i > 0 { ", " } (span.first) "-" (span.last)
                        } }
                        td { @if shard.primary.is_empty() { em { "none" } } @else { (shard.primary) } }
                        td { (shard.epoch) }
                        td { (shard.standbys.join(", ")) }
                    }
                }
            }
            @if !t.moving.is_empty() {
                table #moving {
                    tr { th { "moving slots" } th { "from shard" } th { "to shard" } }
                    @for m in &t.moving {
                        tr { td { (m.slots.first) "-" (m.slots.last) } td { (m.from) } td { (m.to) } }
                    }
                }
            }
        }
    }
}

fn rules_section(rules: &[RuleRow]) -> Markup {
    html! {
        section {
            h2 { "Rules" }
            table #rules {
                tr {
                    th { "rule" } th { "algorithm" } th { "rate" } th { "mode" }
                    th.num { "allowed" } th.num { "denied" } th.num { "shadow-denied" }
                }
                @for r in rules {
                    tr {
                        td { code { (r.name) } }
                        td { (r.algorithm) }
                        td { (r.rate) }
                        td { @if r.shadow { "shadow" } @else { "enforced" } }
                        td.num { (r.allowed) }
                        td.num { (r.denied) }
                        td.num { (r.shadow_denied) }
                    }
                }
            }
        }
    }
}

fn throttled_section(keys: &[(String, u64)], window_ms: u64) -> Markup {
    html! {
        section {
            h2 { "Top throttled keys" }
            p.note { "Denials over the last one to two windows of " (window_ms) " ms." }
            table #throttled {
                tr { th { "key" } th.num { "denied" } }
                @for (key, denied) in keys {
                    tr { td { code { (key) } } td.num { (denied) } }
                }
                @if keys.is_empty() {
                    tr { td colspan="2" { em { "no denials in the window" } } }
                }
            }
        }
    }
}

fn memory_section(s: &Snapshot) -> Markup {
    let used = s.memory as f64 / MIB;
    html! {
        section {
            h2 { "Memory" }
            table #memory {
                tr { th { "keys" } td.num { (s.keys) } }
                tr { th { "memory" } td.num { (format!("{used:.1} MiB")) } }
                @match s.max_memory {
                    Some(cap) => {
                        tr { th { "cap (--max-memory)" } td.num { (format!("{:.1} MiB", cap as f64 / MIB)) } }
                        tr {
                            th { "used" }
                            td.num {
                                (format!("{:.1} %", 100.0 * s.memory as f64 / cap.max(1) as f64))
                                " " meter min="0" max=(cap) value=(s.memory) {}
                            }
                        }
                    }
                    None => { tr { th { "cap (--max-memory)" } td.num { "none" } } }
                }
                tr { th { "evicted at the cap" } td.num { (s.evicted) } }
                tr { th { "refused at the cap" } td.num { (s.refused) } }
            }
        }
    }
}

const STYLE: &str = "\
body{font-family:system-ui,sans-serif;margin:1.5em;color:#1d2330;background:#f6f7f9}\
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.4em}\
.role{background:#2d6cdf;color:#fff;padding:0 .4em;border-radius:4px}\
table{border-collapse:collapse;background:#fff;min-width:24em}\
th,td{border:1px solid #c9ced8;padding:.25em .6em;text-align:left}\
th{background:#e7ebf2}.num{text-align:right}.note{color:#5a6272;font-size:.9em}\
meter{width:8em}";

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_protocol::{MovingSlots, ShardInfo, SlotSpan};

    fn snapshot_with(key: &str) -> Snapshot {
        Snapshot {
            node: NodeStatus {
                role: Role::Primary,
                epoch: 7,
                offset: 42,
                addr: "127.0.0.1:7700".into(),
                primary: String::new(),
                fields: vec![("synced".into(), 1)],
            },
            cluster: None,
            rules: vec![RuleRow::new(
                "api".into(),
                "token-bucket",
                "5/s".into(),
                true,
            )],
            throttled: vec![(key.to_owned(), 3)],
            throttled_window_ms: 60_000,
            keys: 10,
            memory: 1 << 20,
            max_memory: Some(4 << 20),
            evicted: 0,
            refused: 0,
        }
    }

    #[test]
    fn keys_are_escaped() {
        let html = page(
            &snapshot_with("<img src=x onerror=alert(1)>&\""),
            Duration::from_secs(5),
        )
        .into_string();
        assert!(!html.contains("<img"), "{html}");
        assert!(html.contains("&lt;img src=x onerror=alert(1)&gt;&amp;&quot;"));
        assert!(html.contains(r#"<meta http-equiv="refresh" content="5">"#));
        assert!(html.contains("25.0 %"));
    }

    #[test]
    fn the_cluster_section_shows_shards_and_moves() {
        let mut s = snapshot_with("k");
        s.cluster = Some(ClusterTopology {
            version: 9,
            shards: vec![ShardInfo {
                id: 1,
                epoch: 3,
                primary: String::new(),
                standbys: vec!["10.0.0.2:7700".into()],
                slots: vec![SlotSpan { first: 0, last: 99 }],
            }],
            moving: vec![MovingSlots {
                slots: SlotSpan { first: 5, last: 6 },
                from: 1,
                to: 2,
            }],
        });
        let html = page(&s, Duration::from_secs(5)).into_string();
        assert!(html.contains("topology version 9"));
        assert!(html.contains("<td>0-99</td>"), "{html}");
        assert!(html.contains("<em>none</em>"));
        assert!(html.contains("<td>5-6</td>"));
        // Outside cluster mode there is no such section.
        let html = page(&snapshot_with("k"), Duration::from_secs(5)).into_string();
        assert!(!html.contains("id=\"cluster\""));
    }

    #[test]
    fn binary_keys_show_as_escapes() {
        assert_eq!(printable_key(b"a\xffb"), "a\\xffb");
        assert_eq!(printable_key("é".as_bytes()), "é");
    }
}
