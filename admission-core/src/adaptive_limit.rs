//! The adaptive in-flight limit: how many requests the app gets at once, found from the
//! app's own response times, so the queue forms in the sidecar (where the queuing-time
//! signal sees it and the priority order applies) and not inside the app.
//!
//! The limit is the app's bandwidth-delay product with a margin, as BBR sizes a TCP
//! window: `completion rate (max over the horizon) x no-load response time (min over the
//! horizon) x (1 + headroom)`. Up to the app's concurrency `W`, more in flight means
//! proportionally more completions at the same response time, so the product grows by
//! the margin every interval until it reaches `W x (1 + headroom)`; past `W`, more in
//! flight only lengthens the response time (the app's own queue) and adds no completions,
//! so the product stays put. The margin keeps every worker busy across the gap between
//! one response and the next dispatch, so the limit costs no throughput.
//!
//! - It starts at 64 (or the ceiling, if lower) and, while it binds (requests waited for a slot) and the app
//!   answers at its no-load time, the limit is the bottleneck: it doubles, as TCP's slow
//!   start. While it binds and the answers
//!   are slower than that, the app queues internally: the limit goes to the product.
//!   When it does not bind it drifts down to twice the busiest concurrency seen over the
//!   horizon (never below the product), so a spike fills a small app queue, not the
//!   ceiling's worth.
//! - Under sustained saturation every response includes the app's own short queue (the
//!   margin), so the min filter would drift upwards; every `probe_every` a binding limit
//!   drops its margin for two no-load response times (BBR's ProbeRTT): the app keeps
//!   exactly its concurrency in flight, its own queue empties and its answers show the
//!   true no-load time, at no cost in throughput.
//! - Both filters forget after `horizon`, so an app that becomes slower or faster is
//!   followed within it: if only its service time changes, rate and time change
//!   inversely and the limit stays; if its concurrency changes, the limit follows it.
//!
//! Pure: no clock reads, no I/O; the caller passes `now` and wraps it in a lock.

use std::collections::VecDeque;
use std::time::Duration;

use crate::clock::Nanos;

/// Settings of [`AdaptiveLimit`].
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveLimitConfig {
    /// The limit never goes above this (the configured `max_inflight`).
    pub ceiling: usize,
    /// ...nor below this.
    pub floor: usize,
    /// Where it starts (at most the ceiling): low, as TCP's slow start, so the first
    /// burst does not fill the app's own queue before its no-load time is known.
    pub initial: usize,
    /// Shortest measurement interval (it is at least two no-load response times).
    pub interval: Duration,
    /// How long the rate and response-time filters remember.
    pub horizon: Duration,
    /// Margin over the bandwidth-delay product.
    pub headroom: f64,
    /// How often a saturated app's no-load response time is re-measured.
    pub probe_every: Duration,
}

impl Default for AdaptiveLimitConfig {
    fn default() -> Self {
        AdaptiveLimitConfig {
            ceiling: 256,
            floor: 1,
            initial: 64,
            interval: Duration::from_millis(100),
            horizon: Duration::from_millis(1500),
            headroom: 0.2,
            probe_every: Duration::from_secs(1),
        }
    }
}

/// One closed measurement interval.
#[derive(Debug, Clone, Copy)]
struct Interval {
    end: Nanos,
    /// Completions per second.
    rate: f64,
    /// Shortest response time seen (ns); `u64::MAX` when none.
    min_rtt: Nanos,
    /// Most requests in flight at once.
    peak_inflight: usize,
}

/// A point-in-time view for metrics and status.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitStatus {
    /// The limit in force now (lower while probing).
    pub limit: usize,
    /// The limit outside probes.
    pub steady_limit: usize,
    pub ceiling: usize,
    /// Max completion rate over the horizon, per second (0 before any completion).
    pub completions_per_sec: f64,
    /// Min response time over the horizon (zero before any completion).
    pub no_load_time: Duration,
    pub probing: bool,
    /// Probes for the no-load time so far.
    pub probes: u64,
}

#[derive(Debug, Clone)]
pub struct AdaptiveLimit {
    cfg: AdaptiveLimitConfig,
    limit: usize,
    // The open interval.
    start: Nanos,
    completions: u64,
    min_rtt: Nanos,
    rtt_sum: u128,
    peak_inflight: usize,
    bound: bool,
    /// A probe ran during the open interval: its answers are faster than the limit's.
    probed: bool,
    history: VecDeque<Interval>,
    /// End of the running probe, if one runs.
    probe_until: Option<Nanos>,
    next_probe: Nanos,
    probes: u64,
}

impl AdaptiveLimit {
    pub fn new(cfg: AdaptiveLimitConfig, now: Nanos) -> Self {
        let ceiling = cfg.ceiling.max(1);
        let floor = cfg.floor.clamp(1, ceiling);
        let probe_every = cfg.probe_every.as_nanos() as u64;
        AdaptiveLimit {
            limit: cfg.initial.clamp(floor, ceiling),
            cfg: AdaptiveLimitConfig { ceiling, floor, ..cfg },
            start: now,
            completions: 0,
            min_rtt: u64::MAX,
            rtt_sum: 0,
            peak_inflight: 0,
            bound: false,
            probed: false,
            history: VecDeque::new(),
            probe_until: None,
            next_probe: now + probe_every,
            probes: 0,
        }
    }

    /// A fixed limit: never adapts (`max_inflight` set explicitly with `adaptive: false`).
    pub fn fixed(limit: usize, now: Nanos) -> Self {
        let cfg = AdaptiveLimitConfig {
            ceiling: limit.max(1),
            floor: limit.max(1),
            initial: limit.max(1),
            ..AdaptiveLimitConfig::default()
        };
        Self::new(cfg, now)
    }

    /// The limit in force now.
    pub fn limit(&self) -> usize {
        match self.probe_until {
            Some(_) => self.probe_limit(),
            None => self.limit,
        }
    }

    pub fn ceiling(&self) -> usize {
        self.cfg.ceiling
    }

    /// A request was handed to the app; `inflight` counts it.
    pub fn on_dispatch(&mut self, inflight: usize) {
        self.peak_inflight = self.peak_inflight.max(inflight);
    }

    /// Requests are waiting for a slot: the limit binds.
    pub fn on_waiting(&mut self) {
        self.bound = true;
    }

    /// The app answered (response headers) `rtt` after dispatch.
    pub fn on_response(&mut self, rtt: Duration) {
        let rtt = rtt.as_nanos().min(u64::MAX as u128 - 1) as u64;
        self.completions += 1;
        self.min_rtt = self.min_rtt.min(rtt);
        self.rtt_sum += rtt as u128;
    }

    /// Ends a probe that is over, closes the interval if it is over and recomputes the
    /// limit. Call it from a timer (every 50 ms or so) and after each response (a probe
    /// lasts a few milliseconds). Returns the limit in force.
    pub fn tick(&mut self, now: Nanos) -> usize {
        if let Some(until) = self.probe_until {
            if now >= until {
                self.probe_until = None;
            }
        }
        let no_load = self.no_load_rtt();
        let interval = (self.cfg.interval.as_nanos() as u64).max(no_load.saturating_mul(2));
        if now.saturating_sub(self.start) < interval {
            return self.limit();
        }
        let secs = now.saturating_sub(self.start) as f64 / 1e9;
        let closed = Interval {
            end: now,
            rate: self.completions as f64 / secs,
            min_rtt: self.min_rtt,
            peak_inflight: self.peak_inflight,
        };
        let bound = std::mem::take(&mut self.bound);
        let probing = self.probe_until.is_some() || std::mem::take(&mut self.probed);
        let mean_rtt = (self.rtt_sum / self.completions.max(1) as u128) as u64;
        self.start = now;
        self.completions = 0;
        self.rtt_sum = 0;
        self.min_rtt = u64::MAX;
        self.peak_inflight = 0;
        let horizon = self.cfg.horizon.as_nanos() as u64;
        self.history.push_back(closed);
        while self.history.front().is_some_and(|i| now.saturating_sub(i.end) > horizon) {
            self.history.pop_front();
        }
        if probing || closed.rate == 0.0 || self.no_load_rtt() == 0 {
            // A probe's low rate is not the app's, and an interval without completions
            // (idle, or a stalled app) says nothing about its concurrency.
            return self.limit();
        }
        let target = self.product().ceil() as usize;
        let no_load = self.no_load_rtt() as f64;
        // Little's law: the mean number in flight over the interval.
        let mean_inflight = closed.rate * mean_rtt as f64 / 1e9;
        let full = mean_inflight >= 0.75 * self.limit as f64;
        let app_queues = (mean_rtt as f64) > no_load * (1.0 + self.cfg.headroom / 2.0);
        let next = if bound && mean_inflight >= 0.9 * self.limit as f64 && !app_queues {
            // The limit was full all interval long (by Little's law) and requests waited
            // for a slot, while the app answered at its no-load time: the limit, not the
            // app, is the bottleneck. Double (slow start); should that
            // overshoot, the next interval sees the app queue and goes back to the product.
            target.max(2 * self.limit)
        } else if bound && full && app_queues {
            // The app's own queue lengthens its answers: back to the product. (Both of its
            // filters go stale together when the app's service time changes, so the
            // product, its concurrency, holds.)
            target
        } else {
            // Not binding, or binding only in a burst the app absorbed without queueing.
            let peak = self.history.iter().map(|i| i.peak_inflight).max().unwrap_or(0);
            target.max(self.limit.min(2 * peak))
        };
        self.limit = next.clamp(self.cfg.floor, self.cfg.ceiling);
        if bound && now >= self.next_probe && self.cfg.floor < self.cfg.ceiling {
            let len = no_load_of(&self.history).saturating_mul(2).clamp(5_000_000, 200_000_000);
            self.probe_until = Some(now + len);
            self.probed = true;
            self.probes += 1;
            self.next_probe = now + self.cfg.probe_every.as_nanos() as u64;
        }
        self.limit()
    }

    pub fn status(&self) -> LimitStatus {
        LimitStatus {
            limit: self.limit(),
            steady_limit: self.limit,
            ceiling: self.cfg.ceiling,
            completions_per_sec: self.max_rate(),
            no_load_time: Duration::from_nanos(self.no_load_rtt()),
            probing: self.probe_until.is_some(),
            probes: self.probes,
        }
    }

    /// Max completion rate over the horizon, per second.
    pub fn max_rate(&self) -> f64 {
        self.history.iter().map(|i| i.rate).fold(0.0, f64::max)
    }

    fn no_load_rtt(&self) -> Nanos {
        no_load_of(&self.history)
    }

    /// Rate x no-load time x (1 + headroom): what keeps the app's workers busy.
    fn product(&self) -> f64 {
        self.max_rate() * self.no_load_rtt() as f64 / 1e9 * (1.0 + self.cfg.headroom)
    }

    /// The limit without its margin: the app's concurrency, so its own queue drains and
    /// its answers show the no-load time while every worker stays busy.
    fn probe_limit(&self) -> usize {
        let h = 1.0 + self.cfg.headroom;
        ((self.limit as f64 / h).floor() as usize).clamp(self.cfg.floor, self.cfg.ceiling)
    }
}

fn no_load_of(history: &VecDeque<Interval>) -> Nanos {
    match history.iter().map(|i| i.min_rtt).min() {
        Some(n) if n != u64::MAX => n,
        _ => 0,
    }
}

#[cfg(test)]
mod tests;
