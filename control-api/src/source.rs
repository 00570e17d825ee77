//! Where the table comes from: the start-up precedence and the table-file watcher.
//!
//! Rule: **the newest accepted change wins.**
//! - At start: the state file (the last accepted table) if present and valid, unless the
//!   table file's content differs from the one the state recorded (the ConfigMap was edited
//!   while the process was down; then the table file wins); without a state file, the table
//!   file; else `--table`; else the embedded default. An invalid state or table file is
//!   logged and skipped; an invalid table file or `--table` with nothing better to serve
//!   is a start-up error.
//! - At run time: API edits and table-file changes apply in the order they happen; a
//!   change of the table file's content replaces earlier API edits (logged).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use admission_core::table::{CompiledTable, PriorityTable, TableErrors};
use tokio::sync::watch;

use crate::config::AdminConfig;
use crate::error::ControlError;
use crate::persist::{digest, StateFile};
use crate::server::ControlPlane;

/// Parses a table document, JSON if it starts with `{`, else YAML.
pub fn parse_table(text: &str) -> Result<PriorityTable, TableErrors> {
    if text.trim_start().starts_with('{') {
        PriorityTable::from_json(text)
    } else {
        PriorityTable::from_yaml(text)
    }
}

/// Reads and parses a table file; also returns the digest of its content.
pub fn read_table_file(path: &Path) -> Result<(PriorityTable, u64), ControlError> {
    let bytes =
        std::fs::read(path).map_err(|source| ControlError::Io { path: path.into(), source })?;
    let text = String::from_utf8_lossy(&bytes);
    let table = parse_table(&text)
        .map_err(|e| ControlError::Config(format!("table file {}: {e}", path.display())))?;
    Ok((table, digest(&bytes)))
}

/// The table to serve at start, by the precedence in the module docs. Persists it to the
/// state path when it came from elsewhere.
pub fn load_initial_table(
    cfg: &AdminConfig,
    cli_table: Option<&Path>,
    secret: &[u8],
) -> Result<CompiledTable, ControlError> {
    let state = cfg.state_path.as_ref().map(StateFile::new);
    let persisted = state.as_ref().and_then(|s| match s.read() {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "ignoring unreadable state file");
            None
        }
    });
    let file = cfg.table_file.as_deref().map(read_table_file);
    let (mut table, origin, file_digest) = match (persisted, file) {
        (Some(p), Some(Ok((t, d)))) if p.table_file_digest != Some(d) => {
            tracing::info!("table file changed since the state was saved; it wins");
            let version = t.version.max(p.table.version + 1);
            (PriorityTable { version, ..t }, "table_file", Some(d))
        }
        (Some(p), Some(Err(e))) => {
            tracing::warn!(error = %e, "ignoring invalid table file; serving the saved state");
            (p.table, "state_path", p.table_file_digest)
        }
        (Some(p), _) => (p.table, "state_path", p.table_file_digest),
        (None, Some(Ok((t, d)))) => (t, "table_file", Some(d)),
        (None, Some(Err(e))) => return Err(e),
        (None, None) => match cli_table {
            Some(path) => (read_table_file(path)?.0, "--table", None),
            None => (PriorityTable::embedded_default(), "embedded default", None),
        },
    };
    table.version = table.version.max(1);
    let compiled = table
        .compile_with_secret(secret)
        .map_err(|e| ControlError::Config(format!("priority table from {origin}: {e}")))?;
    if let Some(state) = state.filter(|_| origin != "state_path") {
        state
            .write(compiled.source(), file_digest)
            .map_err(|source| ControlError::Persist { path: state.path().into(), source })?;
    }
    tracing::info!(origin, version = compiled.version(), "priority table loaded");
    Ok(compiled)
}

// === table-file watcher ===

/// Polls the table file's content. Kubernetes updates a mounted ConfigMap by swapping a
/// `..data` symlink, which inotify on the file path does not reliably report; re-reading
/// through the path every interval follows the swap and costs one small read.
pub(crate) async fn watch_table_file(
    plane: Arc<ControlPlane>,
    path: PathBuf,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut last_seen = plane.applied_file_digest();
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        let bytes = match tokio::fs::read(&path).await {
            Ok(b) => b,
            Err(e) => {
                // Mid-swap or not mounted yet: try again next tick.
                tracing::debug!(path = %path.display(), error = %e, "table file unreadable");
                continue;
            }
        };
        let d = digest(&bytes);
        if last_seen == Some(d) {
            continue;
        }
        last_seen = Some(d);
        let table = match parse_table(&String::from_utf8_lossy(&bytes)) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "ignoring invalid table file");
                plane.table_file_rejections.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        let (plane_for_errors, plane) = (&plane, plane.clone());
        let applied = tokio::task::spawn_blocking(move || plane.commit(table, None, Some(d))).await;
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
