//! The inbound path on pingora's phases: priority (before the body), admission, the pending
//! queue (its wait is the queuing time the detector sees), the residence-time gate, the app,
//! and `x-admission-level` on the way back.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use admission_core::audit::Outcome;
use admission_core::{residence_gate, Decision, GateDecision};
use async_trait::async_trait;
use http::HeaderValue;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, ErrorSource, ErrorType, Result};

use crate::config::AppProtocol;
use crate::deadline;
use crate::inflight::{NoSlot, Slot};
use crate::priority::PriorityHeaders;
use crate::refusal::{Refusals, ShedReason};
use crate::sidecar::{ActiveRequest, Shared};
use crate::telemetry::ProxyMetrics;
use crate::wire_name::WireName;

/// The pingora application of the inbound listener.
pub struct Inbound {
    pub(crate) shared: Arc<Shared>,
    pub(crate) metrics: ProxyMetrics,
    pub(crate) refusals: Refusals,
    pub(crate) priority: PriorityHeaders,
    pub(crate) timeout_header: WireName,
    pub(crate) entry: bool,
    pub(crate) task_timeout: Duration,
    pub(crate) overload_max_wait: Duration,
    pub(crate) app: SocketAddr,
    pub(crate) app_protocol: AppProtocol,
}

/// Per-request state across the phases.
pub struct RequestCtx {
    arrival: Instant,
    deadline: Instant,
    business: u8,
    outcome: Option<Outcome>,
    grpc: bool,
    /// Holds the in-flight slot until `logging`.
    slot: Option<Slot>,
    /// When the request left the queue for the app.
    dispatched: Option<Instant>,
    /// Whether it waited in the queue (rather than finding a free slot).
    queued: bool,
    _active: Option<ActiveRequest>,
}

const GRPC_TIMEOUT: &str = "grpc-timeout";

mod steps;

#[async_trait]
impl ProxyHttp for Inbound {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        let now = Instant::now();
        RequestCtx {
            arrival: now,
            deadline: now + self.task_timeout,
            business: 0,
            outcome: None,
            grpc: false,
            slot: None,
            dispatched: None,
            queued: false,
            _active: Some(self.shared.active_request()),
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        // `new_ctx` ran just after the request header was read: `ctx.arrival` is the arrival.
        ctx.grpc = session
            .req_header()
            .headers
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
        let priority = match self.priority_of(session) {
            Ok(p) => p,
            Err(bad) => {
                let body = bytes::Bytes::from(format!("{bad}\n"));
                session.respond_error_with_body(400, body).await?;
                return Ok(true);
            }
        };
        ctx.business = priority.business;
        ctx.deadline = ctx.arrival + self.budget(session.req_header());

        let engine = &self.shared.engine;
        let mut would_shed = match engine.admit(priority) {
            Decision::Admit => false,
            Decision::WouldShed => true,
            Decision::Shed => return self.refuse(session, ctx, ShedReason::Overload).await,
        };

        let slot = match self.shared.limit.try_slot() {
            Some(slot) => {
                engine.record_queuing(Duration::ZERO);
                self.metrics.queuing_time.record(0.0);
                slot
            }
            None => {
                ctx.queued = true;
                let queued_at = Instant::now();
                let waited = self.wait_for_slot(session, priority).await;
                // A refusal by a full queue never entered it: a zero-wait sample from it would
                // dilute the very signal that says the queue is full.
                if !matches!(waited, Some(Err(NoSlot::QueueFull))) {
                    // Every request leaving the queue counts, whatever the order it left in:
                    // the queue is work-conserving, so its mean wait is the same as FIFO's.
                    let queuing = queued_at.elapsed();
                    engine.record_queuing(queuing);
                    self.metrics.queuing_time.record(queuing.as_secs_f64());
                }
                match waited {
                    Some(Ok((slot, over_bound))) => {
                        would_shed |= over_bound;
                        slot
                    }
                    // Refused by a full queue, or evicted by a more important newcomer.
                    Some(Err(no_slot)) => {
                        if no_slot == NoSlot::Evicted {
                            engine.record_gate_drop();
                        }
                        return self.refuse(session, ctx, ShedReason::Overload).await;
                    }
                    None => {
                        // Left the queue without costing the app anything.
                        engine.record_gate_drop();
                        self.metrics.queue_abandoned.increment(1);
                        return Err(Error::new_down(ErrorType::ConnectionClosed));
                    }
                }
            }
        };

        // Without a wait, the arrival is "now" to within microseconds: one clock read fewer.
        let now = if ctx.queued { Instant::now() } else { ctx.arrival };
        let clock = engine.clock();
        let gate = residence_gate(
            clock.nanos_at(ctx.arrival),
            clock.nanos_at(now),
            clock.nanos_at(ctx.deadline),
            self.task_timeout.as_nanos() as u64,
        );
        if gate != GateDecision::Forward || self.cannot_finish_in_time(ctx) || self.waited_out(ctx)
        {
            if !self.shadow() {
                drop(slot);
                // The sample above counted it as dispatched; it never reached the app, so
                // the goodput law must not count it as capacity.
                engine.record_gate_drop();
                return self.refuse(session, ctx, ShedReason::Deadline).await;
            }
            would_shed = true;
        }
        ctx.slot = Some(slot);
        ctx.dispatched = Some(now);
        ctx.outcome = Some(if would_shed { Outcome::WouldShed } else { Outcome::Admitted });
        Ok(false)
    }

    async fn upstream_peer(
        &self,
        session: &mut Session,
        _ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        let mut peer = HttpPeer::new(self.app, false, String::new());
        let h2c = match self.app_protocol {
            AppProtocol::Auto => session.is_http2(),
            AppProtocol::Http1 => false,
            AppProtocol::H2c => true,
        };
        if h2c {
            peer.options.set_http_version(2, 2);
            peer.options.max_h2_streams = 128;
        }
        Ok(Box::new(peer))
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        // The app gets what is left of the caller's budget, not the budget it arrived with.
        let remaining = ctx.deadline.saturating_duration_since(Instant::now());
        let mut buf = [0u8; 20];
        let ms = deadline::format_ms(remaining, &mut buf);
        if let Ok(v) = HeaderValue::from_bytes(ms) {
            upstream.insert_header(self.timeout_header.wire(), v)?;
        }
        if upstream.headers.contains_key(GRPC_TIMEOUT) {
            let grpc = deadline::format_grpc_ms(remaining, &mut buf);
            if let Ok(v) = HeaderValue::from_bytes(grpc) {
                upstream.insert_header(GRPC_TIMEOUT, v)?;
            }
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream: &mut ResponseHeader,
        _ctx: &mut RequestCtx,
    ) -> Result<()> {
        let level = self.refusals.level_value(self.shared.engine.level());
        upstream.insert_header(self.refusals.level_name().wire(), level)?;
        Ok(())
    }

    async fn logging(&self, _session: &mut Session, e: Option<&Error>, ctx: &mut RequestCtx) {
        self.release_slot(e, ctx);
        if let Some(outcome) = ctx.outcome {
            self.shared.audit.record(ctx.business, outcome);
        }
    }

    fn suppress_error_log(&self, _session: &Session, _ctx: &RequestCtx, error: &Error) -> bool {
        // A caller leaving while queued is an expected outcome, not an error.
        error.esource() == &ErrorSource::Downstream && error.etype() == &ErrorType::ConnectionClosed
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        _ctx: &mut RequestCtx,
    ) -> FailToProxy {
        let code = match e.etype() {
            ErrorType::HTTPStatus(code) => *code,
            _ => match e.esource() {
                ErrorSource::Upstream => 502,
                ErrorSource::Downstream => match e.etype() {
                    ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed => 0,
                    _ => 400,
                },
                ErrorSource::Internal | ErrorSource::Unset => 500,
            },
        };
        // The caller left or the response already started: nothing more to send.
        if code > 0 && session.response_written().is_none() {
            let resp = self.refusals.error_response(code, self.shared.engine.level());
            let _ = session.write_response_header(resp, true).await;
        }
        FailToProxy { error_code: code, can_reuse_downstream: false }
    }
}
