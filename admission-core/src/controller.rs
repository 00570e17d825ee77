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
        if w.dispatched == 0 {
            // Nothing left the queue: with admitted work that means the app is stuck, so
            // hold; with no work at all there is nothing to protect, so relax.
            return if w.admitted > 0 {
                Zone::Hold
            } else {
                self.overloaded = false;
                Zone::Relax
            };
        }
        if w.mean_queuing_ns > self.enter_ns {
            self.overloaded = true;
            Zone::Cut
        } else if w.mean_queuing_ns > self.exit_ns {
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
        }
    }

    /// The goodput law's current capacity estimate, requests per second.
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
        let target = match self.law {
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
