//! The goodput law (the capacity law's predecessor, opt-in): the dispatch rate (gate drops
//! excluded) of windows whose queue did not shrink, less the trim and a drain term;
//! relaxed, back to that rate at once, then `beta` up.

use super::histogram::toward_target;
use super::law::ControlLaw;
use super::window::{secs, WindowSummary, Zone};
use crate::config::EngineConfig;
use crate::priority::AdmissionLevel;

/// The drain term is the window's excess wait over its length, over this: a gentle drain,
/// since the capacity it multiplies was measured with that backlog in place.
const DRAIN_DIVISOR: f64 = 4.0;
/// The drain term takes at most this share off the target: a cut that refuses more idles
/// the app once the backlog is gone.
const MAX_DRAIN: f64 = 0.25;

#[derive(Debug, Clone)]
pub(super) struct GoodputLaw {
    alpha: f64,
    beta: f64,
    trim: f64,
    exit_ns: u64,
    /// The app's dispatch rate (per second) measured while saturated.
    capacity_per_sec: Option<f64>,
    /// Whether that figure was measured saturated, or is only a lower bound.
    capacity_measured: bool,
}

impl GoodputLaw {
    pub(super) fn new(config: &EngineConfig) -> Self {
        GoodputLaw {
            alpha: config.alpha,
            beta: config.beta,
            trim: config.trim,
            exit_ns: config.queuing_exit_threshold.as_nanos() as u64,
            capacity_per_sec: None,
            capacity_measured: false,
        }
    }
}

impl ControlLaw for GoodputLaw {
    fn next_level(
        &mut self,
        current: AdmissionLevel,
        zone: Zone,
        w: &WindowSummary,
        histogram: &[u32],
    ) -> AdmissionLevel {
        let target = match (zone, self.observe_capacity(zone, w)) {
            // A burst the budget absorbs: the level stays (its busy window still measured
            // the app's capacity).
            (Zone::Absorb, _) => return current,
            // Inside the hysteresis band the queue is where it should be: sit at the
            // measured capacity instead of wherever the last cut left the level.
            (Zone::Hold, Some(cap)) => cap * secs(w) * (1.0 - self.trim),
            (Zone::Hold, None) => return current,
            (Zone::Cut, Some(cap)) => {
                // Aim below capacity by the trim plus what drains the backlog above
                // the exit threshold within about one window.
                let excess = w.mean_queuing_ns.saturating_sub(self.exit_ns) as f64;
                let drain = (excess / w.duration_ns.max(1) as f64 / DRAIN_DIVISOR).min(MAX_DRAIN);
                cap * secs(w) * (1.0 - self.trim - drain)
            }
            (Zone::Cut, None) => (1.0 - self.alpha) * w.admitted as f64,
            // Back to just under capacity at once, then probe upwards gently in case
            // the app got faster.
            (Zone::Relax, Some(cap)) => {
                ((1.0 + self.beta) * w.admitted as f64).max(cap * secs(w) * (1.0 - self.trim))
            }
            (Zone::Relax, None) => w.admitted as f64 + self.beta * w.arrivals as f64,
        };
        toward_target(histogram, current, zone, target)
    }

    fn capacity_estimate(&self) -> Option<f64> {
        self.capacity_per_sec
    }
}

impl GoodputLaw {
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
