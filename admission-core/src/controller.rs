//! Overload detection and the control laws that move the admission level.
//!
//! Both are pure: they see one closed window ([`WindowSummary`] plus the arrivals
//! histogram) and return the next level, so they are tested and simulated without
//! threads or time.

use crate::config::{EngineConfig, Law};
use crate::priority::{AdmissionLevel, COMPOUND_LEVELS};

mod capacity;
mod dagor;
mod detector;
mod goodput;
mod histogram;
mod law;
mod window;

pub use capacity::open_beyond_arrivals;
pub use detector::{
    burst_fits, judge, overloaded_after, projected_drain_ns, refused_after_admission,
    DetectorThresholds, OverloadDetector, BURST_ALLOWANCE_PER_THRESHOLD,
};
pub use histogram::{level_binds, level_for_target};
pub use window::{queuing_signal_ns, WindowSummary, Zone};

use capacity::CapacityLaw;
use dagor::DagorLaw;
use goodput::GoodputLaw;
use law::ControlLaw;

// === the laws ===

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

#[cfg(test)]
mod tests;
