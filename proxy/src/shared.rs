//! State shared by the request path, the admin API and the drain logic.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::Arc;

use admission_core::audit::AuditCounters;
use admission_core::AdmissionEngine;
use control_api::{SidecarStatus, SidecarView, TableStore};

use crate::app_time::AppTime;
use crate::control_loop::ControlLoop;
use crate::inflight::InflightLimit;
use crate::own_time::DownstreamWaits;

/// State shared by the request path, the admin API and the drain logic.
pub struct Shared {
    pub engine: AdmissionEngine,
    pub limit: Arc<InflightLimit>,
    /// Drives `limit` from the app's response times; feeds the engine the queue's state.
    pub control: ControlLoop,
    pub audit: Arc<AuditCounters>,
    pub table: Arc<TableStore>,
    /// How long the app typically takes per request.
    pub app_time: AppTime,
    /// With the egress role on: the app's waits on its downstreams, paired with the
    /// inbound requests they serve (see [`crate::own_time`]).
    pub waits: Option<Arc<DownstreamWaits>>,
    /// Requests inside the sidecar (from the first phase to logging).
    pub(crate) active: AtomicUsize,
    /// What `/ready` answers: set once every listener is bound and the inbound one accepts
    /// (the table is loaded before any of them), cleared for good at a graceful stop,
    /// before the drain delay, while weir still serves.
    pub(crate) ready: AtomicBool,
    /// Set when the inbound listener stops accepting (after the drain delay).
    pub(crate) draining: AtomicBool,
}

/// Counts a request as active while alive.
pub struct ActiveRequest(Arc<Shared>);

// === impl Shared ===

impl Shared {
    pub(crate) fn active_request(self: &Arc<Self>) -> ActiveRequest {
        self.active.fetch_add(1, AcqRel);
        ActiveRequest(self.clone())
    }

    /// Requests inside the sidecar now (queued or in flight).
    pub fn active(&self) -> usize {
        self.active.load(Acquire)
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Acquire)
    }

    /// The window timer's turn (every 50 ms): the queue's depth and oldest waiter to the
    /// engine (which closes windows, early ones included), and the adaptive limit.
    pub fn control_tick(&self) {
        self.control.tick(&self.engine, &self.limit);
    }

    /// Whether `/ready` answers 200 (see [`Shared::ready`]'s field).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Acquire)
    }

    pub(crate) fn set_started(&self) {
        self.ready.store(true, Release);
    }

    /// A graceful stop began: `/ready` fails from now on, whatever else happens.
    pub(crate) fn stop_ready(&self) {
        self.ready.store(false, Release);
    }

    pub(crate) fn start_draining(&self) {
        self.stop_ready();
        self.draining.store(true, Release);
    }
}

impl Drop for ActiveRequest {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, AcqRel);
    }
}

impl SidecarView for Shared {
    fn status(&self) -> SidecarStatus {
        SidecarStatus {
            engine: self.engine.status(),
            inflight: self.limit.inflight() as u64,
            max_inflight: self.limit.limit() as u64,
            queue_depth: self.limit.queued() as u64,
            max_queued: self.limit.max_queued() as u64,
            draining: self.draining(),
        }
    }

    fn ready(&self) -> bool {
        self.is_ready() && !self.draining()
    }
}
