//! Reading a step run's per-second series: how long until goodput and queuing settle
//! after the load jumps, and how long until refusals stop after it falls back.

use serde::Serialize;

use super::ScenarioConfig;
use crate::load::{Phase, SecondReport};

/// Seconds a condition must keep holding to count as settled.
const HOLD_SECS: usize = 3;

#[derive(Clone, Debug, Default, Serialize)]
pub struct StepAnalysis {
    /// From the step up to the first whole second from which goodput >= 95% of capacity
    /// and admitted queuing (mean admitted latency minus service time) < threshold hold
    /// for [`HOLD_SECS`] seconds (or to the end of the phase). None: never.
    pub settle_secs: Option<f64>,
    /// The same, goodput condition only.
    pub goodput_settle_secs: Option<f64>,
    /// From the step down to the first second from which under 1% of requests go unserved.
    pub recover_secs: Option<f64>,
    /// Mean goodput over the second half of the high phase, as a share of capacity.
    pub high_phase_goodput_ratio: f64,
}

impl StepAnalysis {
    pub fn of(
        series: &[SecondReport],
        phases: &[Phase],
        capacity: f64,
        config: &ScenarioConfig,
    ) -> Self {
        let [low, high, ..] = phases else { return StepAnalysis::default() };
        let up = low.duration.as_secs() as usize;
        let down = up + high.duration.as_secs() as usize;
        let end =
            series.len().min(down + phases.get(2).map_or(0, |p| p.duration.as_secs() as usize));
        let service_ms = config.backend.service_time.as_secs_f64() * 1000.0;
        let threshold_ms = config.queuing_threshold.as_secs_f64() * 1000.0;
        let ok = |s: &SecondReport| SecondReport::total(&s.ok) as f64;
        let goodput_ok = |s: &SecondReport| ok(s) >= 0.95 * capacity;
        let queue_ok = |s: &SecondReport| ok(s) > 0.0 && s.ok_mean_ms - service_ms < threshold_ms;
        let high_end = down.min(series.len());
        let high_phase = series.get(up..high_end).unwrap_or(&[]);
        let settle = settle_secs(high_phase, |s| goodput_ok(s) && queue_ok(s));
        let goodput_settle = settle_secs(high_phase, goodput_ok);
        let recover = settle_secs(series.get(down.min(end)..end).unwrap_or(&[]), |s| {
            let sent = SecondReport::total(&s.sent).max(1) as f64;
            (sent - ok(s)) / sent < 0.01
        });
        let half = series.get((up + down) / 2..high_end).unwrap_or(&[]);
        let high_phase_goodput_ratio = if half.is_empty() {
            0.0
        } else {
            half.iter().map(ok).sum::<f64>() / half.len() as f64 / capacity
        };
        StepAnalysis {
            settle_secs: settle,
            goodput_settle_secs: goodput_settle,
            recover_secs: recover,
            high_phase_goodput_ratio,
        }
    }
}

/// Seconds from the start of `seconds` until `holds` is true for [`HOLD_SECS`] seconds in
/// a row (or through the end).
pub fn settle_secs(seconds: &[SecondReport], holds: impl Fn(&SecondReport) -> bool) -> Option<f64> {
    (0..seconds.len())
        .find(|&start| {
            let window = &seconds[start..(start + HOLD_SECS).min(seconds.len())];
            window.iter().all(&holds)
        })
        .map(|s| s as f64)
}

pub fn fmt_secs(secs: Option<f64>) -> String {
    secs.map_or("never".into(), |s| format!("{s:.0} s"))
}
