//! `--huge-pages`: with `on` the tables a fill allocates sit on transparent
//! huge pages (AnonHugePages of the server process grows); with `off`, and
//! without the flag (off is the default), none of them do. Which outcome
//! `on` must have depends on the host's THP mode; under `never` the test
//! says so on stderr and checks that no setting gets huge pages.

use super::*;
use bytes::Bytes;
use tollgate::huge_pages::{host_mode, HostMode};
use tollgate_protocol::{Algorithm, CheckBatch, Limit, Pair};

/// Keys checked into the server: about 16 MiB of tables (52 bytes a key at
/// this count, measured), eight huge pages and more.
const KEYS: usize = 300_000;

/// AnonHugePages of a process, in KiB.
fn anon_huge_kib(pid: u32) -> u64 {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .expect("/proc/PID/smaps_rollup (Linux 4.14+)");
    rollup
        .lines()
        .find_map(|l| l.strip_prefix("AnonHugePages:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("an AnonHugePages line")
}

/// Starts `serve` with `flags`, checks KEYS new token-bucket keys in
/// batches, and returns AnonHugePages (KiB) before and after the fill.
fn fill(flags: &[&str]) -> (u64, u64) {
    let server = ServeProcess::start(flags);
    let pid = server.child.id();
    let before = anon_huge_kib(pid);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let config = tollgate_client::ClientConfig {
            deadline: Duration::from_secs(20),
            ..Default::default()
        };
        let client = tollgate_client::Client::connect(server.addr.clone(), config)
            .await
            .expect("connect");
        let limit = Limit {
            algorithm: Algorithm::TokenBucket,
            count: 100,
            period_ms: 60_000,
            burst: 100,
        };
        for chunk in (0..KEYS).collect::<Vec<_>>().chunks(1000) {
            let mut batch = CheckBatch::with_capacity(chunk.len());
            for i in chunk {
                batch.push(Pair {
                    key: Bytes::from(format!("thp:{i:08}")),
                    limit: limit.into(),
                    cost: 1,
                });
            }
            let results = client.check_batch(batch).await.expect("batch");
            assert_eq!(results.len(), chunk.len());
            assert!(results
                .iter()
                .all(|r| matches!(r, tollgate_client::CheckResult::Decision(_))));
        }
    });
    let after = anon_huge_kib(pid);
    drop(server);
    (before, after)
}

#[test]
fn huge_pages_on_backs_the_tables_and_off_keeps_them_off() {
    let host = host_mode();
    let (on_before, on_after) = fill(&["--huge-pages", "on"]);
    let (off_before, off_after) = fill(&["--huge-pages", "off"]);
    let (default_before, default_after) = fill(&[]);
    eprintln!(
        "host THP mode {:?}: AnonHugePages on {on_before} -> {on_after} KiB, \
         off {off_before} -> {off_after} KiB, default {default_before} -> {default_after} KiB",
        host.map(HostMode::name)
    );
    // `off` never adds a huge page, whatever the host allows (only what
    // was faulted in before the flags were read may be on them), and it is
    // what a server started without the flag gets.
    assert_eq!(off_after, off_before, "--huge-pages off grew AnonHugePages");
    assert_eq!(
        default_after, default_before,
        "serve without --huge-pages grew AnonHugePages: the default must be off"
    );
    match host {
        Some(HostMode::Madvise | HostMode::Always) => assert!(
            on_after >= on_before + 4 * 2048,
            "--huge-pages on: AnonHugePages {on_before} -> {on_after} KiB after \
             {KEYS} keys, expected the tables on huge pages"
        ),
        _ => {
            eprintln!(
                "!!!!! THIS HOST HAS NO TRANSPARENT HUGE PAGES (THP mode {:?}): \
                 --huge-pages on is NOT tested here, only that it adds none !!!!!",
                host.map(HostMode::name)
            );
            assert_eq!(on_after, on_before);
        }
    }
}
