//! The one signature every control law answers to.

use super::window::{WindowSummary, Zone};
use crate::priority::AdmissionLevel;

/// One control law: the level for the next window, from the detector's verdict on the
/// window that closed, its summary and its arrivals histogram (`histogram[c]` counts
/// arrivals at compound level `c`; at least one arrived).
pub(super) trait ControlLaw {
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
