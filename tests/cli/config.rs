//! The binary's configuration from the command line: bad flags refused
//! with a message, `--print-config` (and loading it back), a config file
//! under flags, the rules file at start and on SIGHUP, and `--resp`.

use super::*;

#[test]
fn bad_flags_are_refused_with_a_message() {
    for args in [
        &["check", "--key", "k", "--rate", "0/s"][..],
        &["check", "--key", "k", "--rate", "NaN/s"],
        &["check", "--key", "k", "--rate", "-5/s"],
        &["check", "--key", "k", "--rate", "5/s", "--cost", "-1"],
        &["check", "--key", "k", "--rate", "5/s", "--window", "10s"],
        &["check", "--key", "k", "--algorithm", "concurrency"],
        &[
            "check",
            "--key",
            "k",
            "--algorithm",
            "fixed-window",
            "--rate",
            "5/s",
            "--burst",
            "2",
        ],
        &[
            "check",
            "--key",
            "k",
            "--algorithm",
            "nope",
            "--rate",
            "5/s",
        ],
        &["release", "--key", "k", "--lease", "x"],
        &["serve", "--max-log-entries", "0"],
        &["serve", "--max-batch", "0"],
        &["serve", "--max-frame", "10"],
        &["serve", "--idle-timeout", "soon"],
    ] {
        let (code, _, err) = tollgate(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("error"), "{args:?}: {err}");
    }
}

#[test]
fn print_config_shows_the_defaults() {
    let (code, out, _) = tollgate(&["serve", "--print-config", "--max-batch", "64"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["listen"], "127.0.0.1:7700");
    assert_eq!(v["max-batch"], 64);
    assert_eq!(v["max-frame"], 1_048_576);
    assert_eq!(v["idle-timeout"], "5m");
    assert_eq!(v["auth-token"], serde_json::Value::Null);
    assert_eq!(v["max-log-entries"], 1000);
}

/// A temporary rules file, removed on drop.
struct RulesFile(std::path::PathBuf);

impl RulesFile {
    fn new(name: &str, text: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("tollgate-cli-{name}-{}.yaml", std::process::id()));
        std::fs::write(&path, text).unwrap();
        Self(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }

    /// Replaces the content by renaming a new file over it.
    fn replace(&self, text: &str) {
        let tmp = self.0.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &self.0).unwrap();
    }
}

impl Drop for RulesFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn check_rule(
    server: &ServeProcess,
    key: &str,
    rule: &str,
    repeat: &str,
) -> Vec<serde_json::Value> {
    let (code, out, err) = tollgate(&[
        "check",
        "--server",
        &server.addr,
        "--key",
        key,
        "--rule",
        rule,
        "--cost",
        "0",
        "--repeat",
        repeat,
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    decisions(&out)
}

#[test]
fn sighup_reloads_the_rules_file_and_the_cli_shows_rules_and_usage() {
    let rules = RulesFile::new(
        "sighup",
        "rules:\n  - name: api\n    rate: 1/s\n    burst: 3\n    failure-mode: closed\n",
    );
    // No polling: only the signal can reload.
    let server = ServeProcess::start(&["--rules", rules.path(), "--rules-poll", "0s"]);

    let d = check_rule(&server, "rl:{cli}:a", "api", "5");
    assert_eq!(d.iter().filter(|d| d["allowed"] == true).count(), 3);

    rules.replace("rules:\n  - name: api\n    rate: 1/s\n    burst: 2\n  - name: daily\n    algorithm: sliding-window\n    rate: 100/day\n");
    server.signal("-HUP");
    let logged = server.wait_for_log("rules loaded");
    assert_eq!(logged["fields"]["source"], "signal");
    assert_eq!(logged["fields"]["rules"], 2);

    let d = check_rule(&server, "rl:{cli}:b", "api", "5");
    assert_eq!(d.iter().filter(|d| d["allowed"] == true).count(), 2);
    assert_eq!(d[0]["limit"], 2);

    // `tollgate rules`: a table, or the API's JSON.
    let (code, out, err) = tollgate(&["rules", "--admin", &server.admin]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("daily") && out.contains("sliding-window"),
        "{out}"
    );
    let (code, out, _) = tollgate(&["rules", "--admin", &server.admin, "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["rules"].as_array().unwrap().len(), 2);
    assert_eq!(v["last_reload"]["source"], "signal");

    // A bad file on SIGHUP: logged, and the rules stay.
    rules.replace("rules:\n  - name: api\n    rate: 1/s\n    burts: 2\n");
    server.signal("-HUP");
    let logged = server.wait_for_log("rules not reloaded; the previous rules stay in force");
    let error = logged["fields"]["error"].as_str().unwrap();
    assert!(error.contains(&format!("{}:4:", rules.path())), "{error}");
    assert!(error.contains("unknown field `burts`"), "{error}");
    let (code, _, err) = tollgate(&["rules", "--admin", &server.admin]);
    assert_eq!(code, 0);
    assert!(err.contains("the last reload failed"), "{err}");

    // `tollgate usage`: the key's state under each rule of its algorithm.
    let (code, out, err) = tollgate(&["usage", "rl:{cli}:b", "--admin", &server.admin, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["usage"][0]["rule"], "api");
    assert_eq!(v["usage"][0]["used"], 2);
    let (code, out, _) = tollgate(&["usage", "rl:{cli}:b", "--admin", &server.admin]);
    assert_eq!(code, 0);
    assert!(out.contains("api") && out.contains("used 2 of 2"), "{out}");
    assert_eq!(server.terminate().code(), Some(0));
}

#[test]
fn bad_rules_stop_the_server_at_start_with_file_and_line() {
    let rules = RulesFile::new("bad-start", "rules:\n  - name: api\n    rate: 0/s\n");
    let (code, _, err) = tollgate(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "none",
        "--rules",
        rules.path(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&format!("{}:3:", rules.path())), "{err}");
    assert!(err.contains("at least 1"), "{err}");
    // No word of "previous rules" that stay: at start there are none.
    assert!(!err.contains("previous rules"), "{err}");
}

#[test]
fn config_file_under_flags_and_print_config_loads_back() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/config/tollgate.example.yaml");
    let (code, out, err) = tollgate(&["serve", "--config", example, "--print-config"]);
    assert_eq!(code, 0, "{err}");
    let defaults: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(defaults["heartbeat"], "100ms");

    let file = RulesFile::new(
        "config",
        "max-batch: 64\nheartbeat: 250ms\nrepl-timeout: 5s\nmax-memory: 64MiB\nadmin: none\n",
    );
    let (code, out, err) = tollgate(&[
        "serve",
        "--config",
        file.path(),
        "--print-config",
        "--max-batch",
        "32",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["max-batch"], 32, "the flag wins over the file");
    assert_eq!(v["heartbeat"], "250ms");
    assert_eq!(v["max-memory"], 64 << 20);
    assert_eq!(v["admin"], "none");
    assert_eq!(v["max-frame"], defaults["max-frame"]);

    // What --print-config prints is a config file giving the same settings.
    file.replace(&out);
    let (code, again, err) = tollgate(&["serve", "--config", file.path(), "--print-config"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&again).unwrap(),
        v
    );

    file.replace("max-batch: 64\nheartbeet: 250ms\n");
    let (code, _, err) = tollgate(&["serve", "--config", file.path(), "--print-config"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("unknown setting `heartbeet`"), "{err}");
    file.replace("heartbeat: 250\n");
    let (code, _, err) = tollgate(&["serve", "--config", file.path(), "--print-config"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("heartbeat"), "{err}");
}

#[test]
fn serve_with_resp_answers_redis_cli() {
    let server = ServeProcess::start(&["--resp", "127.0.0.1:0"]);
    let port = server
        .resp
        .rsplit_once(':')
        .expect("host:port")
        .1
        .to_owned();
    let cli = |words: &[&str]| {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port])
            .args(words)
            .output()
            .expect("redis-cli runs (scripts/deps.sh installs redis-tools)");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(cli(&["PING"]).trim(), "PONG");
    let out = cli(&["CL.THROTTLE", "cli-key", "15", "30", "60"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(&lines[..3], ["0", "16", "15"], "{out}");
    let status = server.terminate();
    assert!(status.success(), "{status:?}");
}

/// `serve --print-config | head`: a reader that stops early is no error
/// (a `println!` into the closed pipe panicked, with a backtrace).
#[test]
fn print_config_into_a_closed_pipe_exits_cleanly() {
    let mut child = Command::new(BIN)
        .args(["serve", "--print-config"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Closed before the child has parsed its flags, let alone written.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {err}", out.status);
    assert!(!err.contains("panicked"), "{err}");
}
