//! The paper's law, exactly: overloaded, admit `(1 - alpha)` of what the window admitted;
//! not overloaded, `(1 + beta)` of it; at least one fine step either way.

use super::histogram::toward_target;
use super::law::ControlLaw;
use super::window::{WindowSummary, Zone};
use crate::config::EngineConfig;
use crate::priority::AdmissionLevel;

#[derive(Debug, Clone)]
pub(super) struct DagorLaw {
    alpha: f64,
    beta: f64,
}

impl DagorLaw {
    pub(super) fn new(config: &EngineConfig) -> Self {
        DagorLaw { alpha: config.alpha, beta: config.beta }
    }
}

impl ControlLaw for DagorLaw {
    fn next_level(
        &mut self,
        current: AdmissionLevel,
        zone: Zone,
        w: &WindowSummary,
        histogram: &[u32],
    ) -> AdmissionLevel {
        let target = match zone {
            Zone::Cut => (1.0 - self.alpha) * w.admitted as f64,
            Zone::Hold | Zone::Absorb => return current,
            Zone::Relax => (1.0 + self.beta) * w.admitted as f64,
        };
        toward_target(histogram, current, zone, target)
    }
}
