//! The hot path: `admit` and `record_queuing`, lock-free and allocation-free, with the
//! window rollover done by whichever caller first sees the window end (a `try_lock`,
//! so no admit ever waits for it). Counters are sharded per thread (`shard`) so two
//! threads never bump the same cache line; the arrivals histogram is double-buffered
//! (`window`) so a rollover drains one set while admits write the other.

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::Mutex;
use std::time::Duration;

use crate::clock::{Clock, MonotonicClock, Nanos};
use crate::config::{EngineConfig, Law, Mode};
use crate::controller::{self, queuing_signal_ns, Controller, OverloadDetector, WindowSummary};
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
    /// Goodput and capacity laws: estimated app capacity in requests per second.
    pub capacity_per_sec: Option<f64>,
}

pub(crate) mod shard;
mod window;

pub use shard::MAX_WINDOW_REQUESTS;
use shard::{Padded, QueuingShard, MAX_SHARDS};
use window::WindowCounters;

/// State only the rollover touches.
struct RolloverState {
    detector: OverloadDetector,
    controller: Controller,
    /// The last drained window's histogram, and which business classes it holds.
    scratch: Box<[u32]>,
    scratch_classes: Box<[bool]>,
    last: Option<WindowSummary>,
    windows_closed: u64,
    /// The completion count when the open window began (see `completed`).
    completed_at_start: u64,
}

/// Time with a non-empty queue and the completions in it, between queue observations.
#[derive(Default)]
struct BusyClock {
    last_at: Nanos,
    last_depth: u64,
    /// The completion count as of `last_at`.
    last_completed: u64,
    /// Completions counted since the window opened, as of `last_at`.
    busy_ns: u64,
    busy_completed: u64,
    /// Since when the queue has been empty, and the completion count then.
    empty_since: Option<(Nanos, u64)>,
    /// Since when the queue has been non-empty without a break (the detector's standing
    /// queue); kept across windows.
    queued_since: Option<Nanos>,
}

/// How long the level before a cut still admits, behind propagating callers: a few of
/// their response intervals (they learn the new level from the next response).
const CUT_GRACE_NS: u64 = 25_000_000;

/// While the level already refuses, a window closes early only on a queue far past the
/// threshold, or on one still at twice it this many early-close periods into the window.
const STUCK_EARLY_PERIODS: u64 = 3;

/// `record_queuing` checks the window's age on every this-many-th sample of a shard.
const TIME_CHECK_EVERY: u64 = 64;

pub struct AdmissionEngine<C: Clock = MonotonicClock> {
    clock: C,
    mode: Mode,
    window_ns: u64,
    window_requests: u32,
    level: AtomicU16,
    overloaded: AtomicBool,
    /// Whether the level in force binds on the last window's arrivals (see
    /// [`Self::level_binds`]).
    refusing: AtomicBool,
    /// After a cut behind propagating callers: the level before it, still honoured until
    /// `grace_until` (engine clock) for what they sent before they heard of the cut.
    grace_level: AtomicU16,
    grace_until: AtomicU64,
    active: AtomicUsize,
    counters: [WindowCounters; 2],
    /// `shards - 1`; shards is a power of two.
    shard_mask: usize,
    queuing: Box<[QueuingShard]>,
    /// Samples across shards, published in batches of `count_batch` per shard so the
    /// shared line is touched once per batch; exact counts come from the shards.
    queuing_count: Padded<AtomicU32>,
    count_batch: u64,
    dropped: Padded<AtomicU32>,
    /// Responses the app completed since the engine started (a window's are the difference
    /// from its start: one count serves the windows and [`Self::completions`]).
    completed: Padded<AtomicU64>,
    /// The queue as last reported by [`Self::observe_queue`]: depth and the age of the
    /// oldest waiter in nanoseconds (both 0 when empty).
    queue_depth: AtomicU64,
    oldest_waiting_ns: AtomicU64,
    /// Busy-time accounting between `observe_queue` calls (only that caller writes).
    busy: Mutex<BusyClock>,
    /// Earliest window age at which a fast-growing queue closes the window; 0 = never.
    early_close_ns: u64,
    enter_ns: u64,
    /// The controller's capacity estimate (f64 bits; 0 = none), for the early re-open.
    capacity_bits: AtomicU64,
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
        let start = clock.now();
        let shards = shard::shard_count();
        let window_requests = config.window_requests.clamp(1, MAX_WINDOW_REQUESTS);
        // Small windows (tests, tiny services) close on the exact count.
        let count_batch = (window_requests as usize / (4 * MAX_SHARDS)).clamp(1, 16) as u64;
        AdmissionEngine {
            mode: config.mode,
            window_ns: config.window.as_nanos() as u64,
            window_requests,
            level: AtomicU16::new(AdmissionLevel::FULLY_OPEN.compound()),
            overloaded: AtomicBool::new(false),
            refusing: AtomicBool::new(false),
            grace_level: AtomicU16::new(0),
            grace_until: AtomicU64::new(0),
            active: AtomicUsize::new(0),
            counters: [WindowCounters::new(shards), WindowCounters::new(shards)],
            shard_mask: shards - 1,
            queuing: (0..shards).map(|_| QueuingShard::default()).collect(),
            queuing_count: Padded(AtomicU32::new(0)),
            count_batch,
            dropped: Padded(AtomicU32::new(0)),
            completed: Padded(AtomicU64::new(0)),
            queue_depth: AtomicU64::new(0),
            busy: Mutex::new(BusyClock { last_at: start, ..BusyClock::default() }),
            oldest_waiting_ns: AtomicU64::new(0),
            // Early closes change the window length the paper's law was tuned for: only
            // the capacity law, which works in rates, uses them.
            early_close_ns: match config.law {
                Law::Capacity => config.early_close_after.as_nanos() as u64,
                Law::Dagor | Law::Goodput => 0,
            },
            enter_ns: config.queuing_threshold.as_nanos() as u64,
            capacity_bits: AtomicU64::new(0),
            window_start: AtomicU64::new(start),
            rollover: Mutex::new(RolloverState {
                detector: OverloadDetector::new(config),
                controller: Controller::new(config),
                scratch: vec![0; COMPOUND_LEVELS].into_boxed_slice(),
                scratch_classes: vec![false; 256].into_boxed_slice(),
                last: None,
                windows_closed: 0,
                completed_at_start: 0,
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
        self.counters[self.active.load(Relaxed)].record(self.shard(), c);
        if c <= self.level.load(Relaxed) {
            Decision::Admit
        } else if self.mode == Mode::Shadow {
            Decision::WouldShed
        } else if self.in_cut_grace(p) {
            // Sent under the level before a cut, by a caller that had not yet heard of it.
            Decision::Admit
        } else {
            Decision::Shed
        }
    }

    /// Records how long a request waited in the pending queue before it went to the app
    /// (or was dropped at the gate). Closes the window when it is full or old enough.
    #[inline]
    pub fn record_queuing(&self, waited: Duration) {
        let local = self.queuing[self.shard()].add(waited.as_micros() as u64);
        if local % self.count_batch != 0 {
            return;
        }
        let n = self.queuing_count.0.fetch_add(self.count_batch as u32, Relaxed) as u64
            + self.count_batch;
        if n >= self.window_requests as u64 {
            self.try_rollover(self.clock.now(), false);
        } else if local % TIME_CHECK_EVERY == 0 {
            // Reading the clock costs as much as the rest of the call; the 50 ms timer
            // closes windows on time, this only backs it up.
            self.tick();
        }
    }

    /// Call, in addition to [`Self::record_queuing`], for a request that left the queue
    /// without reaching the app (refused at dequeue or while waiting, evicted, or its caller
    /// left): it cost the app nothing, so the goodput law must not count it as capacity.
    #[inline]
    pub fn record_gate_drop(&self) {
        self.dropped.0.fetch_add(1, Relaxed);
    }

    /// Call when the app answered a request (its response headers arrived): the capacity
    /// law aims at what the app completes, not at what left the queue.
    #[inline]
    pub fn record_completion(&self) {
        self.completed.0.fetch_add(1, Relaxed);
    }

    /// Responses the app completed since the engine started ([`Self::record_completion`]).
    #[inline]
    pub fn completions(&self) -> u64 {
        self.completed.0.load(Relaxed)
    }

    /// Closes the window if its time is up. Call it from a timer too, so windows close
    /// even when no request completes.
    #[inline]
    pub fn tick(&self) {
        let now = self.clock.now();
        if now.saturating_sub(self.window_start.load(Relaxed)) >= self.window_ns {
            self.try_rollover(now, false);
        }
    }

    /// Reports the pending queue: how many wait and how long the oldest has waited
    /// (`Duration::ZERO` when empty). Call it from the same timer as [`Self::tick`]
    /// (it ticks too). The oldest waiter's age counts in the window's queuing signal, so
    /// a stalled app, from which nothing leaves the queue, is seen as overloaded; and
    /// with the capacity law a queue that grows fast closes the window early, so a spike
    /// is cut within `early_close_after` instead of a whole window.
    pub fn observe_queue(&self, depth: usize, oldest_waiting: Duration) {
        let oldest = oldest_waiting.as_nanos().min(u64::MAX as u128) as u64;
        self.queue_depth.store(depth as u64, Relaxed);
        self.oldest_waiting_ns.store(oldest, Relaxed);
        let now = self.clock.now();
        {
            let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
            // The completion count now: a queue that was non-empty at the last observation
            // kept the app busy until now.
            let completed = self.completed.0.load(Relaxed);
            // Non-empty at both ends: busy throughout, as far as the timer can tell.
            if busy.last_depth > 0 && depth > 0 {
                busy.busy_ns += now.saturating_sub(busy.last_at);
                busy.busy_completed += completed.saturating_sub(busy.last_completed);
            }
            busy.last_at = now;
            busy.last_depth = depth as u64;
            busy.last_completed = completed;
            busy.empty_since = match (depth, busy.empty_since) {
                (0, None) => Some((now, completed)),
                (0, since) => since,
                _ => None,
            };
            busy.queued_since = match (depth, busy.queued_since) {
                (0, _) => None,
                (_, None) => Some(now),
                (_, since) => since,
            };
        }
        let age = now.saturating_sub(self.window_start.load(Relaxed));
        if age >= self.window_ns {
            self.try_rollover(now, false);
        } else if self.early_close_ns > 0 && age >= self.early_close_ns {
            let (n, mean) = self.running_queuing();
            let signal = queuing_signal_ns(n, mean, depth as u64, oldest);
            // Already overloaded with a level that refuses: only a queue far past the
            // threshold (a second spike on top of the first) is worth a short window;
            // otherwise full windows keep the histogram fine enough for the 1-pp dial.
            // Not yet overloaded (the spike has started), or overloaded while the level
            // refuses nothing (the law judged the queue a burst the span has room for):
            // judge again soon, so a burst that turns out to be a step is cut within
            // another early window or two.
            // A queue still at twice the threshold three early periods into a dialled
            // window is no dial's noise: the level is far from where it has to be (a first
            // cut that a burst's room held to a notch, while classes it admits whole
            // overflow). A whole window of it is a second of waits past the bar.
            let dialling = self.overloaded.load(Relaxed) && self.level_binds();
            let far_off = signal > 8 * self.enter_ns
                || (signal > 2 * self.enter_ns && age >= STUCK_EARLY_PERIODS * self.early_close_ns);
            if signal > self.enter_ns && (!dialling || far_off) {
                self.try_rollover(now, true);
            } else if self.app_has_room(now, age, depth) {
                // The other way: the level is cut, yet the queue stayed empty and the app
                // completes well under its capacity. The load has dropped: re-open now
                // rather than at the end of a window that began in the spike.
                self.try_rollover(now, true);
            }
        }
    }

    /// Early re-open condition: the level is cut (or open but still reported overloaded,
    /// as after a spike's last window), yet the queue has been empty for two early-close
    /// periods (and the window is at least that old), while the app completed under 80% of
    /// its capacity estimate.
    fn app_has_room(&self, now: Nanos, age: u64, depth: usize) -> bool {
        let min = 2 * self.early_close_ns;
        let settled = self.level() == AdmissionLevel::FULLY_OPEN && !self.overloaded();
        if depth > 0 || age < min || settled {
            return false;
        }
        let capacity = f64::from_bits(self.capacity_bits.load(Relaxed));
        let busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        let Some((since, completed_then)) = busy.empty_since else { return false };
        let empty_for = now.saturating_sub(since);
        let completed = self.completed.0.load(Relaxed).saturating_sub(completed_then);
        empty_for >= min
            && capacity > 0.0
            && (completed as f64) < 0.8 * capacity * empty_for as f64 / 1e9
    }

    /// This window's queuing samples so far and their mean wait in nanoseconds (the
    /// shards are read, not taken).
    fn running_queuing(&self) -> (u64, u64) {
        let (n, us) = self.queuing.iter().fold((0u64, 0u64), |(n, us), s| {
            let (dn, dus) = s.peek();
            (n + dn, us + dus)
        });
        (n, (us * 1_000).checked_div(n).unwrap_or(0))
    }

    #[inline]
    pub fn level(&self) -> AdmissionLevel {
        AdmissionLevel::from_compound(self.level.load(Relaxed)).unwrap_or_default()
    }

    /// The capacity estimate of the goodput and capacity laws as of the last window,
    /// requests per second; a lock-free read for the request path (the door's expected wait).
    #[inline]
    pub fn capacity_estimate(&self) -> Option<f64> {
        let c = f64::from_bits(self.capacity_bits.load(Relaxed));
        (c > 0.0).then_some(c)
    }

    pub fn overloaded(&self) -> bool {
        self.overloaded.load(Relaxed)
    }

    /// Whether `p`, beyond the level, is still admitted by the grace after a cut behind
    /// propagating callers (the level before the cut, for a few of their response
    /// intervals).
    #[inline]
    pub fn in_cut_grace(&self, p: Priority) -> bool {
        p.compound() <= self.grace_level.load(Relaxed)
            && self.clock.now() < self.grace_until.load(Relaxed)
    }

    /// Whether the level binds: it refuses a real share of what arrives here (see
    /// [`controller::level_binds`], applied to the last window's arrivals). A level can be
    /// cut and refuse (next to) nothing: behind callers whose egress already refuses beyond
    /// it, everything that arrives is within it. The queue's max wait trims the backlog of
    /// a level that binds; behind such callers a refusal here would only waste the work
    /// they did.
    #[inline]
    pub fn level_binds(&self) -> bool {
        self.refusing.load(Relaxed)
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
    fn try_rollover(&self, now: Nanos, early: bool) {
        // Whoever loses the race just carries on: the winner closes the window.
        let Ok(mut state) = self.rollover.try_lock() else { return };
        let start = self.window_start.load(Relaxed);
        let count_now = self.queuing_count.0.load(Relaxed);
        let due = now.saturating_sub(start) >= self.window_ns || count_now >= self.window_requests;
        let early_due = early && now.saturating_sub(start) >= self.early_close_ns;
        if !(due || early_due) {
            return; // another caller closed it just before us
        }
        let old = self.active.fetch_xor(1, AcqRel);
        self.window_start.store(now, Relaxed);
        let counters = &self.counters[old];
        let state = &mut *state;
        let level = self.level.load(Relaxed) as usize;
        // The level only changes here, so what the window admitted is the prefix sum.
        let (arrivals, admitted) =
            counters.drain_into(&mut state.scratch, &mut state.scratch_classes, level);
        self.queuing_count.0.store(0, Relaxed);
        let (mut dispatched, mut sum_us) = (0u64, 0u64);
        for shard in self.queuing.iter() {
            let (n, us) = shard.take();
            dispatched += n;
            sum_us += us;
        }
        let dropped = (self.dropped.0.swap(0, Relaxed) as u64).min(dispatched);
        let total = self.completed.0.load(Relaxed);
        let completed =
            total.saturating_sub(std::mem::replace(&mut state.completed_at_start, total));
        let (busy_ns, busy_completed, queue_standing_ns) = {
            let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
            let standing = busy.queued_since.map_or(0, |since| now.saturating_sub(since));
            let taken = (busy.busy_ns, busy.busy_completed, standing);
            busy.busy_ns = 0;
            busy.busy_completed = 0;
            // The busy counts restart with the window.
            busy.last_completed = total;
            busy.last_at = now;
            if let Some(since) = busy.empty_since.as_mut() {
                *since = (now, total);
            }
            taken
        };
        let summary = WindowSummary {
            duration_ns: now.saturating_sub(start).max(1),
            arrivals,
            admitted,
            dispatched,
            dropped,
            mean_queuing_ns: (sum_us * 1_000).checked_div(dispatched).unwrap_or(0),
            completed,
            busy_ns,
            busy_completed,
            queue_standing_ns,
            oldest_waiting_ns: self.oldest_waiting_ns.load(Relaxed),
            queue_depth: self.queue_depth.load(Relaxed),
            early: !due,
        };
        let zone = state.detector.observe(&summary, state.controller.capacity_estimate());
        let current = self.level();
        let next = state.controller.next_level(current, zone, &summary, &state.scratch);
        // Behind callers whose egress refuses beyond the advertised level (this level
        // refused next to nothing), a cut reaches them with the next response: what they
        // send until then was admissible when sent, and refusing it here would waste the
        // work they did for it. The old level holds for a short grace. Not for the first
        // cut from fully open (a lone sidecar's spike: its backlog must not grow).
        let censored_cut =
            next < current && current != AdmissionLevel::FULLY_OPEN && !self.level_binds();
        if censored_cut {
            self.grace_level.store(current.compound(), Relaxed);
            self.grace_until.store(now.saturating_add(CUT_GRACE_NS), Relaxed);
        }
        self.level.store(next.compound(), Relaxed);
        // Nor does such a cut bind, if the window that closed shows the callers filtering
        // (next to nothing arrived beyond the level in force): it holds what they sent under
        // the old level, but from their next response on they refuse beyond the new one, so
        // what arrives keeps within it. Judged on that window, the level bound for the whole
        // next window, and the queue's max wait (section 8) refused, after the network, what
        // the callers had let through (multihop-bench: B refused 4-13% of what it received
        // behind a propagating caller; 0-1% with this). The next window's own arrivals
        // decide again: callers that do not filter make it bind then (judged on the window's
        // arrivals, never on this flag, so an exemption cannot carry over from cut to cut).
        let filtered = censored_cut && !controller::level_binds(&state.scratch, current);
        self.refusing.store(controller::level_binds(&state.scratch, next) && !filtered, Relaxed);
        let capacity = state.controller.capacity_estimate().unwrap_or(0.0);
        self.capacity_bits.store(capacity.to_bits(), Relaxed);
        self.overloaded.store(state.detector.overloaded(), Relaxed);
        state.last = Some(summary);
        state.windows_closed += 1;
    }

    #[inline]
    fn shard(&self) -> usize {
        shard::thread_ordinal() & self.shard_mask
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
