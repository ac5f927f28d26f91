//! The config file (`tollgate serve --config FILE`): the same settings as
//! the flags, by the same names, in one flat YAML mapping.
//!
//! ```yaml
//! listen: 0.0.0.0:7700
//! max-memory: 1GiB
//! heartbeat: 250ms
//! ```
//!
//! Each setting is defined once, as a flag of [`ServerConfig`]: a key of the
//! file is a flag's long name, and its value is parsed by that flag's own
//! parser, so units ("250ms", "64MiB"), ranges and enums mean the same in
//! both places. The file's values become the flags' defaults
//! ([`ConfigFile::apply`]), so whatever is given on the command line (or in
//! an environment variable such as `TOLLGATE_AUTH_TOKEN`) overrides the
//! file, and the file overrides the built-in defaults.
//!
//! Invariants: an unknown key, a list or a map where a value belongs, or a
//! value the flag would refuse is a [`FileError`] naming the file and the
//! key, before anything starts; `null` leaves a setting at its default, so
//! the output of `--print-config` loads back as a config file.

use super::ServerConfig;
use clap::{Args, Command};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A config file, read and checked.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    path: PathBuf,
    /// (argument id, value as the flag would take it), in key order.
    settings: Vec<(clap::Id, String)>,
}

/// Why a config file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Yaml { path: PathBuf, reason: String },
    #[error("{path}: unknown setting `{key}` (the settings are the flags of `tollgate serve --help`, without the dashes)")]
    Unknown { path: PathBuf, key: String },
    #[error("{path}: {key} takes one value, not a list or a map")]
    NotScalar { path: PathBuf, key: String },
    #[error("{path}: {key}: invalid value {value:?}: {reason}")]
    Invalid {
        path: PathBuf,
        key: String,
        value: String,
        reason: String,
    },
}

/// One value of the file, as YAML typed it.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Scalar {
    Null(()),
    Bool(bool),
    Unsigned(u64),
    Signed(i64),
    Float(f64),
    Text(String),
    /// A list or a map: refused, so its content is never looked at.
    Nested(#[allow(dead_code)] serde::de::IgnoredAny),
}

impl ConfigFile {
    /// Reads `path` and checks every key and value against the flags.
    pub fn load(path: &Path) -> Result<Self, FileError> {
        let text = std::fs::read_to_string(path).map_err(|source| FileError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Checks `text`, the content of the file at `path`.
    pub fn parse(path: &Path, text: &str) -> Result<Self, FileError> {
        let yaml = |e: serde_norway::Error| FileError::Yaml {
            path: path.to_owned(),
            reason: e.to_string(),
        };
        // An empty file (or one of comments only) sets nothing.
        let entries: BTreeMap<String, Scalar> = serde_norway::from_str::<Option<_>>(text)
            .map_err(yaml)?
            .unwrap_or_default();
        let flags = settings_command();
        let mut settings = Vec::with_capacity(entries.len());
        for (key, value) in entries {
            let Some(arg) = flags.get_arguments().find(|a| a.get_long() == Some(&key)) else {
                return Err(FileError::Unknown {
                    path: path.to_owned(),
                    key,
                });
            };
            let value = match value {
                Scalar::Null(()) => continue,
                Scalar::Bool(b) => b.to_string(),
                Scalar::Unsigned(n) => n.to_string(),
                Scalar::Signed(n) => n.to_string(),
                Scalar::Float(x) => x.to_string(),
                Scalar::Text(s) => s,
                Scalar::Nested(_) => {
                    return Err(FileError::NotScalar {
                        path: path.to_owned(),
                        key,
                    })
                }
            };
            if value == super::REDACTED {
                return Err(FileError::Invalid {
                    path: path.to_owned(),
                    key,
                    value,
                    reason: "--print-config hides secrets: write the secret itself, \
                             or leave it to the environment"
                        .to_owned(),
                });
            }
            let id = arg.get_id().clone();
            // The flag's own parser judges the value: clap parses defaults
            // like given values.
            let alone = flags
                .clone()
                .mut_arg(&id, |a| a.default_value(value.clone()))
                .try_get_matches_from(["tollgate serve"]);
            if let Err(e) = alone {
                return Err(FileError::Invalid {
                    path: path.to_owned(),
                    key,
                    value,
                    reason: reason(&e),
                });
            }
            settings.push((id, value));
        }
        Ok(Self {
            path: path.to_owned(),
            settings,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `command` (one that flattens [`ServerConfig`]) with this file's
    /// values as the defaults of their flags.
    pub fn apply(&self, mut command: Command) -> Command {
        for (id, value) in &self.settings {
            let value = value.clone();
            command = command.mut_arg(id, |arg| arg.default_value(value));
        }
        command
    }
}

/// A command holding exactly the settings' flags.
fn settings_command() -> Command {
    ServerConfig::augment_args(Command::new("tollgate serve"))
}

/// What a flag's parser said of a value, without clap's usage lines.
fn reason(e: &clap::Error) -> String {
    if let Some(source) = std::error::Error::source(e) {
        return source.to_string();
    }
    let text = e.render().to_string();
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let first = lines.next().unwrap_or_default();
    let first = first.strip_prefix("error: ").unwrap_or(first);
    match lines.next() {
        Some(more) if more.trim_start().starts_with('[') => format!("{first} {}", more.trim()),
        _ => first.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{FromArgMatches, Parser};

    #[derive(Debug, Parser)]
    struct Serve {
        #[command(flatten)]
        config: ServerConfig,
    }

    /// The settings `argv` gives with `file` beneath them.
    fn merged(file: &ConfigFile, argv: &[&str]) -> ServerConfig {
        let command = file.apply(<Serve as clap::CommandFactory>::command());
        let matches = command
            .try_get_matches_from(std::iter::once("serve").chain(argv.iter().copied()))
            .unwrap();
        Serve::from_arg_matches(&matches).unwrap().config
    }

    fn file(text: &str) -> Result<ConfigFile, FileError> {
        ConfigFile::parse(Path::new("t.yaml"), text)
    }

    #[test]
    fn the_example_names_every_setting_and_loads_to_the_defaults() {
        let path = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/tollgate.example.yaml"
        ));
        let example = ConfigFile::load(path).unwrap();
        let text = std::fs::read_to_string(path).unwrap();
        for arg in settings_command().get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            assert!(
                text.lines().any(|l| l.starts_with(&format!("{long}:"))),
                "the example lacks `{long}`"
            );
        }
        let config = merged(&example, &[]);
        config.validate().unwrap();
        let defaults = ServerConfig::with_listen(config.network.listen);
        assert_eq!(
            serde_json::to_value(&config).unwrap(),
            serde_json::to_value(&defaults).unwrap()
        );
    }

    #[test]
    fn the_documented_config_example_loads() {
        let example = crate::readme::yaml_after(crate::readme::CONFIGURATION, "## Config file");
        let example = file(example).expect("docs/CONFIGURATION.md example is valid");
        let config = merged(&example, &[]);
        config.validate().unwrap();
        assert_eq!(config.store.max_memory, Some(1 << 30));
    }

    #[test]
    fn flags_override_the_file_which_overrides_the_defaults() {
        let f = file(
            "max-batch: 64\nheartbeat: 250ms\nrepl-timeout: 5s\nmax-memory: 64MiB\n\
             serve-stale-reads: true\nadmin: none\nrules: r.yaml\nauth-token: null\n",
        )
        .unwrap();
        let c = merged(&f, &["--max-batch", "32"]);
        assert_eq!(c.limits.max_batch, 32);
        assert_eq!(c.replication.heartbeat.as_millis(), 250);
        assert_eq!(c.replication.repl_timeout.as_secs(), 5);
        assert_eq!(c.store.max_memory, Some(64 << 20));
        assert!(c.replication.serve_stale_reads);
        assert_eq!(c.admin.listen, crate::config::AdminAddr::Off);
        assert_eq!(c.rules.file.as_deref(), Some(Path::new("r.yaml")));
        assert_eq!(c.auth.auth_token, None);
        // Untouched by both: the built-in default.
        assert_eq!(c.limits.max_frame, crate::config::DEFAULT_MAX_FRAME);
    }

    #[test]
    fn bad_files_are_typed_errors_naming_the_key() {
        assert!(matches!(
            file("max-batches: 3\n"),
            Err(FileError::Unknown { key, .. }) if key == "max-batches"
        ));
        assert!(matches!(
            file("heartbeat: soon\n"),
            Err(FileError::Invalid { key, .. }) if key == "heartbeat"
        ));
        assert!(matches!(
            file("max-batch: -1\n"),
            Err(FileError::Invalid { key, .. }) if key == "max-batch"
        ));
        assert!(matches!(
            file("on-full: sometimes\n"),
            Err(FileError::Invalid { key, reason, .. })
                if key == "on-full" && reason.contains("evict")
        ));
        assert!(matches!(
            file("listen: [1, 2]\n"),
            Err(FileError::NotScalar { key, .. }) if key == "listen"
        ));
        assert!(matches!(file("listen: [1,\n"), Err(FileError::Yaml { .. })));
        // Flags that are not settings are not keys either.
        assert!(matches!(
            file("print-config: true\n"),
            Err(FileError::Unknown { .. })
        ));
        assert!(file("# nothing set\n").unwrap().settings.is_empty());
        assert!(matches!(
            file("auth-token: <redacted>\n"),
            Err(FileError::Invalid { key, .. }) if key == "auth-token"
        ));
        let e = file("heartbeat: soon\n").unwrap_err().to_string();
        assert!(
            e.starts_with("t.yaml: heartbeat: invalid value \"soon\""),
            "{e}"
        );
    }
}
