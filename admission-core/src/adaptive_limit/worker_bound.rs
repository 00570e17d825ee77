//! A middle hop's bound on everything at its app, lent slots included, while its level
//! spares routes (the proxy's control loop applies it as the in-flight ceiling).
//!
//! A lent slot (a request waiting on a downstream) frees room under the adaptive limit:
//! right for an app that waits without holding anything, wrong for one that holds a worker
//! (a thread) while it waits, which is the model the sparing itself rests on (a route is
//! heavy because its waits hold what the app holds). There, the lent requests of the heavy
//! routes keep the app's workers, the requests let in beside them queue for a worker in the
//! app (FIFO, where the spared routes' place at the head of the sidecar's queue is lost),
//! and that queue is in the app's own time whatever the limit does: the limit then measures
//! the wait for a worker as the app's service time (a knee search read 23 for an app of 8
//! workers). Measured on the no-harm middle hop: defaults 0.55-0.71x of a hand-set
//! `max_inflight` equal to the workers.
//!
//! So the most the app held at once, lent included, in a window whose own time held (within
//! the limit's hysteresis of its baseline), over the horizon, is what it serves without a
//! queue: while the level spares (and for [`SPARING_HOLD`] after), everything at the app
//! stays within that plus an eighth (and one: a bound that binds while the own time holds
//! grows by it each clean window, so an app that waits without holding anything leaves it
//! behind within about 3 s if its windows stay clean (a gateway of 0.2 ms, whose windows on
//! a busy machine rarely were, grew from 16 to 30 over 7 s); with a quarter, a peak of 11 seen on an 8-worker app left it a queue of
//! 6). Otherwise, or before a window was judged, the bound is the ceiling (`max_inflight`).
//!
//! **Only on evidence of a worker pool.** The bound applies only once a window that held
//! more than the clean peak took longer by more than the limit's noise tolerance (the app's
//! own time rose with what it held: requests waited in it for something the lent ones
//! keep), over the horizon. An app that holds nothing while it waits (an entry's gateway of
//! 256 workers in front of a middle hop) never shows that, and is never bound: bound at the
//! most it held in the lead-in, an entry queued its load in its own sidecar, its level cut
//! both APIs there, and what reached the bottleneck was too little for its limit to leave
//! the ceiling (multi-hop M^k k = 3: the top class of X at 34-93%).
//!
//! One window of evidence is enough, and must be: once the lent requests hold a pool's
//! workers, it answers too few in a window for another to be judged. Asking the evidence
//! to recur (two windows 200 ms apart), and also to outnumber the windows that held more
//! than the bound without a rise (a window's peak is a moment, its mean the whole window),
//! left the no-harm middle hop unbound: 0.55-0.87x and 0.57x of the best hand-set
//! `max_inflight`, against 0.99-1.00x in the same rounds. (Both were tried against a
//! multi-hop entry's gateway that one window bound at 16 and 40 in 2 of 15 runs at 3x.)
//! What refutes that one window instead is a window that held twice as much without a
//! rise ([`REFUTED_AT`]): traced, the gateway had held 94-119 at 0.4 ms before it.
//!
//! Pure, like the limit: the caller passes `now` and wraps it in a lock.

use std::collections::VecDeque;
use std::time::Duration;

use super::AdaptiveLimitConfig;
use crate::clock::Nanos;

/// The bound holds this long after the level last spared a route: the sparing flickers at
/// its thresholds, and each lapse let the heavy routes' requests fill the app's workers.
pub const SPARING_HOLD: Nanos = 2_000_000_000;

/// A window that rose is no evidence of a pool once another, over the horizon, held this
/// many times as much without a rise: a pool's workers are a number the app cannot exceed
/// without its own time rising. The clean windows alone (within the hysteresis, a tenth of
/// the baseline) could not refute it for an app of a few hundred microseconds: a multi-hop
/// entry's gateway (256 workers, 0.2-0.4 ms of its own) held 94-119 requests at 0.4 ms, none
/// clean, then one window of 22 at 7.9 ms (the machine busy at the step) bound it at 11, and
/// its level cut both APIs for the load queued in its sidecar. Twice, not merely more: a
/// window's peak is a moment and its mean the whole window, so a pool's window may hold a
/// little more than its workers for a moment without a rise (asking rises to outnumber such
/// windows left the no-harm middle hop unbound: 0.57x of a hand-set `max_inflight`).
const REFUTED_AT: usize = 2;

/// A window closes after this (with enough answers)...
const WINDOW: Nanos = 100_000_000;
/// ...or unjudged after this.
const WINDOW_MAX: Nanos = 1_000_000_000;
/// Answers a window needs to be judged.
const MIN_ANSWERS: u32 = 8;

/// See the module's documentation.
#[derive(Debug)]
pub struct WorkerBound {
    /// The limit's noise tolerance (relative, and absolute in nanoseconds) and horizon.
    tolerance: f64,
    tolerance_min: f64,
    horizon: Nanos,
    /// The open window.
    start: Nanos,
    answers: u32,
    own_sum: u128,
    /// The answers' routes' no-queue times, and how many had none (see `RouteCosts`).
    expected_sum: u128,
    unrouted: u32,
    peak: usize,
    /// `(end, peak, mean own time)` of the windows whose own time held, over the horizon
    /// (at most one per [`WINDOW`]).
    clean: VecDeque<(Nanos, usize, f64)>,
    /// `(end, peak, mean own time)` of the judged windows over the horizon: the lowest mean
    /// is a baseline too (the limit's may have been measured while the app queued from the
    /// start).
    means: VecDeque<(Nanos, usize, f64)>,
    /// A window's own time above this rose (the baseline of the last judgement plus the
    /// limit's noise tolerance): one that also held more than the clean peak is evidence of
    /// a pool that the lent requests hold. Infinite before a judgement.
    rose_above: f64,
    /// When the level last spared a route.
    spared_at: Option<Nanos>,
}

impl WorkerBound {
    /// With the limit's settings (its tolerance and horizon).
    pub fn new(cfg: &AdaptiveLimitConfig, now: Nanos) -> Self {
        WorkerBound {
            tolerance: cfg.tolerance,
            tolerance_min: cfg.tolerance_min.as_nanos() as f64,
            horizon: cfg.horizon.as_nanos() as Nanos,
            start: now,
            answers: 0,
            own_sum: 0,
            expected_sum: 0,
            unrouted: 0,
            peak: 0,
            clean: VecDeque::new(),
            means: VecDeque::new(),
            rose_above: f64::INFINITY,
            spared_at: None,
        }
    }

    /// An answer: the app's own time, and everything at the app (lent included) when it
    /// came; `expected` is its route's own time without a queue, if known (what
    /// `AdaptiveLimit::on_response` returns).
    pub fn on_response(&mut self, own: Duration, at_app: usize, expected: Option<Duration>) {
        match expected {
            Some(e) => self.expected_sum += e.as_nanos(),
            None => self.unrouted = self.unrouted.saturating_add(1),
        }
        self.answers = self.answers.saturating_add(1);
        self.own_sum += own.as_nanos();
        self.peak = self.peak.max(at_app);
    }

    /// The timer's turn: closes the window once it is over, remembering its peak if its own
    /// time held against `baseline` (the limit's; zero while it has none) or the lowest
    /// window mean, whichever is lower.
    pub fn tick(&mut self, now: Nanos, baseline: Duration) {
        let elapsed = now.saturating_sub(self.start);
        if elapsed < WINDOW {
            return;
        }
        if self.answers >= MIN_ANSWERS {
            let n = f64::from(self.answers);
            let lowest = self.means.iter().map(|&(_, _, m)| m).fold(f64::INFINITY, f64::min);
            let overall = match baseline.as_nanos() as f64 {
                0.0 => lowest.min(self.own_sum as f64 / n),
                limit => limit.min(lowest),
            };
            // The window's mean own time over its mix's own baseline (each answer at its
            // route's, the unrouted at the overall one): a burst of a slow route is no rise
            // and no evidence of a pool. Kept relative to the overall baseline, so a window
            // is judged as one of the overall mix.
            let mix = self.expected_sum as f64 / n + f64::from(self.unrouted) / n * overall;
            let mean = self.own_sum as f64 / n * overall / mix.max(overall).max(1.0);
            self.means.push_back((now, self.peak, mean));
            self.clean.push_back((now, self.peak, mean));
            let lowest = lowest.min(mean);
            let b = match baseline.as_nanos() as f64 {
                0.0 => lowest,
                limit => limit.min(lowest),
            };
            // Held: within the limit's hysteresis (half its noise tolerance, at most a tenth
            // of the baseline): a queue of a quarter of an 8-worker app's workers is not.
            // (A window measured clean against a baseline that was itself queued is not.)
            let held = b + ((self.tolerance * b).max(self.tolerance_min) / 2.0).min(0.1 * b);
            self.clean.retain(|&(_, _, m)| m <= held);
            // Rose: the limit's own test of a queue (a tenth would be scheduling noise for
            // an app of a millisecond on a busy machine).
            self.rose_above = b + (self.tolerance * b).max(self.tolerance_min);
        } else if elapsed < WINDOW_MAX {
            return;
        }
        let old = |end: Nanos| now.saturating_sub(end) > self.horizon;
        while self.clean.front().is_some_and(|&(end, _, _)| old(end)) {
            self.clean.pop_front();
        }
        while self.means.front().is_some_and(|&(end, _, _)| old(end)) {
            self.means.pop_front();
        }
        (self.start, self.answers, self.own_sum, self.peak) = (now, 0, 0, 0);
        (self.expected_sum, self.unrouted) = (0, 0);
    }

    /// The last judged window's end, peak and mean own time, and the rise test in force
    /// (nanoseconds): for the control loop's trace.
    pub fn last_judged(&self) -> Option<(Nanos, usize, f64, f64)> {
        self.means.back().map(|&(end, peak, mean)| (end, peak, mean, self.rose_above))
    }

    /// The bound on everything at the app once a window has been judged clean and one that
    /// held more took longer, unless another held twice that without a rise (see the
    /// module's documentation and [`REFUTED_AT`]): its clean peak plus an eighth (and one).
    pub fn bound(&self) -> Option<usize> {
        let peak = self.clean.iter().map(|&(_, p, _)| p).max()?;
        // The most a judged window held without a rise (within the rise test, not only the
        // hysteresis that makes a window clean): a window that rose while it held less than
        // half that is no pool the app ran out of (see `REFUTED_AT`).
        let unrisen = self
            .means
            .iter()
            .filter(|&&(_, _, m)| m <= self.rose_above)
            .map(|&(_, p, _)| p)
            .max()
            .unwrap_or(0);
        let pooled = self
            .means
            .iter()
            .any(|&(_, p, m)| p > peak && m > self.rose_above && unrisen < REFUTED_AT * p);
        pooled.then(|| peak + (peak / 8).max(1))
    }

    /// The ceiling in force now: `ceiling` (`max_inflight`), or within [`Self::bound`]
    /// while the level spares a route (`sparing`) and for [`SPARING_HOLD`] after.
    pub fn ceiling(&mut self, now: Nanos, sparing: bool, ceiling: usize) -> usize {
        if sparing {
            self.spared_at = Some(now);
        }
        match self.spared_at {
            Some(at) if now.saturating_sub(at) <= SPARING_HOLD => {
                self.bound().map_or(ceiling, |b| b.min(ceiling))
            }
            _ => ceiling,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    fn bound_at(now: Nanos) -> WorkerBound {
        WorkerBound::new(&AdaptiveLimitConfig::default(), now)
    }

    /// One 100 ms window of `n` answers at `own` with `at_app` held, closed at `now`.
    fn window(w: &mut WorkerBound, now: Nanos, own: Duration, at_app: usize, n: u32) {
        for _ in 0..n {
            w.on_response(own, at_app, None);
        }
        w.tick(now, Duration::ZERO);
    }

    #[test]
    fn no_bound_before_a_clean_window_and_a_queued_one_and_the_ceiling_while_nothing_is_spared() {
        let mut w = bound_at(0);
        assert_eq!(w.bound(), None);
        assert_eq!(w.ceiling(50 * MS, true, 256), 256, "nothing judged yet");
        window(&mut w, 100 * MS, Duration::from_millis(20), 8, 40);
        assert_eq!(w.bound(), None, "no evidence yet that holding more adds a wait");
        // Twelve at the app, and its own time half as long again: a queue for a worker.
        window(&mut w, 200 * MS, Duration::from_millis(30), 12, 40);
        assert_eq!(w.bound(), Some(9), "a clean peak of 8, plus one");
        let mut idle = bound_at(0);
        window(&mut idle, 100 * MS, Duration::from_millis(20), 8, 40);
        window(&mut idle, 200 * MS, Duration::from_millis(30), 12, 40);
        assert_eq!(idle.ceiling(250 * MS, false, 256), 256, "never spared: no bound");
    }

    #[test]
    fn a_queued_window_is_not_a_peak_the_app_serves_without_a_queue() {
        let mut w = bound_at(0);
        window(&mut w, 100 * MS, Duration::from_millis(20), 8, 40);
        window(&mut w, 200 * MS, Duration::from_millis(30), 12, 40);
        assert_eq!(w.bound(), Some(9));
        // Within the hysteresis (20 ms + 2 ms): held, and the bound grows with it.
        window(&mut w, 300 * MS, Duration::from_micros(21_500), 11, 40);
        assert_eq!(w.bound(), Some(12));
        // Sixteen held without a rise: more than the queued window held, which so no longer
        // shows a pool the app runs out of. No bound.
        window(&mut w, 400 * MS, Duration::from_micros(21_500), 16, 40);
        assert_eq!(w.bound(), None);
    }

    #[test]
    fn a_baseline_measured_queued_is_corrected_by_a_lower_window() {
        let mut w = bound_at(0);
        // The first window already queued (40 ms at 12); a later one shows 20 ms at 8.
        window(&mut w, 100 * MS, Duration::from_millis(40), 12, 40);
        assert_eq!(w.bound(), None, "alone, it is the lowest seen: no rise");
        window(&mut w, 200 * MS, Duration::from_millis(20), 8, 40);
        assert_eq!(w.bound(), Some(9), "the queued window is now the evidence, not a peak");
    }

    /// An app that holds nothing while it waits (an entry's gateway: 256 workers, a few
    /// hundred microseconds of its own) holds more and more, its own time jittering by a
    /// few milliseconds on a busy machine: never bound.
    #[test]
    fn an_app_whose_own_time_never_rises_with_what_it_holds_is_never_bound() {
        let mut w = bound_at(0);
        for i in 1..=60u64 {
            let own = Duration::from_micros(300 + (i * 7_919) % 4_000);
            window(&mut w, i * 100 * MS, own, 8 + (i as usize * 5) % 80, 40);
            assert_eq!(w.ceiling(i * 100 * MS, true, 256), 256, "window {i}");
        }
    }

    /// The multi-hop entry's gateway at a 3x step: it held 119 at 0.4 ms of its own (none
    /// clean against a 0.2 ms baseline's hysteresis), then one window rose to 7.9 ms at 22
    /// (the machine busy). No bound: it held five times as much without a rise. A pool's
    /// rise is not refuted by a window that held only a little more.
    #[test]
    fn a_rise_is_no_pool_when_the_app_held_twice_as_much_without_one() {
        let mut w = bound_at(0);
        window(&mut w, 100 * MS, Duration::from_micros(200), 10, 40);
        window(&mut w, 200 * MS, Duration::from_micros(400), 119, 40);
        window(&mut w, 300 * MS, Duration::from_micros(190), 10, 40);
        window(&mut w, 400 * MS, Duration::from_micros(7_900), 22, 40);
        assert_eq!(w.bound(), None);
        assert_eq!(w.ceiling(400 * MS, true, 256), 256);
        let mut pool = bound_at(0);
        window(&mut pool, 100 * MS, Duration::from_millis(20), 8, 40);
        window(&mut pool, 200 * MS, Duration::from_millis(23), 15, 40);
        window(&mut pool, 300 * MS, Duration::from_millis(30), 12, 40);
        assert_eq!(pool.bound(), Some(9), "15 without a rise is less than twice 12");
    }

    #[test]
    fn the_bound_holds_two_seconds_after_the_sparing_and_forgets_after_the_horizon() {
        let mut w = bound_at(0);
        window(&mut w, 100 * MS, Duration::from_millis(30), 12, 40);
        window(&mut w, 200 * MS, Duration::from_millis(20), 8, 40);
        assert_eq!(w.ceiling(200 * MS, true, 256), 9);
        assert_eq!(w.ceiling(200 * MS + SPARING_HOLD, false, 256), 9);
        assert_eq!(w.ceiling(201 * MS + SPARING_HOLD, false, 256), 256);
        assert_eq!(w.ceiling(300 * MS, true, 4), 4, "never above max_inflight");
        // A window without enough answers closes unjudged after a second; the clean peak
        // is forgotten once older than the horizon (10 s).
        w.tick(11_000 * MS, Duration::ZERO);
        assert_eq!(w.bound(), None);
    }
}
