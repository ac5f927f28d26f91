//! Log set-up of `tollgate serve`: lines on stderr, text or JSON,
//! filtered by `RUST_LOG` (default `info`); a line stderr cannot take is
//! dropped, never a reason to stop serving.

use crate::config::LogFormat;

pub(super) fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        // A line stderr cannot take (a closed pipe: the log's reader died)
        // is dropped. Reported, it would be `eprintln!`ed to that same
        // stderr, which panics: the server died at its next log line, or
        // hung in its shutdown.
        .log_internal_errors(false);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
