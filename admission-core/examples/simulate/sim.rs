//! A deterministic discrete-event simulation of one sidecar in front of one app, driven
//! through the real [`AdmissionEngine`] on a [`ManualClock`]. Shared by the `simulate`
//! example and the tests in `tests/simulation.rs`; no I/O here.
//!
//! Model: Poisson arrivals (a mix of business classes, user ids hashed by the real
//! [`UserPriorityHasher`]) -> `admit` -> unbounded FIFO -> `W` workers of fixed service
//! time `S`. At dequeue the request's wait goes to `record_queuing` and the residence
//! gate drops anything past its deadline or the task timeout. A 50 ms timer calls `tick`.

use std::collections::VecDeque;
use std::time::Duration;

use admission_core::{
    residence_gate, AdmissionEngine, Decision, EngineConfig, GateDecision, ManualClock, Priority,
    UserPriorityHasher,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp};
use serde::Serialize;

const SEC: u64 = 1_000_000_000;

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub workers: u32,
    pub service: Duration,
    /// Offered load as multiples of capacity, one phase each, equal lengths.
    pub phases: Vec<f64>,
    pub seconds: u32,
    /// Equal shares of business classes `0..classes`.
    pub classes: u8,
    pub users: u32,
    pub seed: u64,
    pub task_timeout: Duration,
    pub tick: Duration,
    pub engine: EngineConfig,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            workers: 32,
            service: Duration::from_millis(10),
            phases: vec![3.0],
            seconds: 60,
            classes: 3,
            users: 10_000,
            seed: 1,
            task_timeout: Duration::from_millis(500),
            tick: Duration::from_millis(50),
            engine: EngineConfig::default(),
        }
    }
}

impl SimConfig {
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
}

/// One second of simulated time.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WindowReport {
    pub second: u32,
    pub load: f64,
    pub offered: u64,
    pub admitted: u64,
    /// Served within the request's deadline.
    pub completed: u64,
    pub gate_dropped: u64,
    pub mean_queuing_ms: f64,
    pub level: String,
    pub overloaded: bool,
    /// The engine's capacity estimate (goodput law), requests per second.
    pub capacity_estimate: Option<f64>,
    #[serde(skip)]
    queuing_sum_ns: u64,
    #[serde(skip)]
    queuing_count: u64,
}

/// Steady-period counts of one business class.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClassReport {
    pub business: u8,
    pub offered: u64,
    pub completed: u64,
    pub success: f64,
    /// This class's own offered load over capacity in the steady period.
    pub load: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub law: String,
    pub capacity_per_sec: f64,
    pub phases: Vec<f64>,
    /// First second of the steady period the ratios below are measured over.
    pub steady_from: u32,
    pub goodput_ratio: f64,
    /// Refused at admission plus dropped at the gate, over offered.
    pub shed_fraction: f64,
    pub ideal_shed_fraction: f64,
    pub shed_error_pp: f64,
    /// Per load step: windows from the step until the loop stays settled.
    pub settle_windows: Vec<Option<u32>>,
    /// Standard deviation of admitted per window over capacity, steady period.
    pub oscillation: f64,
    /// The same over the second half of each phase.
    pub phase_oscillation: Vec<f64>,
    pub mean_queuing_ms: f64,
    pub classes: Vec<ClassReport>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<WindowReport>,
}

struct Queued {
    arrival: u64,
    deadline: u64,
    class: u8,
}

// === run ===

pub fn run(cfg: &SimConfig) -> Summary {
    let clock = ManualClock::new();
    let engine = AdmissionEngine::new(&cfg.engine, clock.clone());
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let hasher = UserPriorityHasher::new(*b"weir-simulator", UserPriorityHasher::DEFAULT_REKEY);
    let user_levels: Vec<u8> = (0..cfg.users)
        .map(|u| hasher.user_priority_in_period(format!("user-{u}").as_bytes(), 1))
        .collect();
    let capacity = cfg.capacity_per_sec();
    let service_ns = cfg.service.as_nanos() as u64;
    let timeout_ns = cfg.task_timeout.as_nanos() as u64;
    let tick_ns = cfg.tick.as_nanos() as u64;
    let end = cfg.seconds as u64 * SEC;

    let mut windows: Vec<WindowReport> = (0..cfg.seconds)
        .map(|s| WindowReport { second: s, load: cfg.load_at(s), ..Default::default() })
        .collect();
    // Per class, offered and completed during the steady period.
    let steady_from = cfg.steady_from();
    let mut class_counts = vec![[0u64; 2]; cfg.classes as usize];
    // Requests that arrived in the steady period early enough to finish before the end.
    let counts_for_class = |arrival: u64| {
        arrival >= steady_from as u64 * SEC && arrival + timeout_ns + service_ns <= end
    };
    let mut queue: VecDeque<Queued> = VecDeque::new();
    // (done at, class, deadline, arrival). Fixed service time and FIFO start order:
    // completions come out in start order.
    let mut in_service: VecDeque<(u64, u8, u64, u64)> = VecDeque::new();

    let mut now = 0u64;
    let mut next_tick = tick_ns;
    let mut next_arrival = 0u64;
    let sample_gap = |rng: &mut StdRng, at: u64| -> u64 {
        let rate = cfg.load_at((at / SEC) as u32) * capacity / SEC as f64;
        let exp = Exp::new(rate.max(1e-12)).unwrap_or_else(|_| Exp::new(1e-12).expect("valid"));
        exp.sample(rng).ceil() as u64
    };
    next_arrival += sample_gap(&mut rng, 0);

    while now < end {
        let next_done = in_service.front().map_or(u64::MAX, |d| d.0);
        now = next_arrival.min(next_done).min(next_tick);
        if now >= end {
            break;
        }
        clock.set(now);
        let second = (now / SEC) as usize;
        if now == next_done {
            let (_, class, deadline, arrival) = in_service.pop_front().expect("front exists");
            if now <= deadline {
                windows[second].completed += 1;
                // Per class by arrival, so offered and completed cover the same requests.
                if counts_for_class(arrival) {
                    class_counts[class as usize][1] += 1;
                }
            }
        } else if now == next_arrival {
            let phase_end = (now / SEC + 1) * SEC;
            next_arrival = now + sample_gap(&mut rng, now);
            if cfg.load_at((now / SEC) as u32) != cfg.load_at((next_arrival / SEC) as u32) {
                // Memoryless: restart the gap at the phase boundary with the new rate.
                next_arrival = phase_end + sample_gap(&mut rng, phase_end);
            }
            let class = rng.random_range(0..cfg.classes);
            let user = user_levels[rng.random_range(0..cfg.users) as usize];
            let w = &mut windows[second];
            w.offered += 1;
            if counts_for_class(now) {
                class_counts[class as usize][0] += 1;
            }
            if engine.admit(Priority { business: class, user }) != Decision::Shed {
                w.admitted += 1;
                queue.push_back(Queued { arrival: now, deadline: now + timeout_ns, class });
            }
        } else {
            next_tick += tick_ns;
            engine.tick();
        }
        // Hand queued requests to free workers.
        while in_service.len() < cfg.workers as usize {
            let Some(q) = queue.pop_front() else { break };
            let waited = now - q.arrival;
            engine.record_queuing(Duration::from_nanos(waited));
            let w = &mut windows[second];
            w.queuing_sum_ns += waited;
            w.queuing_count += 1;
            match residence_gate(q.arrival, now, q.deadline, timeout_ns) {
                GateDecision::Forward => {
                    in_service.push_back((now + service_ns, q.class, q.deadline, q.arrival))
                }
                GateDecision::DeadlinePassed | GateDecision::WaitedTooLong => {
                    engine.record_gate_drop();
                    w.gate_dropped += 1;
                }
            }
        }
        let w = &mut windows[second];
        w.level = engine.level().to_string();
        w.overloaded = engine.overloaded();
        if now + tick_ns > (second as u64 + 1) * SEC {
            // Last event of the second (or close): sample the estimate once.
            w.capacity_estimate = engine.status().capacity_per_sec;
        }
    }
    for w in &mut windows {
        w.mean_queuing_ms = w.queuing_sum_ns as f64 / w.queuing_count.max(1) as f64 / 1e6;
    }
    summarize(cfg, windows, &class_counts)
}

// === summary ===

fn summarize(cfg: &SimConfig, windows: Vec<WindowReport>, class_counts: &[[u64; 2]]) -> Summary {
    let capacity = cfg.capacity_per_sec();
    let phase_len = cfg.phase_len();
    let steady_from = cfg.steady_from();
    let steady = &windows[steady_from..];
    let sum = |f: fn(&WindowReport) -> u64| steady.iter().map(f).sum::<u64>() as f64;
    let (offered, completed) = (sum(|w| w.offered), sum(|w| w.completed));
    let shed = offered - sum(|w| w.admitted) + sum(|w| w.gate_dropped);
    let load = cfg.phases[cfg.phases.len() - 1];
    // Against what was actually offered (Poisson), not the nominal load.
    let ideal = (1.0 - capacity * steady.len() as f64 / offered.max(1.0)).max(0.0);
    let shed_fraction = shed / offered.max(1.0);
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
    let q = steady.iter().map(|w| w.queuing_sum_ns).sum::<u64>() as f64;
    let qn = steady.iter().map(|w| w.queuing_count).sum::<u64>().max(1) as f64;
    let classes = class_counts
        .iter()
        .enumerate()
        .map(|(b, &[offered, completed])| ClassReport {
            business: b as u8,
            offered,
            completed,
            success: completed as f64 / offered.max(1) as f64,
            load: load / cfg.classes as f64,
        })
        .collect();
    Summary {
        law: format!("{:?}", cfg.engine.law).to_lowercase(),
        capacity_per_sec: capacity,
        phases: cfg.phases.clone(),
        steady_from: steady_from as u32,
        goodput_ratio: completed / (capacity * steady.len() as f64),
        shed_fraction,
        ideal_shed_fraction: ideal,
        shed_error_pp: (shed_fraction - ideal) * 100.0,
        settle_windows,
        oscillation: oscillation(steady, capacity),
        phase_oscillation,
        mean_queuing_ms: q / qn / 1e6,
        classes,
        windows,
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
