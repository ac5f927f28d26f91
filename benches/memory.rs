//! Resident memory per key: fills a store with N token-bucket keys of 16
//! bytes and reports RSS growth / N, beside the tables' own accounting.
//!
//! `cargo bench --bench memory -- 1000000 10000000` (counts optional; each
//! measurement runs in a fresh process). The heap is the server's: mimalloc
//! without transparent huge pages (`--huge-pages off`, the server's
//! default) or, with `--huge-pages on` among the arguments, with them.
//! Resident bytes are read once the allocator has settled (see [`settle`]),
//! and straight after the fill.
//! Reads /proc/self/statm, so Linux only. Nothing is asserted.

use tollgate::huge_pages::HugePages;
use tollgate::store::{Mode, ResolvedPair, Store, StoreConfig};
use tollgate_protocol::{Algorithm, Limit};

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

/// mimalloc's purge delay (`mi_option_purge_delay`, 1000 ms by default in
/// the bundled v3), plus a margin.
const PAST_PURGE_DELAY: std::time::Duration = std::time::Duration::from_millis(1500);

/// Lets the allocator do what it does in a running server after a fill:
/// mimalloc gives freed memory (the half-size tables each doubling left
/// behind) back to the OS only once its purge delay has passed, at the next
/// page it frees; a server under traffic frees pages all the time. Waits
/// out the delay, then `mi_collect(false)`, which purges what has expired
/// (as that next free would) without forcing anything the delay still
/// holds. With glibc this changes nothing: it unmaps a freed table at once.
fn settle() {
    std::thread::sleep(PAST_PURGE_DELAY);
    // SAFETY: `mi_collect` takes no pointers; it may be called from any
    // thread at any time (this one holds no mimalloc state mid-operation).
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_collect(false)
    };
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
        store.check(&[ResolvedPair::new(&key, limit, 1)], now, Mode::Charge);
    }
    let filled = rss_bytes();
    settle();
    let after = rss_bytes();
    assert_eq!(store.len(), keys);
    let per_key = |rss: usize| (rss - before) as f64 / keys as f64;
    println!(
        "{:>15} {:>10} keys: {:>6.1} B/key resident ({:>6.1} right after the fill), \
         {:>6.1} B/key in tables",
        algorithm.name(),
        keys,
        per_key(after),
        per_key(filled),
        store.memory_bytes() as f64 / keys as f64,
    );
}

fn main() {
    let held = tollgate::huge_pages::hold().expect("prctl");
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let huge_pages = match args.iter().position(|a| a == "--huge-pages") {
        Some(at) => {
            let value = args.get(at + 1).map_or("", String::as_str);
            let mode = <HugePages as clap::ValueEnum>::from_str(value, false)
                .unwrap_or_else(|_| panic!("--huge-pages on|off, not {value:?}"));
            args.drain(at..at + 2);
            mode
        }
        None => HugePages::Off,
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
    let mode = huge_pages.name();
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
