//! Reading a run's per-request log ([`Event`]s) for transitions: when a spike was cut,
//! when every class was served again after it, which refusals reached clients as
//! timeouts, and latency quantiles over any span. Pure functions of the log, so they are
//! tested with synthetic runs.
//!
//! Spans are `[from, to)` in seconds since the start of the run and select requests by
//! when they were scheduled, so a request counts in the phase whose load sent it.

use crate::load::{Ending, Event};

#[cfg(test)]
mod tests;

/// Grid on which settle and recovery times are searched.
pub const GRID_SECS: f64 = 0.1;

/// Counts of the requests scheduled in a span (one class or all).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub sent: u64,
    pub ok: u64,
    pub refused: u64,
    pub timed_out: u64,
    pub errors: u64,
}

impl Counts {
    /// Share served; 1 when nothing was sent (nothing failed).
    pub fn success(&self) -> f64 {
        if self.sent == 0 {
            1.0
        } else {
            self.ok as f64 / self.sent as f64
        }
    }

    /// Of the requests not served by a refusal or a timeout, the share that were timeouts:
    /// refusals that reached the client only when it gave up. None when nothing was
    /// refused or timed out.
    pub fn timeout_share(&self) -> Option<f64> {
        let not_served = self.refused + self.timed_out;
        (not_served > 0).then(|| self.timed_out as f64 / not_served as f64)
    }

    /// Share of the requests not served (refused, timed out or failed).
    pub fn unserved(&self) -> f64 {
        1.0 - self.success()
    }
}

fn in_span(e: &Event, from: f64, to: f64) -> bool {
    e.at_secs >= from && e.at_secs < to
}

/// Counts over `[from, to)`, for `class` or (None) every class.
pub fn counts(events: &[Event], from: f64, to: f64, class: Option<u16>) -> Counts {
    let mut c = Counts::default();
    for e in events.iter().filter(|e| in_span(e, from, to) && class.is_none_or(|k| e.class == k)) {
        c.sent += 1;
        match e.ending {
            Ending::Ok => c.ok += 1,
            Ending::Refused => c.refused += 1,
            Ending::TimedOut => c.timed_out += 1,
            Ending::Error => c.errors += 1,
        }
    }
    c
}

/// Success of each of `classes` classes over `[from, to)`.
pub fn success_by_class(events: &[Event], from: f64, to: f64, classes: usize) -> Vec<f64> {
    (0..classes).map(|k| counts(events, from, to, Some(k as u16)).success()).collect()
}

/// Latency quantile `q` (nearest rank) of the successful requests scheduled in
/// `[from, to)`, milliseconds; None when none succeeded.
pub fn admitted_latency_ms(events: &[Event], from: f64, to: f64, q: f64) -> Option<f64> {
    let mut latencies: Vec<f64> = events
        .iter()
        .filter(|e| e.ending == Ending::Ok && in_span(e, from, to))
        .map(|e| e.latency_ms)
        .collect();
    quantile(&mut latencies, q)
}

/// Nearest-rank quantile; sorts `values`.
pub fn quantile(values: &mut [f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((q.clamp(0.0, 1.0) * values.len() as f64).ceil() as usize).clamp(1, values.len());
    Some(values[rank - 1])
}

/// Recovery after the load drops at `drop_at`: seconds until the earliest grid point `t`
/// from which every class that sent anything keeps `min_success` over `[t, end)`, with at
/// least `min_tail` seconds of run left to judge by. None: never.
///
/// `class` restricts the test to one class (per-class recovery).
pub fn recovery_secs(
    events: &[Event],
    drop_at: f64,
    end: f64,
    classes: usize,
    class: Option<u16>,
    min_success: f64,
    min_tail: f64,
) -> Option<f64> {
    let judged: Vec<u16> = match class {
        Some(k) => vec![k],
        None => (0..classes as u16).collect(),
    };
    (0..)
        .map(|i| drop_at + i as f64 * GRID_SECS)
        .take_while(|t| end - t >= min_tail - 1e-9)
        .find(|&t| judged.iter().all(|&k| counts(events, t, end, Some(k)).success() >= min_success))
        .map(|t| t - drop_at)
}

/// What a window of the high phase must show to count as settled.
#[derive(Clone, Copy, Debug)]
pub struct SettleRule {
    /// The app's capacity, requests per second.
    pub capacity: f64,
    /// Successful requests scheduled in the window, as a share of what capacity allows.
    pub min_goodput: f64,
    /// Admitted (successful) latency p90 in the window must not exceed this.
    pub max_p90_ms: f64,
    /// Window length, seconds.
    pub window: f64,
}

/// Settle time after the load jumps at `step_at`: seconds until the earliest grid point
/// `t` from which every window `[u, u + rule.window)` (u on the grid, `u >= t`, the window
/// inside the phase that ends at `end`) meets `rule`. None: never.
pub fn settle_secs(events: &[Event], step_at: f64, end: f64, rule: SettleRule) -> Option<f64> {
    let starts: Vec<f64> = (0..)
        .map(|i| step_at + i as f64 * GRID_SECS)
        .take_while(|u| u + rule.window <= end + 1e-9)
        .collect();
    let good: Vec<bool> = starts
        .iter()
        .map(|&u| {
            let c = counts(events, u, u + rule.window, None);
            let goodput_ok = c.ok as f64 >= rule.min_goodput * rule.capacity * rule.window;
            let p90 = admitted_latency_ms(events, u, u + rule.window, 0.9);
            goodput_ok && p90.is_some_and(|p| p <= rule.max_p90_ms)
        })
        .collect();
    // The first window from which every later one is good.
    let first_bad_from_end = good.iter().rposition(|g| !g);
    let first = match first_bad_from_end {
        None => 0,
        Some(i) => i + 1,
    };
    (first < starts.len()).then(|| starts[first] - step_at)
}

/// Holds within a band: seconds after `from` until the earliest sample from which every
/// later sample before `to` stays within `band` of `target`. None: never (or no samples).
pub fn follow_secs(
    samples: &[(f64, f64)],
    from: f64,
    to: f64,
    target: f64,
    band: f64,
) -> Option<f64> {
    let inside: Vec<(f64, bool)> = samples
        .iter()
        .filter(|(t, _)| *t >= from && *t < to)
        .map(|&(t, v)| (t, (v - target).abs() <= band))
        .collect();
    let first = match inside.iter().rposition(|(_, ok)| !ok) {
        None => 0,
        Some(i) => i + 1,
    };
    inside.get(first).map(|(t, _)| t - from)
}

/// Median of the sample values in `[from, to)`.
pub fn median_in(samples: &[(f64, f64)], from: f64, to: f64) -> Option<f64> {
    let mut v: Vec<f64> =
        samples.iter().filter(|(t, _)| *t >= from && *t < to).map(|&(_, v)| v).collect();
    quantile(&mut v, 0.5)
}
