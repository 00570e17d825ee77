//! A deterministic discrete-event simulation of one sidecar in front of one app, driven
//! through the real [`AdmissionEngine`], [`AdaptiveLimit`] and queue policy
//! ([`admission_core::queue_policy`], the proxy's own) on a [`ManualClock`]. Shared by the
//! `simulate` example and the tests in `tests/simulation.rs`; no I/O here.
//!
//! Model: Poisson arrivals (a mix of business classes, user ids hashed by the real
//! [`UserPriorityHasher`]) -> `admit` -> the door (expected wait against the budget and,
//! while the level binds, the max wait) -> the sidecar's priority-ordered pending queue
//! ([`queue`]; each waiter's timer gives up once its budget no longer covers the app's
//! typical time, and past the max wait evicts the cut class behind it and goes) -> the
//! in-flight limit (fixed, or adaptive) -> the app: its own unbounded FIFO queue in front
//! of `W` workers of service time `S` (which may change mid-run, or stall). The dequeue
//! check runs as a waiter leaves. A 50 ms timer reports the queue to the engine, ticks it
//! and ticks the adaptive limit.
//!
//! Every request has a client timeout (its deadline, 500 ms). An outcome that reaches
//! the client after it counts as a timeout, whatever it was.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Duration;

use admission_core::adaptive_limit::{AdaptiveLimit, AdaptiveLimitConfig};
use admission_core::queue_policy::{
    completion_rate, serve_next, Conditions, Door, QueuePolicy, Rates, Step,
};
use admission_core::{
    AdmissionEngine, AdmissionLevel, Decision, EngineConfig, ManualClock, Priority,
    UserPriorityHasher,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp};
use serde::Serialize;

#[path = "queue.rs"]
mod queue;

use queue::{Pending, Request, SimQueue};

const SEC: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;
/// The trace's resolution.
const TRACE_NS: u64 = 100 * MS;

/// How many requests the app gets at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Inflight {
    Fixed(usize),
    /// Adaptive, up to this ceiling.
    Adaptive(usize),
}

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub workers: u32,
    pub service: Duration,
    /// Offered load as multiples of capacity, one phase each, equal lengths.
    pub phases: Vec<f64>,
    pub seconds: u32,
    /// Share of each business class `0..`, most important first (normalised).
    pub mix: Vec<f64>,
    pub users: u32,
    pub seed: u64,
    /// Client timeout and task timeout.
    pub task_timeout: Duration,
    pub tick: Duration,
    pub engine: EngineConfig,
    pub inflight: Inflight,
    /// Refuse at the door when the expected wait exceeds the budget (or the max wait).
    pub door: bool,
    /// Run each waiter's timer: refuse it once its budget no longer covers the app's time,
    /// and apply the max wait (else: the dequeue check only).
    pub give_up: bool,
    /// While the level binds, a waiter of the cut class (or a less important one) that
    /// waited longer than this evicts the less important behind it and is dropped, unless
    /// it is about to be served (zero = off).
    pub overload_max_wait: Duration,
    /// `(from second, to second, factor)`: the service time is multiplied meanwhile.
    pub slowdown: Option<(u32, u32, f64)>,
    /// `(from ms, for ms)`: the app answers nothing meanwhile.
    pub stall: Option<(u64, u64)>,
    /// `(on ms, off ms)`: bursts. Within each phase the load runs for `on` ms, then nothing
    /// arrives for `off` ms, repeated (the phase's load is the burst's, not the average).
    pub on_off: Option<(u64, u64)>,
    /// A caller in front that runs weir's egress: it refuses, before sending, every request
    /// beyond the level the sidecar advertised this long ago (the level travels on
    /// responses, so the caller hears of a change late). The sidecar's histogram is then
    /// censored, as a downstream's behind a propagating caller.
    pub caller_lag: Option<Duration>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            workers: 4,
            service: Duration::from_millis(10),
            phases: vec![3.0],
            seconds: 60,
            mix: vec![1.0, 1.0, 1.0],
            users: 10_000,
            seed: 1,
            task_timeout: Duration::from_millis(500),
            tick: Duration::from_millis(50),
            engine: EngineConfig::default(),
            inflight: Inflight::Adaptive(256),
            door: true,
            give_up: true,
            overload_max_wait: Duration::from_millis(30),
            slowdown: None,
            stall: None,
            on_off: None,
            caller_lag: None,
        }
    }
}

impl SimConfig {
    /// The app's nominal capacity, requests per second.
    pub fn capacity_per_sec(&self) -> f64 {
        self.workers as f64 * SEC as f64 / self.service.as_nanos() as f64
    }

    fn phase_len(&self) -> usize {
        (self.seconds as usize).div_ceil(self.phases.len()).max(1)
    }

    fn load_at(&self, second: u32) -> f64 {
        self.phases[(second as usize / self.phase_len()).min(self.phases.len() - 1)]
    }

    /// Steady period: the second half of the last phase.
    fn steady_from(&self) -> usize {
        let last_phase_start = self.phase_len() * (self.phases.len() - 1);
        (last_phase_start + self.phase_len() / 2).min(self.seconds.saturating_sub(1) as usize)
    }

    /// The offered load at `ns` (a multiple of capacity): the phase's, or nothing in the
    /// off part of an on/off cycle.
    fn rate_at(&self, ns: u64) -> f64 {
        match self.on_off {
            Some((on, off)) if ns % ((on + off) * MS) >= on * MS => 0.0,
            _ => self.load_at((ns / SEC) as u32),
        }
    }

    /// The next instant after `ns` at which the offered load may change: a phase boundary
    /// (a whole second) or an on/off edge.
    fn next_rate_change(&self, ns: u64) -> u64 {
        let second = (ns / SEC + 1) * SEC;
        match self.on_off {
            Some((on, off)) => {
                let period = (on + off) * MS;
                let start = ns - ns % period;
                let edge = if ns - start < on * MS { start + on * MS } else { start + period };
                edge.min(second)
            }
            None => second,
        }
    }

    fn service_ns_at(&self, now: u64) -> u64 {
        let base = self.service.as_nanos() as u64;
        match self.slowdown {
            Some((from, to, f)) if now >= from as u64 * SEC && now < to as u64 * SEC => {
                (base as f64 * f) as u64
            }
            _ => base,
        }
    }

    fn classes(&self) -> usize {
        self.mix.len().max(1)
    }
}

/// One second of simulated time, by arrival (outcomes) or by event time (the rest).
#[derive(Debug, Clone, Default, Serialize)]
pub struct WindowReport {
    pub second: u32,
    pub load: f64,
    pub offered: u64,
    pub admitted: u64,
    /// Answered by the app within the request's deadline (by completion time).
    pub completed: u64,
    pub gate_dropped: u64,
    pub mean_queuing_ms: f64,
    pub level: String,
    pub overloaded: bool,
    pub capacity_estimate: Option<f64>,
    pub inflight_limit: usize,
    /// Per class, of the requests that arrived this second: served in time / offered.
    pub class_success: Vec<f64>,
    #[serde(skip)]
    queuing_sum_ns: u64,
    #[serde(skip)]
    queuing_count: u64,
    #[serde(skip)]
    class_offered: Vec<u64>,
    #[serde(skip)]
    class_ok: Vec<u64>,
}

/// The state every 100 ms, for plots.
#[derive(Debug, Clone, Serialize)]
pub struct TracePoint {
    pub ms: u64,
    /// Compound admission level (32767 = fully open).
    pub level: u16,
    pub inflight_limit: usize,
    pub queue_depth: usize,
    pub oldest_wait_ms: f64,
    pub overloaded: bool,
}

/// One business class over a period.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClassReport {
    pub business: u8,
    pub offered: u64,
    pub completed: u64,
    pub success: f64,
    /// This class's own offered load over capacity.
    pub load: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
}

/// One load phase, counted by arrival.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PhaseReport {
    pub load: f64,
    pub from_second: u32,
    /// Served in time over what the app can do in the phase (or what was offered, if less).
    pub goodput_ratio: f64,
    /// Refusals (of any kind) and timeouts, over offered.
    pub refused_fraction: f64,
    /// Of all refusals and timeouts, the share the client saw as a timeout.
    pub timeout_share: f64,
    /// Admitted (served) latency, arrival to answer, from the 2nd second of the phase on.
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    /// From the phase start until the level first cut (the first refusal by level), ms.
    pub first_cut_ms: Option<u64>,
    /// From the phase start until every class is at >= 99% success in every later
    /// second of the phase (by arrival); `None` if never.
    pub recovered_after_s: Option<u32>,
    pub classes: Vec<ClassReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub law: String,
    pub inflight: String,
    pub capacity_per_sec: f64,
    pub phases: Vec<f64>,
    /// First second of the steady period the ratios below are measured over.
    pub steady_from: u32,
    pub goodput_ratio: f64,
    /// Refused (any way) plus timed out, over offered, in the steady period.
    pub shed_fraction: f64,
    pub ideal_shed_fraction: f64,
    pub shed_error_pp: f64,
    /// Per load step: windows from the step until the loop stays settled.
    pub settle_windows: Vec<Option<u32>>,
    /// Per load step, overload-bench's strict rule: seconds from the step until every
    /// 500 ms span (on a 100 ms grid, by arrival) serves >= 90% of capacity with served
    /// p90 <= S + 40 ms; and the spans that fail it (start in ms after the step).
    pub strict_settle_s: Vec<Option<f64>>,
    pub strict_failures: Vec<Vec<String>>,
    /// Standard deviation of admitted per window over capacity, steady period.
    pub oscillation: f64,
    /// The same over the second half of each phase.
    pub phase_oscillation: Vec<f64>,
    pub mean_queuing_ms: f64,
    /// Steady period, per class.
    pub classes: Vec<ClassReport>,
    pub phase_reports: Vec<PhaseReport>,
    /// The in-flight limit at the end of each phase.
    pub phase_end_limit: Vec<usize>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<WindowReport>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub trace: Vec<TracePoint>,
    /// Behind a caller (`SimConfig::caller_lag`), steady period: of the requests that
    /// reached the sidecar, the share it refused (its level, door or queue), after the
    /// caller had sent them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused_of_received: Option<f64>,
}

/// How one request ended.
#[derive(Debug, Clone, Copy, PartialEq)]
enum End {
    /// Answered by the app at this time.
    Served(u64),
    /// Refused (any reason) at this time.
    Refused(u64),
}

// === run ===

/// A waiter refused while it waits (its budget gone, or evicted by the max wait): a queuing
/// sample that never reached the app.
fn refuse_waiter(
    engine: &AdmissionEngine<ManualClock>,
    w: &mut WindowReport,
    ends: &mut [Option<End>],
    id: u64,
    waited: u64,
    now: u64,
) {
    engine.record_queuing(Duration::from_nanos(waited));
    engine.record_gate_drop();
    w.queuing_sum_ns += waited;
    w.queuing_count += 1;
    w.gate_dropped += 1;
    ends[id as usize] = Some(End::Refused(now));
}

/// What the sidecar knows at `now`, for the queue policy.
fn conditions(engine: &AdmissionEngine<ManualClock>, now: u64, typical_app: u64) -> Conditions {
    Conditions { now, level: engine.level(), level_binds: engine.level_binds(), typical_app }
}

/// What the queue policy's completion rate is made of, read as the proxy reads it.
fn rates(engine: &AdmissionEngine<ManualClock>, limit: &AdaptiveLimit) -> Rates {
    Rates {
        capacity_estimate: engine.capacity_estimate(),
        best_recent: limit.max_rate(),
        inflight_limit: limit.limit(),
    }
}

pub fn run(cfg: &SimConfig) -> Summary {
    let clock = ManualClock::new();
    let engine = AdmissionEngine::new(&cfg.engine, clock.clone());
    let mut limit = match cfg.inflight {
        Inflight::Fixed(n) => AdaptiveLimit::fixed(n, 0),
        Inflight::Adaptive(ceiling) => {
            AdaptiveLimit::new(AdaptiveLimitConfig { ceiling, ..AdaptiveLimitConfig::default() }, 0)
        }
    };
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let hasher = UserPriorityHasher::new(*b"weir-simulator", UserPriorityHasher::DEFAULT_REKEY);
    let user_levels: Vec<u8> = (0..cfg.users)
        .map(|u| hasher.user_priority_in_period(format!("user-{u}").as_bytes(), 1))
        .collect();
    let mix_total: f64 = cfg.mix.iter().sum::<f64>().max(1e-9);
    let mix_cdf: Vec<f64> = cfg
        .mix
        .iter()
        .scan(0.0, |acc, m| {
            *acc += m / mix_total;
            Some(*acc)
        })
        .collect();
    let capacity = cfg.capacity_per_sec();
    let timeout_ns = cfg.task_timeout.as_nanos() as u64;
    let tick_ns = cfg.tick.as_nanos() as u64;
    let policy = QueuePolicy::new(cfg.task_timeout, cfg.overload_max_wait, false);
    let end = cfg.seconds as u64 * SEC;
    let classes = cfg.classes();

    let mut windows: Vec<WindowReport> = (0..cfg.seconds)
        .map(|s| WindowReport {
            second: s,
            load: cfg.load_at(s),
            class_offered: vec![0; classes],
            class_ok: vec![0; classes],
            ..Default::default()
        })
        .collect();
    let mut trace = Vec::new();
    let mut requests: Vec<Request> = Vec::new();
    let mut ends: Vec<Option<End>> = Vec::new();
    let mut pending = Pending::new();
    let mut give_ups: BinaryHeap<Reverse<(u64, u16, u64)>> = BinaryHeap::new();
    // The app: its own FIFO in front of its workers; (done at, id, dispatched at).
    let mut app_queue: VecDeque<(u64, u64)> = VecDeque::new();
    let mut in_service: BinaryHeap<Reverse<(u64, u64, u64)>> = BinaryHeap::new();
    let mut inflight = 0usize;
    let mut typical_app = 0u64;

    let mut now = 0u64;
    let mut next_tick = tick_ns;
    let mut next_trace = 0u64;
    let sample_gap = |rng: &mut StdRng, at: u64| -> u64 {
        let rate = cfg.rate_at(at) * capacity / SEC as f64;
        let exp = Exp::new(rate.max(1e-12)).unwrap_or_else(|_| Exp::new(1e-12).expect("valid"));
        (exp.sample(rng).ceil() as u64).max(1)
    };
    // The next arrival after one at `now`. Memoryless: where the rate changes before the
    // sampled gap ends, the gap restarts at the change with the new rate.
    let next_arrival_after = |rng: &mut StdRng, now: u64| -> u64 {
        let next = now + sample_gap(rng, now);
        if cfg.on_off.is_none() {
            // Phases: a whole second each.
            if cfg.rate_at(now) == cfg.rate_at(next) {
                return next;
            }
            let phase_end = (now / SEC + 1) * SEC;
            return phase_end + sample_gap(rng, phase_end);
        }
        let (mut at, mut next) = (now, next);
        loop {
            let change = cfg.next_rate_change(at);
            if next < change && cfg.rate_at(at) > 0.0 {
                return next;
            }
            if change >= end {
                return if cfg.rate_at(at) > 0.0 { next } else { end };
            }
            at = change;
            next = at + if cfg.rate_at(at) > 0.0 { sample_gap(rng, at) } else { 0 };
        }
    };
    let mut next_arrival = next_arrival_after(&mut rng, 0);
    let stall = cfg.stall.map(|(from, len)| (from * MS, (from + len) * MS));
    // The levels the sidecar advertised and since when (a level is recorded at the first
    // event after the one that changed it): the caller applies the newest one advertised at
    // least `caller_lag` ago, the front of the queue once older ones are dropped.
    let caller_lag_ns = cfg.caller_lag.map(|lag| lag.as_nanos() as u64);
    let mut advertised: VecDeque<(u64, AdmissionLevel)> =
        VecDeque::from([(0, AdmissionLevel::FULLY_OPEN)]);
    let mut refused_by_caller: Vec<bool> = Vec::new();

    while now < end {
        if advertised.back().is_some_and(|&(_, level)| level != engine.level()) {
            advertised.push_back((now, engine.level()));
        }
        let next_done = in_service.peek().map_or(u64::MAX, |d| d.0 .0);
        let next_give_up = give_ups.peek().map_or(u64::MAX, |g| g.0 .0);
        now = next_arrival.min(next_done).min(next_tick).min(next_give_up);
        if now >= end {
            break;
        }
        clock.set(now);
        let second = (now / SEC) as usize;
        if now == next_done {
            let Reverse((_, id, dispatched)) = in_service.pop().expect("front exists");
            if let Some((from, to)) = stall {
                if now >= from && now < to {
                    // The app is stuck: this answer comes when it is back.
                    in_service.push(Reverse((to, id, dispatched)));
                    continue;
                }
            }
            let r = requests[id as usize];
            let rtt = now - dispatched;
            // (The app holds it until now: the limit is told what it held, this one too.)
            limit.on_response(now, Duration::from_nanos(rtt), Duration::ZERO, inflight, None);
            inflight -= 1;
            limit.tick(now);
            engine.record_completion();
            typical_app =
                if typical_app == 0 { rtt } else { typical_app - typical_app / 8 + rtt / 8 };
            ends[id as usize] = Some(End::Served(now));
            if now <= r.deadline {
                windows[second].completed += 1;
            }
            // A worker is free: the app's own queue goes first.
            if let Some((id, at)) = app_queue.pop_front() {
                in_service.push(Reverse((now + cfg.service_ns_at(now), id, at)));
            }
        } else if now == next_arrival {
            next_arrival = next_arrival_after(&mut rng, now);
            let u: f64 = rng.random();
            let class = mix_cdf.iter().position(|&c| u < c).unwrap_or(classes - 1) as u8;
            let user = user_levels[rng.random_range(0..cfg.users) as usize];
            let p = Priority { business: class, user };
            let id = requests.len() as u64;
            let mut r = Request {
                arrival: now,
                deadline: now + timeout_ns,
                class,
                compound: p.compound(),
                expiry: 0,
            };
            r.expiry = policy.expiry(&r.waiter());
            requests.push(r);
            ends.push(None);
            refused_by_caller.push(false);
            let w = &mut windows[second];
            w.offered += 1;
            if let Some(lag) = caller_lag_ns {
                while advertised.len() > 1 && advertised[1].0 + lag <= now {
                    advertised.pop_front();
                }
                if p.compound() > advertised[0].1.compound() {
                    ends[id as usize] = Some(End::Refused(now));
                    refused_by_caller[id as usize] = true;
                    continue;
                }
            }
            if engine.admit(p) == Decision::Shed {
                ends[id as usize] = Some(End::Refused(now));
                continue;
            }
            // The door, for a request that finds no free slot (as the proxy's `try_slot`).
            if cfg.door && (inflight >= limit.limit() || pending.len() > 0) {
                let waiting = SimQueue::new(&mut pending, rates(&engine, &limit));
                let at = conditions(&engine, now, typical_app);
                if let Door::Refuse(_) = queue::door_turn(&policy, &r, &at, &waiting) {
                    ends[id as usize] = Some(End::Refused(now));
                    continue;
                }
            }
            windows[second].admitted += 1;
            pending.push(id, r);
            if cfg.give_up {
                let at = conditions(&engine, now, typical_app);
                if let Some(at) = policy.first_check(&r.waiter(), &at) {
                    give_ups.push(Reverse((at, r.compound, id)));
                }
            }
        } else if now == next_give_up {
            let Reverse((_, compound, id)) = give_ups.pop().expect("exists");
            let Some(r) = pending.get((compound, id)).copied() else { continue };
            let mut waiting = SimQueue::new(&mut pending, rates(&engine, &limit));
            let at = conditions(&engine, now, typical_app);
            let step = queue::timer_turn(&policy, &r, &at, &mut waiting);
            for (evicted, e) in waiting.evicted {
                refuse_waiter(
                    &engine,
                    &mut windows[second],
                    &mut ends,
                    evicted,
                    now - e.arrival,
                    now,
                );
            }
            match step {
                Step::CheckAt(again) => give_ups.push(Reverse((again, compound, id))),
                Step::Refuse(_) => {
                    if let Some(r) = pending.remove((compound, id)) {
                        // Refused while waiting, before the client's timeout.
                        let waited = now - r.arrival;
                        refuse_waiter(&engine, &mut windows[second], &mut ends, id, waited, now);
                    }
                }
            }
        } else {
            next_tick += tick_ns;
            let oldest = pending.oldest().map_or(0, |a| now - a);
            engine.observe_queue(pending.len(), Duration::from_nanos(oldest));
            engine.tick();
            limit.set_refusing(engine.level_binds());
            limit.observe_held(now, inflight);
            limit.tick(now);
        }
        // Hand waiting requests to the app while the limit allows, in the policy's order.
        let service = policy.service(
            &conditions(&engine, now, typical_app),
            completion_rate(rates(&engine, &limit), typical_app),
        );
        while inflight < limit.limit() {
            let Some((id, r)) = serve_next(service, &mut pending) else { break };
            let waited = now - r.arrival;
            engine.record_queuing(Duration::from_nanos(waited));
            let w = &mut windows[second];
            w.queuing_sum_ns += waited;
            w.queuing_count += 1;
            let at = conditions(&engine, now, typical_app);
            if !policy.at_dequeue(&r.waiter(), &at, waited > 0).is_forward() {
                engine.record_gate_drop();
                w.gate_dropped += 1;
                ends[id as usize] = Some(End::Refused(now));
                continue;
            }
            inflight += 1;
            if in_service.len() < cfg.workers as usize {
                in_service.push(Reverse((now + cfg.service_ns_at(now), id, now)));
            } else {
                app_queue.push_back((id, now));
            }
        }
        if pending.len() > 0 {
            limit.on_waiting();
        }
        while next_trace <= now {
            trace.push(TracePoint {
                ms: next_trace / MS,
                level: engine.level().compound(),
                inflight_limit: limit.limit(),
                queue_depth: pending.len(),
                oldest_wait_ms: pending.oldest().map_or(0.0, |a| (now - a) as f64 / 1e6),
                overloaded: engine.level() != AdmissionLevel::FULLY_OPEN,
            });
            next_trace += TRACE_NS;
        }
        let w = &mut windows[second];
        w.level = engine.level().to_string();
        w.overloaded = engine.overloaded();
        w.inflight_limit = limit.limit();
        w.capacity_estimate = engine.status().capacity_per_sec;
    }
    for (r, e) in requests.iter().zip(&ends) {
        if r.deadline > end {
            continue; // could not finish within the run
        }
        windows[(r.arrival / SEC) as usize].class_offered[r.class as usize] += 1;
        if matches!(e, Some(End::Served(t)) if *t <= r.deadline) {
            windows[(r.arrival / SEC) as usize].class_ok[r.class as usize] += 1;
        }
    }
    for w in &mut windows {
        w.mean_queuing_ms = w.queuing_sum_ns as f64 / w.queuing_count.max(1) as f64 / 1e6;
        w.class_success = w
            .class_offered
            .iter()
            .zip(&w.class_ok)
            .map(|(&o, &k)| if o == 0 { 1.0 } else { k as f64 / o as f64 })
            .collect();
    }
    let mut summary = summarize(cfg, windows, trace, &requests, &ends, &limit);
    if cfg.caller_lag.is_some() {
        let steady = summary.steady_from as u64 * SEC;
        let (mut received, mut refused) = (0u64, 0u64);
        for ((r, e), &by_caller) in requests.iter().zip(&ends).zip(&refused_by_caller) {
            if r.arrival < steady || r.deadline > end || by_caller {
                continue;
            }
            received += 1;
            refused += u64::from(matches!(e, Some(End::Refused(_))));
        }
        summary.refused_of_received = Some(refused as f64 / received.max(1) as f64);
    }
    summary
}

// === summary ===

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i] as f64 / 1e6
}

/// Counts by class of the requests that arrived in `[from, to)` and could finish by `end`.
fn period(
    cfg: &SimConfig,
    requests: &[Request],
    ends: &[Option<End>],
    from: u64,
    to: u64,
    latency_from: u64,
) -> (Vec<ClassReport>, u64, u64, u64, Vec<u64>) {
    let classes = cfg.classes();
    let end = cfg.seconds as u64 * SEC;
    let mut reports: Vec<ClassReport> =
        (0..classes).map(|b| ClassReport { business: b as u8, ..Default::default() }).collect();
    let mut lat: Vec<Vec<u64>> = vec![Vec::new(); classes];
    let (mut refused_in_time, mut timeouts, mut served) = (0u64, 0u64, 0u64);
    let mut all = Vec::new();
    for (r, e) in requests.iter().zip(ends) {
        if r.arrival < from || r.arrival >= to || r.deadline > end {
            continue;
        }
        let c = &mut reports[r.class as usize];
        c.offered += 1;
        match e {
            Some(End::Served(t)) if *t <= r.deadline => {
                c.completed += 1;
                served += 1;
                if r.arrival >= latency_from {
                    lat[r.class as usize].push(t - r.arrival);
                    all.push(t - r.arrival);
                }
            }
            Some(End::Refused(t)) if *t < r.deadline => refused_in_time += 1,
            _ => timeouts += 1,
        }
    }
    let total: f64 = cfg.mix.iter().sum::<f64>().max(1e-9);
    for (c, l) in reports.iter_mut().zip(&mut lat) {
        l.sort_unstable();
        c.success = c.completed as f64 / c.offered.max(1) as f64;
        c.load = cfg.load_at((from / SEC) as u32) * cfg.mix[c.business as usize] / total;
        (c.p50_ms, c.p90_ms, c.p99_ms) =
            (percentile(l, 0.5), percentile(l, 0.9), percentile(l, 0.99));
    }
    all.sort_unstable();
    (reports, served, refused_in_time, timeouts, all)
}

fn summarize(
    cfg: &SimConfig,
    windows: Vec<WindowReport>,
    trace: Vec<TracePoint>,
    requests: &[Request],
    ends: &[Option<End>],
    limit: &AdaptiveLimit,
) -> Summary {
    let capacity = cfg.capacity_per_sec();
    let phase_len = cfg.phase_len();
    let steady_from = cfg.steady_from();
    let steady = &windows[steady_from..];
    let (classes, served, refused, timeouts, all) = period(
        cfg,
        requests,
        ends,
        steady_from as u64 * SEC,
        cfg.seconds as u64 * SEC,
        steady_from as u64 * SEC,
    );
    let offered = (served + refused + timeouts) as f64;
    let measured_secs =
        (cfg.seconds as usize - steady_from) as f64 - cfg.task_timeout.as_secs_f64();
    // Against what was actually offered (Poisson), not the nominal load.
    let ideal = (1.0 - capacity * measured_secs / offered.max(1.0)).max(0.0);
    let shed_fraction = (refused + timeouts) as f64 / offered.max(1.0);
    let _ = all;
    let phase_oscillation = (0..cfg.phases.len())
        .map(|p| {
            let from = (p * phase_len + phase_len / 2).min(windows.len());
            oscillation(&windows[from..((p + 1) * phase_len).min(windows.len())], capacity)
        })
        .collect();
    let settle_windows = (1..cfg.phases.len())
        .map(|p| {
            let phase = &windows
                [(p * phase_len).min(windows.len())..((p + 1) * phase_len).min(windows.len())];
            settle_after(phase, capacity)
        })
        .collect();
    let strict: Vec<(Option<f64>, Vec<String>)> = (1..cfg.phases.len())
        .filter(|&p| cfg.phases[p] > cfg.phases[p - 1])
        .map(|p| {
            strict_settle(
                cfg,
                requests,
                ends,
                (p * phase_len) as u64 * SEC,
                ((p + 1) * phase_len) as u64 * SEC,
            )
        })
        .collect();
    let phase_reports = (0..cfg.phases.len())
        .map(|p| {
            let from = (p * phase_len) as u64 * SEC;
            let to = (((p + 1) * phase_len) as u64 * SEC).min(cfg.seconds as u64 * SEC);
            let (classes, served, refused, timeouts, lat) =
                period(cfg, requests, ends, from, to, from + SEC);
            let secs = (to - from) as f64 / 1e9;
            let first_cut_ms = trace
                .iter()
                .find(|t| t.ms * MS >= from && t.ms * MS < to && t.level != u16::MAX >> 1)
                .map(|t| t.ms - from / MS);
            let phase_windows = &windows[(from / SEC) as usize..(to / SEC) as usize];
            let bad = phase_windows.iter().rposition(|w| {
                w.class_success.iter().zip(&w.class_offered).any(|(&s, &o)| o > 0 && s < 0.99)
            });
            // The last second's requests may still be in flight at the end: skip it.
            let recovered_after_s = match bad {
                None => Some(0),
                Some(i) if i + 1 < phase_windows.len() => Some(i as u32 + 1),
                Some(_) => None,
            };
            PhaseReport {
                load: cfg.phases[p],
                from_second: (from / SEC) as u32,
                goodput_ratio: served as f64
                    / (capacity * secs).min((served + refused + timeouts) as f64).max(1.0),
                refused_fraction: (refused + timeouts) as f64
                    / (served + refused + timeouts).max(1) as f64,
                timeout_share: timeouts as f64 / (refused + timeouts).max(1) as f64,
                p50_ms: percentile(&lat, 0.5),
                p90_ms: percentile(&lat, 0.9),
                p99_ms: percentile(&lat, 0.99),
                first_cut_ms,
                recovered_after_s,
                classes,
            }
        })
        .collect();
    let phase_end_limit = (0..cfg.phases.len())
        .map(|p| {
            let at = (((p + 1) * phase_len) as u64 * 1000).min(cfg.seconds as u64 * 1000);
            trace.iter().rev().find(|t| t.ms < at).map_or(limit.limit(), |t| t.inflight_limit)
        })
        .collect();
    let q = steady.iter().map(|w| w.queuing_sum_ns).sum::<u64>() as f64;
    let qn = steady.iter().map(|w| w.queuing_count).sum::<u64>().max(1) as f64;
    Summary {
        law: format!("{:?}", cfg.engine.law).to_lowercase(),
        inflight: match cfg.inflight {
            Inflight::Fixed(n) => format!("fixed {n}"),
            Inflight::Adaptive(c) => format!("adaptive (ceiling {c})"),
        },
        capacity_per_sec: capacity,
        phases: cfg.phases.clone(),
        steady_from: steady_from as u32,
        goodput_ratio: served as f64 / (capacity * measured_secs),
        shed_fraction,
        ideal_shed_fraction: ideal,
        shed_error_pp: (shed_fraction - ideal) * 100.0,
        settle_windows,
        strict_settle_s: strict.iter().map(|s| s.0).collect(),
        strict_failures: strict.into_iter().map(|s| s.1).collect(),
        oscillation: oscillation(steady, capacity),
        phase_oscillation,
        mean_queuing_ms: q / qn / 1e6,
        classes,
        phase_reports,
        phase_end_limit,
        windows,
        trace,
        refused_of_received: None,
    }
}

/// Standard deviation of admitted per window, over capacity.
fn oscillation(windows: &[WindowReport], capacity: f64) -> f64 {
    if windows.is_empty() {
        return 0.0;
    }
    let admitted: Vec<f64> = windows.iter().map(|w| w.admitted as f64 / capacity).collect();
    let mean = admitted.iter().sum::<f64>() / admitted.len() as f64;
    let var = admitted.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / admitted.len() as f64;
    var.sqrt()
}

/// Windows from the start of `phase` until it stays settled: over every later pair of
/// windows (so one noisy second does not count as unsettled) the app completes at least
/// 90% of what it can (capacity, or the offered load when that fits) and admissions are
/// within 10% of it.
fn settle_after(phase: &[WindowReport], capacity: f64) -> Option<u32> {
    let settled = |pair: &[WindowReport]| {
        let sum = |f: fn(&WindowReport) -> u64| pair.iter().map(f).sum::<u64>() as f64;
        let want = sum(|w| w.offered).min(capacity * pair.len() as f64);
        sum(|w| w.completed) >= 0.9 * want && (sum(|w| w.admitted) - want).abs() <= 0.1 * want
    };
    let pairs: Vec<&[WindowReport]> = phase.windows(2).collect();
    match pairs.iter().rposition(|p| !settled(p)) {
        None => Some(0),
        Some(i) if i + 1 < pairs.len() => Some(i as u32 + 1),
        Some(_) => None,
    }
}

/// overload-bench's settle rule over `[from, to)` (see [`Summary::strict_settle_s`]).
fn strict_settle(
    cfg: &SimConfig,
    requests: &[Request],
    ends: &[Option<End>],
    from: u64,
    to: u64,
) -> (Option<f64>, Vec<String>) {
    let span = SEC / 2;
    let grid = SEC / 10;
    let need = 0.9 * cfg.capacity_per_sec() * 0.5;
    let max_p90 = cfg.service.as_nanos() as u64 + 40 * MS;
    let mut good = Vec::new();
    let mut fails = Vec::new();
    let mut u = from;
    while u + span <= to {
        let mut lat: Vec<u64> = requests
            .iter()
            .zip(ends)
            .filter(|(r, _)| r.arrival >= u && r.arrival < u + span)
            .filter_map(|(r, e)| match e {
                Some(End::Served(t)) if *t <= r.deadline => Some(t - r.arrival),
                _ => None,
            })
            .collect();
        lat.sort_unstable();
        let p90 = percentile(&lat, 0.9);
        let ok = lat.len() as f64 >= need && p90 * 1e6 <= max_p90 as f64;
        if !ok {
            fails.push(format!("+{}:{}/{:.0},p90 {:.0}", (u - from) / MS, lat.len(), need, p90));
        }
        good.push(ok);
        u += grid;
    }
    let first = good.iter().rposition(|g| !g).map_or(0, |i| i + 1);
    ((first < good.len()).then_some(first as f64 * 0.1), fails)
}
