//! Reloads the rules file when it changes, by polling.
//!
//! Every `interval` the file's metadata (modification time, length) is
//! compared with the last poll; when it differs, or the file was modified
//! within the last two seconds (a same-size edit inside the file system's
//! timestamp granularity), the file is read and its text hashed. A text not
//! loaded or tried before is read a second time after a short pause and
//! loaded only if both reads agree, so an editor caught halfway through a
//! write does not produce a spurious failed reload. Polling works the same on
//! every file system, through renames and symlink swaps (the way editors and
//! Kubernetes ConfigMaps replace files), with no platform notification API.

use super::{read_file_async, Rules};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;

/// Pause between the two reads of a changed file.
const SETTLE: Duration = Duration::from_millis(50);
/// Files modified this recently are re-read even when metadata looks equal.
const RECENT: Duration = Duration::from_secs(2);

/// Polls the rules file until `shutdown`. Does nothing without a file.
pub async fn watch(rules: Arc<Rules>, interval: Duration, shutdown: CancellationToken) {
    let Some(path) = rules.path().map(ToOwned::to_owned) else {
        return;
    };
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_meta: Option<(Option<SystemTime>, u64)> = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let meta = match tokio::fs::metadata(&path).await {
            Ok(m) => (m.modified().ok(), m.len()),
            // Missing for a moment (replaced by rename) or gone: the rules in
            // force stay; the next poll looks again.
            Err(_) => continue,
        };
        let recent = meta
            .0
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age < RECENT);
        if last_meta == Some(meta) && !recent {
            continue;
        }
        last_meta = Some(meta);
        let Ok(text) = read_file_async(&path).await else {
            continue;
        };
        if rules.is_last_text(&text) {
            continue;
        }
        tokio::time::sleep(SETTLE).await;
        match read_file_async(&path).await {
            Ok(again) if again == text => {}
            // Still being written: look again at the next poll.
            _ => {
                last_meta = None;
                continue;
            }
        }
        // The outcome is logged, counted and kept for the admin API by Rules.
        let _ = rules.reload_if_new(&text).await;
    }
}
