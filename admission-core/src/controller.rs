//! Overload detection and the control laws that move the admission level.
//!
//! Both are pure: they see one closed window ([`WindowSummary`] plus the arrivals
//! histogram) and return the next level, so they are tested and simulated without
//! threads or time.

use crate::config::{EngineConfig, Law};
use crate::priority::{AdmissionLevel, COMPOUND_LEVELS, USER_LEVELS};

mod capacity;
mod dagor;
mod detector;
mod goodput;

pub use capacity::open_beyond_arrivals;
pub use detector::OverloadDetector;

use capacity::CapacityLaw;
use dagor::DagorLaw;
use goodput::GoodputLaw;

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

// === the laws ===

/// One control law: the level for the next window, from the detector's verdict on the
/// window that closed, its summary and its arrivals histogram (`histogram[c]` counts
/// arrivals at compound level `c`; at least one arrived).
trait ControlLaw {
    fn next_level(
        &mut self,
        current: AdmissionLevel,
        zone: Zone,
        w: &WindowSummary,
        histogram: &[u32],
    ) -> AdmissionLevel;

    /// A window in which nothing arrived (the level does not move on it).
    fn observe_idle(&mut self, _zone: Zone, _w: &WindowSummary) {}

    /// The app's capacity as the law measures it, requests per second.
    fn capacity_estimate(&self) -> Option<f64> {
        None
    }
}

#[derive(Debug, Clone)]
enum Laws {
    Capacity(CapacityLaw),
    Dagor(DagorLaw),
    Goodput(GoodputLaw),
}

impl Laws {
    fn get(&self) -> &dyn ControlLaw {
        match self {
            Laws::Capacity(l) => l,
            Laws::Dagor(l) => l,
            Laws::Goodput(l) => l,
        }
    }

    fn get_mut(&mut self) -> &mut dyn ControlLaw {
        match self {
            Laws::Capacity(l) => l,
            Laws::Dagor(l) => l,
            Laws::Goodput(l) => l,
        }
    }
}

// === impl Controller ===

/// Moves the admission level once per window.
#[derive(Debug, Clone)]
pub struct Controller {
    law: Laws,
    /// The nominal window, seconds.
    window_secs: f64,
    /// Silence so far (consecutive windows with no arrivals and nobody waiting), and the
    /// level it began at.
    silence: Option<(AdmissionLevel, u64)>,
}

impl Controller {
    pub fn new(config: &EngineConfig) -> Self {
        let law = match config.law {
            Law::Capacity => Laws::Capacity(CapacityLaw::new(config)),
            Law::Dagor => Laws::Dagor(DagorLaw::new(config)),
            Law::Goodput => Laws::Goodput(GoodputLaw::new(config)),
        };
        Controller { law, window_secs: config.window.as_secs_f64().max(1e-3), silence: None }
    }

    /// The capacity estimate of the goodput and capacity laws, requests per second.
    pub fn capacity_estimate(&self) -> Option<f64> {
        self.law.get().capacity_estimate()
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
            self.law.get_mut().observe_idle(zone, w);
            // Silence: nobody came, waited or left the queue.
            if w.dispatched == 0 && w.queue_depth == 0 && w.oldest_waiting_ns == 0 {
                return self.relax_in_silence(current, w.duration_ns);
            }
            self.silence = None;
            return current;
        }
        self.silence = None;
        self.law.get_mut().next_level(current, zone, w, histogram)
    }
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

// === the histogram ===

/// A level binds when more than 1 in this many of a window's arrivals lie beyond it: below
/// that it refuses (next to) nothing, as behind callers whose egress refuses beyond it.
const BINDS_ONE_IN: u64 = 50;

/// Whether `level` binds on a window's arrivals: more than 1 in 50 (`BINDS_ONE_IN`) of them lie
/// beyond it. The one boundary between a level that refuses a real share of what arrives
/// (the engine's [`level_binds`](crate::AdmissionEngine::level_binds), under which the
/// queue's max wait applies) and one that cuts but refuses next to nothing (behind callers
/// whose egress refuses beyond it: the capacity law's censored window).
pub fn level_binds(histogram: &[u32], level: AdmissionLevel) -> bool {
    let all: u64 = histogram.iter().map(|&n| u64::from(n)).sum();
    arrivals_beyond(histogram, level) * BINDS_ONE_IN > all
}

/// Arrivals less important than `level` (those it refuses).
fn arrivals_beyond(histogram: &[u32], level: AdmissionLevel) -> u64 {
    let first = (level.compound() as usize + 1).min(histogram.len());
    histogram[first..].iter().map(|&n| u64::from(n)).sum()
}

fn secs(w: &WindowSummary) -> f64 {
    w.duration_ns.max(1) as f64 / 1e9
}

/// The level that admits about `target` of the window's arrivals, at least one fine step
/// tighter when cutting and one looser when relaxing (so a cut always sheds something
/// that arrived, and a relax always admits more).
fn toward_target(
    histogram: &[u32],
    current: AdmissionLevel,
    zone: Zone,
    target: f64,
) -> AdmissionLevel {
    let proposed = level_for_target(histogram, target);
    match zone {
        Zone::Cut if proposed >= current => step_below(histogram, current),
        Zone::Relax if proposed <= current => step_above(histogram, current),
        _ => proposed,
    }
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
