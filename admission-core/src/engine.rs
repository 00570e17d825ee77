//! The hot path: `admit` and `record_queuing`, lock-free and allocation-free, with the
//! window rollover done by whichever caller first sees the window end (a `try_lock`,
//! so no admit ever waits for it).

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::Mutex;
use std::time::Duration;

use crate::clock::{Clock, MonotonicClock, Nanos};
use crate::config::{EngineConfig, Mode};
use crate::controller::{Controller, OverloadDetector, WindowSummary};
use crate::priority::{AdmissionLevel, Priority, COMPOUND_LEVELS};

/// The outcome of [`AdmissionEngine::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Admit,
    /// Refuse: the request is below the admission level.
    Shed,
    /// Shadow mode: below the level, but let through. Count it as a would-be refusal.
    WouldShed,
}

/// A point-in-time view for status endpoints and metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineStatus {
    pub level: AdmissionLevel,
    pub overloaded: bool,
    pub mode: Mode,
    /// The last closed window, if any.
    pub last_window: Option<WindowSummary>,
    pub windows_closed: u64,
    /// Goodput law only: estimated app capacity in requests per second.
    pub capacity_per_sec: Option<f64>,
}

/// Counters for one window, double-buffered so a rollover drains one set while admits
/// write the other. A straggler that wrote the old set after it was drained is counted
/// when that set is drained next, so no arrival is ever lost.
struct WindowCounters {
    histogram: Box<[AtomicU32]>,
    admitted: AtomicU64,
}

/// State only the rollover touches.
struct RolloverState {
    detector: OverloadDetector,
    controller: Controller,
    scratch: Box<[u32]>,
    last: Option<WindowSummary>,
    windows_closed: u64,
}

pub struct AdmissionEngine<C: Clock = MonotonicClock> {
    clock: C,
    mode: Mode,
    window_ns: u64,
    window_requests: u32,
    level: AtomicU16,
    overloaded: AtomicBool,
    active: AtomicUsize,
    counters: [WindowCounters; 2],
    queuing_sum_ns: AtomicU64,
    queuing_count: AtomicU32,
    window_start: AtomicU64,
    rollover: Mutex<RolloverState>,
}

// === impl AdmissionEngine ===

impl AdmissionEngine<MonotonicClock> {
    pub fn with_config(config: &EngineConfig) -> Self {
        Self::new(config, MonotonicClock::new())
    }
}

impl<C: Clock> AdmissionEngine<C> {
    pub fn new(config: &EngineConfig, clock: C) -> Self {
        let counters = || WindowCounters {
            histogram: (0..COMPOUND_LEVELS).map(|_| AtomicU32::new(0)).collect(),
            admitted: AtomicU64::new(0),
        };
        let start = clock.now();
        AdmissionEngine {
            mode: config.mode,
            window_ns: config.window.as_nanos() as u64,
            window_requests: config.window_requests,
            level: AtomicU16::new(AdmissionLevel::FULLY_OPEN.compound()),
            overloaded: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            counters: [counters(), counters()],
            queuing_sum_ns: AtomicU64::new(0),
            queuing_count: AtomicU32::new(0),
            window_start: AtomicU64::new(start),
            rollover: Mutex::new(RolloverState {
                detector: OverloadDetector::new(config),
                controller: Controller::new(config),
                scratch: vec![0; COMPOUND_LEVELS].into_boxed_slice(),
                last: None,
                windows_closed: 0,
            }),
            clock,
        }
    }

    pub fn clock(&self) -> &C {
        &self.clock
    }

    #[inline]
    pub fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// Counts the arrival in this window's histogram and decides against the level.
    #[inline]
    pub fn admit(&self, p: Priority) -> Decision {
        let c = p.compound();
        let counters = &self.counters[self.active.load(Relaxed)];
        counters.histogram[c as usize].fetch_add(1, Relaxed);
        if c <= self.level.load(Relaxed) {
            counters.admitted.fetch_add(1, Relaxed);
            Decision::Admit
        } else if self.mode == Mode::Shadow {
            Decision::WouldShed
        } else {
            Decision::Shed
        }
    }

    /// Records how long a request waited in the pending queue before it went to the app
    /// (or was dropped at the gate). Closes the window when it is full or old enough.
    #[inline]
    pub fn record_queuing(&self, waited: Duration) {
        self.queuing_sum_ns.fetch_add(waited.as_nanos() as u64, Relaxed);
        let n = self.queuing_count.fetch_add(1, Relaxed) + 1;
        if n >= self.window_requests {
            self.try_rollover(self.clock.now());
        } else {
            self.tick();
        }
    }

    /// Closes the window if its time is up. Call it from a timer too, so windows close
    /// even when no request completes.
    #[inline]
    pub fn tick(&self) {
        let now = self.clock.now();
        if now.saturating_sub(self.window_start.load(Relaxed)) >= self.window_ns {
            self.try_rollover(now);
        }
    }

    #[inline]
    pub fn level(&self) -> AdmissionLevel {
        AdmissionLevel::from_compound(self.level.load(Relaxed)).unwrap_or_default()
    }

    pub fn overloaded(&self) -> bool {
        self.overloaded.load(Relaxed)
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn status(&self) -> EngineStatus {
        let state = self.rollover.lock().unwrap_or_else(|e| e.into_inner());
        EngineStatus {
            level: self.level(),
            overloaded: self.overloaded(),
            mode: self.mode,
            last_window: state.last,
            windows_closed: state.windows_closed,
            capacity_per_sec: state.controller.capacity_estimate(),
        }
    }

    #[cold]
    fn try_rollover(&self, now: Nanos) {
        // Whoever loses the race just carries on: the winner closes the window.
        let Ok(mut state) = self.rollover.try_lock() else { return };
        let start = self.window_start.load(Relaxed);
        let count_now = self.queuing_count.load(Relaxed);
        if now.saturating_sub(start) < self.window_ns && count_now < self.window_requests {
            return; // another caller closed it just before us
        }
        let old = self.active.fetch_xor(1, AcqRel);
        self.window_start.store(now, Relaxed);
        let counters = &self.counters[old];
        let state = &mut *state;
        let mut arrivals = 0u64;
        for (slot, counter) in state.scratch.iter_mut().zip(counters.histogram.iter()) {
            *slot = counter.swap(0, Relaxed);
            arrivals += *slot as u64;
        }
        let admitted = counters.admitted.swap(0, Relaxed);
        let dispatched = self.queuing_count.swap(0, Relaxed) as u64;
        let sum = self.queuing_sum_ns.swap(0, Relaxed);
        let summary = WindowSummary {
            duration_ns: now.saturating_sub(start).max(1),
            arrivals,
            admitted,
            dispatched,
            mean_queuing_ns: if dispatched == 0 { 0 } else { sum / dispatched },
        };
        let zone = state.detector.observe(&summary);
        let next = state.controller.next_level(self.level(), zone, &summary, &state.scratch);
        self.level.store(next.compound(), Relaxed);
        self.overloaded.store(state.detector.overloaded(), Relaxed);
        state.last = Some(summary);
        state.windows_closed += 1;
    }

    pub fn windows_closed(&self) -> u64 {
        self.rollover.lock().unwrap_or_else(|e| e.into_inner()).windows_closed
    }

    /// Runs `f` over the arrivals histogram of the last closed window (indexed by
    /// compound level) and that window's summary.
    pub fn with_last_window<R>(&self, f: impl FnOnce(Option<&WindowSummary>, &[u32]) -> R) -> R {
        let state = self.rollover.lock().unwrap_or_else(|e| e.into_inner());
        f(state.last.as_ref(), &state.scratch)
    }
}

#[cfg(test)]
mod tests;
