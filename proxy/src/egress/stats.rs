//! What the egress role did, counted: per business class and outcome in the same
//! `AuditCounters` the inbound role counts with (one atomic add per request; the control
//! API renders both as the one `weir_requests_total{role,business,outcome}` family at
//! scrape time), and the rest through the process's metrics recorder.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use admission_core::audit::{AuditCounters, Outcome};
use admission_core::downstream::Observation;
use metrics::Counter;

use crate::refusal::WeirError;

/// The egress outcomes (the `outcome` label of `weir_requests_total{role="egress"}`):
/// [`Outcome::Admitted`] (sent to the downstream), [`Outcome::ShedDownstream`] (refused
/// locally: the downstream's cached level would shed it) and [`Outcome::ShedDeadline`]
/// (refused locally: its budget was spent before it was sent).
pub use admission_core::audit::Outcome as EgressOutcome;

/// Metric names of the egress role (`weir_requests_total` is rendered by the control API).
pub const DOWNSTREAM_LEVEL_METRIC: &str = "weir_downstream_level";
pub const LEVEL_HEADERS_TOTAL: &str = "weir_downstream_level_headers_total";
pub const ERRORS_TOTAL: &str = "weir_egress_errors_total";
pub const REJECTED_TOTAL: &str = "weir_egress_rejected_total";
const LEVEL_HEADER_RESULTS: [&str; 5] =
    ["cached", "uncached_over_max_authorities", "absent", "malformed", "repeated"];

/// What the egress role did (see the module's documentation).
pub struct EgressStats {
    /// Per business class and outcome; the same counters the control API renders.
    requests: Arc<AuditCounters>,
    /// Requests answered with weir's own error (downstream unreachable, silent, garbage).
    errors: AtomicU64,
    errors_metric: Counter,
    /// What the responses' level headers did to the cache (`result` label).
    level_headers: [Counter; 5],
    /// Requests refused before anything was sent, by [`Rejection`].
    rejected: [(AtomicU64, Counter); Rejection::ALL.len()],
}

/// Requests the egress refuses to send at all: the app (or whoever reached the egress)
/// asked for something it must not do. Not downstream errors, not shedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// A scheme other than `http`: it would go out as cleartext HTTP.
    Scheme,
    /// Its `Via` names this egress: it has come round a loop.
    ViaLoop,
    /// Its downstream address is one of this sidecar's own listeners.
    OwnListener,
}

impl Rejection {
    pub const ALL: [Rejection; 3] = [Rejection::Scheme, Rejection::ViaLoop, Rejection::OwnListener];

    /// The `reason` label of `weir_egress_rejected_total`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Rejection::Scheme => "scheme",
            Rejection::ViaLoop => "via_loop",
            Rejection::OwnListener => "own_listener",
        }
    }

    /// The error weir answers with (`x-weir-error` and the status).
    pub(super) fn error(self) -> WeirError {
        match self {
            Rejection::Scheme => WeirError::UnsupportedScheme,
            Rejection::ViaLoop | Rejection::OwnListener => WeirError::LoopDetected,
        }
    }

    /// INVALID_ARGUMENT for the scheme, FAILED_PRECONDITION for a loop: retrying the same
    /// call cannot help either way.
    pub(super) fn grpc_status(self) -> &'static str {
        match self {
            Rejection::Scheme => "3",
            Rejection::ViaLoop | Rejection::OwnListener => "9",
        }
    }

    /// The response body (and `grpc-message`): what was refused and why.
    pub(super) fn message(self) -> &'static str {
        match self {
            Rejection::Scheme => {
                "weir egress: only http:// requests are forwarded (https:// and other schemes \
                 would go out as cleartext HTTP)"
            }
            Rejection::ViaLoop => {
                "weir egress: this request has already passed through this egress (its Via \
                 names it): a forwarding loop"
            }
            Rejection::OwnListener => {
                "weir egress: the downstream address is one of this sidecar's own listeners: \
                 a forwarding loop"
            }
        }
    }
}

// === impl EgressStats ===

impl EgressStats {
    /// `requests`: the egress's per-class counters (rendered by the control API).
    pub(super) fn new(requests: Arc<AuditCounters>) -> Self {
        let _ = crate::telemetry::prometheus();
        metrics::describe_gauge!(
            DOWNSTREAM_LEVEL_METRIC,
            "A downstream's cached admission level (business * 128 + user); 32767 when expired"
        );
        metrics::describe_counter!(
            LEVEL_HEADERS_TOTAL,
            "Level headers on downstream responses, by what the egress cache did with them"
        );
        metrics::describe_counter!(
            ERRORS_TOTAL,
            "Outbound requests answered with weir's own error (downstream down, silent, garbage)"
        );
        metrics::describe_counter!(
            REJECTED_TOTAL,
            "Outbound requests refused before sending: a forwarding loop or a scheme other than http"
        );
        EgressStats {
            requests,
            errors: AtomicU64::new(0),
            errors_metric: metrics::counter!(ERRORS_TOTAL),
            level_headers: LEVEL_HEADER_RESULTS
                .map(|r| metrics::counter!(LEVEL_HEADERS_TOTAL, "result" => r)),
            rejected: Rejection::ALL.map(|r| {
                (AtomicU64::new(0), metrics::counter!(REJECTED_TOTAL, "reason" => r.as_str()))
            }),
        }
    }

    #[inline]
    pub(super) fn record(&self, business: u8, outcome: Outcome) {
        self.requests.record(business, outcome);
    }

    pub(super) fn reject(&self, rejection: Rejection) {
        let (count, metric) = &self.rejected[rejection as usize];
        count.fetch_add(1, Relaxed);
        metric.increment(1);
    }

    pub(super) fn error(&self) {
        self.errors.fetch_add(1, Relaxed);
        self.errors_metric.increment(1);
    }

    pub(super) fn level_header(&self, observation: Observation) {
        let i = match observation {
            Observation::Cached(_) => 0,
            Observation::Uncached(_) => 1,
            Observation::Absent => 2,
            Observation::Malformed(_) => 3,
            Observation::Repeated => 4,
        };
        self.level_headers[i].increment(1);
    }

    /// Requests refused for `rejection` so far.
    pub fn rejected(&self, rejection: Rejection) -> u64 {
        self.rejected[rejection as usize].0.load(Relaxed)
    }

    /// Requests of `business` with `outcome` so far.
    pub fn count(&self, business: u8, outcome: Outcome) -> u64 {
        self.requests.snapshot().classes[business as usize].get(outcome)
    }

    /// Requests with `outcome` so far, all classes.
    pub fn total(&self, outcome: Outcome) -> u64 {
        self.requests.snapshot().classes.iter().map(|c| c.get(outcome)).sum()
    }

    pub fn errors(&self) -> u64 {
        self.errors.load(Relaxed)
    }
}
