//! A step run's figures, read from its per-request log with `weir_workload::analysis`.

use serde::Serialize;

use crate::load::{Ending, Event, Phase};
use weir_workload::analysis::{self as a, Counts, SettleRule};

/// Compound levels from here up admit every class the benchmark sends (businesses 0-2).
pub const LEVEL_ALL_OPEN: u32 = 3 * 128;

/// The margin over the service time the issue allows admitted latency.
pub const LATENCY_MARGIN_MS: f64 = 40.0;

/// Settled: a 500 ms window serves >= 90% of capacity with admitted p90 <= S + 40 ms.
pub const SETTLE_MIN_GOODPUT: f64 = 0.9;
pub const SETTLE_WINDOW_SECS: f64 = 0.5;

/// Recovered: every class keeps >= 99% success from then to the end of the run.
pub const RECOVERY_MIN_SUCCESS: f64 = 0.99;

#[derive(Clone, Debug, Default, Serialize)]
pub struct CountsDoc {
    pub sent: u64,
    pub ok: u64,
    pub refused: u64,
    pub timed_out: u64,
    pub errors: u64,
}

impl From<Counts> for CountsDoc {
    fn from(c: Counts) -> Self {
        CountsDoc {
            sent: c.sent,
            ok: c.ok,
            refused: c.refused,
            timed_out: c.timed_out,
            errors: c.errors,
        }
    }
}

/// One class's figures in a step run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ClassLine {
    pub success_high: f64,
    /// From 2 s after the drop to the end.
    pub success_after_drop: f64,
    pub recovery_secs: Option<f64>,
    pub timeout_share: Option<f64>,
}

/// What the issue asks of a step, overall and per class.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StepMetrics {
    /// From the jump until the cut holds (see [`SettleRule`] with the constants above).
    pub settle_secs: Option<f64>,
    /// From the drop until every class keeps >= 99% success.
    pub recovery_secs: Option<f64>,
    /// Of everything refused or timed out over the run, the share that timed out.
    pub timeout_share: Option<f64>,
    pub refused: u64,
    pub timed_out: u64,
    /// Admitted latency from the 2nd second of the spike to its end.
    pub admitted_p50_ms: Option<f64>,
    pub admitted_p90_ms: Option<f64>,
    pub admitted_p99_ms: Option<f64>,
    /// Served in the high phase, as a share of capacity x its length.
    pub high_goodput_ratio: f64,
    pub top_class_success_high: f64,
    pub classes: Vec<ClassLine>,
}

impl StepMetrics {
    /// Lowest per-class success from 2 s after the drop.
    pub fn worst_after_drop(&self) -> f64 {
        self.classes.iter().map(|c| c.success_after_drop).fold(1.0, f64::min)
    }
}

/// The figures of a low -> high -> low step, from its log.
pub fn step_metrics(
    events: &[Event],
    phases: &[Phase],
    capacity: f64,
    service_ms: f64,
    classes: usize,
) -> StepMetrics {
    let [low, high, rest @ ..] = phases else { return StepMetrics::default() };
    let up = low.duration.as_secs_f64();
    let down = up + high.duration.as_secs_f64();
    let end = down + rest.iter().map(|p| p.duration.as_secs_f64()).sum::<f64>();
    let rule = SettleRule {
        capacity,
        min_goodput: SETTLE_MIN_GOODPUT,
        max_p90_ms: service_ms + LATENCY_MARGIN_MS,
        window: SETTLE_WINDOW_SECS,
    };
    let whole = a::counts(events, 0.0, end, None);
    let high_counts = a::counts(events, up, down, None);
    let q = |q: f64| a::admitted_latency_ms(events, (up + 1.0).min(down), down, q);
    let class_lines = (0..classes)
        .map(|k| {
            let k16 = k as u16;
            ClassLine {
                success_high: a::counts(events, up, down, Some(k16)).success(),
                success_after_drop: a::counts(events, down + 2.0, end, Some(k16)).success(),
                recovery_secs: a::recovery_secs(
                    events,
                    down,
                    end,
                    classes,
                    Some(k16),
                    RECOVERY_MIN_SUCCESS,
                    1.0,
                ),
                timeout_share: a::counts(events, 0.0, end, Some(k16)).timeout_share(),
            }
        })
        .collect::<Vec<_>>();
    StepMetrics {
        settle_secs: a::settle_secs(events, up, down, rule),
        recovery_secs: a::recovery_secs(
            events,
            down,
            end,
            classes,
            None,
            RECOVERY_MIN_SUCCESS,
            1.0,
        ),
        timeout_share: whole.timeout_share(),
        refused: whole.refused,
        timed_out: whole.timed_out,
        admitted_p50_ms: q(0.5),
        admitted_p90_ms: q(0.9),
        admitted_p99_ms: q(0.99),
        high_goodput_ratio: high_counts.ok as f64 / (capacity * (down - up)).max(1e-9),
        top_class_success_high: class_lines.first().map_or(1.0, |c| c.success_high),
        classes: class_lines,
    }
}

/// Per class, admitted / refused / timed out in one bucket of the run.
#[derive(Clone, Debug, Serialize)]
pub struct TimelineBucket {
    pub at_secs: f64,
    pub ok: Vec<u64>,
    pub refused: Vec<u64>,
    pub timed_out: Vec<u64>,
    /// Mean latency of the admitted requests, ms (0 when none).
    pub ok_mean_ms: f64,
}

/// Buckets of `width` seconds by scheduled time.
pub fn timeline(events: &[Event], classes: usize, width: f64) -> Vec<TimelineBucket> {
    let end = events.iter().map(|e| e.at_secs).fold(0.0, f64::max);
    let n = (end / width).floor() as usize + 1;
    let mut buckets: Vec<TimelineBucket> = (0..n)
        .map(|i| TimelineBucket {
            at_secs: i as f64 * width,
            ok: vec![0; classes],
            refused: vec![0; classes],
            timed_out: vec![0; classes],
            ok_mean_ms: 0.0,
        })
        .collect();
    for e in events {
        let i = ((e.at_secs / width).floor() as usize).min(n - 1);
        let k = (e.class as usize).min(classes.saturating_sub(1));
        let b = &mut buckets[i];
        match e.ending {
            Ending::Ok => {
                b.ok[k] += 1;
                b.ok_mean_ms += e.latency_ms;
            }
            Ending::Refused => b.refused[k] += 1,
            Ending::TimedOut | Ending::Error => b.timed_out[k] += 1,
        }
    }
    for b in &mut buckets {
        let ok: u64 = b.ok.iter().sum();
        b.ok_mean_ms = if ok == 0 { 0.0 } else { b.ok_mean_ms / ok as f64 };
    }
    buckets
}

pub fn fmt_secs(secs: Option<f64>) -> String {
    secs.map_or("never".into(), |s| format!("{s:.1} s"))
}

/// One line per settle window of the high phase (the grid and rule of [`step_metrics`]):
/// start (s after the jump), served against the bar, admitted p90 against the bar, and which
/// condition failed. For `OVERLOAD_STEP_TRACE`.
pub fn settle_trace(
    events: &[Event],
    phases: &[Phase],
    capacity: f64,
    service_ms: f64,
) -> Vec<String> {
    let [low, high, ..] = phases else { return Vec::new() };
    let up = low.duration.as_secs_f64();
    let down = up + high.duration.as_secs_f64();
    let need = SETTLE_MIN_GOODPUT * capacity * SETTLE_WINDOW_SECS;
    let max_p90 = service_ms + LATENCY_MARGIN_MS;
    (0..)
        .map(|i| up + i as f64 * a::GRID_SECS)
        .take_while(|u| u + SETTLE_WINDOW_SECS <= down + 1e-9)
        .map(|u| {
            let c = a::counts(events, u, u + SETTLE_WINDOW_SECS, None);
            let p90 = a::admitted_latency_ms(events, u, u + SETTLE_WINDOW_SECS, 0.9);
            let served_ok = c.ok as f64 >= need;
            let p90_ok = p90.is_some_and(|p| p <= max_p90);
            let verdict = match (served_ok, p90_ok) {
                (true, true) => "ok",
                (false, true) => "FAIL served",
                (true, false) => "FAIL p90",
                (false, false) => "FAIL both",
            };
            format!(
                "t+{:.1} sent {} ok {} (need {:.0}) refused {} timed_out {} p90 {} (max {:.0}) {}",
                u - up,
                c.sent,
                c.ok,
                need,
                c.refused,
                c.timed_out,
                p90.map_or("-".into(), |p| format!("{p:.1}")),
                max_p90,
                verdict
            )
        })
        .collect()
}

/// A status sample on one line, for `OVERLOAD_STEP_TRACE`.
pub fn status_line(s: &crate::status::StatusSample) -> String {
    let d = &s.doc;
    format!(
        "t={:.2} level {} overloaded {} cap {} q {}ms inflight {}/{} queued {} windows {} last {}",
        s.at_secs,
        d.level,
        d.overloaded,
        d.capacity_per_sec.map_or("-".into(), |c| format!("{c:.0}")),
        d.mean_queuing_ms.map_or("-".into(), |q| format!("{q:.1}")),
        d.inflight,
        d.max_inflight,
        d.queue_depth,
        d.windows_closed,
        d.window.as_ref().map_or("-".into(), |w| format!(
            "{:.0}ms arr {} adm {} disp {}",
            w.duration_ms, w.arrivals, w.admitted, w.dispatched
        )),
    )
}
