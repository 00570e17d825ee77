//! The overload detector: the window's queuing signal against two thresholds, and the
//! line between a burst the budget absorbs and an overload.
//!
//! DAGOR's signal (mean queuing over a window above 20 ms) is a standing queue's: sustained
//! arrivals above what the app completes. A burst above capacity raises the same mean while
//! it lasts (1.5x for 500 ms queues ~125 ms on average, ~250 ms at its end) yet drains in
//! the lull after it, well within the 500 ms budget; refusing it costs a healthy app
//! requests it had the room to serve. CoDel draws the same line between a good queue (one
//! that drains within an interval) and a standing one. Here a queue above the threshold is
//! a burst, and the level holds ([`Zone::Absorb`]), while all of these hold:
//!
//! - the detector is not already in the overloaded state (inside an overload DAGOR's
//!   signal decides alone: the dial is unchanged);
//! - the queue formed within the last nominal window (it emptied, as seen by the queue
//!   observations, less than a window ago): a queue that stood for a whole window is an
//!   overload's, however short;
//! - the app completes requests (a stall is judged by DAGOR's signal as before), and the
//!   level refuses at most 1 in 50 arrivals (a level that binds is an overload's tail);
//! - the oldest waiter has waited at most the burst allowance, and the queue, grown for one
//!   look-ahead (the next early close) at the pace it grew since it formed, drains within
//!   the allowance at the app's completion rate.
//!
//! The allowance is a share of the budget the queuing threshold stands for (DAGOR: 20 ms
//! against a 500 ms task timeout; [`BURST_ALLOWANCE_PER_THRESHOLD`] thresholds, 400 ms at
//! the defaults): a burst that queues longer is refused, by priority, as an overload. A
//! step far above capacity projects past it within an early window or two (3x: 200 ms of
//! queue after 100 ms, growing 200 ms per look-ahead of 100 ms: cut at most one early
//! window later than DAGOR's signal alone); a sustained load just above capacity is cut
//! once its queue stood for a window or projects past the allowance, whichever comes first
//! (2x: after ~300 ms; 1.5x: after ~700 ms).

use super::window::{secs, WindowSummary, Zone};
use crate::config::EngineConfig;

/// The burst allowance in queuing thresholds: 20 x 20 ms = 400 ms, 80% of the 500 ms
/// budget the default threshold is set against (DAGOR's 20 ms of 500). The rest of the
/// budget is the app's own time. (A 1.5x burst of 500 ms peaks at 250 ms of queue, 300 ms
/// projected; a Poisson burst of ~330 requests queues up to ~2 standard deviations more.)
pub const BURST_ALLOWANCE_PER_THRESHOLD: f64 = 20.0;

/// A window's completion rate while the queue was busy replaces a higher capacity estimate
/// only when measured over at least this long: a 50 ms slice of a burst is too noisy to
/// lower the drain rate on (and a lower rate means more cuts).
const MIN_BUSY_FOR_RATE_NS: u64 = 200_000_000;

/// What the detector compares a window with (see [`judge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DetectorThresholds {
    /// Above this mean queuing (ns), a window is overloaded (or a burst).
    pub enter_ns: u64,
    /// At or below this, the overloaded state ends; between the two the level holds.
    pub exit_ns: u64,
    /// A queue that stood (never seen empty) this long is a standing queue: the nominal
    /// window.
    pub standing_ns: u64,
    /// A burst's queue drains within this at the app's completion rate, and nobody in it
    /// waited longer.
    pub burst_allowance_ns: u64,
    /// How far ahead the queue's growth is projected (the next early close).
    pub lookahead_ns: u64,
}

impl DetectorThresholds {
    pub fn new(config: &EngineConfig) -> Self {
        let enter_ns = config.queuing_threshold.as_nanos() as u64;
        let window_ns = config.window.as_nanos() as u64;
        let early_ns = config.early_close_after.as_nanos() as u64;
        DetectorThresholds {
            enter_ns,
            exit_ns: config.queuing_exit_threshold.as_nanos() as u64,
            standing_ns: window_ns,
            burst_allowance_ns: (enter_ns as f64 * BURST_ALLOWANCE_PER_THRESHOLD) as u64,
            lookahead_ns: if early_ns > 0 { early_ns } else { window_ns / 10 },
        }
    }
}

/// The detector's verdict on a closed window: a pure function of the thresholds, whether
/// the detector is in the overloaded state, the window and the app's capacity estimate
/// (requests per second, from the law, if it has one). The next overloaded state is
/// [`overloaded_after`].
pub fn judge(
    t: &DetectorThresholds,
    overloaded: bool,
    w: &WindowSummary,
    capacity_per_sec: Option<f64>,
) -> Zone {
    let signal = w.queuing_signal_ns();
    if w.dispatched == 0 && signal <= t.enter_ns {
        // Nothing left the queue and nobody has waited long: with admitted work the
        // app may be slow to start, so hold; with no work at all, relax.
        return if w.admitted > 0 || w.queue_depth > 0 { Zone::Hold } else { Zone::Relax };
    }
    if signal > t.exit_ns && burst_absorbed(w) {
        // The queue held a burst and the app served it within the window: the wait was
        // the burst's, not a sustained overload's (DAGOR's signal). A step past capacity
        // never empties the queue, nor does the app complete what arrives.
        return Zone::Relax;
    }
    if signal > t.enter_ns {
        if !overloaded && burst_fits(t, w, capacity_per_sec) {
            Zone::Absorb
        } else {
            Zone::Cut
        }
    } else if signal > t.exit_ns {
        Zone::Hold
    } else {
        Zone::Relax
    }
}

/// The overloaded state after a verdict: a cut enters it, a relax leaves it, a hold or an
/// absorbed burst keeps it.
pub fn overloaded_after(overloaded: bool, zone: Zone) -> bool {
    match zone {
        Zone::Cut => true,
        Zone::Relax => false,
        Zone::Hold | Zone::Absorb => overloaded,
    }
}

/// The queue is a burst the budget absorbs (see the module doc): it formed within the last
/// nominal window, and nobody in it, nor the queue projected one look-ahead on, waits past
/// the allowance at the app's completion rate.
pub fn burst_fits(
    t: &DetectorThresholds,
    w: &WindowSummary,
    capacity_per_sec: Option<f64>,
) -> bool {
    // A level that refuses a real share (more than 1 in 50, as `level_binds`) is the tail
    // of an overload, not a burst on a healthy app: DAGOR's signal judges it.
    let level_refused = w.arrivals.saturating_sub(w.admitted) * 50 > w.arrivals;
    if level_refused
        || refused_after_admission(w) * 50 > w.admitted
        || w.queue_standing_ns >= t.standing_ns
        || w.oldest_waiting_ns > t.burst_allowance_ns
    {
        return false;
    }
    projected_drain_ns(w, capacity_per_sec, t.lookahead_ns)
        .is_some_and(|drain| drain <= t.burst_allowance_ns)
}

/// What the sidecar refused or dropped of what the level admitted: dropped from the queue
/// (the max wait, the deadline gate, callers who left), or refused at its door (expected to
/// wait past their budget: admitted, yet neither dispatched nor still waiting). The door's
/// share is inferred: requests admitted late in the previous window and dispatched in this
/// one hide some of it, and requests still waiting for their body at the close (a burst of
/// uploads) count as refused, which only hands the window back to DAGOR's signal. A burst
/// that fits the budgets needs none of
/// it; a queue kept short by refusing is an overload's. (A bottleneck behind a middle hop
/// whose callers reached it with little budget left: its door and deadline gate refused a
/// tenth of what arrived, for seconds, while each short queue read as a burst and the level
/// never cut, so nothing told the callers.)
pub fn refused_after_admission(w: &WindowSummary) -> u64 {
    w.dropped + w.admitted.saturating_sub(w.dispatched + w.queue_depth)
}

/// How long the queue takes to drain at the app's completion rate, grown for `lookahead_ns`
/// more at the pace it grew since it formed (its depth over how long it has stood, that
/// time taken as at least the look-ahead: a queue seen first at this observation has
/// doubled at most). The next verdict comes no sooner than an early close later; a queue
/// that would pass the allowance by then is cut now. `None` when the app completed nothing
/// in the window (a stall drains at no known rate).
pub fn projected_drain_ns(
    w: &WindowSummary,
    capacity_per_sec: Option<f64>,
    lookahead_ns: u64,
) -> Option<u64> {
    let rate = drain_rate(w, capacity_per_sec)?;
    let stood = w.queue_standing_ns.max(lookahead_ns).max(1);
    let depth = w.queue_depth as f64 * (1.0 + lookahead_ns as f64 / stood as f64);
    Some((depth / rate * 1e9).min(u64::MAX as f64) as u64)
}

/// The app's completion rate, requests per second: the capacity estimate, or what the app
/// completed while the queue was busy in this window if that is lower and measured long
/// enough (the app got slower); without an estimate, the window's own rates. `None` if the
/// window completed nothing.
fn drain_rate(w: &WindowSummary, capacity_per_sec: Option<f64>) -> Option<f64> {
    if w.completed == 0 {
        return None;
    }
    let busy = (w.busy_ns > 0 && w.busy_completed > 0)
        .then(|| w.busy_completed as f64 / (w.busy_ns as f64 / 1e9));
    let estimate = capacity_per_sec.filter(|c| c.is_finite() && *c > 0.0);
    Some(match (estimate, busy) {
        (Some(c), Some(b)) if w.busy_ns >= MIN_BUSY_FOR_RATE_NS => c.min(b),
        (Some(c), _) => c,
        (None, Some(b)) => b,
        // A lower bound of the rate (the app may have idled part of the window): the
        // drain it gives is an upper bound, so a doubtful queue is judged an overload.
        (None, None) => w.completed as f64 / secs(w),
    })
}

/// Mean queuing time against a threshold, with a lower exit threshold so the state
/// does not flap around a single boundary, and bursts the budget absorbs told from
/// overloads ([`judge`]).
#[derive(Debug, Clone)]
pub struct OverloadDetector {
    thresholds: DetectorThresholds,
    overloaded: bool,
}

impl OverloadDetector {
    pub fn new(config: &EngineConfig) -> Self {
        OverloadDetector { thresholds: DetectorThresholds::new(config), overloaded: false }
    }

    pub fn overloaded(&self) -> bool {
        self.overloaded
    }

    /// Judges a closed window (see [`judge`]); `capacity_per_sec` is the law's estimate of
    /// the app's completion rate as of the window before.
    pub fn observe(&mut self, w: &WindowSummary, capacity_per_sec: Option<f64>) -> Zone {
        let zone = judge(&self.thresholds, self.overloaded, w, capacity_per_sec);
        self.overloaded = overloaded_after(self.overloaded, zone);
        zone
    }
}

/// The queue that formed in the window was gone by its close, and the app completed at
/// least as many requests as arrived (refused ones included: a level that refuses anything
/// makes arrivals outnumber completions): a burst absorbed, not an overload.
pub fn burst_absorbed(w: &WindowSummary) -> bool {
    w.queue_depth == 0 && w.oldest_waiting_ns == 0 && w.arrivals > 0 && w.completed >= w.arrivals
}
