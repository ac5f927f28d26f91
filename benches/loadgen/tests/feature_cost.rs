//! `benches/feature-cost.sh` (docs/BENCHMARKS.md, "The price of each
//! feature") runs every setup it promises against real processes it starts
//! itself (Tollgate, Redis + Lua, Redis + redis-cell, nats-server, etcd, a
//! standby, two peer regions, TLS) and prints a measurement for each, then
//! the medians with each feature's cost and the ratios to Redis. Short
//! windows, a small key space and the debug build of `tollgate` (built
//! beside this test by the workspace's `--all-features` run): only that
//! every row and ratio is printed, with no failed check, is asserted, never
//! a figure.

use std::path::PathBuf;
use std::process::Command;

/// The `tollgate` binary the workspace build put beside this test's own
/// directory (target/debug/tollgate).
fn tollgate_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("this test's path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let binary = dir.join("tollgate");
    assert!(
        binary.exists(),
        "{} is missing: build it with `cargo build -p tollgate --features cluster,events` \
         (the workspace's --all-features test run builds it)",
        binary.display()
    );
    binary
}

#[test]
fn feature_cost_prints_every_promised_row() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../feature-cost.sh");
    let output = Command::new("bash")
        .arg(script)
        .env("TOLLGATE", tollgate_binary())
        .env("BENCH", env!("CARGO_BIN_EXE_tollgate-bench"))
        .env("ROUNDS", "1")
        .env("DURATION", "3")
        .env("WARMUP", "0")
        .env("KEYS", "1000")
        // Away from the ports other tests pick (free ephemeral ones).
        .env("PORT_BASE", "17940")
        .output()
        .expect("run feature-cost.sh");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "feature-cost.sh failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let (runs, medians) = stdout
        .split_once("medians over")
        .expect("a summary after the runs");
    let rows = [
        ("tollgate", "50x16x1"),
        ("tollgate", "4x8x64"),
        ("redis-lua", "50x16x1"),
        ("redis-lua", "4x8x64"),
        ("redis-cell", "50x16x1"),
        ("redis-cell", "4x8x64"),
        ("events", "50x16x1"),
        ("cluster", "50x16x1"),
        ("routing", "50x16x1"),
        ("standby", "50x16x1"),
        ("regional", "50x16x1"),
        ("global", "50x16x1"),
        ("check2", "50x16x1"),
        ("tls", "50x16x1"),
    ];
    for (setup, shape) in rows {
        for text in [runs, medians] {
            let line = text
                .lines()
                .find(|l| l.split_whitespace().take(2).eq([setup, shape]))
                .unwrap_or_else(|| panic!("no {setup} {shape} row:\n{stdout}"));
            // checks/s, server and generator CPU per check, checks per
            // server CPU-second: all measured, so all above zero.
            let figures: Vec<f64> = line
                .split_whitespace()
                .skip(2)
                .take(4)
                .map(|f| f.parse().unwrap_or_else(|_| panic!("{line}")))
                .collect();
            assert!(
                figures.len() == 4 && figures.iter().all(|f| *f > 0.0),
                "{line}"
            );
        }
    }
    for (setup, cost) in [
        ("events", "%"),
        ("cluster", "%"),
        ("routing", "% client"),
        ("standby", "%"),
        ("global", "% vs regional"),
        ("check2", "%"),
        ("tls", "%"),
    ] {
        let line = medians
            .lines()
            .find(|l| l.starts_with(setup))
            .expect("its median");
        assert!(line.trim_end().ends_with(cost), "{line}");
    }
    for ratio in [
        "at 50x16x1: tollgate / redis-lua",
        "at 50x16x1: tollgate / redis-cell",
        "at 4x8x64: tollgate / redis-lua",
        "at 4x8x64: tollgate / redis-cell",
    ] {
        assert!(medians.contains(ratio), "{ratio}:\n{medians}");
    }
}
