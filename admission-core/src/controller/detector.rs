//! The overload detector: the window's queuing signal against two thresholds.

use super::window::{WindowSummary, Zone};
use crate::config::EngineConfig;

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
        if signal > self.exit_ns && burst_absorbed(w) {
            // The queue held a burst and the app served it within the window: the wait was
            // the burst's, not a sustained overload's (DAGOR's signal). A step past capacity
            // never empties the queue, nor does the app complete what arrives, so it is
            // still cut within the window.
            self.overloaded = false;
            return Zone::Relax;
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

/// The queue that formed in the window was gone by its close, and the app completed at
/// least as many requests as arrived (refused ones included: a level that refuses anything
/// makes arrivals outnumber completions): a burst absorbed, not an overload.
pub fn burst_absorbed(w: &WindowSummary) -> bool {
    w.queue_depth == 0 && w.oldest_waiting_ns == 0 && w.arrivals > 0 && w.completed >= w.arrivals
}
