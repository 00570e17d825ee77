//! State shared by the request path, the admin API and the drain logic.

use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::Arc;

use admission_core::audit::{AuditCounters, AuditSnapshot};
use admission_core::table::CompiledTable;
use admission_core::{AdmissionEngine, Clock, MonotonicClock};
use control_api::{SidecarStatus, SidecarView, TableStore};
use weir_net::drain::{Tracked, Watch};

use crate::app_time::AppTime;
use crate::config::SidecarConfig;
use crate::control_loop::ControlLoop;
use crate::inflight::InflightLimit;
use crate::own_time::DownstreamWaits;
use crate::route_level::RouteState;

/// State shared by the request path, the admin API and the drain logic.
pub struct Shared {
    pub engine: AdmissionEngine,
    pub limit: Arc<InflightLimit>,
    /// Drives `limit` from the app's response times; feeds the engine the queue's state.
    pub control: ControlLoop,
    /// The inbound role's per-class request counts (also the inflation audit's input).
    pub audit: Arc<AuditCounters>,
    /// The egress role's (zero while it is off): the same family,
    /// `weir_requests_total{role="egress"}`.
    pub egress_audit: Arc<AuditCounters>,
    pub table: Arc<TableStore>,
    /// How long the app typically takes per request.
    pub app_time: AppTime,
    /// With the egress role on: the app's waits on its downstreams, paired with the
    /// inbound requests they serve (see [`crate::own_time`]).
    pub waits: Option<Arc<DownstreamWaits>>,
    /// The inbound drain: signalled when the inbound listener stops accepting (after the
    /// drain delay); it tracks the requests inside the sidecar (queued or in flight, until
    /// their response head), which the drain waits for.
    pub(crate) drain: Watch,
    /// What `/ready` answers: set once every listener is bound and the inbound one accepts
    /// (the table is loaded before any of them), cleared for good at a graceful stop,
    /// before the drain delay, while weir still serves.
    pub(crate) ready: AtomicBool,
}

/// Counts a request as active (and the drain as not finished) while alive.
#[derive(Debug)]
pub struct ActiveRequest(#[allow(dead_code)] Tracked);

// === impl Shared ===

impl Shared {
    /// The state of a sidecar configured by `config` (validated), serving `table`; `drain`
    /// is the inbound drain's watch. Not ready until started.
    pub(crate) fn new(config: &SidecarConfig, table: CompiledTable, drain: Watch) -> Shared {
        // On the runtime's clock, as the request path's instants are (tests pause it).
        let origin = tokio::time::Instant::now().into_std();
        let engine = AdmissionEngine::new(&config.admission, MonotonicClock::starting_at(origin));
        let control = ControlLoop::new(
            config.inbound.max_inflight,
            config.inbound.adaptive_inflight,
            config.admission.queuing_threshold,
            engine.clock().now(),
        );
        control.set_middle_hop(config.egress.enabled);
        let limit = InflightLimit::new(control.limit(), config.inbound.max_queued);
        // With the egress role on, the app's calls are paired with the requests they serve,
        // so the limit sees the app's own time, not its downstreams'.
        let waits = config.egress.enabled.then(|| {
            let e = &config.egress;
            let routes = RouteState::new(&e.per_route, e.level_expiry, e.max_authorities);
            DownstreamWaits::with_routes(limit.clone(), Some(Arc::new(routes)))
        });
        Shared {
            limit,
            engine,
            control,
            audit: Arc::new(AuditCounters::new()),
            egress_audit: Arc::new(AuditCounters::new()),
            table: TableStore::new(table),
            app_time: AppTime::with_cap(config.inbound.task_timeout),
            waits,
            drain,
            ready: AtomicBool::new(false),
        }
    }

    #[inline]
    pub(crate) fn active_request(&self) -> ActiveRequest {
        ActiveRequest(self.drain.track())
    }

    /// Requests inside the sidecar now (queued or in flight).
    pub fn active(&self) -> usize {
        self.drain.in_flight()
    }

    /// Whether the inbound listener has stopped accepting.
    pub fn draining(&self) -> bool {
        self.drain.is_signaled()
    }

    /// The window timer's turn (every 50 ms): the queue's depth and oldest waiter to the
    /// engine (which closes windows, early ones included), and the adaptive limit.
    pub fn control_tick(&self) {
        if let Some(routes) = self.waits.as_ref().and_then(|w| w.routes()) {
            self.control.set_downstream_bound(routes.enabled && routes.holds.sparing());
        }
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

    fn egress_counters(&self) -> Option<AuditSnapshot> {
        Some(self.egress_audit.snapshot())
    }
}
