//! The adaptive in-flight limit: how many requests the app gets at once. It exists to move
//! an overloaded app's queue out of the app and into the sidecar, where the queuing-time
//! signal sees it and the priority order applies; an app that is not overloaded must never
//! feel it. So it binds only on evidence:
//!
//! - **It starts at the ceiling** (`max_inflight`) and never moves down because demand was
//!   low: a quiet app's response times say nothing about how much it could take.
//! - **Suspicion** (a Vegas-style queue estimate on the app's own time). Over an interval
//!   the app completes `X` per second at a mean own time `m`; by Little's law it held
//!   `X m` requests on average, of which it was serving `X b`, `b` being its own time
//!   without a queue (the baseline: the lowest mean of 32 consecutive answers over the
//!   horizon, or a trial's measurement below the app's concurrency). When `m` rose above
//!   `b` by more than noise (`max(b x tolerance, tolerance_min)`) and the app held at least
//!   one request more than it served plus the headroom, the surplus looks like its queue.
//!   It must persist (ten baseline times and 100 ms, or the own time doubled at once): a
//!   Poisson burst the app works off within a few of its times is no overload to move.
//! - **A cut is an experiment** (a throughput-vs-concurrency knee search). On suspicion
//!   the limit goes to what the app serves plus the headroom, never below the floor, and
//!   the answers to requests dispatched after the cut are watched:
//!   - the cut bound throughout (the app held all it allowed) and the app still completed
//!     as many per second (Little's law: the new limit over their own time): more
//!     concurrency had added only latency. The cut stays; if the app still holds more
//!     than it serves at the new limit, the next cut (a quarter lower) is tried;
//!   - the cut bound throughout and the app completed fewer: it needs more concurrency
//!     than the cut left it. Its own time at that concurrency is its time without a queue
//!     (the new baseline), and what it needs is its earlier completion rate times that
//!     time (Little's law again): the limit goes there plus the headroom;
//!   - the cut did not bind throughout, and the own time did not come down at least halfway
//!     to what a queue predicts (`old mean x new limit / old in-flight`): the latency was
//!     not the app's queue (it got slower, the machine was busy). The cut is undone, the
//!     baseline is what was measured, and what the app held before is the floor.
//! - **It probes upwards** while the limit binds throughout an interval (requests waited
//!   in the sidecar while the app held all the limit allowed) and the app's own time did
//!   not rise: a quarter more per interval, up to the ceiling. So a wrong cut, or an app
//!   that became faster or wider, is followed within a few intervals.
//! - **Refresh.** A limit that has bound throughout for `refresh_every` (the app saturated
//!   at it) is searched down again until a cut costs throughput, so a baseline measured
//!   while the app was already queueing (overloaded from the start) is corrected. That
//!   needs a limit that binds; an undone cut that did not (its baseline is then the own time
//!   measured at the cut, queued if the cut was too close to what the app held to tell) is
//!   searched once more from what the app holds, a second later, if the app still takes
//!   twice its earlier own time and the limit does not bind (`reopen_search`).
//! - **A healthy queue stays in the app.** While the level refuses nothing, no cut (a
//!   suspicion's, a search step's) leaves the app less than it completes in its baseline
//!   time plus `healthy_queue` (the detector's queuing threshold): a queue that short is no
//!   overload by the detector's own measure, the app serves it in its own order as well as
//!   the sidecar would, and moved into the sidecar it would read as one (a closed loop of
//!   320 streams on a 30 us app holds ~10 ms of queue: in the sidecar, on a busy machine,
//!   it crossed 20 ms and the level cut a healthy app). For an app of many milliseconds
//!   this is about what a suspicion's cut leaves anyway; for a fast app it is the ceiling.
//!   Once the level refuses, the cuts go to the knee as below, so the priority order
//!   applies to an overload's queue.
//! - **The floor** is the most the app held at once in an interval whose own time did not
//!   rise, nor in the next one (latency lags concurrency), over the horizon (and at least
//!   `floor`): a suspicion never cuts below it. While the level refuses, an interval that
//!   bound throughout at the limit and rose contradicts every floor at or above that
//!   limit, and they are forgotten (a peak held for a moment, or an app that got slower).
//!
//! There is no fixed point below the app's concurrency need: below it, requests wait in the
//! sidecar while the app answers at its no-queue time, which is the probe's condition, and
//! a cut below it costs throughput, which ends the search at what the app needs.
//!
//! "Own time" is what the caller passes: dispatch to response headers less the time the
//! app spent waiting on its downstreams (the proxy measures that through its egress role),
//! so a slow downstream is never taken for the app's own queue. Without the egress role the
//! downstream's wait is in it; then a route that rose alone while the app's other routes
//! stayed at their baselines is left out of the judgement of a rise (a queue at the app
//! slows every route, a downstream only its callers: see `route_cost`). Pure: no clock reads, no
//! I/O; the caller passes `now` and wraps it in a lock.

use std::collections::VecDeque;
use std::time::Duration;

use crate::clock::Nanos;

/// Settings of [`AdaptiveLimit`].
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveLimitConfig {
    /// The limit never goes above this (the configured `max_inflight`), and starts here.
    pub ceiling: usize,
    /// ...nor below this.
    pub floor: usize,
    /// Shortest measurement interval (it is also at least two baseline own times).
    pub interval: Duration,
    /// An interval with fewer than `min_samples` answers closes unjudged after this.
    pub max_interval: Duration,
    /// Answers an interval (or a cut's trial) needs to be judged.
    pub min_samples: u32,
    /// How long the baseline, the floor and the best completion rate are remembered.
    pub horizon: Duration,
    /// Margin over what the app serves at once, so a worker freed between two dispatches
    /// never idles.
    pub headroom: f64,
    /// A rise of the mean own time above the baseline that counts as noise, relative...
    pub tolerance: f64,
    /// ...and at least this much (scheduling noise on a busy machine is absolute).
    pub tolerance_min: Duration,
    /// Probe step while the limit binds and the latency holds, as a fraction of the limit.
    pub growth: f64,
    /// A cut that binds "costs throughput" when the app completes this fraction fewer.
    pub rate_tolerance: f64,
    /// A limit that has bound throughout this long is searched down to the knee again.
    pub refresh_every: Duration,
    /// While the level refuses nothing, a cut leaves the app at least what it completes in
    /// its baseline time plus this (its own queue of up to this long stays in it): the
    /// queuing threshold of the overload detector (`admission.queuing_threshold`).
    pub healthy_queue: Duration,
    /// A middle hop (the egress role on: its app's calls lend their slots): a cut undone
    /// goes back to what the app held before it, not to the ceiling (see `settle_trial`).
    pub middle_hop: bool,
}

impl Default for AdaptiveLimitConfig {
    fn default() -> Self {
        AdaptiveLimitConfig {
            ceiling: 256,
            floor: 1,
            interval: Duration::from_millis(20),
            max_interval: Duration::from_secs(1),
            min_samples: 8,
            horizon: Duration::from_secs(10),
            headroom: 0.2,
            tolerance: 0.2,
            tolerance_min: Duration::from_millis(5),
            growth: 0.25,
            rate_tolerance: 0.1,
            refresh_every: Duration::from_secs(5),
            healthy_queue: Duration::from_millis(20),
            middle_hop: false,
        }
    }
}

/// Each further cut of a search is this fraction of the last.
const SEARCH_STEP: f64 = 0.75;

/// A suspicion's cut leaves the app this many times what it serves (a queue of three of its
/// times: a Poisson burst at 0.9x of an app of four rarely holds more).
const LOOSE: f64 = 3.0;

/// Still queueing this long after a loose cut (and ten baseline times) while the level
/// refuses, or saturated at the limit this long, the limit is searched down to the knee.
const TIGHTEN_AFTER: Nanos = 1_000_000_000;

/// The shortest a suspicion must last before a cut (unless the app's own time doubled).
const PERSISTENT_MIN: Nanos = 100_000_000;

/// A route's calm or risen verdict reads its answers of the last four intervals, and at
/// least of this long (see `route_cost`): long enough that a calm route at 100/s always has
/// answers in it (at 150 ms a gap let one interval be judged whole, and cut, on a busy
/// machine), short enough that answers from before an overload's onset do not vouch for
/// long (its last four answers are read, so a busy route turns within a few of them).
const ROUTE_EVIDENCE_MIN: Nanos = 500_000_000;

/// The limit binds throughout an interval (or a trial) when at least this share of its
/// answers left it full: a burst that filled it for a moment does not count.
const FULL: f64 = 0.8;

/// A stall: no answer for at least this long (and eight baseline times)...
const STALL_MIN: Nanos = 250_000_000;
/// ...while at least this many requests (and twice what it held at its last answer) pile up.
const STALL_PILE: usize = 8;

/// A trial's own time "fell in proportion" to its concurrency within this margin.
const PROPORTIONAL: f64 = 0.1;

/// Answers the baseline averages over: one interval's handful, of an app whose service
/// time varies, would put the baseline at a lucky low and see a queue in every mean.
const BASELINE_SAMPLES: u32 = 32;

/// A point-in-time view for metrics and status.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitStatus {
    /// The limit in force now.
    pub limit: usize,
    pub ceiling: usize,
    /// The floor in force now (see the module doc).
    pub floor: usize,
    /// Best completion rate of a judged interval over the horizon, per second (0 before).
    pub completions_per_sec: f64,
    /// The app's own time without a queue (zero before any measurement).
    pub baseline: Duration,
    /// A cut is being tried.
    pub trying: bool,
    /// Cuts tried so far; of those, how many cost throughput (a search's last step) and
    /// how many were undone (the latency was not the app's queue).
    pub cuts: u64,
    pub costly: u64,
    pub undone: u64,
}

/// What the horizon remembers of one judged interval or trial.
#[derive(Debug, Clone, Copy, Default)]
struct Record {
    end: Nanos,
    /// Completions, over how long (0 for a trial's result).
    answers: u32,
    secs: f64,
    /// Completions per second.
    rate: f64,
    /// A baseline candidate (nanoseconds; 0 = none): a block's mean or a trial's result.
    baseline: u64,
    /// Most requests the app held at once while its own time did not rise, then or in
    /// the next interval (0 otherwise).
    peak: usize,
}

/// A cut on trial: the state before it, and what happened after it.
#[derive(Debug, Clone, Copy)]
struct Trial {
    /// Given up (the cut kept) when no answer at all comes by then; every answer moves it
    /// on, so a long backlog in the app may drain first.
    until: Nanos,
    /// The limit before the search began (what an undo restores), and before this step.
    search_from: usize,
    prev: usize,
    before_mean: f64,
    before_held: f64,
    /// Completions per second before the search began (the best a step has shown since).
    ref_rate: f64,
    target: usize,
    /// When an answer first found the app holding no more than `target`.
    drained: Option<Nanos>,
    /// A search: on, a quarter lower each step, until one costs throughput (whatever the
    /// baseline says: this is what re-measures it).
    to_the_knee: bool,
    /// Answers to requests dispatched after the cut, their own time, and how many of them
    /// found the app holding the whole cut.
    answers: u32,
    own_sum: u128,
    full: u32,
}

/// What one closed interval measured.
#[derive(Debug, Clone, Copy, PartialEq)]
struct IntervalView {
    start: Nanos,
    secs: f64,
    answers: u32,
    /// The answers of the routes that rose alone (a downstream's queue, not the app's: see
    /// `route_cost`), left out of the judgement of a rise.
    alone: Sums,
    /// Answers of routes not yet measured: the interval says nothing of a rise.
    neutral: u32,
    /// The interval's own time summed over all its answers, their routes' no-queue times
    /// summed over the routed ones, and how many had no route (nanoseconds).
    own_sum: u128,
    expected_sum: u128,
    unrouted_answers: u32,
    /// Requests waited in the sidecar, and the share of answers that left the limit full.
    bound: bool,
    full: f64,
    /// Most requests the app held at once, and how many more it held at the end than at
    /// the start.
    peak: usize,
    grown: usize,
}

#[derive(Debug, Clone)]
pub struct AdaptiveLimit {
    cfg: AdaptiveLimitConfig,
    limit: usize,
    // The open interval.
    start: Nanos,
    answers: u32,
    own_sum: u128,
    /// The answers' routes' no-queue times (see [`RouteCosts`]), and how many answers had
    /// none (they count at the overall baseline).
    expected_sum: u128,
    unrouted: u32,
    full: u32,
    peak: usize,
    bound: bool,
    routes: RouteCosts,
    // The open baseline block.
    block_answers: u32,
    block_sum: u128,
    history: VecDeque<Record>,
    trial: Option<Trial>,
    /// When the last trial ended, and since when every judged interval found the limit
    /// binding throughout.
    last_trial: Nanos,
    saturated_since: Option<Nanos>,
    /// The last cut was a suspicion's loose one, not yet tightened.
    loose: Option<Nanos>,
    refusing: bool,
    /// The last answer, and what the app held then; the limit before a stall froze it.
    last_answer: Nanos,
    held_at_answer: usize,
    /// What the app held at the last answer before the open interval began.
    held_at_start: usize,
    frozen_from: Option<usize>,
    /// A search has measured the baseline below the app's knee.
    confirmed: bool,
    /// The app's slots are held mostly by requests waiting on slow downstreams (a middle
    /// hop's routes that do not call them are spared by its level): see `healthy`.
    downstream_bound: bool,
    /// Since when every judged interval has looked like the app's queue.
    suspicious_since: Option<Nanos>,
    /// Since when every judged interval's answers, all routes together, took longer than
    /// their baselines (a route measured only since can not vouch for the app: see
    /// `route_cost`).
    rise_began: Option<Nanos>,
    /// When the limit last changed: an interval that began before it had settled (one
    /// baseline time later) mixes two limits and decides nothing.
    changed_at: Nanos,
    cuts: u64,
    costly: u64,
    undone: u64,
    /// The baseline when the last trial (or search) judged here began: what an undo of it
    /// replaced with a measurement taken at the cut.
    pre_trial_baseline: Nanos,
    /// Undos seen by `judge`, and whether the trial running is a reopened search's.
    seen_undone: u64,
    retrying: bool,
    /// An undone cut left the question open (see `reopen_search`): since when, and the
    /// baseline the undo replaced.
    reopen: Option<(Nanos, Nanos)>,
}

impl AdaptiveLimit {
    pub fn new(cfg: AdaptiveLimitConfig, now: Nanos) -> Self {
        let ceiling = cfg.ceiling.max(1);
        let floor = cfg.floor.clamp(1, ceiling);
        AdaptiveLimit {
            limit: ceiling,
            cfg: AdaptiveLimitConfig { ceiling, floor, ..cfg },
            start: now,
            answers: 0,
            own_sum: 0,
            expected_sum: 0,
            unrouted: 0,
            full: 0,
            peak: 0,
            bound: false,
            routes: RouteCosts::new(cfg.horizon.as_nanos() as Nanos),
            block_answers: 0,
            block_sum: 0,
            history: VecDeque::new(),
            trial: None,
            last_trial: now,
            saturated_since: None,
            loose: None,
            refusing: false,
            last_answer: now,
            held_at_answer: 0,
            held_at_start: 0,
            frozen_from: None,
            confirmed: false,
            downstream_bound: false,
            suspicious_since: None,
            rise_began: None,
            changed_at: now,
            cuts: 0,
            costly: 0,
            undone: 0,
            pre_trial_baseline: 0,
            seen_undone: 0,
            retrying: false,
            reopen: None,
        }
    }

    /// A fixed limit: never adapts (`adaptive_inflight: false`, or set by hand).
    pub fn fixed(limit: usize, now: Nanos) -> Self {
        let cfg = AdaptiveLimitConfig {
            ceiling: limit.max(1),
            floor: limit.max(1),
            ..AdaptiveLimitConfig::default()
        };
        Self::new(cfg, now)
    }

    /// See [`AdaptiveLimitConfig::middle_hop`].
    pub fn set_middle_hop(&mut self, on: bool) {
        self.cfg.middle_hop = on;
    }

    /// Whether the app's slots are held mostly by requests waiting on slow downstreams now
    /// (a middle hop's per-route levels say so): see `healthy`.
    pub fn set_downstream_bound(&mut self, on: bool) {
        self.downstream_bound = on;
    }

    /// See [`AdaptiveLimit::set_downstream_bound`].
    pub fn downstream_bound(&self) -> bool {
        self.downstream_bound
    }

    /// See [`AdaptiveLimitConfig::middle_hop`]. (A fixed limit is never one: it adapts nothing.)
    pub fn middle_hop(&self) -> bool {
        self.cfg.middle_hop && self.adapts()
    }

    /// The limit in force now.
    pub fn limit(&self) -> usize {
        self.limit
    }

    pub fn ceiling(&self) -> usize {
        self.cfg.ceiling
    }

    fn adapts(&self) -> bool {
        self.cfg.floor < self.cfg.ceiling
    }

    /// Requests are waiting for a slot.
    pub fn on_waiting(&mut self) {
        self.bound = true;
    }

    /// Whether the admission level refuses a real share of the arrivals now (the engine's
    /// `level_binds`): a loose cut tightens only then.
    pub fn set_refusing(&mut self, refusing: bool) {
        self.refusing = refusing;
    }

    /// The timer's look at the app: `held` requests there now. An app that answers nothing
    /// for a while (eight baseline times, and at least `STALL_MIN`) while requests pile up
    /// in it (at least `STALL_PILE` and twice what it held at its last answer) has
    /// stalled: more concurrency adds only waiting. The limit drops to what the app holds,
    /// so the queue (and the stall) shows in the sidecar and a slot freed by a caller who
    /// gave up does not feed the stalled app more work nobody waits for; the first answer
    /// lifts the freeze. (Not to the configured floor: the effect is the same while nothing
    /// is answered, and a limit of 1 would read, in the status and the metrics, as if the
    /// app's concurrency need were 1.)
    pub fn observe_held(&mut self, now: Nanos, held: usize) {
        if !self.adapts() || self.frozen_from.is_some() {
            return;
        }
        let quiet = (8 * self.baseline()).max(STALL_MIN);
        let piled = held >= STALL_PILE.max(2 * self.held_at_answer);
        if piled && now.saturating_sub(self.last_answer) >= quiet && held < self.limit {
            self.frozen_from = Some(self.limit);
            self.trial = None;
            self.limit = held.max(self.cfg.floor);
            self.changed_at = now;
        }
    }

    /// The app answered (response headers) at `now`, `rtt` after dispatch, of which it
    /// spent `downstream` waiting on its downstreams; `held` requests were at the app
    /// (not waiting on a downstream), this one included; `route` is its route's key, if
    /// known ([`route_key`]). Returns the route's own time without a queue as far as known
    /// (see [`RouteCosts::answer`]).
    pub fn on_response(
        &mut self,
        now: Nanos,
        rtt: Duration,
        downstream: Duration,
        held: usize,
        route: Option<RouteKey>,
    ) -> Option<Duration> {
        let rtt = rtt.as_nanos().min(u64::MAX as u128) as u64;
        let own = rtt.saturating_sub(downstream.as_nanos().min(u64::MAX as u128) as u64);
        let expected = self.routes.answer(now, route, own);
        match expected {
            Some(e) => self.expected_sum += u128::from(e),
            None => self.unrouted = self.unrouted.saturating_add(1),
        }
        self.last_answer = now;
        self.held_at_answer = held;
        if let Some(limit) = self.frozen_from.take() {
            self.limit = limit;
            self.changed_at = now;
        }
        self.answers = self.answers.saturating_add(1);
        self.own_sum += u128::from(own);
        self.full += u32::from(held >= self.limit);
        self.peak = self.peak.max(held);
        if let Some(t) = self.trial.as_mut() {
            t.until = t.until.max(now + patience(t.before_mean));
            // Only requests dispatched once the app's backlog drained to the cut show what
            // it did (earlier ones queued behind what it held before).
            if held <= t.target && t.drained.is_none() {
                t.drained = Some(now);
            }
            if t.drained.is_some_and(|d| now.saturating_sub(rtt) > d) {
                t.answers = t.answers.saturating_add(1);
                t.own_sum += u128::from(own);
                t.full += u32::from(held >= t.target);
            }
        }
        expected.map(Duration::from_nanos)
    }

    /// Settles a trial that has its answers, closes the interval if it is over and judges
    /// it. Call it from a timer (every 50 ms or so) and after responses. Returns the limit.
    pub fn tick(&mut self, now: Nanos) -> usize {
        if !self.adapts() {
            return self.limit;
        }
        let before = self.limit;
        self.settle_trial(now);
        if self.limit != before {
            self.changed_at = now;
        }
        let before = self.limit;
        self.close_interval(now);
        if self.limit != before {
            self.changed_at = now;
        }
        self.limit
    }

    fn close_interval(&mut self, now: Nanos) {
        let elapsed = now.saturating_sub(self.start);
        // Nothing closes before `interval` (the length is at least that, and so is the early
        // close's age): the baseline, a scan of the history, is not needed on every answer.
        if elapsed < self.cfg.interval.as_nanos() as u64 {
            return;
        }
        let b = self.baseline();
        let length = (self.cfg.interval.as_nanos() as u64).max(b.saturating_mul(2));
        // Early, when the app's own time has already doubled (and more) on enough answers:
        // the start of an overload, whose backlog in the app grows with every millisecond.
        let doubled = b > 0
            && self.trial.is_none()
            && elapsed >= self.cfg.interval.as_nanos() as u64
            && self.answers >= self.min_samples()
            && self.own_sum as f64 / f64::from(self.answers)
                > 2.0 * b as f64 + self.tolerance(b as f64);
        if elapsed < length && !doubled {
            return;
        }
        let judged = self.answers >= self.min_samples();
        if !judged && elapsed < self.cfg.max_interval.as_nanos() as u64 {
            return;
        }
        let answers = f64::from(self.answers.max(1));
        let (relative, least) = (self.cfg.tolerance, self.cfg.tolerance_min.as_nanos() as f64);
        let span = (4 * length).max(ROUTE_EVIDENCE_MIN);
        let rise_began = self.rise_began.unwrap_or(self.start);
        let split =
            self.routes.close_interval(now, span, rise_began, |b: f64| (b * relative).max(least));
        let view = IntervalView {
            start: self.start,
            secs: elapsed as f64 / 1e9,
            answers: self.answers,
            alone: split.alone,
            neutral: split.neutral,
            own_sum: self.own_sum,
            expected_sum: self.expected_sum,
            unrouted_answers: self.unrouted,
            bound: std::mem::take(&mut self.bound),
            full: f64::from(self.full) / answers,
            peak: self.peak,
            grown: self.held_at_answer.saturating_sub(self.held_at_start),
        };
        self.held_at_start = self.held_at_answer;
        self.start = now;
        self.answers = 0;
        self.own_sum = 0;
        (self.expected_sum, self.unrouted) = (0, 0);
        self.full = 0;
        self.peak = 0;
        if judged {
            self.judge(now, view);
        }
    }

    fn min_samples(&self) -> u32 {
        self.cfg.min_samples.max(1)
    }

    /// The limit's decision on one closed interval (see the module doc).
    fn judge(&mut self, now: Nanos, w: IntervalView) {
        let horizon = self.cfg.horizon.as_nanos() as u64;
        while self.history.front().is_some_and(|r| now.saturating_sub(r.end) > horizon) {
            self.history.pop_front();
        }
        // Mean own time; the routed answers' mean no-queue time (over all answers) and the
        // share of answers without one.
        let answers = f64::from(w.answers.max(1));
        let mean = (w.own_sum as f64 / answers).max(1.0);
        let (expected, unrouted) =
            (w.expected_sum as f64 / answers, f64::from(w.unrouted_answers) / answers);
        let rate = f64::from(w.answers) / w.secs.max(1e-9);
        let known = self.baseline() > 0;
        // The interval's own baseline: what its mix of routes takes without a queue (each
        // answer at its route's, the unrouted at the overall one), never below the overall
        // one. A mix shift towards a slower route is then no rise; a queue, which makes
        // every route slower, still is (see `route_cost`).
        let b = if known {
            let overall = self.baseline() as f64;
            overall.max(expected + unrouted * overall)
        } else {
            mean
        };
        // Answers of a route not yet measured: nothing is judged (the routes are measured
        // before a rise is read, so that one can vouch for the app when another rises).
        let unknown = w.neutral > 0;
        if known && !unknown {
            let whole_rose = mean > b + self.tolerance(b);
            self.rise_began = if whole_rose { self.rise_began.or(Some(w.start)) } else { None };
        }
        self.block_answers += w.answers;
        self.block_sum += (mean * f64::from(w.answers)) as u128;
        // Whether the app queues is read on the routes that did not rise alone: a route
        // whose downstream queues (unseen without the egress role) rises while the others
        // stay at their baselines, and a queue in the app would have slowed them too (see
        // `route_cost`). From here on the interval is those answers: their mean own time,
        // their baseline, their rate. (With none of them in the interval, the calm answers
        // just before it say the same: no queue.)
        let (mean, b, rate) = if w.alone.answers == 0 || !known {
            (mean, b, rate)
        } else if let Some(rest) = w.answers.checked_sub(w.alone.answers).filter(|&n| n > 0) {
            let n = f64::from(rest);
            let overall = self.baseline() as f64;
            let own = (w.own_sum.saturating_sub(w.alone.own)) as f64 / n;
            let expected = (w.expected_sum.saturating_sub(w.alone.expected)) as f64 / n;
            let unrouted = f64::from(w.unrouted_answers) / n;
            (own.max(1.0), overall.max(expected + unrouted * overall), n / w.secs.max(1e-9))
        } else {
            (b, b, 0.0)
        };
        // Little's law on the app's own time: what it held, and what of that it served.
        let held = rate * mean / 1e9;
        let serving = rate * b.min(mean) / 1e9;
        let rose = !unknown && mean > b + self.tolerance(b);
        // Hysteresis: latency that held (for the probe) is within half the relative
        // tolerance (and half the absolute one); a limit with its headroom sits between
        // the two and stays.
        let clean =
            !unknown && mean <= b + (self.tolerance(b) / 2.0).min(b * self.cfg.tolerance / 2.0);
        let baseline = if self.block_answers >= BASELINE_SAMPLES {
            let block = self.block_sum as f64 / f64::from(self.block_answers);
            (self.block_answers, self.block_sum) = (0, 0);
            block as u64
        } else {
            0
        };
        self.history.push_back(Record {
            end: now,
            answers: w.answers,
            secs: w.secs,
            rate: f64::from(w.answers) / w.secs.max(1e-9),
            baseline,
            // Nothing is known to have held before there is a baseline, nor in an interval
            // not judged (a route not yet measured in it: its queue unread). (Nor when a route
            // rose alone: what the app held then is not known to have cost it nothing; a
            // worker-pool app at an overload's onset, before its vouching route's answers
            // show the queue, set its floor at 101 of 16 workers.)
            peak: if rose || unknown || !known || w.alone.answers > 0 { 0 } else { w.peak },
        });
        if rose {
            // Latency lags concurrency by up to a service time (an interval is at least
            // two): the interval before a rise held what caused it, not what the app
            // served without one.
            if let Some(before) = self.history.iter_mut().rev().nth(1) {
                before.peak = 0;
            }
        }
        let full = w.bound && w.full >= FULL;
        // The floor contradicted: while the level refuses, the limit bound throughout and
        // the app's own time rose at a concurrency the floor says it served without a rise
        // (a peak an earlier interval held for a moment, or an app that got slower). That
        // floor no longer stands for what the app serves, and kept, it holds the overload's
        // queue in the app until a refresh (a second later). A cut is still an experiment,
        // undone if the own time does not come down.
        if self.refusing && rose && full && w.alone.answers == 0 {
            let contradicted = self.limit;
            for record in self.history.iter_mut().filter(|r| r.peak >= contradicted) {
                record.peak = 0;
            }
        }
        // Saturated: the limit binds, and the sidecar's queue never ran dry for a whole
        // interval since.
        self.saturated_since = match (full, w.bound) {
            (_, false) => None,
            (true, true) => self.saturated_since.or(Some(w.start)),
            (false, true) => self.saturated_since,
        };
        let served = serving * (1.0 + self.cfg.headroom);
        let suspicious = rose && held >= served + 1.0;
        if !unknown {
            self.suspicious_since =
                if suspicious { self.suspicious_since.or(Some(w.start)) } else { None };
        }
        debug(|| {
            format!("judge {} ms: mean {:.1} b {:.1} alone {} neutral {} held {held:.1} serving {serving:.1} rate {rate:.0} rose {rose} clean {clean} bound {} full {:.2} limit {} floor {} trial {}", now / 1_000_000, mean / 1e6, b / 1e6, w.alone.answers, w.neutral, w.bound, w.full, self.limit, self.floor(), self.trial.is_some())
        });
        self.note_undo(now);
        if unknown || self.trial.is_some() || w.start < self.changed_at.saturating_add(b as u64) {
            return;
        }
        self.pre_trial_baseline = self.baseline();
        let saturated = self.saturated_since.map_or(0, |t| now.saturating_sub(t));
        let suspected = self.suspicious_since.map_or(0, |t| now.saturating_sub(t));
        let lasting = (10.0 * b).max(PERSISTENT_MIN as f64) as u64;
        let refresh = self.cfg.refresh_every.as_nanos() as u64;
        // A while after a loose cut the app still queues while the level refuses: an
        // overload (a burst would have passed). Cut to what it serves plus the headroom.
        // (The level refusing says the sidecar sheds: its queue, not the app's, is where
        // the priority order has to apply. Without that, a loose limit stays: a queue the
        // app works off at 0.9x must not be moved where it would read as an overload.)
        let tighten = match self.loose {
            Some(at) => {
                now.saturating_sub(at) >= lasting.max(TIGHTEN_AFTER) && rose && self.refusing
            }
            None => false,
        };
        if tighten {
            self.loose = None;
            let target = (served.ceil() as usize).max(self.cfg.floor);
            let ref_rate = self.recent_rate(now, (4.0 * mean) as u64);
            if target < self.limit && (target as f64) < held {
                let _ = self.start_trial(now, self.limit, mean, held, ref_rate, target);
                return;
            }
            // The baseline says the app serves all it holds, yet it queues: the baseline
            // was measured queued (an app overloaded from the start). Search down.
            let target = (self.limit as f64 * SEARCH_STEP).floor() as usize;
            if target >= self.cfg.floor && target < self.limit {
                let _ = self.start_trial(now, self.limit, mean, held, ref_rate, target);
                self.set_trial(|t| t.to_the_knee = true);
                return;
            }
        }
        // Saturated at the limit for a while, now and then: is the baseline still the
        // app's time without a queue (it was measured queued if the app was overloaded from
        // the start)? Search down to where a cut costs throughput.
        // (Until a search has measured the baseline below the knee, soon.)
        let spacing = if self.confirmed { refresh } else { TIGHTEN_AFTER };
        let refresh = saturated >= TIGHTEN_AFTER && now.saturating_sub(self.last_trial) >= spacing;
        if refresh {
            let target = (self.limit as f64 * SEARCH_STEP).floor() as usize;
            if target >= self.cfg.floor && target < self.limit {
                let ref_rate = self.recent_rate(now, (4.0 * mean) as u64);
                let _ = self.start_trial(now, self.limit, mean, held, ref_rate, target);
                self.set_trial(|t| t.to_the_knee = true);
                self.loose = None;
                return;
            }
        }
        if self.reopen_search(now, mean, held) {
            return;
        }
        // A queue the app builds up and keeps (an overload), not a Poisson burst it works
        // off within a few of its times: as much queued as served (its own time doubled),
        // or a queue that lasted ten of its times (and 100 ms).
        if suspicious && (suspected >= lasting || held >= 2.0 * served) {
            // Loose: the app keeps a queue of a few times what it serves, so a long burst
            // mostly stays in it (moved here, its waits would read as an overload). An
            // overload makes the level refuse, which tightens it within a second.
            // (With the level refusing already, it is an overload: no loose stage.)
            // (Nor when what the app holds grew by twice what it serves within the interval:
            // a step, not a burst.)
            let loose = !self.refusing && (w.grown as f64) < 2.0 * served;
            let share = if loose { LOOSE } else { 1.0 + self.cfg.headroom };
            // (What it serves at the rate of the last few of its times: one interval of an
            // app whose answers come in waves holds too few of them to count on.)
            let ref_rate = self.recent_rate(now, (4.0 * mean) as u64);
            let serving = ref_rate * b.min(mean) / 1e9;
            let target = ((serving * share).ceil() as usize).max(self.floor());
            // A cut to less than a tenth (and one) under what the app holds is no
            // experiment. (What it holds now: Little's average over the interval lags a
            // growing backlog.)
            let holds = held.max(self.held_at_answer as f64);
            if target < self.limit
                && (target as f64) <= holds - (holds / 10.0).max(1.0)
                && self.start_trial(now, self.limit, mean, held, ref_rate, target)
            {
                self.loose = loose.then_some(now);
            }
        } else if known && clean && full && self.limit < self.cfg.ceiling {
            // The limit, not the app, was the bottleneck: requests waited in the sidecar
            // while the app held all the limit allowed and answered at its own pace.
            let step = ((self.limit as f64 * self.cfg.growth).ceil() as usize).max(1);
            self.limit = (self.limit + step).min(self.cfg.ceiling);
        }
    }

    /// An undo (the cut did not bind throughout and the own time did not come down) takes
    /// the own time measured at the cut as the baseline and goes back to the limit before
    /// it. When the cut was too close to what the app held to tell (a loose cut of an app
    /// whose callers bound what it held, while their load still grew), that baseline is a
    /// queued one: the app then keeps its queue, its own time reads as its baseline, the
    /// limit (the ceiling) never binds, and neither a suspicion, the probe nor the refresh
    /// ever starts a search again. So an undone cut is noted here (unless it was this
    /// search's own): see `reopen_search`.
    fn note_undo(&mut self, now: Nanos) {
        if self.undone > self.seen_undone {
            self.seen_undone = self.undone;
            let own_search = std::mem::take(&mut self.retrying);
            let before = self.pre_trial_baseline;
            self.reopen = (!own_search && before > 0).then_some((now, before));
        } else if self.trial.is_none() {
            self.retrying = false;
        }
    }

    /// A while (`TIGHTEN_AFTER`) after an undone cut, the app still takes more than twice
    /// its own time from before the cut, holds at least four at once, and the limit does
    /// not bind: one knee search from what it holds (a quarter less each step, the earlier
    /// baseline back in the horizon so the healthy queue is measured from it), which ends
    /// where a cut costs throughput (an app that got slower: its need, plus the headroom)
    /// or finds the queue and moves it into the sidecar. At most one per undo, and none
    /// once a search has measured the baseline below the knee; forgotten after the horizon.
    fn reopen_search(&mut self, now: Nanos, mean: f64, held: f64) -> bool {
        let Some((at, before)) = self.reopen else { return false };
        let since = now.saturating_sub(at);
        if self.confirmed || since > self.cfg.horizon.as_nanos() as u64 {
            self.reopen = None;
            return false;
        }
        let holds = held.max(self.held_at_answer as f64);
        let slower = mean > 2.0 * before as f64 + self.tolerance(before as f64);
        let waited = since >= TIGHTEN_AFTER && now.saturating_sub(self.last_trial) >= TIGHTEN_AFTER;
        if !waited || !slower || holds < 4.0 || self.limit as f64 <= holds {
            return false;
        }
        self.reopen = None;
        self.remember_baseline(now, before as f64);
        let target = (holds * SEARCH_STEP).floor() as usize;
        let ref_rate = self.recent_rate(now, (4.0 * mean) as u64);
        if !self.start_trial(now, self.limit, mean, held, ref_rate, target) {
            return false;
        }
        self.set_trial(|t| t.to_the_knee = true);
        self.retrying = true;
        self.loose = None;
        true
    }

    fn start_trial(
        &mut self,
        now: Nanos,
        search_from: usize,
        before_mean: f64,
        before_held: f64,
        ref_rate: f64,
        target: usize,
    ) -> bool {
        let mut target = target.clamp(self.cfg.floor, self.cfg.ceiling);
        if !self.refusing || self.downstream_bound {
            // Nothing refused: the app keeps a queue the detector calls healthy (moved into
            // the sidecar, it would read as an overload, and no priority order is needed).
            // (A middle hop bound by its downstreams keeps it while refusing too: `healthy`.)
            target = target.max(self.healthy(now));
            if target >= self.limit {
                return false;
            }
        }
        self.trial = Some(Trial {
            until: now + patience(before_mean),
            search_from,
            prev: search_from,
            before_mean,
            before_held,
            ref_rate,
            target,
            drained: None,
            to_the_knee: false,
            answers: 0,
            own_sum: 0,
            full: 0,
        });
        self.cuts += 1;
        self.limit = target;
        true
    }

    fn set_trial(&mut self, f: impl FnOnce(&mut Trial)) {
        if let Some(t) = self.trial.as_mut() {
            f(t);
        }
    }

    /// A trial with enough answers is judged (see the module doc); one that got none in its
    /// time is kept (a stalled app proves nothing either way).
    fn settle_trial(&mut self, now: Nanos) {
        let Some(t) = self.trial else { return };
        // At least half a turnover of the app's concurrency (its answers come in waves).
        let enough = self.min_samples().max(u32::try_from(t.target / 2).unwrap_or(u32::MAX));
        if t.answers < enough {
            if now >= t.until {
                self.trial = None;
                self.last_trial = now;
            }
            return;
        }
        self.trial = None;
        self.last_trial = now;
        debug(|| {
            format!(
                "settle {} ms: {t:?} after {:.1}",
                now / 1_000_000,
                t.own_sum as f64 / f64::from(t.answers) / 1e6
            )
        });
        let after = (t.own_sum as f64 / f64::from(t.answers)).max(1.0);
        // A queue's wait scales with what is in it.
        let expected = (t.before_mean * t.target as f64 / t.before_held.max(1.0)).max(1.0);
        if f64::from(t.full) >= FULL * f64::from(t.answers) {
            // Little's law: the app held `target` throughout. (Own time that fell in
            // proportion is still a queue's, whatever a rate estimate says: below the knee
            // it would have stopped at the service time.)
            let rate = t.target as f64 / after * 1e9;
            let queue = after <= expected * (1.0 + PROPORTIONAL);
            if queue || rate >= t.ref_rate * (1.0 - self.cfg.rate_tolerance) {
                self.free_cut(now, t, after, rate);
            } else {
                self.costly_cut(now, t, after);
            }
            return;
        }
        if after <= (t.before_mean + expected) / 2.0 {
            // Kept. A search step that did not bind throughout says nothing of the
            // throughput: while its own time still fell in proportion (a queue), the search
            // goes on; once it did not, the queue is about gone: headroom back, and this
            // own time is the baseline.
            if t.to_the_knee {
                if after <= expected * (1.0 + PROPORTIONAL) {
                    self.free_cut(now, t, after, t.target as f64 / after * 1e9);
                } else {
                    self.confirmed = true;
                    self.remember_baseline(now, after);
                    let with_headroom = (t.target as f64 * (1.0 + self.cfg.headroom)).ceil();
                    self.limit = (with_headroom as usize).clamp(t.target, t.prev.max(t.target));
                }
            }
            return;
        }
        // Undone: the app's own time did not come down with its concurrency. It is now
        // what was measured after the cut, and what the app held before it, it serves.
        self.undone += 1;
        self.limit = t.search_from;
        if self.cfg.middle_hop {
            // A middle hop's app may hold a worker while it waits on its calls (their slots
            // are lent): its own time then includes the wait for a worker those calls hold,
            // which no cut of the limit brings down. Back to what it held before the cut
            // (plus the headroom), not to the ceiling: undone to 256, a 16-worker hop took
            // 130 requests into its own queue, where no priority order applies.
            let held = (t.before_held * (1.0 + self.cfg.headroom)).ceil() as usize;
            self.limit = held.max(t.target + 1).min(t.search_from);
        }
        self.history.clear();
        let peak = t.before_held.ceil() as usize;
        self.history.push_back(Record {
            end: now,
            baseline: after as u64,
            peak,
            ..Record::default()
        });
    }

    /// The app completes as much with less. Whatever looked held "without rising latency"
    /// above this was measured against a baseline that was itself queued.
    ///
    /// (The routes' baselines are kept: each is the lowest block over the horizon, which
    /// falls by itself once the app answers without the queue the cut removed. Forgotten
    /// here, they were measured again inside the queue the cut still leaves, read it as the
    /// routes' own time, and the probe grew the limit into the app's queue: 14 on an app of 4
    /// workers for 2.5 s after a step to 3x.)
    fn free_cut(&mut self, now: Nanos, t: Trial, after: f64, rate: f64) {
        for r in self.history.iter_mut() {
            r.peak = r.peak.min(t.target);
        }
        let next = ((t.target as f64 * SEARCH_STEP).floor() as usize).max(self.cfg.floor);
        self.history.push_back(Record {
            end: now,
            rate,
            baseline: after as u64,
            ..Record::default()
        });
        if t.to_the_knee && next < t.target {
            let ref_rate = t.ref_rate.max(rate);
            let _ = self.start_trial(now, t.search_from, after, t.target as f64, ref_rate, next);
            self.set_trial(|n| {
                n.prev = t.target;
                n.to_the_knee = true;
            });
        } else if t.prev != t.search_from || t.to_the_knee {
            self.confirmed |= t.to_the_knee;
            // A later step (a quarter below the one before) found the queue gone: give it
            // its headroom back. (A suspicion's first step carries it already.)
            let with_headroom = (t.target as f64 * (1.0 + self.cfg.headroom)).ceil() as usize;
            self.limit = with_headroom.clamp(t.target, t.prev.max(t.target));
        }
    }

    /// At `target` the app serves without a queue, and fewer than before: its own time
    /// there is its baseline, and it needs its earlier rate times that time.
    fn costly_cut(&mut self, now: Nanos, t: Trial, after: f64) {
        self.costly += 1;
        self.confirmed = true;
        let needs = t.ref_rate * after / 1e9;
        // Capped where the search started, not at the step before: a step judged free
        // within the rate tolerance may already have cost the app some of its concurrency
        // (31 workers searched 38 -> 28 -> 21 stayed at 28).
        let limit = ((needs * (1.0 + self.cfg.headroom)).ceil() as usize)
            .max(t.target + 1)
            .min(t.search_from.max(t.target + 1));
        self.history.clear();
        let peak = needs.floor() as usize;
        self.history.push_back(Record {
            end: now,
            rate: t.ref_rate,
            baseline: after as u64,
            peak,
            ..Record::default()
        });
        self.limit = limit.clamp(self.cfg.floor, self.cfg.ceiling);
    }

    /// What the app completes (at its recent rate, and at least at the rate a trial started
    /// from) in its baseline own time plus the healthy queue: the least a cut leaves it while
    /// the level refuses nothing. (Not from the mean own time: a slower app must never be
    /// left more.)
    ///
    /// A middle hop's arrivals are what its callers let through after its own level and its
    /// downstreams' (an entry refuses by them): while it refuses, its completion rate says
    /// what it was sent, not what it needs, and a knee searched at that rate left the app
    /// less than it needs once the callers send again (a 16-worker hop with 20 ms of own
    /// work at 250/s searched down to 4). Its queue then built in the sidecar, its level
    /// cut, and the healthy API it serves beside the overloaded one was refused at its door.
    /// So while its slots are held mostly by requests waiting on slow downstreams (its level
    /// spares the routes that do not call them), a middle hop keeps the healthy queue at the
    /// best completion rate over the horizon, refusing or not. (A middle hop overloaded by
    /// its own work goes to the knee as any app: its queue then belongs in the sidecar,
    /// where the priority order applies.)
    fn healthy(&self, now: Nanos) -> usize {
        let mut rate = self.recent_rate(now, 0).max(self.trial.map_or(0.0, |t| t.ref_rate));
        if self.downstream_bound {
            rate = rate.max(self.max_rate());
        }
        let span = self.baseline() as f64 + self.cfg.healthy_queue.as_nanos() as f64;
        ((rate * span / 1e9).ceil() as usize).clamp(self.cfg.floor, self.cfg.ceiling)
    }

    fn remember_baseline(&mut self, now: Nanos, own: f64) {
        self.history.push_back(Record { end: now, baseline: own as u64, ..Record::default() });
    }

    /// Completions per second over the judged intervals of the last `span` (at least
    /// 250 ms, and at least the last interval): one interval of a fixed-time app holds a
    /// whole number of its waves of completions, too few to count on.
    fn recent_rate(&self, now: Nanos, span: Nanos) -> f64 {
        let from = now.saturating_sub(span.max(250_000_000));
        let (mut answers, mut secs) = (0u64, 0.0);
        for r in self.history.iter().rev().filter(|r| r.secs > 0.0) {
            if r.end < from && secs > 0.0 {
                break;
            }
            answers += u64::from(r.answers);
            secs += r.secs;
        }
        if secs > 0.0 {
            answers as f64 / secs
        } else {
            0.0
        }
    }

    fn tolerance(&self, baseline: f64) -> f64 {
        (baseline * self.cfg.tolerance).max(self.cfg.tolerance_min.as_nanos() as f64)
    }

    /// The lowest baseline candidate over the horizon; 0 before any.
    fn baseline(&self) -> Nanos {
        self.history.iter().map(|r| r.baseline).filter(|&b| b > 0).min().unwrap_or(0)
    }

    /// The most the app held at once without its own time rising, over the horizon.
    fn floor(&self) -> usize {
        let seen = self.history.iter().map(|r| r.peak).max().unwrap_or(0);
        seen.clamp(self.cfg.floor, self.cfg.ceiling)
    }

    pub fn status(&self) -> LimitStatus {
        LimitStatus {
            limit: self.limit,
            ceiling: self.cfg.ceiling,
            floor: self.floor(),
            completions_per_sec: self.max_rate(),
            baseline: Duration::from_nanos(self.baseline()),
            trying: self.trial.is_some(),
            cuts: self.cuts,
            costly: self.costly,
            undone: self.undone,
        }
    }

    /// Best completion rate of a judged interval over the horizon, per second.
    pub fn max_rate(&self) -> f64 {
        self.history.iter().map(|r| r.rate).fold(0.0, f64::max)
    }
}

/// `LIMIT_DEBUG=1 cargo test -p admission-core --lib adaptive_limit -- --nocapture`: every
/// judgement and trial, for tuning against the model in the tests.
#[cfg(test)]
fn debug(f: impl FnOnce() -> String) {
    if std::env::var_os("LIMIT_DEBUG").is_some() {
        eprintln!("{}", f());
    }
}

#[cfg(not(test))]
fn debug(_: impl FnOnce() -> String) {}

/// How long a trial waits for the next answer: a second, or four of the app's times.
fn patience(mean: f64) -> Nanos {
    (4.0 * mean) as u64 + 1_000_000_000
}

mod route_cost;
mod worker_bound;
pub use route_cost::{route_key, RouteCosts, RouteKey, RouteSplit, Sums};
pub use worker_bound::WorkerBound;

#[cfg(test)]
mod tests;
