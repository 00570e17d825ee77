//! The control plane: shared state, listeners, background tasks.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use admission_core::audit::AuditCounters;
use admission_core::table::{CompiledTable, PriorityTable};
use admission_core::FieldError;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Semaphore};

use crate::audit::{AuditHistory, WindowReport, WINDOWS};
use crate::config::{read_trimmed, AdminConfig};
use crate::error::ControlError;
use crate::persist::{digest, StateFile};
use crate::status::SidecarView;
use crate::store::{SwapError, TableStore};

/// The most CPU that unauthenticated table checks take in all, in cores, whatever is sent
/// and whatever `max_concurrent_table_checks` is: after each check its permit stays taken
/// for a cool-down ([`check_cooldown`]) that keeps every permit together within it. A
/// tenth of a core: the parse of a 1 MiB table in a release build takes about a tenth of a
/// second, so one such check a second still passes (a small table's, many), and the
/// operator's writes (which have their own permit), the probes and the data plane keep
/// the rest.
pub const UNAUTHENTICATED_CHECK_SHARE: f64 = 0.1;

/// Unauthenticated table checks that may wait for a permit, per permit (see
/// [`ControlPlane::table_check_permit`]).
pub const QUEUED_CHECKS_PER_PERMIT: usize = 8;

/// How long a table-check permit stays taken after a check that took `took`: each of
/// `permits` permits then checks at most `took / (took + cool-down)` of the time, together
/// at most [`UNAUTHENTICATED_CHECK_SHARE`] of a core (the time is the check's wall time,
/// which is never less than the CPU it used).
pub fn check_cooldown(took: Duration, permits: usize) -> Duration {
    let factor = (permits as f64 / UNAUTHENTICATED_CHECK_SHARE - 1.0).max(0.0);
    took.mul_f64(factor)
}

pub struct ControlPlane {
    pub(crate) cfg: AdminConfig,
    pub(crate) table: Arc<TableStore>,
    pub(crate) audit: Arc<AuditCounters>,
    pub(crate) view: Arc<dyn SidecarView>,
    pub(crate) metrics: PrometheusHandle,
    pub(crate) history: AuditHistory,
    state: Option<StateFile>,
    /// Digest of the table-file content the current table reflects; persisted with every
    /// change so the start-up precedence can tell whether the file changed since.
    applied_file_digest: Mutex<Option<u64>>,
    /// Table-file contents that failed to parse or validate (exported as a metric).
    pub(crate) table_file_rejections: AtomicU64,
    /// Polls of the table file that could not read it as a document: missing, not a
    /// regular file, too large, an I/O error (exported as a metric).
    pub(crate) table_file_unreadable: AtomicU64,
    background_started: AtomicBool,
    stop_background: watch::Sender<bool>,
    /// Permits for unauthenticated table validations on the blocking pool (see
    /// [`ControlPlane::check_table`]).
    table_checks: Arc<Semaphore>,
    /// Unauthenticated table checks waiting for one of those permits.
    table_checks_waiting: AtomicUsize,
    /// The threads those validations run on, at the lowest CPU priority.
    check_threads: CheckThreads,
    /// The one permit of authenticated table writes (see [`ControlPlane::write_table`]):
    /// a flood of validations cannot lock the operator out.
    table_writes: Arc<Semaphore>,
}

/// `GET /v1/audit`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditDoc {
    pub table_version: u64,
    pub level: String,
    pub overloaded: bool,
    pub last_1m: WindowReport,
    pub last_10m: WindowReport,
}

// === impl ControlPlane ===

impl ControlPlane {
    pub fn new(
        cfg: AdminConfig,
        table: Arc<TableStore>,
        audit: Arc<AuditCounters>,
        view: Arc<dyn SidecarView>,
        metrics: PrometheusHandle,
    ) -> Result<Arc<Self>, ControlError> {
        cfg.validate().map_err(|e| ControlError::Config(e.at("admin")))?;
        if let Some(path) = &cfg.token_file {
            // Fail at start, not at the first edit, when the Secret is not mounted.
            read_trimmed(path).map_err(|e| {
                ControlError::Config(FieldError::new("admin.token_file", e.to_string()))
            })?;
        }
        let cfg_checks = cfg.max_concurrent_table_checks;
        let applied = cfg
            .table_file
            .as_deref()
            .and_then(|p| crate::source::read_table_bytes(p).ok())
            .map(|b| digest(&b));
        Ok(Arc::new(ControlPlane {
            history: AuditHistory::new(cfg.audit_sample_interval, Instant::now()),
            state: cfg.state_path.as_ref().map(StateFile::new),
            cfg,
            table,
            audit,
            view,
            metrics,
            applied_file_digest: Mutex::new(applied),
            table_file_rejections: AtomicU64::new(0),
            table_file_unreadable: AtomicU64::new(0),
            background_started: AtomicBool::new(false),
            stop_background: watch::channel(false).0,
            table_checks: Arc::new(Semaphore::new(cfg_checks)),
            table_checks_waiting: AtomicUsize::new(0),
            check_threads: CheckThreads::start(cfg_checks)
                .map_err(|e| ControlError::Internal(format!("table check threads: {e}")))?,
            table_writes: Arc::new(Semaphore::new(1)),
        }))
    }

    pub fn table(&self) -> &Arc<TableStore> {
        &self.table
    }

    pub fn config(&self) -> &AdminConfig {
        &self.cfg
    }

    pub(crate) fn applied_file_digest(&self) -> Option<u64> {
        *self.applied_file_digest.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Validates, version-checks, persists and swaps in `next` (blocking: it fsyncs).
    /// `file_digest` is set when the change comes from the table file.
    pub fn commit(
        &self,
        next: PriorityTable,
        if_version: Option<u64>,
        file_digest: Option<u64>,
    ) -> Result<Arc<CompiledTable>, ControlError> {
        let swapped = self.table.swap(next, if_version, |compiled| {
            let mut applied = self.applied_file_digest.lock().unwrap_or_else(|p| p.into_inner());
            let digest = file_digest.or(*applied);
            if let Some(state) = &self.state {
                state.write(compiled.source(), digest).map_err(|source| ControlError::Persist {
                    path: state.path().into(),
                    source,
                })?;
            }
            *applied = digest;
            Ok(())
        });
        match swapped {
            Ok(t) => Ok(t),
            Err(SwapError::VersionMismatch { expected, current }) => {
                Err(ControlError::PreconditionFailed { expected, current })
            }
            Err(SwapError::Invalid(errors)) => Err(ControlError::InvalidTable(errors)),
            Err(SwapError::Persist(e)) => Err(e),
        }
    }

    /// A permit for one unauthenticated table check. With all `max_concurrent_table_checks`
    /// taken, the request waits for one in line (first come, first served), at most
    /// `timeouts.write_wait`, with at most [`QUEUED_CHECKS_PER_PERMIT`] per permit waiting;
    /// past either bound, 503 (and the connection closes: its body was never read). Taken
    /// before the body is read: a waiting or refused validation costs its head, never a
    /// read of up to `max_body_bytes`. Waiting rather than bouncing: a client refused at
    /// once comes straight back, so eight of them made some 3,000 requests a second, and
    /// the refusals and the clients' own work on the node cost more CPU than the checks.
    pub(crate) async fn table_check_permit(
        &self,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, ControlError> {
        let busy = || ControlError::Busy(self.cfg.max_concurrent_table_checks);
        if let Ok(permit) = self.table_checks.clone().try_acquire_owned() {
            return Ok(permit);
        }
        let room = self.cfg.max_concurrent_table_checks * QUEUED_CHECKS_PER_PERMIT;
        let Some(_waiting) = Waiting::join(&self.table_checks_waiting, room) else {
            return Err(busy());
        };
        let wait = self.cfg.timeouts.write_wait;
        match tokio::time::timeout(wait, self.table_checks.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(busy()),
        }
    }

    /// Runs `job` (an unauthenticated table parse and validation) with `permit` (from
    /// [`ControlPlane::table_check_permit`]) on one of the check threads, which run at the
    /// lowest CPU priority (nice 19): the admin runtime keeps answering probes and metrics,
    /// and the operator's writes and the data plane get the CPU first, whatever the body
    /// costs. The permit is then held for a cool-down ([`check_cooldown`]), so that
    /// unauthenticated callers get at most [`UNAUTHENTICATED_CHECK_SHARE`] of a core in
    /// all, whatever they send. `job` should leave the big things it made (the parsed
    /// table) behind on the check thread: freeing them is part of the check's cost.
    pub(crate) async fn check_table<T: Send + 'static>(
        self: &Arc<Self>,
        permit: tokio::sync::OwnedSemaphorePermit,
        job: impl FnOnce(&ControlPlane) -> Result<T, ControlError> + Send + 'static,
    ) -> Result<T, ControlError> {
        let plane = self.clone();
        let (answer, answered) = tokio::sync::oneshot::channel();
        let check: CheckJob = Box::new(move || {
            let started = std::time::Instant::now();
            let result = job(&plane);
            let _ = answer.send((result, started.elapsed()));
        });
        // As many threads and queue places as permits: a permit holder always finds room.
        self.check_threads
            .jobs
            .try_send(check)
            .map_err(|_| ControlError::Busy(self.cfg.max_concurrent_table_checks))?;
        let (result, took) = answered
            .await
            .map_err(|_| ControlError::Internal("a table check thread stopped".into()))?;
        let cooldown = check_cooldown(took, self.cfg.max_concurrent_table_checks);
        tokio::spawn(async move {
            tokio::time::sleep(cooldown).await;
            drop(permit);
        });
        result
    }

    /// Runs an authenticated table write (parse, validate, persist, swap) on the blocking
    /// pool with the write permit, which no validation takes: whatever unauthenticated
    /// callers send, a write waits at most for the write before it, and at most
    /// `timeouts.write_wait` (then 503).
    pub(crate) async fn write_table<T: Send + 'static>(
        self: &Arc<Self>,
        job: impl FnOnce(&ControlPlane) -> Result<T, ControlError> + Send + 'static,
    ) -> Result<T, ControlError> {
        let wait = self.cfg.timeouts.write_wait;
        let permit = tokio::time::timeout(wait, self.table_writes.clone().acquire_owned())
            .await
            .map_err(|_| {
                ControlError::WriteBusy(
                    humantime_serde::re::humantime::format_duration(wait).to_string(),
                )
            })?
            .map_err(|e| ControlError::Internal(format!("table write permit: {e}")))?;
        self.run_blocking(permit, job).await
    }

    async fn run_blocking<T: Send + 'static>(
        self: &Arc<Self>,
        permit: tokio::sync::OwnedSemaphorePermit,
        job: impl FnOnce(&ControlPlane) -> Result<T, ControlError> + Send + 'static,
    ) -> Result<T, ControlError> {
        let plane = self.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            job(&plane)
        })
        .await
        .map_err(|e| ControlError::Internal(format!("table check task: {e}")))?
    }

    /// Takes an audit sample now (the sampler task calls this periodically).
    pub fn sample_audit(&self) {
        self.history.record(Instant::now(), self.audit.snapshot());
    }

    /// The audit over the last 1 and 10 minutes, up to this instant.
    pub fn audit_report(&self) -> AuditDoc {
        let now = Instant::now();
        let current = self.audit.snapshot();
        let status = self.view.status();
        let table = self.table.load_full();
        let (level, overloaded) = (status.engine.level, status.engine.overloaded);
        let report = |span| {
            let (window, covered) = self.history.window(&current, now, span);
            WindowReport::new(&window, covered, &table, level, overloaded, &self.cfg.inflation)
        };
        AuditDoc {
            table_version: table.version(),
            level: level.encode().as_str().to_owned(),
            overloaded,
            last_1m: report(WINDOWS[0].1),
            last_10m: report(WINDOWS[1].1),
        }
    }
}

/// One place among the table checks waiting for a permit; left on drop (the request may be
/// dropped while it waits).
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    /// A place, if fewer than `room` are taken.
    fn join(waiting: &'a AtomicUsize, room: usize) -> Option<Self> {
        waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < room).then_some(n + 1))
            .ok()
            .map(|_| Waiting(waiting))
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One unauthenticated table check, run on a [`CheckThreads`] thread.
type CheckJob = Box<dyn FnOnce() + Send>;

/// `max_concurrent_table_checks` threads for unauthenticated table checks, each at nice 19
/// (on Linux a thread's own): they get only the CPU nothing else wants. The threads end
/// when the control plane (the sender) is dropped.
struct CheckThreads {
    jobs: std::sync::mpsc::SyncSender<CheckJob>,
}

impl CheckThreads {
    fn start(threads: usize) -> std::io::Result<CheckThreads> {
        let (jobs, queue) = std::sync::mpsc::sync_channel::<CheckJob>(threads);
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..threads {
            let queue = queue.clone();
            std::thread::Builder::new().name(format!("weir-table-check-{i}")).spawn(move || {
                if let Err(e) = rustix::process::nice(19) {
                    tracing::warn!(error = %e, "table check thread keeps its priority");
                }
                loop {
                    let next = match queue.lock() {
                        Ok(queue) => queue.recv(),
                        Err(_) => return,
                    };
                    match next {
                        Ok(check) => check(),
                        Err(_) => return,
                    }
                }
            })?;
        }
        Ok(CheckThreads { jobs })
    }
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane").field("listen", &self.cfg.listen).finish_non_exhaustive()
    }
}

mod listen;
mod table_file;
