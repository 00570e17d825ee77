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
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use admission_core::adaptive_limit::{AdaptiveLimit, AdaptiveLimitConfig, LimitStatus};
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
}

/// A middle hop's bound on everything at its app, lent slots included, while its level
/// spares routes (`set_downstream_bound`).
///
/// A lent slot (a request waiting on a downstream) frees room under the limit: right for an
/// app that waits without holding anything, wrong for one that holds a worker (a thread) while
/// it waits, which is the model the sparing itself rests on (a route is heavy because its
/// waits hold what the app holds). There, the lent requests of the heavy routes keep the
/// app's workers, the requests let in beside them queue for a worker in the app (FIFO, where
/// the spared routes' place at the head of the sidecar's queue is lost), and that queue is in
/// the app's own time whatever the limit does: the limit then measures the wait for a worker
/// as the app's service time (a knee search read 23 for an app of 8 workers). Measured on the
/// no-harm middle hop: defaults 0.55-0.71x of a hand-set `max_inflight` equal to the workers.
///
/// So the most the app held at once, lent included, in a window whose own time held (within
/// the limit's noise of its baseline), over the horizon, is what it serves without a queue:
/// while the level spares (and for 2 s after), everything at the app stays within that plus
/// an eighth (and one: a bound that binds while the own time holds grows by it each window,
/// so an app that waits without holding anything leaves it behind within about 3 s; with a
/// quarter, a peak of 11 seen on an 8-worker app left it a queue of 6).
/// Otherwise, or before a window was judged, the bound is the ceiling (`max_inflight`).
#[derive(Debug, Default)]
struct WorkerBound {
    start: u64,
    answers: u32,
    own_sum: u128,
    peak: usize,
    /// `(end, peak, mean own time)` of the windows whose own time held.
    clean: VecDeque<(u64, usize, f64)>,
    /// `(end, mean own time)` of the judged windows: the lowest is a baseline too (the
    /// limit's may have been measured while the app queued from the start).
    means: VecDeque<(u64, f64)>,
    /// When the level last spared routes: the bound holds for `WORKER_SPARING_HOLD` after
    /// (the sparing flickers at its thresholds, and each lapse let the heavy routes' requests
    /// fill the app's workers again).
    spared_at: Option<u64>,
}

/// See `WorkerBound::spared_at`: the sparing's own staleness bound.
const WORKER_SPARING_HOLD: u64 = 2_000_000_000;

/// A worker-bound window closes after this (with enough answers)...
const WORKER_WINDOW: u64 = 100_000_000;
/// ...or unjudged after this.
const WORKER_WINDOW_MAX: u64 = 1_000_000_000;
const WORKER_MIN_ANSWERS: u32 = 8;
/// How long a window that held is remembered (the limit's horizon).
const WORKER_HORIZON: u64 = 10_000_000_000;

impl WorkerBound {
    /// An answer: its own time, and everything at the app (lent included) when it came.
    fn on_response(&mut self, own: Duration, total: usize) {
        self.answers = self.answers.saturating_add(1);
        self.own_sum += own.as_nanos();
        self.peak = self.peak.max(total);
    }

    /// The timer's turn: closes the window once it is over, remembering its peak if its own
    /// time held (see below).
    fn tick(&mut self, now: u64, baseline: Duration) {
        let elapsed = now.saturating_sub(self.start);
        if elapsed < WORKER_WINDOW {
            return;
        }
        if self.answers >= WORKER_MIN_ANSWERS {
            let mean = self.own_sum as f64 / f64::from(self.answers);
            self.means.push_back((now, mean));
            self.clean.push_back((now, self.peak, mean));
            let lowest = self.means.iter().map(|&(_, m)| m).fold(f64::INFINITY, f64::min);
            let b = match baseline.as_nanos() as f64 {
                0.0 => lowest,
                limit => limit.min(lowest),
            };
            // Held: within the limit's hysteresis (half its noise tolerance, at most a tenth
            // of the baseline): a queue of a quarter of an 8-worker app's workers is not.
            // (A window measured clean against a baseline that was itself queued is not.)
            let held = b + ((0.2 * b).max(5e6) / 2.0).min(0.1 * b);
            self.clean.retain(|&(_, _, m)| m <= held);
        } else if elapsed < WORKER_WINDOW_MAX {
            return;
        }
        let old = |end: u64| now.saturating_sub(end) > WORKER_HORIZON;
        while self.clean.front().is_some_and(|&(end, _, _)| old(end)) {
            self.clean.pop_front();
        }
        while self.means.front().is_some_and(|&(end, _)| old(end)) {
            self.means.pop_front();
        }
        (self.start, self.answers, self.own_sum, self.peak) = (now, 0, 0, 0);
    }

    /// The bound on everything at the app, if a window has been judged.
    fn bound(&self) -> Option<usize> {
        let peak = self.clean.iter().map(|&(_, p, _)| p).max()?;
        Some(peak + (peak / 8).max(1))
    }
}

impl ControlLoop {
    /// `ceiling` is `inbound.max_inflight`; with `adaptive` off the limit stays there.
    /// `healthy_queue` is the detector's queuing threshold (`admission.queuing_threshold`):
    /// while nothing is refused, the app keeps a queue that short.
    pub fn new(ceiling: usize, adaptive: bool, healthy_queue: Duration, now: u64) -> Self {
        let limit = if adaptive {
            AdaptiveLimit::new(
                AdaptiveLimitConfig { ceiling, healthy_queue, ..AdaptiveLimitConfig::default() },
                now,
            )
        } else {
            AdaptiveLimit::fixed(ceiling, now)
        };
        ControlLoop {
            adaptive: Mutex::new(limit),
            workers: Mutex::new(WorkerBound::default()),
            ceiling: AtomicUsize::new(0),
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

    /// The app's response headers arrived `rtt` after dispatch, of which it spent
    /// `downstream` waiting on its downstreams.
    pub fn on_response(
        &self,
        rtt: Duration,
        downstream: Duration,
        engine: &AdmissionEngine<MonotonicClock>,
        limit: &InflightLimit,
    ) {
        engine.record_completion();
        let now = engine.clock().now();
        let held = limit.held();
        let next = {
            let mut adaptive = self.adaptive();
            if adaptive.middle_hop() {
                self.workers().on_response(rtt.saturating_sub(downstream), limit.inflight());
            }
            adaptive.on_response(now, rtt, downstream, held);
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
                let mut workers = self.workers();
                workers.tick(engine.clock().now(), adaptive.status().baseline);
                let now = engine.clock().now();
                if adaptive.downstream_bound() {
                    workers.spared_at = Some(now);
                }
                let mut ceiling = adaptive.ceiling();
                if workers.spared_at.is_some_and(|t| now.saturating_sub(t) <= WORKER_SPARING_HOLD) {
                    ceiling = workers.bound().map_or(ceiling, |b| b.min(ceiling));
                }
                drop(workers);
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
            next
        };
        if next != limit.limit() {
            limit.set_limit(next);
            self.keep_ceiling(limit);
        }
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
