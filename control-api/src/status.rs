//! What the sidecar reports about itself, and the `/v1/status` document.

use admission_core::audit::AuditSnapshot;
use admission_core::{EngineStatus, Mode};
use serde::{Deserialize, Serialize};

/// A point-in-time view of the sidecar, provided by the proxy.
#[derive(Debug, Clone)]
pub struct SidecarStatus {
    pub engine: EngineStatus,
    pub inflight: u64,
    pub max_inflight: u64,
    pub queue_depth: u64,
    pub max_queued: u64,
    pub draining: bool,
}

/// Implemented by the proxy; called on every status, audit and metrics request.
pub trait SidecarView: Send + Sync + 'static {
    fn status(&self) -> SidecarStatus;
    /// Whether `/ready` should answer 200 (listeners up, not draining).
    fn ready(&self) -> bool;
    /// The egress role's per-class request counts (`weir_requests_total{role="egress"}`),
    /// when the sidecar has an egress role.
    fn egress_counters(&self) -> Option<AuditSnapshot> {
        None
    }
}

/// `GET /v1/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusDoc {
    /// `B.U`, as in `x-admission-level`.
    pub level: String,
    /// `B * 128 + U`, as in `weir_admission_level`.
    pub level_compound: u16,
    pub overloaded: bool,
    pub mode: Mode,
    /// Mean queuing time of the last closed window.
    pub mean_queuing_ms: Option<f64>,
    pub window: Option<WindowDoc>,
    pub windows_closed: u64,
    pub capacity_per_sec: Option<f64>,
    pub inflight: u64,
    pub max_inflight: u64,
    pub queue_depth: u64,
    pub max_queued: u64,
    pub draining: bool,
    pub table_version: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowDoc {
    pub duration_ms: f64,
    pub arrivals: u64,
    pub admitted: u64,
    pub dispatched: u64,
    pub mean_queuing_ms: f64,
}

// === impl StatusDoc ===

impl StatusDoc {
    pub fn new(s: &SidecarStatus, table_version: u64) -> Self {
        let window = s.engine.last_window.map(|w| WindowDoc {
            duration_ms: w.duration_ns as f64 / 1e6,
            arrivals: w.arrivals,
            admitted: w.admitted,
            dispatched: w.dispatched,
            mean_queuing_ms: w.mean_queuing_ns as f64 / 1e6,
        });
        StatusDoc {
            level: s.engine.level.encode().as_str().to_owned(),
            level_compound: s.engine.level.compound(),
            overloaded: s.engine.overloaded,
            mode: s.engine.mode,
            mean_queuing_ms: window.as_ref().map(|w| w.mean_queuing_ms),
            window,
            windows_closed: s.engine.windows_closed,
            capacity_per_sec: s.engine.capacity_per_sec,
            inflight: s.inflight,
            max_inflight: s.max_inflight,
            queue_depth: s.queue_depth,
            max_queued: s.max_queued,
            draining: s.draining,
            table_version,
        }
    }
}
