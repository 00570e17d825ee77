//! The capacity law, the default: admit what the app completes (measured while the queue
//! was busy), less what drains an excess backlog; behind callers that run weir's egress
//! (a censored histogram), open past what arrived by the spare room rather than fully.

use std::collections::VecDeque;

use super::histogram::{arrivals_beyond, level_binds, level_for_target, step_above};
use super::law::ControlLaw;
use super::window::{secs, WindowSummary, Zone};
use crate::config::EngineConfig;
use crate::priority::{AdmissionLevel, COMPOUND_LEVELS, USER_LEVELS};

/// The capacity law's state: the app's completion rate and how it was measured.
#[derive(Debug, Clone)]
pub(super) struct CapacityLaw {
    beta: f64,
    exit_ns: u64,
    /// The app's completion rate (per second) measured while saturated.
    capacity_per_sec: Option<f64>,
    /// Whether that figure was measured saturated, or is only a lower bound seen while
    /// the app had spare room (which a first saturated window replaces outright).
    capacity_measured: bool,
    /// The nominal window, seconds: the law drains excess backlog over it, and judges a
    /// shorter window over a span of it (see [`CapacityLaw::idle_credit`]).
    window_secs: f64,
    /// The windows before this one, oldest first, as far back as one nominal window.
    recent: VecDeque<PastWindow>,
    /// Consecutive quiet censored windows so far (see [`quiet_probe`]): each raises the
    /// next window's target by more, none raises the estimate itself.
    quiet_streak: u32,
    /// How far under the app's rate a censored window aims (see [`next_censored_margin`]):
    /// it starts at [`CENSORED_MARGIN`] and eases towards [`CENSORED_MARGIN_MIN`] while
    /// nothing this sidecar admitted is refused here.
    censored_margin: f64,
    /// How far over the estimate this window's level is sized (requests per second): two
    /// standard deviations of the completions when the estimate was first measured in this
    /// very window over a thin busy time ([`thin_first_headroom`]), zero otherwise. Set by
    /// each window's [`CapacityLaw::observe_completions`]; never stored in the estimate.
    sizing_headroom: f64,
    /// The highest estimate a saturated window left (0 before one did): a level-bound probe
    /// may go back up to it in one window (see [`LEVEL_BOUND_PROBE`]).
    best_measured: f64,
    /// The least important business class any window has seen arrive (`None` before one
    /// did; never forgotten): a censored opening short of it crosses into at most one more
    /// class per window (see [`cap_censored_opening`]).
    least_important_class_seen: Option<u8>,
    /// How long the censored windows in a row up to the last one each had room for
    /// [`CENSORED_FULL_OPEN_ROOM`] times what came beyond it (ns): short windows that
    /// together span [`MIN_JUDGED_WINDOW`] of the nominal one may open fully, as one such
    /// window may (see [`CapacityLaw::may_open_fully`]).
    roomy_ns: u64,
}

/// At most this many past windows are remembered: windows close early no sooner than
/// `early_close_after` (100 ms by default), so a nominal window holds about ten; more
/// (windows closed by their request count) only lose credit, never add it.
const REMEMBERED_WINDOWS: usize = 32;

/// What the law remembers of a closed window: how long it was, and how long of it the
/// pending queue was empty (the app had room) and what the app completed meanwhile.
#[derive(Debug, Clone, Copy)]
struct PastWindow {
    duration_ns: u64,
    idle_ns: u64,
    idle_completed: u64,
}

impl CapacityLaw {
    pub(super) fn new(config: &EngineConfig) -> Self {
        CapacityLaw {
            beta: config.beta,
            exit_ns: config.queuing_exit_threshold.as_nanos() as u64,
            capacity_per_sec: None,
            capacity_measured: false,
            window_secs: config.window.as_secs_f64().max(1e-3),
            recent: VecDeque::with_capacity(REMEMBERED_WINDOWS),
            quiet_streak: 0,
            censored_margin: CENSORED_MARGIN,
            sizing_headroom: 0.0,
            best_measured: 0.0,
            least_important_class_seen: None,
            roomy_ns: 0,
        }
    }

    /// Remembers a closed window, and forgets those that ended a nominal window before it
    /// (and the oldest beyond [`REMEMBERED_WINDOWS`]: the rollover never allocates).
    fn remember(&mut self, w: &WindowSummary) {
        if self.recent.len() == REMEMBERED_WINDOWS {
            self.recent.pop_front();
        }
        self.recent.push_back(PastWindow {
            duration_ns: w.duration_ns,
            idle_ns: w.duration_ns.saturating_sub(w.busy_ns),
            idle_completed: w.completed.saturating_sub(w.busy_completed),
        });
        let span = (self.window_secs * 1e9) as u64;
        let mut covered: u64 = self.recent.iter().map(|p| p.duration_ns).sum();
        while let Some(oldest) = self.recent.front() {
            if covered.saturating_sub(oldest.duration_ns) < span {
                break;
            }
            covered -= oldest.duration_ns;
            self.recent.pop_front();
        }
    }
}

impl ControlLaw for CapacityLaw {
    fn next_level(
        &mut self,
        current: AdmissionLevel,
        zone: Zone,
        w: &WindowSummary,
        histogram: &[u32],
    ) -> AdmissionLevel {
        if let Some(highest) = histogram.iter().rposition(|&n| n > 0) {
            let class = (highest / USER_LEVELS as usize).min(255) as u8;
            self.least_important_class_seen =
                Some(self.least_important_class_seen.map_or(class, |c| c.max(class)));
        }
        let next = self.decide(current, zone, w, histogram);
        if is_censored(histogram, current) {
            self.censored_margin =
                next_censored_margin(self.censored_margin, w.dropped, w.admitted);
        }
        self.remember(w);
        next
    }

    fn observe_idle(&mut self, zone: Zone, w: &WindowSummary) {
        self.observe_completions(zone, w, false);
        self.remember(w);
    }

    fn capacity_estimate(&self) -> Option<f64> {
        self.capacity_per_sec
    }
}

impl CapacityLaw {
    fn decide(
        &mut self,
        current: AdmissionLevel,
        zone: Zone,
        w: &WindowSummary,
        histogram: &[u32],
    ) -> AdmissionLevel {
        let censored = is_censored(histogram, current);
        if zone == Zone::Absorb {
            // A burst the budget absorbs (see the detector): the level stays, whatever a
            // target over this window alone would say; the window still measures the app
            // (its queue was busy).
            self.observe_completions(zone, w, censored);
            self.roomy_ns = 0;
            return current;
        }
        let Some((target, credit, headroom)) = self.capacity_target(zone, w, censored) else {
            self.roomy_ns = 0;
            return current;
        };
        let may_open_fully = self.may_open_fully(w, censored, target, histogram);
        // A thin first sample's headroom sizes a cut, it never decides whether to cut:
        // opening on it let a step's first early window in whole, and the next cut drained
        // the backlog that left (see `thin_first_headroom`).
        let sized = match level_for_target(histogram, target) {
            AdmissionLevel::FULLY_OPEN if headroom > 0.0 => {
                level_for_target(histogram, target - headroom)
            }
            sized => sized,
        };
        let proposed = match sized {
            // Everything that arrived fits while the level cuts, and the
            // window is censored: the histogram says nothing about the demand
            // beyond what arrived, which behind callers whose egress refuses
            // above this sidecar's advertised level is most of it. Opening
            // fully would let them all in at once: open past what arrived by
            // what the spare room admits at the density seen there (fully
            // when the room is large). Uncensored, fully open as ever.
            AdmissionLevel::FULLY_OPEN if censored => cap_censored_opening(
                open_beyond_arrivals(histogram, current, target, may_open_fully),
                current,
                self.least_important_class_seen,
            ),
            p => p,
        };
        let next = match zone {
            // A cut opens only if the backlog is gone already (the long waits
            // were the spike's, now drained); it needs no forced step: the
            // target already is what the app completes, and one long wait in
            // a quiet window (target above all arrivals) must not refuse anyone.
            Zone::Cut if w.queue_depth > 0 => proposed.min(current),
            // Censored, the span's unused room only keeps a burst from cutting; it never
            // opens past what the callers were told (see `capacity_target`).
            Zone::Cut if censored && credit > 0.0 => proposed.min(current),
            Zone::Cut => proposed,
            // Sit at what the app completes; a level already within a few
            // percent of it stays, so histogram noise does not move it. A window
            // whose queue was never busy says nothing about the app's rate (a
            // full queue refusing, a quiet spell): it never lowers the level.
            Zone::Hold if near(w.admitted as f64, target) => current,
            Zone::Hold if w.busy_ns == 0 => proposed.max(current),
            Zone::Hold => proposed,
            // Censored, more admitted than the target: the queue is short
            // because this sidecar's wait bound refuses the surplus, after it
            // crossed the network. Sit at the target like a hold would.
            Zone::Relax if proposed <= current && censored => proposed,
            // Short queue: at least what the app completes, and one more
            // bucket than now (a probe, in case the app got faster).
            Zone::Relax if proposed <= current => {
                match step_above(histogram, current) {
                    // No bucket beyond the next: same as above, no evidence.
                    AdmissionLevel::FULLY_OPEN if censored => cap_censored_opening(
                        open_beyond_arrivals(histogram, current, target, may_open_fully),
                        current,
                        self.least_important_class_seen,
                    ),
                    step => step,
                }
            }
            Zone::Relax => proposed,
            Zone::Absorb => current,
        };
        // (Censored inside the top class, its arrivals are only what the
        // callers let through: its size is unknown.)
        if censored && current.priority().business == top_class(histogram) {
            return next;
        }
        // (Censored, the callers filter by the advertised level: the level hardly binds
        // and nothing it admits queues long here.)
        let next = if censored { next } else { self.bound_whole_classes(next, histogram, w) };
        self.keep_top_class(next, histogram, w)
    }
}

// === the top class ===

/// The most important class present is admitted whole while it alone arrives at no more
/// than this share of what the app completes: a cut that drains a backlog, or the noise of
/// one window, must not reach into it.
const TOP_CLASS_FITS: f64 = 0.9;

/// The most of the top class a window may hold and still fit, for `fits` (what fits the
/// app over the window): that plus [`TOP_CLASS_NOISE_SD`] standard deviations of a Poisson
/// count of `fits`. A short window (an early close) holds tens of requests, and its count
/// of a top class at 0.6x of the app passes 0.9x a quarter of the time: the first cut of
/// a step (a 100-150 ms window, on a capacity measured over it) reached into the top class
/// and refused 52 of its requests (overload-bench step, 8x20 ms, 20/30/50: 98.48%). Over a
/// whole window of a 400/s app the allowance is ~11% (a top class up to about the app's
/// rate is kept whole); the level it keeps is the end of the top class, whose waiters the
/// queue's max wait still bounds.
fn top_class_bar(fits: f64) -> f64 {
    fits + TOP_CLASS_NOISE_SD * fits.max(0.0).sqrt()
}

/// See [`top_class_bar`].
const TOP_CLASS_NOISE_SD: f64 = 2.0;

impl CapacityLaw {
    /// `next`, or the level that admits the whole of the most important business class
    /// that arrived if that is higher and the class alone fits the app (see
    /// [`TOP_CLASS_FITS`]). A dip into the top class refuses the requests that matter most,
    /// and callers that cache this level refuse them too until they hear otherwise.
    fn keep_top_class(
        &self,
        next: AdmissionLevel,
        histogram: &[u32],
        w: &WindowSummary,
    ) -> AdmissionLevel {
        let Some(capacity) = self.capacity_per_sec.map(|c| c + self.sizing_headroom) else {
            return next;
        };
        let Some(first) = histogram.iter().position(|&n| n > 0) else { return next };
        let class = usize::from(top_class(histogram));
        let end = (class + 1) * USER_LEVELS as usize;
        let top: u64 = histogram[first..end].iter().map(|&n| u64::from(n)).sum();
        let whole = AdmissionLevel::from_compound((end - 1) as u16).unwrap_or(next);
        if (top as f64) <= top_class_bar(TOP_CLASS_FITS * capacity * secs(w)) {
            next.max(whole)
        } else {
            next
        }
    }
}

impl CapacityLaw {
    /// `next`, or a level in a more important class if the classes `next` admits whole
    /// (those more important than its own) arrived at more than the app completes. The
    /// queue's max wait bounds only the waiters of the level's own class and beyond
    /// (section 8: the classes a level admits whole keep their whole budget), so the
    /// overfeed above the app's rate must fall on that class: a level one bucket into the
    /// next class made the class before it whole, and at 1.2x the app its waiters queued
    /// up to their budget (overload-bench step, 4x10 ms 10/30/60: the relax probe 1.118 ->
    /// 2.0, admitted p90 60-137 ms for 700 ms; the first cut at 2.80 with classes 0-1 at
    /// 1.3x the app, p90 200-300 ms). The level moves to the end of the first class at which
    /// the whole classes overflow: it admits the same requests but one bucket, and that
    /// class's waiters are bounded again. A cut level only, on a measured capacity: an open
    /// level bounds no one, and a lower-bound estimate (an app never saturated) would
    /// refuse a healthy load.
    fn bound_whole_classes(
        &self,
        next: AdmissionLevel,
        histogram: &[u32],
        w: &WindowSummary,
    ) -> AdmissionLevel {
        let Some(capacity) = self.capacity_per_sec.filter(|_| self.capacity_measured) else {
            return next;
        };
        if next == AdmissionLevel::FULLY_OPEN {
            return next;
        }
        let fits = capacity * secs(w);
        // The top class alone is judged on a thin first sample's headroom, as the level is
        // sized: bounded at its end on the sample's low reading, its waiters were the ones
        // the max wait dropped behind the backlog still inside the app (see
        // `thin_first_headroom`).
        let top = usize::from(top_class(histogram));
        let top_fits = (capacity + self.sizing_headroom) * secs(w);
        let mut whole = 0u64;
        for class in 0..usize::from(next.priority().business) {
            let chunk =
                &histogram[class * USER_LEVELS as usize..(class + 1) * USER_LEVELS as usize];
            whole += chunk.iter().map(|&n| u64::from(n)).sum::<u64>();
            let bar = if class == top { fits.max(top_fits) } else { fits };
            if whole as f64 > bar {
                let end = (class + 1) * USER_LEVELS as usize - 1;
                return AdmissionLevel::from_compound(end as u16).unwrap_or(next);
            }
        }
        next
    }
}

/// The most important business class that arrived (255 when nothing did).
fn top_class(histogram: &[u32]) -> u8 {
    histogram
        .iter()
        .position(|&n| n > 0)
        .map_or(u8::MAX, |c| (c / USER_LEVELS as usize).min(255) as u8)
}

/// The capacity law's margin under the app's measured completion rate; negative, so it
/// aims 10% *over* it. The sidecar's queue is bounded in time (`overload_max_wait` drops the least important
/// waiters past it, the door refuses whoever expects to wait past it), so a slight
/// overfeed cannot drift into a long queue; it keeps the queue from running dry between
/// Poisson bursts, which at exactly the app's rate idles it ~5% of the time (measured:
/// goodput at 3x 93-95% with 0.0, 97-98% with -0.1; the surplus is refused within the max
/// wait, never as a timeout).
const CAPACITY_MARGIN: f64 = -0.1;
/// The margin once the cut is done (the hold and relax zones, where the queue is short):
/// the level then sits 30% over the app's rate. The max wait keeps only ~30 ms of work
/// queued, and what a level admits in the next window is a Poisson count of a share
/// chosen on the last window's histogram, so at 10% over the rate lulls of the admitted
/// arrivals ran the queue dry: single 500 ms windows served 84-89% of capacity while the
/// level refused two thirds of what arrived (overload-bench step, 3x: admitted 1.02-1.04x
/// of the rate after a hold's step down; a fixed 1.1x feed behind a 30 ms bound has a
/// window under 90% in 12-14 of 20 simulated 15 s runs, 1.2x in 1-2, 1.3x in none). The
/// surplus is refused within the max wait, never as a timeout; at 1.35-1.42x the admitted
/// p90 was still 10 ms under S + 40 ms. A cut keeps the smaller margin: its queue stands
/// above the threshold and needs no feeding, and a first cut must shed the backlog.
const SITTING_MARGIN: f64 = -0.3;
/// The margin instead when the window is censored (see [`is_censored`]): callers' egress
/// refuse above the level before sending, for free, while whatever this sidecar's wait
/// bound refuses has crossed the network and cost the callers their work. So aim under
/// the app's rate, where the queue stays short and nothing admitted is refused.
///
/// That is where the margin starts; it is the most it ever is (see
/// [`next_censored_margin`]).
const CENSORED_MARGIN: f64 = 0.1;
/// The least a censored window aims under the app's rate: a queue kept short but not dry.
/// At a fixed 10% the app idled ~10% of the time and more with the level's noise
/// (multihop-bench, M^k: the bottleneck completed 67-88 of its 100/s).
const CENSORED_MARGIN_MIN: f64 = 0.02;
/// A censored window in which more than this share of what the level admitted was refused
/// here anyway (dropped from the queue: its wait bound, a deadline, a caller that left)
/// raises the margin back: behind filtering callers those refusals cost their work.
const CENSORED_REFUSED_GUARD: f64 = 0.01;
/// The margin rises by this much per window over the guard ...
const CENSORED_MARGIN_RAISE: f64 = 0.04;
/// ... and each window within it, halves its distance to [`CENSORED_MARGIN_MIN`].
const CENSORED_MARGIN_EASE: f64 = 0.5;
/// Inside the hysteresis band, the capacity law keeps a level that admits within this
/// fraction of its target.
const HOLD_BAND: f64 = 0.05;
/// A cut drains only the backlog beyond this many exit thresholds of the app's work (40 ms
/// at the defaults): a queue that short is the hysteresis band's, which the max wait bounds.
const BACKLOG_KEPT_EXITS: f64 = 4.0;
/// A cut drains at most this share of the app's rate per window: refusing more would idle
/// the app once the backlog is gone.
const MAX_DRAIN_SHARE: f64 = 0.5;
/// The app was saturated over a window whose queue was busy at least 1 / this of it: long
/// enough that the rate over the busy time is the app's, not one burst's.
const SATURATED_BUSY_SHARE: u64 = 4;
/// When the level, not the app, set a window's rate (it refused, the queue never held
/// any), the estimate probes this much higher: a faster app is followed within ~2 s.
///
/// The probe is half past what completed, and never past half over the estimate itself
/// unless back towards the most a saturated window measured: after a slowdown under 3x (the
/// simulation's app of 400/s at half speed for 5 s), the estimate at 279 (an earlier
/// probe's), a window the level bound completed 303 and the probe set 455, above anything
/// the app ever completed; saturated windows then averaged it down over seconds (in 3 of 8
/// seeded runs, none before a change to the first cut moved the path).
const LEVEL_BOUND_PROBE: f64 = 1.5;
/// The first quiet censored window in a row raises its target by this share of the
/// estimate; each further one in a row doubles the raise (see [`quiet_probe`]).
const QUIET_PROBE_FIRST: f64 = 0.15;
/// A quiet censored window's target is at most this many times the estimate (after the
/// margin): a little over twice, as the probe once was for every quiet window.
const QUIET_PROBE_MAX: f64 = 2.1 / (1.0 - CENSORED_MARGIN);
/// A censored window is quiet only if its mean wait is under 1 / this of the exit
/// threshold: a queue that formed at all is evidence against room.
const QUIET_WAIT_SHARE: u64 = 10;
/// A window shorter than this share of the nominal one (an early close) holds too few
/// requests to judge room for twice what came on.
const MIN_JUDGED_WINDOW: f64 = 0.5;
/// A saturated rate within this share of the estimate averages with it (noise); beyond,
/// it replaces it (a step change: the app got much slower or faster).
const STEP_CHANGE: f64 = 0.25;
/// A saturated rate far under the estimate lowers it to at most this share per nominal
/// window (see [`fall_floor`]): one odd window must not crash it.
const MAX_FALL_PER_WINDOW: f64 = 0.5;

impl CapacityLaw {
    /// Whether a censored window may open fully ([`open_beyond_arrivals`]): a short one (a
    /// handful of requests let through) is too thin to judge room for twice what came on
    /// alone, but short windows in a row that each had that room, over at least
    /// [`MIN_JUDGED_WINDOW`] of the nominal window, are as good as one window that long.
    /// Behind callers that refuse for it, a downstream whose load dropped sees a few
    /// requests a window and closes its windows early (the level cuts and the app has room):
    /// judged window by window, it crept open by the spare room over a thin density, 10-15
    /// levels every 100-200 ms (multihop-bench's B after the step down: 1.109 -> 3.10 over
    /// 3 s, and X's callers refused what it had room for all that time).
    fn may_open_fully(
        &mut self,
        w: &WindowSummary,
        censored: bool,
        target: f64,
        histogram: &[u32],
    ) -> bool {
        let arrived: u64 = histogram.iter().map(|&n| u64::from(n)).sum();
        let roomy = censored && target - arrived as f64 >= CENSORED_FULL_OPEN_ROOM * arrived as f64;
        self.roomy_ns = if roomy { self.roomy_ns.saturating_add(w.duration_ns) } else { 0 };
        let judged_ns = MIN_JUDGED_WINDOW * self.window_secs * 1e9;
        secs(w) >= MIN_JUDGED_WINDOW * self.window_secs || self.roomy_ns as f64 >= judged_ns
    }

    /// The capacity law's target, in arrivals of this window: the app's completion rate
    /// over the window's length, less (when cutting) the backlog above what the exit
    /// threshold allows, drained over about one nominal window and never more than half
    /// the rate. `None` before any completion was seen (nothing to aim at: hold). With the
    /// idle credit it carries, and the part of it that is a thin first sample's headroom
    /// (zero but for such a cut).
    fn capacity_target(
        &mut self,
        zone: Zone,
        w: &WindowSummary,
        censored: bool,
    ) -> Option<(f64, f64, f64)> {
        // A little over the app's rate while cutting, more while the level sits, or under
        // it when censored (see the margins).
        let margin = match zone {
            _ if censored => self.censored_margin,
            Zone::Cut => CAPACITY_MARGIN,
            Zone::Hold | Zone::Relax | Zone::Absorb => SITTING_MARGIN,
        };
        let cap = self.observe_completions(zone, w, censored)? * (1.0 - margin);
        // A thin first measurement sizes a cut with its headroom (`thin_first_headroom`);
        // the backlog allowed and the idle credit stay on the measured rate.
        let headroom = match zone {
            Zone::Cut => self.sizing_headroom * (1.0 - margin) * secs(w),
            _ => 0.0,
        };
        let per_window = cap * secs(w);
        let allowed = cap * BACKLOG_KEPT_EXITS * self.exit_ns as f64 / 1e9;
        let excess = (w.queue_depth as f64 - allowed).max(0.0);
        // A window shorter than the nominal one (an early close) is judged over a nominal
        // window's span: what the app left unused in the span's earlier part is room for
        // this window's arrivals (a burst after a lull), once the excess backlog is paid.
        //
        // Censored, only a cut gets it: behind callers that filter by the advertised level,
        // what arrives is what the level admits, and a queue in a short window is a Poisson
        // burst of it (the callers refuse a step's surplus). Without the credit such a
        // window, judged over its own 100 ms, cut under the app's rate again and again
        // (multihop-bench: B completed 65-85% of its capacity at M^k, k = 2, 3). It never
        // opens the level there (`decide`): room beyond the level is `open_beyond_arrivals`'.
        let credit = if censored && zone != Zone::Cut { 0.0 } else { self.idle_credit(w, excess) };
        let target = match zone {
            Zone::Cut => {
                let drain_rate = (excess / self.window_secs).min(MAX_DRAIN_SHARE * cap);
                (cap - drain_rate) * secs(w) + credit + headroom
            }
            // (An absorbed burst never asks for a target, see `decide`.)
            Zone::Hold | Zone::Absorb => per_window + credit,
            // Censored, what was admitted says nothing about the demand (callers refused
            // the rest): the rate alone (its probes are in `observe_completions`).
            Zone::Relax if censored => per_window,
            Zone::Relax => per_window.max((1.0 + self.beta) * w.admitted as f64),
        };
        Some((target, credit, headroom))
    }

    /// The room a window shorter than the nominal one has beyond its own length, in
    /// requests: over the nominal window that ends with it, what the app left unused in the
    /// span's earlier part (the windows remembered), less the `excess` backlog waiting now.
    /// Unused is counted only while the pending queue was empty (the app had room): its
    /// measured rate (`capacity`, no overfeed margin) over that time, less what it completed
    /// meanwhile; while the queue was busy the app was saturated and nothing is unused. Zero
    /// for a full window, and for any part of the span the law has no window for (at
    /// start-up: no credit is assumed).
    ///
    /// DAGOR's signal is sustained queuing, and its window is the nominal one; the early
    /// close exists to see a spike sooner, not to judge a 300 ms burst as if it would last.
    /// A burst of 1.5x for 500 ms after 500 ms of silence fits a 1 s span (0.75x of it);
    /// a step to 3x does not: its span holds the load before it and the backlog it builds.
    fn idle_credit(&self, w: &WindowSummary, excess: f64) -> f64 {
        let Some(capacity) = self.capacity_per_sec else { return 0.0 };
        let span = (self.window_secs * 1e9) as u64;
        let mut prior = span.saturating_sub(w.duration_ns);
        let mut unused = 0.0;
        for past in self.recent.iter().rev() {
            if prior == 0 {
                break;
            }
            let part = past.duration_ns.min(prior);
            let share = part as f64 / past.duration_ns.max(1) as f64;
            let room = capacity * past.idle_ns as f64 / 1e9 - past.idle_completed as f64;
            unused += room.max(0.0) * share;
            prior -= part;
        }
        (unused - excess).max(0.0)
    }

    /// Updates the capacity estimate from a window's completions. While the queue was
    /// non-empty the app was busy: its completion rate then *is* the capacity (averaged
    /// with the last one) if that was at least a quarter of the window
    /// ([`SATURATED_BUSY_SHARE`]). Any other window only proves a lower bound. A window with
    /// no completions says nothing (a stall must not zero the estimate, or the level would
    /// take long to re-open after it). `censored`: next to nothing above the level arrived
    /// (see [`is_censored`]).
    fn observe_completions(
        &mut self,
        zone: Zone,
        w: &WindowSummary,
        censored: bool,
    ) -> Option<f64> {
        self.sizing_headroom = 0.0;
        if w.completed == 0 {
            return self.capacity_per_sec;
        }
        // Saturated: the queue was non-empty for a good part of the window, so the app
        // was busy then; its rate over that time is its capacity.
        let saturated = w.busy_ns * SATURATED_BUSY_SHARE >= w.duration_ns && w.busy_completed > 0;
        // A whole quiet censored window: the refusals were made upstream (callers' egress
        // refuses above the level this sidecar advertises), unseen here, in a window (at
        // least half the nominal one: a few requests in a short window prove nothing) in
        // which the app never queued and nobody waited a tenth of the exit threshold.
        let quiet = !saturated
            && censored
            && zone == Zone::Relax
            && w.busy_ns == 0
            && w.queue_depth == 0
            && w.mean_queuing_ns * QUIET_WAIT_SHARE < self.exit_ns
            && secs(w) >= MIN_JUDGED_WINDOW * self.window_secs;
        self.quiet_streak = if quiet { self.quiet_streak.saturating_add(1) } else { 0 };
        let rate = if saturated {
            w.busy_completed as f64 / (w.busy_ns as f64 / 1e9)
        } else if !censored
            && w.busy_ns == 0
            && w.queue_depth == 0
            && w.dropped == 0
            && w.admitted < w.arrivals
        {
            // The level refused requests, yet the queue never held any: the app took all
            // it was given, so the level (not the app) set this rate. Probe a half
            // higher; a window that finds the queue busy measures the real figure. Not
            // when censored: there the few refused are stragglers sent before the callers
            // heard of a cut, not demand the level held back (raised by a half on them,
            // the estimate stayed up for windows, the level opened past the app and the
            // callers' backlog filled its queue). Nor when the queue dropped requests: it
            // held a backlog, gone by the first tick that could see it (a step's, refused
            // at the max wait), so the app's rate was the backlog's drain, not the level's
            // doing (probed on it, 349/s went to 484 and 519 for an app of 358, and the
            // level re-opened into the step twice: p90 80 ms for a second).
            let probe = LEVEL_BOUND_PROBE * w.completed as f64 / secs(w);
            // No further than half past the estimate, unless back towards the most the
            // app was measured to complete (see [`LEVEL_BOUND_PROBE`]).
            match self.capacity_per_sec {
                Some(old) => probe.min((LEVEL_BOUND_PROBE * old).max(self.best_measured)),
                None => probe,
            }
        } else {
            w.completed as f64 / secs(w)
        };
        self.capacity_per_sec = Some(match self.capacity_per_sec {
            // A step change (the app got much slower or faster) replaces the estimate;
            // within a quarter of it, the two average out noise.
            Some(old)
                if saturated
                    && self.capacity_measured
                    && (rate - old).abs() <= STEP_CHANGE * old =>
            {
                0.5 * old + 0.5 * rate
            }
            // Far lower: at most halve per nominal window of time (one odd window must not
            // crash it, nor a stall that closes windows early).
            Some(old) if saturated && self.capacity_measured && rate < old => {
                rate.max(fall_floor(old, secs(w) / self.window_secs))
            }
            Some(old) if !saturated => old.max(rate),
            _ => rate,
        });
        if saturated && !self.capacity_measured {
            self.sizing_headroom = thin_first_headroom(w);
        }
        if saturated {
            self.best_measured = self.best_measured.max(self.capacity_per_sec.unwrap_or(0.0));
        }
        self.capacity_measured |= saturated;
        self.capacity_per_sec.map(|c| c * quiet_probe(self.quiet_streak))
    }
}

/// The headroom (requests per second) over the rate a first saturated window measured, for
/// sizing that window's level: two standard deviations of a Poisson count of its busy
/// completions, over its busy time, when that time is under [`THIN_BUSY_NS`]; zero for a
/// longer one. A step's first cut is judged on an early close (100-150 ms, the busy time
/// counted in the 50 ms ticks of the queue's observer) in which the app still holds the
/// backlog let in before it: the rate measured there read 239-240/s for an app of 378/s in
/// 2 of 8 quiet runs (overload-bench step, 8x20 ms), and a level sized on it went into the
/// top class (0.127, with 48 requests still inside the app): the top class lost 40 requests
/// to the max wait behind that backlog (98.84%), and the app served 57% of its rate for the
/// next whole second (the drain of the backlog in that window cut deeper still). The two
/// errors do not cost alike: a level too deep is not re-judged
/// for a whole window (while it binds, an early close needs a queue eight thresholds long,
/// and the early re-open compares against the same low figure), one too shallow overfeeds
/// the level's own class, whose waiters the max wait refuses within 30 ms (never as
/// timeouts), until the next window measures the rate over a longer busy time. The top
/// class is judged on the same figure (`keep_top_class`, and `bound_whole_classes` for the
/// top class alone); the stored estimate keeps the measured rate, and the whole-class bound
/// of the classes after the top one, and everything after this window, read that.
fn thin_first_headroom(w: &WindowSummary) -> f64 {
    if w.busy_ns == 0 || w.busy_ns >= THIN_BUSY_NS {
        return 0.0;
    }
    FIRST_SAMPLE_NOISE_SD * (w.busy_completed as f64).sqrt() / (w.busy_ns as f64 / 1e9)
}

/// See [`thin_first_headroom`]: the detector's own bar for a rate measured while the queue
/// was busy (a shorter slice is too noisy to lower the drain rate on).
const THIN_BUSY_NS: u64 = 200_000_000;

/// See [`thin_first_headroom`].
const FIRST_SAMPLE_NOISE_SD: f64 = 2.0;

/// The least a saturated window `window_share` of the nominal one long may lower the
/// estimate `old` to: [`MAX_FALL_PER_WINDOW`] of it for a nominal window, in proportion for
/// a shorter one. Windows close early when the queue grows fast, which is what a stall of
/// the app (or of the machine) looks like: one 100 ms window that completed half the rate
/// halved the estimate, the level cut into the top class and the app idled for 700 ms
/// (overload-bench step, 4x10 ms, 20/30/50: capacity 352 -> 185, level 1.71 -> 0.106). A
/// real slowdown is followed as fast per second as before (ten 100 ms windows: 0.95^10).
pub(super) fn fall_floor(old: f64, window_share: f64) -> f64 {
    old * (1.0 - (1.0 - MAX_FALL_PER_WINDOW) * window_share.clamp(0.0, 1.0))
}

/// The factor on a censored window's target after `streak` quiet windows in a row: 1 for
/// none, then 1 + [`QUIET_PROBE_FIRST`] doubling its raise with each further quiet window,
/// at most [`QUIET_PROBE_MAX`]. Behind callers that refuse above the advertised level, the
/// demand beyond it is unseen and the app's spare room unmeasured (its queue never formed):
/// the target probes past the estimate, and the level opens past what arrived by the spare
/// room (see [`open_beyond_arrivals`]). The first probe is small, because the usual quiet
/// window is the steady state (the law aims 2-10% under the app's rate): a probe of twice what
/// completed there opened the level far past the app (205 -> 346 in one window at
/// multihop-bench's B), the callers' backlog filled its queue and the next cut went below
/// the rate, a cycle around ~85% of it. A downstream that really recovered stays quiet
/// window after window, and the doubling raise finds its room within four or five. The
/// factor never enters the stored estimate: a window that finds the queue busy measures the
/// app, and one that does not keeps at most what completed.
fn quiet_probe(streak: u32) -> f64 {
    if streak == 0 {
        return 1.0;
    }
    let raise = QUIET_PROBE_FIRST * f64::from(1u32 << (streak - 1).min(8));
    (1.0 + raise).min(QUIET_PROBE_MAX)
}

/// The censored margin for the next window after one that admitted `admitted` and dropped
/// `dropped` of what was queued (refused after it crossed the network): past the guard
/// ([`CENSORED_REFUSED_GUARD`]) it rises by [`CENSORED_MARGIN_RAISE`], up to
/// [`CENSORED_MARGIN`]; within it, it halves its way down to [`CENSORED_MARGIN_MIN`]. A
/// window that admitted nothing says nothing. The margin is a trade: every point of it
/// idles the app by as much, while a margin too small queues the callers' requests here
/// until the wait bound refuses them (their work lost), so it is only as small as the
/// refusals it causes allow.
pub(super) fn next_censored_margin(margin: f64, dropped: u64, admitted: u64) -> f64 {
    if admitted == 0 {
        return margin;
    }
    if dropped as f64 > CENSORED_REFUSED_GUARD * admitted as f64 {
        (margin + CENSORED_MARGIN_RAISE).min(CENSORED_MARGIN)
    } else {
        (CENSORED_MARGIN_MIN + CENSORED_MARGIN_EASE * (margin - CENSORED_MARGIN_MIN))
            .clamp(CENSORED_MARGIN_MIN, CENSORED_MARGIN)
    }
}

/// Within the capacity law's dead band of the target.
fn near(admitted: f64, target: f64) -> bool {
    (admitted - target).abs() <= HOLD_BAND * target
}

/// Next to nothing above `current` arrived in the window (`current` cuts but does not
/// bind, see [`level_binds`], or at most [`CENSORED_STRAGGLERS`] arrived above it): the
/// histogram is censored at the level. That is what a sidecar whose callers run weir's egress sees once they know its
/// level: they refuse above it before sending, so it counts what it admits plus the few
/// sent before the callers heard of a cut. A sidecar that sees all of its demand has far
/// more above a cut, except right at 1x.
pub(super) fn is_censored(histogram: &[u32], current: AdmissionLevel) -> bool {
    if current == AdmissionLevel::FULLY_OPEN {
        return false;
    }
    // A thin window (a short early re-open) judged by share alone would call two stragglers
    // out of nine "demand": that opened the level fully and let the callers' backlog in.
    !level_binds(histogram, current) || arrivals_beyond(histogram, current) <= CENSORED_STRAGGLERS
}

/// Arrivals above the level that a window may hold and still count as censored whatever
/// its size: requests the callers sent before they heard of a cut.
const CENSORED_STRAGGLERS: u64 = 2;

/// [`open_beyond_arrivals`] opens fully when the spare room is this many times what came:
/// with merely as much again, a quiet window's probe opened fully (a sawtooth).
const CENSORED_FULL_OPEN_ROOM: f64 = 2.0;

/// Fewer arrivals than this make a window too thin to extrapolate a density from.
const THIN_WINDOW: u64 = 20;

/// The level for a window whose arrivals all fit in `target` while `current` cuts: past
/// the highest bucket that arrived (or `current`, if higher) by the spare room (`target`
/// less what arrived) over the arrival density there, extrapolated beyond it. At least one
/// fine step (a probe, so a level never sticks), and fully open when the spare room is
/// twice everything that arrived and `may_open_fully` (a downstream with that much room
/// re-opens in one window rather than creeping up).
///
/// Used for censored windows only (see `is_censored`): behind callers' egress (which
/// refuse above the advertised level before sending) it is what keeps the level from
/// opening fully whenever the refused demand, invisible here, fits no longer.
///
/// The density is arrivals per compound level over that bucket's business class up to it
/// (users are spread evenly within a class); with fewer than `THIN_WINDOW` arrivals in
/// all, never less than the arrivals per non-empty bucket (a step then opens at most
/// `spare` levels).
pub fn open_beyond_arrivals(
    histogram: &[u32],
    current: AdmissionLevel,
    target: f64,
    may_open_fully: bool,
) -> AdmissionLevel {
    let Some(highest) = histogram.iter().rposition(|&n| n > 0) else {
        return AdmissionLevel::FULLY_OPEN;
    };
    let base = (current.compound() as usize).max(highest);
    let arrived: u64 = histogram.iter().map(|&n| n as u64).sum();
    let spare = target - arrived as f64;
    // Fully open only with room for three times what came: the estimate behind a quiet
    // censored window is a probe (a little over twice what completed), and room for
    // merely twice what came opened fully on such a probe and let the callers' backlog in
    // (a sawtooth).
    if spare >= CENSORED_FULL_OPEN_ROOM * arrived as f64 && may_open_fully {
        return AdmissionLevel::FULLY_OPEN;
    }
    let class_start = base - base % USER_LEVELS as usize;
    let in_class: u64 = histogram[class_start..=base].iter().map(|&n| n as u64).sum();
    let per_level = in_class as f64 / (base - class_start + 1) as f64;
    let density = if arrived < THIN_WINDOW {
        // A thin window (a few requests over many levels) would extrapolate a near-zero
        // density and open by hundreds of levels: assume no fewer arrivals a level than
        // a non-empty bucket holds on average, so it opens by at most `spare` levels.
        let occupied = histogram.iter().filter(|&&n| n > 0).count();
        per_level.max(arrived as f64 / occupied.max(1) as f64)
    } else if in_class < THIN_WINDOW / 2 {
        // The cut's class barely seen: the density over everything up to the base.
        per_level.max(arrived as f64 / (base + 1) as f64)
    } else {
        per_level
    };
    let steps = if spare > 0.0 { (spare / density).ceil().max(1.0) } else { 1.0 };
    let next = (base as f64 + steps).min((COMPOUND_LEVELS - 1) as f64) as u16;
    AdmissionLevel::from_compound(next).unwrap_or(AdmissionLevel::FULLY_OPEN)
}

/// A censored opening ([`open_beyond_arrivals`]) crosses into at most one business class
/// beyond `current`'s per window, unless that class is the least important one seen
/// (`least_important_seen`; past it nothing is known to come, and the level may open fully). Behind
/// callers' egress the classes beyond the level are unseen, and the density extrapolation
/// assumes them as dense as the class the level cuts: at a middle hop cut to the end of
/// the top class (0.127), where only the top class arrives, that opened fully (or into the
/// third class) in one window; the callers' caches then let every class in at once, the hop
/// cut again, and the callers refused on the old level while it did, so the hop refused
/// what the entry should have (multihop-bench's middle hop A: 0.127 -> 2.27 -> open ->
/// 1.43 within 0.5 s). One class a window: the next class's arrivals are measured before
/// the level opens past it. A hop whose load really dropped still re-opens within two early
/// windows (the engine closes a window early when the level cuts and the app has room).
pub(super) fn cap_censored_opening(
    next: AdmissionLevel,
    current: AdmissionLevel,
    least_important_seen: Option<u8>,
) -> AdmissionLevel {
    let Some(lowest) = least_important_seen else { return next };
    let into = current.priority().business.saturating_add(1);
    if into >= lowest {
        return next;
    }
    let end_of_into = u16::from(into) * USER_LEVELS + (USER_LEVELS - 1);
    AdmissionLevel::from_compound(end_of_into).map_or(next, |cap| next.min(cap))
}
