//! A container's command line as a deployment file starts it, and running
//! it with the real binary and `--print-config` appended.
//!
//! Invariant: the command runs as the container would run it (the same argv
//! and environment, nothing else from the test's environment), except that
//! `tollgate` is this build's binary.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

/// One container of a deployment file that runs the Tollgate image.
#[derive(Debug, Clone)]
pub struct Launch {
    /// Where it comes from, e.g. `deploy/compose/pair.yml: service tollgate-a`.
    pub origin: String,
    /// The container's argv: `tollgate serve ...`, or e.g. `/bin/sh -c
    /// SCRIPT NAME` whose script ends in `exec tollgate serve ... "$@"`.
    pub argv: Vec<String>,
    /// The container's environment as the file sets it (secrets filled in
    /// by the reader).
    pub env: BTreeMap<String, String>,
}

impl Launch {
    /// Runs the command with `--print-config` appended; the effective
    /// settings as JSON, or why the binary refused them.
    pub fn print_config(&self) -> Result<serde_json::Value, String> {
        let (program, args) = self
            .argv
            .split_first()
            .ok_or_else(|| format!("{}: empty command", self.origin))?;
        let bin = Path::new(BIN);
        let mut command = if program == "tollgate" || program.ends_with("/tollgate") {
            Command::new(bin)
        } else {
            Command::new(program)
        };
        // A script finds `tollgate` on PATH: this build's binary first.
        let dir = bin.parent().expect("the binary is in a directory");
        let out = command
            .args(args)
            .arg("--print-config")
            .env_clear()
            .envs(&self.env)
            .env("PATH", format!("{}:/usr/bin:/bin", dir.display()))
            .output()
            .map_err(|e| format!("{}: cannot run {program}: {e}", self.origin))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            return Err(format!(
                "{}: `{} --print-config` failed ({}):\n{stderr}",
                self.origin,
                self.argv.join(" "),
                out.status
            ));
        }
        let config: serde_json::Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| format!("{}: --print-config printed no JSON ({e})", self.origin))?;
        if config.get("listen").is_none() {
            return Err(format!(
                "{}: the command ran, but not `tollgate serve`: {config}",
                self.origin
            ));
        }
        Ok(config)
    }
}

/// Whether an image reference names the Tollgate image (`tollgate`,
/// `tollgate:local`, `registry/x/tollgate:0.1.0`), not etcd or another
/// sidecar.
pub fn is_tollgate_image(image: &str) -> bool {
    let name = image.rsplit('/').next().unwrap_or(image);
    let name = name.split(['@', ':']).next().unwrap_or(name);
    name == "tollgate"
}

/// The value of `--flag VALUE` (or `--flag=VALUE`) in an argv.
pub fn flag_value<'a>(argv: &'a [String], flag: &str) -> Option<&'a str> {
    let joined = format!("{flag}=");
    argv.iter().enumerate().find_map(|(i, a)| {
        if a == flag {
            argv.get(i + 1).map(String::as_str)
        } else {
            a.strip_prefix(&joined)
        }
    })
}
