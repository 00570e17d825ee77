//! The table-file watcher: a mounted ConfigMap, re-read and applied when it changes.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::ControlPlane;
use crate::persist::digest;
use crate::source::{parse_table, read_table_bytes};

/// Polls the table file's content. Kubernetes updates a mounted ConfigMap by swapping a
/// `..data` symlink, which inotify on the file path does not reliably report; re-reading
/// through the path every interval follows the swap and costs one stat and one small read.
/// Whatever the path leads to, a poll reads at most 1 MiB + 1 byte of a regular file
/// ([`read_table_bytes`]); a poll that cannot is counted
/// (`weir_priority_table_file_unreadable_total`) and logged when its reason changes.
pub(crate) async fn watch_table_file(
    plane: Arc<ControlPlane>,
    path: PathBuf,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut last_seen = plane.applied_file_digest();
    let mut last_problem: Option<String> = None;
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        let read = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || read_table_bytes(&path)).await
        };
        let bytes = match read {
            Ok(Ok(b)) => {
                last_problem = None;
                b
            }
            Ok(Err(e)) => {
                plane.table_file_unreadable.fetch_add(1, Ordering::Relaxed);
                let problem = e.to_string();
                // Mid-swap or not mounted yet is routine; a file that stays unusable is
                // said once, not every poll.
                if last_problem.as_deref() != Some(problem.as_str()) {
                    tracing::warn!(path = %path.display(), error = %problem, "table file unreadable; the current table keeps serving");
                } else {
                    tracing::debug!(path = %path.display(), error = %problem, "table file unreadable");
                }
                last_problem = Some(problem);
                continue;
            }
            Err(e) => {
                tracing::error!(error = %e, "table file read task failed");
                continue;
            }
        };
        let d = digest(&bytes);
        if last_seen == Some(d) {
            continue;
        }
        last_seen = Some(d);
        // Parse, validate and persist on the blocking pool: nothing the file holds may
        // hold up the thread that answers probes.
        let (plane_for_errors, plane) = (&plane, plane.clone());
        let applied = tokio::task::spawn_blocking(move || {
            let table = parse_table(&String::from_utf8_lossy(&bytes))?;
            plane.commit(table, None, Some(d))
        })
        .await;
        match applied {
            Ok(Ok(t)) => tracing::warn!(
                path = %path.display(),
                version = t.version(),
                "table file changed: applied it, replacing any earlier API edits"
            ),
            Ok(Err(e)) => {
                tracing::error!(error = %e, "ignoring table file change");
                plane_for_errors.table_file_rejections.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tracing::error!(error = %e, "table file apply task failed"),
        }
    }
}
