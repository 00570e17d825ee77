//! The proxy's half of the control loop: it drives the in-flight limit from the app's own
//! time ([`AdaptiveLimit`]: response time less the waits on downstreams) and feeds the
//! engine what the request path alone cannot show it: the queue's depth and the age of its
//! oldest waiter (so a stalled app, from which nothing leaves the queue, reads as
//! overloaded), and the app's completions (what the capacity law aims at).
//!
//! The window timer calls [`ControlLoop::tick`] every 50 ms; the request path calls
//! [`ControlLoop::on_queued`] and [`ControlLoop::on_response`]. Everything here is a short
//! lock around a pure struct.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use admission_core::adaptive_limit::route_key;
use admission_core::adaptive_limit::{
    AdaptiveLimit, AdaptiveLimitConfig, LimitStatus, RouteKey, WorkerBound,
};
use admission_core::{AdmissionEngine, Clock, MonotonicClock};

use crate::inflight::InflightLimit;

/// The adaptive limit and its inputs.
#[derive(Debug)]
pub struct ControlLoop {
    adaptive: Mutex<AdaptiveLimit>,
    workers: Mutex<WorkerBound>,
    /// A middle hop's ceiling in force (the worker bound, or `max_inflight`), re-applied after
    /// a change of the limit; 0 until its first tick, and for any other sidecar.
    ceiling: AtomicUsize,
    /// The app's answers (the engine's count of completions) as the timer saw them at its
    /// last few ticks: the underfed test's span.
    answered_at: Mutex<AnswerSpan>,
    /// The engine's count of closed windows at the last tick (for the window trace).
    windows_traced: AtomicU64,
}

/// The span over which the app counts as underfed: four ticks (200 ms), long enough that
/// a saturated app's count of answers varies by a few percent, short enough to catch a
/// lull of the arrivals within a settle window (500 ms).
const UNDERFED_TICKS: usize = 4;

/// Underfed: over that span the app answered fewer than this share of its capacity
/// estimate while the level refused.
const UNDERFED_SHARE: f64 = 0.9;

impl ControlLoop {
    /// `ceiling` is `inbound.max_inflight`; with `adaptive` off the limit stays there.
    /// `healthy_queue` is the detector's queuing threshold (`admission.queuing_threshold`):
    /// while nothing is refused, the app keeps a queue that short.
    pub fn new(ceiling: usize, adaptive: bool, healthy_queue: Duration, now: u64) -> Self {
        let cfg = AdaptiveLimitConfig { ceiling, healthy_queue, ..AdaptiveLimitConfig::default() };
        let workers = WorkerBound::new(&cfg, now);
        let limit = if adaptive {
            AdaptiveLimit::new(cfg, now)
        } else {
            AdaptiveLimit::fixed(ceiling, now)
        };
        ControlLoop {
            adaptive: Mutex::new(limit),
            // A middle hop's bound on everything at its app while its level spares routes
            // (lent slots included: its app holds a worker while it waits on a downstream).
            workers: Mutex::new(workers),
            ceiling: AtomicUsize::new(0),
            answered_at: Mutex::new(AnswerSpan::default()),
            windows_traced: AtomicU64::new(0),
        }
    }

    /// The app is a middle hop (the egress role on): see
    /// [`AdaptiveLimitConfig::middle_hop`].
    pub fn set_middle_hop(&self, on: bool) {
        self.adaptive().set_middle_hop(on);
    }

    /// The app's slots are held mostly by requests waiting on slow downstreams now: see
    /// [`AdaptiveLimit::set_downstream_bound`].
    pub fn set_downstream_bound(&self, on: bool) {
        self.adaptive().set_downstream_bound(on);
    }

    fn workers(&self) -> MutexGuard<'_, WorkerBound> {
        self.workers.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn adaptive(&self) -> MutexGuard<'_, AdaptiveLimit> {
        // Nothing under the lock can panic midway; a poisoned lock still holds a usable state.
        self.adaptive.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// From now on the limit is `n`, whatever the app does.
    pub fn set_fixed(&self, n: usize, now: u64) {
        *self.adaptive() = AdaptiveLimit::fixed(n, now);
    }

    /// The limit in force now (apply it with [`InflightLimit::set_limit`]).
    pub fn limit(&self) -> usize {
        self.adaptive().limit()
    }

    pub fn status(&self) -> LimitStatus {
        self.adaptive().status()
    }

    /// A request had to wait for a slot: the limit binds.
    pub fn on_queued(&self) {
        self.adaptive().on_waiting();
    }

    /// The app answered that the request's deadline passed before it did the work (a 504, or
    /// gRPC's DEADLINE_EXCEEDED in a trailers-only answer): a completion for the engine's
    /// count, but no sample of the app's time for the in-flight limit. Such answers take
    /// what the request's budget had left, not the app's work, and a deadline-aware app
    /// whose own queue is long gives many of them: counted as samples they held the mean
    /// own time near the baseline and the limit's completion rate at several times what
    /// the app served, so the limit stayed at its ceiling with the queue inside the app,
    /// where the queuing-time signal cannot see it.
    pub fn on_deadline_answer(&self, engine: &AdmissionEngine<MonotonicClock>) {
        engine.record_completion();
    }

    /// The app's response headers arrived `rtt` after dispatch, of which it spent
    /// `downstream` waiting on its downstreams; `route` is the request's route
    /// ([`route_key`] of its path): each route's own time is judged against its own
    /// baseline, so a burst of a slow route is not taken for a queue.
    pub fn on_response(
        &self,
        rtt: Duration,
        downstream: Duration,
        route: Option<RouteKey>,
        engine: &AdmissionEngine<MonotonicClock>,
        limit: &InflightLimit,
    ) {
        engine.record_completion();
        let now = engine.clock().now();
        let held = limit.held();
        let next = {
            let mut adaptive = self.adaptive();
            let expected = adaptive.on_response(now, rtt, downstream, held, route);
            if adaptive.middle_hop() {
                let own = rtt.saturating_sub(downstream);
                self.workers().on_response(own, limit.inflight(), expected);
            }
            // A trial lasts a few of the app's times: settle it on the answer that ends it.
            let next = adaptive.tick(now);
            trace_change(&adaptive, limit, next, "answer");
            next
        };
        if next != limit.limit() {
            limit.set_limit(next);
            self.keep_ceiling(limit);
        }
    }

    /// A middle hop's ceiling again after a change of the limit (which lifts the ceiling to
    /// a limit set above it).
    fn keep_ceiling(&self, limit: &InflightLimit) {
        let ceiling = self.ceiling.load(Relaxed);
        if ceiling != 0 && ceiling != limit.ceiling() {
            limit.set_ceiling(ceiling);
        }
    }

    /// The timer's turn: report the queue to the engine (which closes windows, early ones
    /// included), and move the limit.
    pub fn tick(&self, engine: &AdmissionEngine<MonotonicClock>, limit: &InflightLimit) {
        let depth = limit.queued();
        let oldest = limit
            .oldest_waiting_since()
            .map_or(Duration::ZERO, |since| Instant::now().saturating_duration_since(since));
        engine.observe_queue(depth, oldest);
        self.trace_window(engine, limit);
        let underfed = self.underfed(engine);
        let next = {
            let mut adaptive = self.adaptive();
            if depth > 0 {
                adaptive.on_waiting();
            }
            adaptive.set_refusing(engine.level_binds());
            // Everything at the app, lent included, within what it serves without a queue while
            // the level spares (see `WorkerBound`); `max_inflight` otherwise. (A middle hop's
            // only: any other sidecar's ceiling stays as it was set.)
            if adaptive.middle_hop() {
                let now = engine.clock().now();
                let ceiling = {
                    let mut workers = self.workers();
                    let judged_before = workers.last_judged().map(|(end, ..)| end);
                    workers.tick(now, adaptive.status().baseline);
                    trace_judged(&workers, judged_before);
                    workers.ceiling(now, adaptive.downstream_bound(), adaptive.ceiling())
                };
                if ceiling != self.ceiling.swap(ceiling, Relaxed) {
                    tracing::debug!(target: "weir::limit", ceiling, lent = limit.lent(), held = limit.held(), queued = depth, "worker bound");
                }
                if ceiling != limit.ceiling() {
                    limit.set_ceiling(ceiling);
                }
            }
            adaptive.observe_held(engine.clock().now(), limit.held());
            let next = adaptive.tick(engine.clock().now());
            trace_change(&adaptive, limit, next, "tick");
            let idle =
                if underfed { idle_workers(adaptive.middle_hop(), &adaptive.status()) } else { 0 };
            limit.set_idle_below(idle);
            next
        };
        if next != limit.limit() {
            limit.set_limit(next);
            self.keep_ceiling(limit);
        }
    }
}

impl ControlLoop {
    /// Each closed window at debug level (`RUST_LOG=weir::window=debug`): what the capacity
    /// law saw (the busy time and the completions in it are the capacity it measures) and
    /// what it decided. Read at the timer's tick after a window closed: the last one closed
    /// since the previous tick (windows that close faster than the tick, on their request
    /// count at a fast app, are sampled; `closed` shows how many went by).
    fn trace_window(&self, engine: &AdmissionEngine<MonotonicClock>, limit: &InflightLimit) {
        if !tracing::enabled!(target: "weir::window", tracing::Level::DEBUG) {
            return;
        }
        let status = engine.status();
        if status.windows_closed == self.windows_traced.swap(status.windows_closed, Relaxed) {
            return;
        }
        let Some(w) = status.last_window else { return };
        tracing::debug!(
            target: "weir::window",
            closed = status.windows_closed,
            ms = w.duration_ns as f64 / 1e6,
            early = w.early,
            arrivals = w.arrivals,
            admitted = w.admitted,
            dispatched = w.dispatched,
            dropped = w.dropped,
            completed = w.completed,
            busy_ms = w.busy_ns as f64 / 1e6,
            busy_completed = w.busy_completed,
            queuing_ms = w.mean_queuing_ns as f64 / 1e6,
            depth = w.queue_depth,
            level = %status.level,
            capacity = status.capacity_per_sec.unwrap_or(0.0),
            inflight_limit = limit.limit(),
            "window"
        );
    }

    /// See [`underfed`]: the count of answers over the span the timer's last ticks cover.
    fn underfed(&self, engine: &AdmissionEngine<MonotonicClock>) -> bool {
        let answered = self
            .answered_at
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .observe(Instant::now(), engine.completions());
        underfed(engine.level_binds(), engine.capacity_estimate(), answered)
    }
}

/// The count of answers at each of the timer's last `UNDERFED_TICKS + 1` ticks.
#[derive(Debug, Default)]
struct AnswerSpan {
    seen: VecDeque<(Instant, u64)>,
}

impl AnswerSpan {
    /// The tick at `now` saw `count` answers so far: the answers over the span it closes
    /// and the span's length, once the span is whole (`None` before).
    fn observe(&mut self, now: Instant, count: u64) -> Option<(u64, Duration)> {
        self.seen.push_back((now, count));
        while self.seen.len() > UNDERFED_TICKS + 1 {
            self.seen.pop_front();
        }
        let &(then, before) = self.seen.front().filter(|_| self.seen.len() > UNDERFED_TICKS)?;
        Some((count.saturating_sub(before), now.saturating_duration_since(then)))
    }
}

/// The level refuses (`binds`), yet over the span (`answered`: answers, over how long) the
/// app answered under `UNDERFED_SHARE` of the capacity estimate: the arrivals the level
/// admits lull and the app idles (its workers wait for work weir refuses). Only then may a
/// refused request take an idle worker: while the app is fed, a momentary gap is the
/// queue's own rhythm, and a refused request in it would only delay the next admitted one.
/// Without an estimate, or before the span is whole, the app is not underfed.
fn underfed(binds: bool, capacity: Option<f64>, answered: Option<(u64, Duration)>) -> bool {
    let (Some(capacity), Some((count, span))) = (capacity, answered) else {
        return false;
    };
    let secs = span.as_secs_f64();
    binds && capacity > 0.0 && secs > 0.0 && (count as f64) < UNDERFED_SHARE * capacity * secs
}

/// While the limit binds on evidence (below its ceiling: the app's knee was found), what
/// the app serves at once without a queue (its best completion rate times its own time
/// without one): with fewer than that at the app a worker is idle, and a request the level
/// refuses may take it (`InflightLimit::try_idle_slot`). Zero otherwise: a limit at its
/// ceiling knows nothing of the app's workers (its own queue may be long), and a middle
/// hop's workers also wait on its downstreams.
fn idle_workers(middle_hop: bool, status: &LimitStatus) -> usize {
    if middle_hop || status.limit >= status.ceiling {
        return 0;
    }
    // (Below the limit, which holds a headroom over it: a slot of the headroom is the app's
    // own queue, and a refused request there would delay the next admitted one.)
    let serves = status.completions_per_sec * status.baseline.as_secs_f64();
    (serves.round() as usize).min(status.limit.saturating_sub(1))
}

/// Each window the worker bound judged since `judged_before` (its end), at debug level
/// (`RUST_LOG=weir::workers=debug`): what it held, its own time against the rise test, and
/// the bound it leaves.
fn trace_judged(workers: &WorkerBound, judged_before: Option<u64>) {
    if !tracing::enabled!(target: "weir::workers", tracing::Level::DEBUG) {
        return;
    }
    let Some((end, peak, mean, rose_above)) = workers.last_judged() else { return };
    if Some(end) != judged_before {
        tracing::debug!(
            target: "weir::workers",
            peak,
            own_ms = mean / 1e6,
            rose_above_ms = rose_above / 1e6,
            bound = ?workers.bound(),
            "judged"
        );
    }
}

/// Every change of the limit at debug level (`RUST_LOG=weir::limit=debug`), with what the
/// limit decided it from: the trace a run needs to tell which of its rules moved it.
fn trace_change(adaptive: &AdaptiveLimit, limit: &InflightLimit, next: usize, on: &str) {
    if next != limit.limit() {
        tracing::debug!(
            target: "weir::limit",
            on,
            from = limit.limit(),
            to = next,
            held = limit.held(),
            lent = limit.lent(),
            queued = limit.queued(),
            ceiling = limit.ceiling(),
            downstream_bound = adaptive.downstream_bound(),
            status = ?adaptive.status(),
        );
    }
}

#[cfg(test)]
mod tests;
