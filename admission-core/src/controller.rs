//! Overload detection and the control laws that move the admission level.
//!
//! Both are pure: they see one closed window ([`WindowSummary`] plus the arrivals
//! histogram) and return the next level, so they are tested and simulated without
//! threads or time.

use crate::config::{EngineConfig, Law};
use crate::priority::{AdmissionLevel, COMPOUND_LEVELS, USER_LEVELS};

/// What happened in one closed window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WindowSummary {
    /// How long the window was open, in nanoseconds.
    pub duration_ns: u64,
    /// Requests that asked for admission (admitted or not).
    pub arrivals: u64,
    /// Requests the level admitted (in shadow mode: would have admitted).
    pub admitted: u64,
    /// Requests that left the pending queue (queuing samples), dropped ones included.
    pub dispatched: u64,
    /// Of those, how many the residence gate dropped instead of sending to the app.
    pub dropped: u64,
    /// Mean time those requests waited in the queue, in nanoseconds.
    pub mean_queuing_ns: u64,
    /// Responses the app completed in the window (response headers received).
    pub completed: u64,
    /// The age of the oldest request still waiting when the window closed, in
    /// nanoseconds: a stalled app lets nothing leave the queue, so without it a stall
    /// would look like an idle window.
    pub oldest_waiting_ns: u64,
    /// Requests waiting in the queue when the window closed.
    pub queue_depth: u64,
    /// Closed before its time because the queue grew fast.
    pub early: bool,
    /// How long in the window the pending queue was non-empty (the app busy throughout,
    /// its in-flight limit full), as seen by `observe_queue`, and how many responses the
    /// app completed meanwhile: the app's capacity is their ratio.
    pub busy_ns: u64,
    pub busy_completed: u64,
}

impl WindowSummary {
    /// What the detector compares with its thresholds: the mean wait of the requests that
    /// left the queue, or the age of the oldest one still in it if that is longer.
    ///
    /// Requests still waiting are samples too, censored: each counts as half the oldest
    /// one's age. In a stall (nothing leaves, the queue grows) they dominate and the
    /// window reads overloaded; in normal operation a few waiters among hundreds of
    /// dispatched requests barely move the mean.
    pub fn queuing_signal_ns(&self) -> u64 {
        queuing_signal_ns(
            self.dispatched,
            self.mean_queuing_ns,
            self.queue_depth,
            self.oldest_waiting_ns,
        )
    }
}

/// The mean wait over `dispatched` requests (mean `mean_ns`) and `waiting` requests still
/// queued, each counted as half the age of the oldest (`oldest_ns`).
pub fn queuing_signal_ns(dispatched: u64, mean_ns: u64, waiting: u64, oldest_ns: u64) -> u64 {
    let waiting = if oldest_ns == 0 { 0 } else { waiting.max(1) };
    let n = dispatched + waiting;
    if n == 0 {
        return 0;
    }
    let sum = dispatched as u128 * mean_ns as u128 + waiting as u128 * (oldest_ns / 2) as u128;
    (sum / n as u128) as u64
}

/// The detector's verdict on a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zone {
    /// Mean queuing above the threshold: cut.
    Cut,
    /// Between the exit and entry thresholds: keep the level (hysteresis).
    Hold,
    /// At or below the exit threshold: relax.
    Relax,
}

// === impl OverloadDetector ===

/// Mean queuing time against a threshold, with a lower exit threshold so the state
/// does not flap around a single boundary.
#[derive(Debug, Clone)]
pub struct OverloadDetector {
    enter_ns: u64,
    exit_ns: u64,
    overloaded: bool,
}

impl OverloadDetector {
    pub fn new(config: &EngineConfig) -> Self {
        OverloadDetector {
            enter_ns: config.queuing_threshold.as_nanos() as u64,
            exit_ns: config.queuing_exit_threshold.as_nanos() as u64,
            overloaded: false,
        }
    }

    pub fn overloaded(&self) -> bool {
        self.overloaded
    }

    pub fn observe(&mut self, w: &WindowSummary) -> Zone {
        let signal = w.queuing_signal_ns();
        if w.dispatched == 0 && signal <= self.enter_ns {
            // Nothing left the queue and nobody has waited long: with admitted work the
            // app may be slow to start, so hold; with no work at all, relax.
            return if w.admitted > 0 || w.queue_depth > 0 {
                Zone::Hold
            } else {
                self.overloaded = false;
                Zone::Relax
            };
        }
        if signal > self.enter_ns {
            self.overloaded = true;
            Zone::Cut
        } else if signal > self.exit_ns {
            Zone::Hold
        } else {
            self.overloaded = false;
            Zone::Relax
        }
    }
}

// === impl Controller ===

/// Moves the admission level once per window.
#[derive(Debug, Clone)]
pub struct Controller {
    law: Law,
    alpha: f64,
    beta: f64,
    trim: f64,
    exit_ns: u64,
    /// Goodput law: the app's completion rate (per second) measured while saturated.
    capacity_per_sec: Option<f64>,
    /// Whether that figure was measured saturated, or is only a lower bound seen while
    /// the app had spare room (which a first saturated window replaces outright).
    capacity_measured: bool,
    /// The nominal window, seconds: the capacity law drains excess backlog over it.
    window_secs: f64,
    /// Silence so far (consecutive windows with no arrivals and nobody waiting), and the
    /// level it began at.
    silence: Option<(AdmissionLevel, u64)>,
}

impl Controller {
    pub fn new(config: &EngineConfig) -> Self {
        Controller {
            law: config.law,
            alpha: config.alpha,
            beta: config.beta,
            trim: config.trim,
            exit_ns: config.queuing_exit_threshold.as_nanos() as u64,
            capacity_per_sec: None,
            capacity_measured: false,
            window_secs: config.window.as_secs_f64().max(1e-3),
            silence: None,
        }
    }

    /// The capacity estimate of the goodput and capacity laws, requests per second.
    pub fn capacity_estimate(&self) -> Option<f64> {
        self.capacity_per_sec
    }

    /// The level for the next window. `histogram[c]` counts arrivals at compound level `c`.
    pub fn next_level(
        &mut self,
        current: AdmissionLevel,
        zone: Zone,
        w: &WindowSummary,
        histogram: &[u32],
    ) -> AdmissionLevel {
        debug_assert_eq!(histogram.len(), COMPOUND_LEVELS);
        if w.arrivals == 0 {
            // Nothing arrived: the histogram says nothing about who to admit, and a walk
            // over it would find no bucket and land on the most important level (refusing
            // everyone). A stall is still seen (the detector's verdict stands), it just
            // cannot move a level chosen by the last window that saw traffic.
            if self.law == Law::Capacity {
                self.observe_completions(zone, w, false);
            }
            // Silence: nobody came, waited or left the queue.
            if w.dispatched == 0 && w.queue_depth == 0 && w.oldest_waiting_ns == 0 {
                return self.relax_in_silence(current, w.duration_ns);
            }
            self.silence = None;
            return current;
        }
        self.silence = None;
        let censored = self.law == Law::Capacity && is_censored(histogram, current);
        // A short censored window (a handful of requests let through) is too thin to
        // judge "room for twice what came" on.
        let may_open_fully = secs(w) >= 0.5 * self.window_secs;
        let target = match self.law {
            Law::Capacity => match self.capacity_target(zone, w, censored) {
                Some(target) => {
                    let proposed = match level_for_target(histogram, target) {
                        // Everything that arrived fits while the level cuts, and the
                        // window is censored: the histogram says nothing about the demand
                        // beyond what arrived, which behind callers whose egress refuses
                        // above this sidecar's advertised level is most of it. Opening
                        // fully would let them all in at once: open past what arrived by
                        // what the spare room admits at the density seen there (fully
                        // when the room is large). Uncensored, fully open as ever.
                        AdmissionLevel::FULLY_OPEN if censored => {
                            open_beyond_arrivals(histogram, current, target, may_open_fully)
                        }
                        p => p,
                    };
                    let next = match zone {
                        // A cut opens only if the backlog is gone already (the long waits
                        // were the spike's, now drained); it needs no forced step: the
                        // target already is what the app completes, and one long wait in
                        // a quiet window (target above all arrivals) must not refuse anyone.
                        Zone::Cut if w.queue_depth > 0 => proposed.min(current),
                        Zone::Cut => proposed,
                        // Sit at what the app completes; a level already within a few
                        // percent of it stays, so histogram noise does not move it. A window
                        // whose queue was never busy says nothing about the app's rate (a
                        // full queue refusing, a quiet spell): it never lowers the level.
                        Zone::Hold if near(w.admitted as f64, target) => current,
                        Zone::Hold if w.busy_ns == 0 => proposed.max(current),
                        Zone::Hold => proposed,
                        // Censored, more admitted than the target: the queue is short
                        // because this sidecar's wait bound refuses the surplus, after it
                        // crossed the network. Sit at the target like a hold would.
                        Zone::Relax if proposed <= current && censored => proposed,
                        // Short queue: at least what the app completes, and one more
                        // bucket than now (a probe, in case the app got faster).
                        Zone::Relax if proposed <= current => {
                            match step_above(histogram, current) {
                                // No bucket beyond the next: same as above, no evidence.
                                AdmissionLevel::FULLY_OPEN if censored => {
                                    open_beyond_arrivals(histogram, current, target, may_open_fully)
                                }
                                step => step,
                            }
                        }
                        Zone::Relax => proposed,
                    };
                    // (Censored inside the top class, its arrivals are only what the
                    // callers let through: its size is unknown.)
                    if censored && current.priority().business == top_class(histogram) {
                        return next;
                    }
                    return self.keep_top_class(next, histogram, w);
                }
                None => return current,
            },
            Law::Dagor => match zone {
                Zone::Cut => (1.0 - self.alpha) * w.admitted as f64,
                Zone::Hold => return current,
                Zone::Relax => (1.0 + self.beta) * w.admitted as f64,
            },
            Law::Goodput => match (zone, self.observe_capacity(zone, w)) {
                // Inside the hysteresis band the queue is where it should be: sit at the
                // measured capacity instead of wherever the last cut left the level.
                (Zone::Hold, Some(cap)) => cap * secs(w) * (1.0 - self.trim),
                (Zone::Hold, None) => return current,
                (Zone::Cut, Some(cap)) => {
                    // Aim below capacity by the trim plus what drains the backlog above
                    // the exit threshold within about one window.
                    let excess = w.mean_queuing_ns.saturating_sub(self.exit_ns) as f64;
                    let drain = (excess / w.duration_ns.max(1) as f64 / 4.0).min(0.25);
                    cap * secs(w) * (1.0 - self.trim - drain)
                }
                (Zone::Cut, None) => (1.0 - self.alpha) * w.admitted as f64,
                // Back to just under capacity at once, then probe upwards gently in case
                // the app got faster.
                (Zone::Relax, Some(cap)) => {
                    ((1.0 + self.beta) * w.admitted as f64).max(cap * secs(w) * (1.0 - self.trim))
                }
                (Zone::Relax, None) => w.admitted as f64 + self.beta * w.arrivals as f64,
            },
        };
        let proposed = level_for_target(histogram, target);
        match zone {
            Zone::Cut if proposed >= current => step_below(histogram, current),
            Zone::Relax if proposed <= current => step_above(histogram, current),
            _ => proposed,
        }
    }
}

// === impl Controller (the top class) ===

/// The most important class present is admitted whole while it alone arrives at no more
/// than this share of what the app completes: a cut that drains a backlog, or the noise of
/// one window, must not reach into it.
const TOP_CLASS_FITS: f64 = 0.9;

impl Controller {
    /// `next`, or the level that admits the whole of the most important business class
    /// that arrived if that is higher and the class alone fits the app (see
    /// [`TOP_CLASS_FITS`]). A dip into the top class refuses the requests that matter most,
    /// and callers that cache this level refuse them too until they hear otherwise.
    fn keep_top_class(
        &self,
        next: AdmissionLevel,
        histogram: &[u32],
        w: &WindowSummary,
    ) -> AdmissionLevel {
        let Some(capacity) = self.capacity_per_sec else { return next };
        let Some(first) = histogram.iter().position(|&n| n > 0) else { return next };
        let class = usize::from(top_class(histogram));
        let end = (class + 1) * USER_LEVELS as usize;
        let top: u64 = histogram[first..end].iter().map(|&n| u64::from(n)).sum();
        let whole = AdmissionLevel::from_compound((end - 1) as u16).unwrap_or(next);
        if (top as f64) <= TOP_CLASS_FITS * capacity * secs(w) {
            next.max(whole)
        } else {
            next
        }
    }
}

/// The most important business class that arrived (255 when nothing did).
fn top_class(histogram: &[u32]) -> u8 {
    histogram
        .iter()
        .position(|&n| n > 0)
        .map_or(u8::MAX, |c| (c / USER_LEVELS as usize).min(255) as u8)
}

// === impl Controller (silence) ===

impl Controller {
    /// Nothing arrived and nobody waits: there is nothing to refuse, so the level moves
    /// towards open in proportion to the silence, fully open after half a nominal window
    /// of silent windows (see [`relaxed_in_silence`]; with the window that held the last
    /// requests, within about a window of the last of them).
    fn relax_in_silence(&mut self, current: AdmissionLevel, duration_ns: u64) -> AdmissionLevel {
        let (from, silent_ns) = self.silence.unwrap_or((current, 0));
        let silent_ns = silent_ns.saturating_add(duration_ns);
        self.silence = Some((from, silent_ns));
        let full_after = (self.window_secs * 1e9 / 2.0) as u64;
        relaxed_in_silence(from, silent_ns, full_after).max(current)
    }
}

/// The level after `silent_ns` of silence that began at `from`: the way to fully open in
/// proportion to the silence, all of it after `full_after_ns`. A lull between bursts moves
/// it a little; an idle sidecar (a second of silence by default) is open, so the first
/// requests after an idle spell are admitted and its status says so.
pub fn relaxed_in_silence(
    from: AdmissionLevel,
    silent_ns: u64,
    full_after_ns: u64,
) -> AdmissionLevel {
    if silent_ns >= full_after_ns {
        return AdmissionLevel::FULLY_OPEN;
    }
    let (start, open) =
        (u64::from(from.compound()), u64::from(AdmissionLevel::FULLY_OPEN.compound()));
    let moved = (open.saturating_sub(start) as u128 * u128::from(silent_ns)
        / u128::from(full_after_ns.max(1))) as u64;
    AdmissionLevel::from_compound((start + moved).min(open) as u16)
        .unwrap_or(AdmissionLevel::FULLY_OPEN)
}

// === impl Controller (capacity law) ===

/// How far under the measured completion rate the capacity law aims: 10% *over* it. The
/// sidecar's queue is bounded in time (`overload_max_wait` drops the least important
/// waiters past it, the door refuses whoever expects to wait past it), so a slight
/// overfeed cannot drift into a long queue; it keeps the queue from running dry between
/// Poisson bursts, which at exactly the app's rate idles it ~5% of the time (measured:
/// goodput at 3x 93-95% with 0.0, 97-98% with -0.1; the surplus is refused within the max
/// wait, never as a timeout).
const CAPACITY_MARGIN: f64 = -0.1;
/// The margin instead when the window is censored (see [`is_censored`]): callers' egress
/// refuse above the level before sending, for free, while whatever this sidecar's wait
/// bound refuses has crossed the network and cost the callers their work. So aim under
/// the app's rate, where the queue stays short and nothing admitted is refused.
const CENSORED_MARGIN: f64 = 0.1;
/// Inside the hysteresis band, the capacity law keeps a level that admits within this
/// fraction of its target.
const HOLD_BAND: f64 = 0.05;

impl Controller {
    /// The capacity law's target, in arrivals of this window: the app's completion rate
    /// over the window's length, less (when cutting) the backlog above what the exit
    /// threshold allows, drained over about one nominal window and never more than half
    /// the rate. `None` before any completion was seen (nothing to aim at: hold).
    fn capacity_target(&mut self, zone: Zone, w: &WindowSummary, censored: bool) -> Option<f64> {
        // See CAPACITY_MARGIN: aim a little over the app's rate.
        let margin = if censored { CENSORED_MARGIN } else { CAPACITY_MARGIN };
        let cap = self.observe_completions(zone, w, censored)? * (1.0 - margin);
        let per_window = cap * secs(w);
        Some(match zone {
            Zone::Cut => {
                let allowed = cap * 4.0 * self.exit_ns as f64 / 1e9;
                let excess = (w.queue_depth as f64 - allowed).max(0.0);
                let drain_rate = (excess / self.window_secs).min(0.5 * cap);
                (cap - drain_rate) * secs(w)
            }
            Zone::Hold => per_window,
            // Censored, what was admitted says nothing about the demand (callers refused
            // the rest): the rate alone (its probes are in `observe_completions`).
            Zone::Relax if censored => per_window,
            Zone::Relax => per_window.max((1.0 + self.beta) * w.admitted as f64),
        })
    }

    /// Updates the capacity estimate from a window's completions. While the queue was
    /// non-empty the app was busy: its completion rate then *is* the capacity (averaged
    /// with the last one) if that was at least a quarter of the window. Any other window
    /// only proves a lower bound. A window with no completions says nothing (a stall must not zero
    /// the estimate, or the level would take long to re-open after it). `censored`: nothing
    /// above the level arrived (see [`is_censored`]).
    fn observe_completions(
        &mut self,
        zone: Zone,
        w: &WindowSummary,
        censored: bool,
    ) -> Option<f64> {
        if w.completed == 0 {
            return self.capacity_per_sec;
        }
        // Saturated: the queue was non-empty for a good part of the window, so the app
        // was busy then; its rate over that time is its capacity.
        let saturated = w.busy_ns * 4 >= w.duration_ns && w.busy_completed > 0;
        let rate = if saturated {
            w.busy_completed as f64 / (w.busy_ns as f64 / 1e9)
        } else if w.busy_ns == 0 && w.queue_depth == 0 && w.admitted < w.arrivals {
            // The level refused requests, yet the queue never held any: the app took all
            // it was given, so the level (not the app) set this rate. Probe a half
            // higher; a window that finds the queue busy measures the real figure.
            1.5 * w.completed as f64 / secs(w)
        } else if w.busy_ns == 0
            && w.queue_depth == 0
            && w.mean_queuing_ns * 10 < self.exit_ns
            && censored
            && zone == Zone::Relax
            && secs(w) >= 0.5 * self.window_secs
        {
            // The same with the refusals made upstream (callers' egress refuses above the
            // level this sidecar advertises), unseen here: a whole window (at least half
            // the nominal one: a few requests in a short window prove nothing) in which
            // the app never queued (and nobody waited a tenth of the exit threshold). Room for twice as much, which re-opens fully (see
            // `open_beyond_arrivals`): a downstream that recovered is not kept creeping
            // up a few levels a window, and if it had not, the callers' requests arrive
            // again and the next window cuts from what it sees. (A little over twice after
            // the margin.)
            2.1 / (1.0 - CENSORED_MARGIN) * w.completed as f64 / secs(w)
        } else {
            w.completed as f64 / secs(w)
        };
        self.capacity_per_sec = Some(match self.capacity_per_sec {
            // A step change (the app got much slower or faster) replaces the estimate;
            // within a quarter of it, the two average out noise.
            Some(old)
                if saturated && self.capacity_measured && (rate - old).abs() <= 0.25 * old =>
            {
                0.5 * old + 0.5 * rate
            }
            // Far lower: at most halve per window (one odd window must not crash it).
            Some(old) if saturated && self.capacity_measured && rate < old => rate.max(0.5 * old),
            Some(old) if !saturated => old.max(rate),
            _ => rate,
        });
        self.capacity_measured |= saturated;
        self.capacity_per_sec
    }
}

// === impl Controller (goodput law) ===

impl Controller {
    /// Updates the capacity estimate from a window: requests per second that reached the
    /// app. A window whose queue did not shrink (admitted >= dequeued) with queuing above
    /// the exit threshold kept the app busy throughout, so its rate *is* the capacity. Any
    /// other window only proves a lower bound.
    fn observe_capacity(&mut self, zone: Zone, w: &WindowSummary) -> Option<f64> {
        let served = w.dispatched.saturating_sub(w.dropped);
        if served == 0 {
            return self.capacity_per_sec;
        }
        let rate = served as f64 / secs(w);
        let saturated = zone != Zone::Relax && w.admitted >= w.dispatched;
        self.capacity_per_sec = Some(match self.capacity_per_sec {
            Some(old) if saturated && self.capacity_measured => 0.5 * old + 0.5 * rate,
            Some(old) if !saturated => old.max(rate),
            _ => rate,
        });
        self.capacity_measured |= saturated;
        self.capacity_per_sec
    }
}

/// Within the capacity law's dead band of the target.
fn near(admitted: f64, target: f64) -> bool {
    (admitted - target).abs() <= HOLD_BAND * target
}

fn secs(w: &WindowSummary) -> f64 {
    w.duration_ns.max(1) as f64 / 1e9
}

/// The least important level whose cumulative arrivals stay within `target`; fully open
/// when everything fits. Levels only ever land just below a non-empty bucket.
pub fn level_for_target(histogram: &[u32], target: f64) -> AdmissionLevel {
    let mut cumulative = 0u64;
    // Whole business classes first (a vectorised sum), buckets only in the class where
    // the target falls: the walk runs on every rollover.
    for (class, chunk) in histogram.chunks(USER_LEVELS as usize).enumerate() {
        let sum: u64 = chunk.iter().map(|&n| n as u64).sum();
        if (cumulative + sum) as f64 <= target {
            cumulative += sum;
            continue;
        }
        for (u, &n) in chunk.iter().enumerate() {
            if n > 0 && (cumulative + n as u64) as f64 > target {
                // Admit everything strictly more important than this bucket.
                let c = class * USER_LEVELS as usize + u;
                return AdmissionLevel::from_compound(c.saturating_sub(1) as u16)
                    .unwrap_or(AdmissionLevel::FULLY_OPEN);
            }
            cumulative += n as u64;
        }
    }
    AdmissionLevel::FULLY_OPEN
}

/// Next to nothing above `current` arrived in the window (at most one in
/// [`CENSORED_ABOVE`], or at most [`CENSORED_STRAGGLERS`], and `current` is not fully
/// open): the histogram is censored at the
/// level. That is what a sidecar whose callers run weir's egress sees once they know its
/// level: they refuse above it before sending, so it counts what it admits plus the few
/// sent before the callers heard of a cut. A sidecar that sees all of its demand has far
/// more above a cut, except right at 1x.
fn is_censored(histogram: &[u32], current: AdmissionLevel) -> bool {
    let cur = current.compound() as usize;
    if cur + 1 >= COMPOUND_LEVELS {
        return false;
    }
    let above: u64 = histogram[cur + 1..].iter().map(|&n| n as u64).sum();
    let all: u64 = above + histogram[..=cur].iter().map(|&n| n as u64).sum::<u64>();
    // A thin window (a short early re-open) judged by share alone would call two stragglers
    // out of nine "demand": that opened the level fully and let the callers' backlog in.
    above * CENSORED_ABOVE <= all || above <= CENSORED_STRAGGLERS
}

/// Arrivals above the level that a window may hold and still count as censored whatever
/// its size: requests the callers sent before they heard of a cut.
const CENSORED_STRAGGLERS: u64 = 2;

/// [`open_beyond_arrivals`] opens fully when the spare room is this many times what came.
const CENSORED_FULL_OPEN_ROOM: f64 = 2.0;

/// Fewer arrivals than this make a window too thin to extrapolate a density from.
const THIN_WINDOW: u64 = 20;

/// See [`is_censored`]: 1 in 50.
const CENSORED_ABOVE: u64 = 50;

/// The level for a window whose arrivals all fit in `target` while `current` cuts: past
/// the highest bucket that arrived (or `current`, if higher) by the spare room (`target`
/// less what arrived) over the arrival density there, extrapolated beyond it. At least one
/// fine step (a probe, so a level never sticks), and fully open when the spare room is
/// twice everything that arrived and `may_open_fully` (a downstream with that much room
/// re-opens in one window rather than creeping up).
///
/// Used for censored windows only (see [`is_censored`]): behind callers' egress (which
/// refuse above the advertised level before sending) it is what keeps the level from
/// opening fully whenever the refused demand, invisible here, fits no longer.
///
/// The density is arrivals per compound level over that bucket's business class up to it
/// (users are spread evenly within a class); with fewer than [`THIN_WINDOW`] arrivals in
/// all, never less than the arrivals per non-empty bucket (a step then opens at most
/// `spare` levels).
pub fn open_beyond_arrivals(
    histogram: &[u32],
    current: AdmissionLevel,
    target: f64,
    may_open_fully: bool,
) -> AdmissionLevel {
    let Some(highest) = histogram.iter().rposition(|&n| n > 0) else {
        return AdmissionLevel::FULLY_OPEN;
    };
    let base = (current.compound() as usize).max(highest);
    let arrived: u64 = histogram.iter().map(|&n| n as u64).sum();
    let spare = target - arrived as f64;
    // Fully open only with room for three times what came: the estimate behind a quiet
    // censored window is a probe (half above what completed), and room for merely twice
    // what came opened fully on a probe and let the callers' backlog in (a sawtooth).
    if spare >= CENSORED_FULL_OPEN_ROOM * arrived as f64 && may_open_fully {
        return AdmissionLevel::FULLY_OPEN;
    }
    let class_start = base - base % USER_LEVELS as usize;
    let in_class: u64 = histogram[class_start..=base].iter().map(|&n| n as u64).sum();
    let per_level = in_class as f64 / (base - class_start + 1) as f64;
    let density = if arrived < THIN_WINDOW {
        // A thin window (a few requests over many levels) would extrapolate a near-zero
        // density and open by hundreds of levels: assume no fewer arrivals a level than
        // a non-empty bucket holds on average, so it opens by at most `spare` levels.
        let occupied = histogram.iter().filter(|&&n| n > 0).count();
        per_level.max(arrived as f64 / occupied.max(1) as f64)
    } else if in_class < THIN_WINDOW / 2 {
        // The cut's class barely seen: the density over everything up to the base.
        per_level.max(arrived as f64 / (base + 1) as f64)
    } else {
        per_level
    };
    let steps = if spare > 0.0 { (spare / density).ceil().max(1.0) } else { 1.0 };
    let next = (base as f64 + steps).min((COMPOUND_LEVELS - 1) as f64) as u16;
    AdmissionLevel::from_compound(next).unwrap_or(AdmissionLevel::FULLY_OPEN)
}

/// One fine step tighter than `current`: just below the nearest non-empty bucket at or
/// under it, so the step always sheds something that arrived.
fn step_below(histogram: &[u32], current: AdmissionLevel) -> AdmissionLevel {
    let cur = current.compound() as usize;
    let c = (0..=cur).rev().find(|&c| histogram[c] > 0).unwrap_or(0);
    AdmissionLevel::from_compound(c.saturating_sub(1) as u16).unwrap_or(current)
}

/// One fine step looser: up to just below the next non-empty bucket above the one
/// `current` would admit next, so the step lets exactly one more bucket in.
fn step_above(histogram: &[u32], current: AdmissionLevel) -> AdmissionLevel {
    let cur = current.compound() as usize;
    let first = (cur + 1..COMPOUND_LEVELS).find(|&c| histogram[c] > 0);
    let Some(first) = first else { return AdmissionLevel::FULLY_OPEN };
    match (first + 1..COMPOUND_LEVELS).find(|&c| histogram[c] > 0) {
        Some(next) => AdmissionLevel::from_compound((next - 1) as u16).unwrap_or(current),
        None => AdmissionLevel::FULLY_OPEN,
    }
}

#[cfg(test)]
mod tests;
