//! One request's turn at the app: the in-flight slot it holds and how the turn ends.
//!
//! - [`AppExchange::headers_received`]: the app answered; the time from dispatch to its
//!   response headers is the app's time (neither the caller's upload nor its download is
//!   in it): it feeds the app-time estimate and the engine's completion count, and, less
//!   what the app spent waiting on its downstreams (with the egress role on), the adaptive
//!   in-flight limit. An answer that the request's deadline passed (504, gRPC status 4)
//!   feeds neither estimate, only the completion count: its time is the budget that was
//!   left, not the app's work.
//! - [`AppExchange::done`]: the app's response ended, or its caller has read nothing for
//!   the app's typical time ([`AppExchange::stall_grace`]); the slot is released.
//! - [`AppExchange::failed`]: the app failed, or the response could not be delivered; the
//!   slot is released.
//! - [`AppExchange::timed_out`]: the request's budget ran out before the app answered. The
//!   app most likely still holds it (few apps notice a closed connection before they answer)
//!   and will spend a service on it later, so the slot is held for the app's typical time
//!   from now (see `timed_out`).
//! - dropped without either: the caller left while the app was working on its request. The
//!   app most likely still is (the connection to it is closed, but an app rarely notices
//!   mid-request), so the slot is held for the app's expected remaining time, never longer
//!   than its typical time; releasing it at once would let the app's own queue grow unseen
//!   by the queuing-time detector.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::inflight::Slot;
use crate::own_time::Visit;
use crate::shared::Shared;

pub(super) struct AppExchange {
    slot: Option<Slot>,
    dispatched: Instant,
    shared: Arc<Shared>,
    /// Its registration with the egress role's pairing, if on.
    visit: Option<Visit>,
    answered: bool,
    /// The request's route, for the adaptive limit (`control_loop::route_key`).
    route: u64,
}

impl AppExchange {
    pub(super) fn new(
        slot: Slot,
        dispatched: Instant,
        shared: Arc<Shared>,
        visit: Option<Visit>,
        route: u64,
    ) -> Self {
        AppExchange { slot: Some(slot), dispatched, shared, visit, answered: false, route }
    }

    /// When the request left for the app.
    pub(super) fn dispatched(&self) -> Instant {
        self.dispatched
    }

    /// How long the app has waited on its downstreams for this request (and ends the
    /// pairing).
    fn end_visit(&mut self) -> Duration {
        match (self.visit.take(), &self.shared.waits) {
            (Some(visit), Some(waits)) => waits.end(visit),
            _ => Duration::ZERO,
        }
    }

    /// The app's response headers arrived; it spent `caller_waited` of the time since the
    /// dispatch waiting for the caller's body, which is not its own time. `deadline_answer`:
    /// the app said the request's deadline passed (`is_deadline_answer`): no sample of its
    /// time (see `ControlLoop::on_deadline_answer`).
    pub(super) fn headers_received(&mut self, caller_waited: Duration, deadline_answer: bool) {
        if std::mem::replace(&mut self.answered, true) {
            return;
        }
        let downstream = self.end_visit();
        let shared = &self.shared;
        if deadline_answer {
            shared.control.on_deadline_answer(&shared.engine);
            return;
        }
        let took = self.dispatched.elapsed().saturating_sub(caller_waited);
        self.shared.app_time.record(took);
        let route = Some(self.route);
        shared.control.on_response(took, downstream, route, &shared.engine, &shared.limit);
    }

    /// How long a response may wait for its caller to read before this exchange gives its
    /// slot back: the app's typical time. A caller that stops reading keeps the app waiting
    /// on it, not working for it; holding the slot longer would let callers who stop reading
    /// keep slots beyond the app's own service time (as for callers who hang up, below). With
    /// the adaptive limit a handful of slots is all there is: eight callers that never read a
    /// 20 MB response held them all, and every other request waited in the queue until
    /// `timeouts.write` ended theirs.
    pub(super) fn stall_grace(&self) -> Duration {
        self.shared.app_time.typical()
    }

    pub(super) fn done(mut self) {
        self.slot = None;
    }

    pub(super) fn failed(mut self) {
        self.slot = None;
    }

    /// The request's budget ran out before the app's response headers. The app still holds
    /// the request, most likely in its own queue (it answers in its order, not the
    /// budgets'), and will work on it once it gets there. Releasing the slot at once (as
    /// before) let the sidecar send another request into that queue for each one that timed
    /// out there, which then timed out too: behind a bottleneck of 4 workers and a limit of
    /// 10, the app came to hold 35-50 requests while the sidecar counted 2-10, 40-55 of them
    /// started after their deadline, and its completions as the sidecar saw them fell to
    /// about half the app's rate: the capacity estimate and the in-flight limit (once 1)
    /// were measured on that (multihop-bench at 6x; docs/design.md, "Where the refusals not
    /// made at the entry come from"). So the slot is held for the app's typical time from
    /// now (capped at the task timeout like every sample of it): about when the app is done
    /// with it, if it answers in its typical time. An app that cancels on a closed
    /// connection only loses that much of a slot.
    pub(super) fn timed_out(mut self) {
        self.end_visit();
        let Some(slot) = self.slot.take() else { return };
        hold_slot(slot, self.shared.app_time.typical());
    }
}

/// Gives `slot` back after `hold` (at once if it is zero, or outside a runtime).
fn hold_slot(slot: Slot, hold: Duration) {
    if hold.is_zero() {
        return;
    }
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            tokio::time::sleep(hold).await;
            drop(slot);
        });
    }
}

impl Drop for AppExchange {
    fn drop(&mut self) {
        self.end_visit();
        let Some(slot) = self.slot.take() else { return };
        // The app's typical time (dispatch to response headers, capped) less what it has
        // had: releasing earlier lets the app's own queue grow unseen; holding longer would
        // let callers who hang up keep slots beyond the app's own service time.
        let typical = self.shared.app_time.typical();
        hold_slot(slot, typical.saturating_sub(self.dispatched.elapsed()));
    }
}

/// Whether the app's answer says the request's deadline passed before the work was done:
/// HTTP 504, or a trailers-only gRPC answer with `grpc-status: 4` (DEADLINE_EXCEEDED) in
/// its head.
pub(super) fn is_deadline_answer(head: &http::response::Parts) -> bool {
    head.status == http::StatusCode::GATEWAY_TIMEOUT
        || head.headers.get("grpc-status").is_some_and(|v| v.as_bytes() == b"4")
}

#[cfg(test)]
mod tests {
    use super::is_deadline_answer;

    fn head(status: u16, grpc_status: Option<&str>) -> http::response::Parts {
        let mut b = http::Response::builder().status(status);
        if let Some(s) = grpc_status {
            b = b.header("grpc-status", s);
        }
        b.body(()).expect("valid").into_parts().0
    }

    #[test]
    fn a_deadline_answer_is_a_504_or_a_trailers_only_deadline_exceeded() {
        assert!(is_deadline_answer(&head(504, None)));
        assert!(is_deadline_answer(&head(200, Some("4"))));
        assert!(!is_deadline_answer(&head(200, None)));
        assert!(!is_deadline_answer(&head(200, Some("0"))));
        assert!(!is_deadline_answer(&head(200, Some("14"))));
        assert!(!is_deadline_answer(&head(503, None)));
        assert!(!is_deadline_answer(&head(500, None)));
    }
}
