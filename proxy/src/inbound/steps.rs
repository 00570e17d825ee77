//! The steps of `request_filter`: where the priority and the budget come from, waiting
//! for a slot while watching the caller, and refusing.

use std::time::{Duration, Instant, SystemTime};

use admission_core::audit::Outcome;
use admission_core::Priority;
use pingora::http::RequestHeader;
use pingora::proxy::Session;
use pingora::{Error, ErrorSource, Result};

use super::{Inbound, RequestCtx, GRPC_TIMEOUT};
use crate::deadline;
use crate::inflight::{NoSlot, Slot};
use crate::refusal::ShedReason;

// === impl Inbound ===

impl Inbound {
    /// `Err`: an entry request whose path is ambiguous (answered 400, not forwarded).
    pub(super) fn priority_of(
        &self,
        session: &mut Session,
    ) -> std::result::Result<Priority, crate::priority::BadPath> {
        let table = self.shared.table.load();
        if self.entry {
            let unix = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
            return self.priority.stamp(session.req_header_mut(), &table, unix);
        }
        let default = self.priority.default_priority(&table);
        let read = self.priority.read(&session.req_header().headers, default);
        if let Some(reason) = read.invalid {
            self.metrics.header_invalid(reason).increment(1);
        }
        Ok(read.priority)
    }

    /// The caller's remaining budget: `grpc-timeout`, else the timeout header, else the task
    /// timeout. An unparsable value counts as absent.
    pub(super) fn budget(&self, req: &RequestHeader) -> Duration {
        let grpc =
            req.headers.get(GRPC_TIMEOUT).and_then(|v| deadline::parse_grpc_timeout(v.as_bytes()));
        grpc.or_else(|| {
            req.headers
                .get(self.timeout_header.name())
                .and_then(|v| deadline::parse_timeout_ms(v.as_bytes()))
        })
        .unwrap_or(self.task_timeout)
    }

    pub(super) async fn refuse(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        reason: ShedReason,
    ) -> Result<bool> {
        ctx.outcome = Some(match reason {
            ShedReason::Overload => Outcome::ShedOverload,
            ShedReason::Deadline => Outcome::ShedDeadline,
        });
        let resp = self.refusals.response(ctx.grpc, reason, self.shared.engine.level());
        session.write_response_header(resp, true).await?;
        Ok(true)
    }

    pub(super) fn shadow(&self) -> bool {
        self.shared.engine.mode() == admission_core::Mode::Shadow
    }

    /// Waits for an in-flight slot in priority order unless the caller leaves first
    /// (`None`). In shadow mode a full queue neither refuses nor evicts; the flag says it
    /// would have.
    pub(super) async fn wait_for_slot(
        &self,
        session: &mut Session,
        priority: Priority,
    ) -> Option<Result<(Slot, bool), NoSlot>> {
        let limit = &self.shared.limit;
        if self.shadow() {
            tokio::select! {
                biased;
                waited = limit.slot_past_bound(priority) => Some(Ok(waited)),
                () = caller_gone(session) => None,
            }
        } else {
            tokio::select! {
                biased;
                slot = limit.slot(priority) => Some(slot.map(|s| (s, false))),
                () = caller_gone(session) => None,
            }
        }
    }

    /// A request that waited and has less budget left than the app typically takes would
    /// only spend the app's time on an answer nobody waits for.
    pub(super) fn cannot_finish_in_time(&self, ctx: &RequestCtx) -> bool {
        ctx.queued
            && ctx.deadline.saturating_duration_since(Instant::now())
                < self.shared.app_time.typical()
    }

    /// Under overload, a request that waited longer than `overload_max_wait` is backlog the
    /// admission level has not cut yet: drop it so the queue stops delaying everyone.
    pub(super) fn waited_out(&self, ctx: &RequestCtx) -> bool {
        ctx.queued
            && !self.overload_max_wait.is_zero()
            && self.shared.engine.overloaded()
            && ctx.arrival.elapsed() > self.overload_max_wait
    }

    /// Gives the in-flight slot back. If the caller left while the app was working, the
    /// app most likely still is: keep the slot for the app's expected remaining time.
    pub(super) fn release_slot(&self, e: Option<&Error>, ctx: &mut RequestCtx) {
        let (Some(slot), Some(dispatched)) = (ctx.slot.take(), ctx.dispatched) else {
            ctx.slot = None;
            return;
        };
        let took = dispatched.elapsed();
        let caller_left = e.is_some_and(|e| e.esource() == &ErrorSource::Downstream);
        if !caller_left {
            self.shared.app_time.record(took);
            return;
        }
        // An eighth more than typical: holding a little long costs a little throughput only
        // when callers leave; releasing early lets the app's own queue grow.
        let typical = self.shared.app_time.typical();
        let left = (typical + typical / 8).saturating_sub(took);
        if left.is_zero() {
            return;
        }
        tokio::spawn(async move {
            tokio::time::sleep(left).await;
            drop(slot);
        });
    }
}

/// Resolves when the caller has gone: the h2 stream was reset or closed, or the HTTP/1.1
/// connection closed after a complete request. An HTTP/1.1 request whose body is still
/// unread cannot be watched without consuming the body; it stays queued until served.
async fn caller_gone(session: &mut Session) {
    if let Some(idle) = session.downstream_session.watch_h2_stream_close() {
        let _ = idle.await;
        return;
    }
    if (session.is_body_empty() || session.is_body_done())
        && session.downstream_session.read_body_or_idle(true).await.is_err()
    {
        return;
    }
    std::future::pending::<()>().await
}
