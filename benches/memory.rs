//! Resident memory per key: fills a store with N token-bucket keys of 16
//! bytes and reports RSS growth / N, beside the tables' own accounting.
//!
//! `cargo bench --bench memory -- 1000000 10000000` (counts optional; each
//! measurement runs in a fresh process). The heap is the server's: mimalloc
//! with `--huge-pages on` (the default) or, with `--huge-pages off` among
//! the arguments, without transparent huge pages.
//! Reads /proc/self/statm, so Linux only. Nothing is asserted.

use bytes::Bytes;
use tollgate::huge_pages::HugePages;
use tollgate::store::{Mode, Store, StoreConfig};
use tollgate_protocol::{Algorithm, Limit, Pair};

/// The server binary's allocator (src/main.rs), so that resident bytes are
/// what `tollgate serve` would hold.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("linux /proc");
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm resident field");
    pages * 4096
}

fn measure(keys: usize, algorithm: Algorithm) {
    let before = rss_bytes();
    let store = Store::new(StoreConfig::default());
    let limit = Limit {
        algorithm,
        count: 100,
        period_ms: 1000,
        // Bursts for the buckets; the others take none. A sliding log and a
        // concurrency limit hold one entry (timestamp, lease) per charge.
        burst: match algorithm {
            Algorithm::TokenBucket | Algorithm::LeakyBucket => 100,
            _ => 0,
        },
    };
    let now = 1_000_000_000;
    let mut key = Vec::with_capacity(16);
    for i in 0..keys {
        key.clear();
        // 16 bytes: "rl:{" + 8 hex digits + "}:ab".
        key.extend_from_slice(format!("rl:{{{i:08x}}}:ab").as_bytes());
        let pair = Pair {
            key: Bytes::copy_from_slice(&key),
            limit: limit.into(),
            cost: 1,
        };
        store.check(std::slice::from_ref(&pair), now, Mode::Charge);
    }
    let after = rss_bytes();
    assert_eq!(store.len(), keys);
    println!(
        "{:>15} {:>10} keys: {:>6.1} B/key resident, {:>6.1} B/key in tables",
        algorithm.name(),
        keys,
        (after - before) as f64 / keys as f64,
        store.memory_bytes() as f64 / keys as f64,
    );
}

fn main() {
    let held = tollgate::huge_pages::hold().expect("prctl");
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let huge_pages = match args.iter().position(|a| a == "--huge-pages") {
        Some(at) => {
            let mode = match args.get(at + 1).map(String::as_str) {
                Some("on") => HugePages::On,
                Some("off") => HugePages::Off,
                other => panic!("--huge-pages on|off, not {other:?}"),
            };
            args.drain(at..at + 2);
            mode
        }
        None => HugePages::On,
    };
    let applied = held.apply(huge_pages).expect("huge-page policy");
    let counts: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let counts = if counts.is_empty() {
        vec![1_000_000]
    } else {
        counts
    };
    // `--one ALGORITHM COUNT`: measure in this process. Otherwise run each
    // combination in a fresh process, so no run reuses memory another freed.
    if let [flag, name, n] = &args[..] {
        if flag == "--one" {
            let algorithm = Algorithm::ALL
                .into_iter()
                .find(|a| a.name() == name)
                .expect("algorithm name");
            measure(n.parse().expect("count"), algorithm);
            return;
        }
    }
    let mode = match huge_pages {
        HugePages::On => "on",
        HugePages::Off => "off",
    };
    println!(
        "mimalloc, --huge-pages {mode}, host THP mode {}",
        applied.host.map_or("none", |h| h.name())
    );
    let exe = std::env::current_exe().expect("own path");
    for &n in &counts {
        for algorithm in Algorithm::ALL {
            let status = std::process::Command::new(&exe)
                .args([
                    "--huge-pages",
                    mode,
                    "--one",
                    algorithm.name(),
                    &n.to_string(),
                ])
                .status()
                .expect("run measurement");
            assert!(status.success());
        }
    }
}
