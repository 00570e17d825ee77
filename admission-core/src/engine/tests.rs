use super::*;
use crate::clock::ManualClock;
use crate::config::Law;

fn engine(law: Law, mode: Mode) -> AdmissionEngine<ManualClock> {
    let cfg = EngineConfig { law, mode, ..EngineConfig::default() };
    AdmissionEngine::new(&cfg, ManualClock::new())
}

fn user(u: u8) -> Priority {
    Priority { business: 0, user: u }
}

/// One 1-second window: `arrivals` requests spread over the 128 user levels, the app
/// dispatches `dispatched` of them after waiting `wait_ms` each.
fn run_window(
    e: &AdmissionEngine<ManualClock>,
    arrivals: u32,
    dispatched: u32,
    wait_ms: u64,
) -> u32 {
    let mut admitted = 0;
    for i in 0..arrivals {
        if e.admit(user((i % 128) as u8)) != Decision::Shed {
            admitted += 1;
        }
    }
    for _ in 0..dispatched {
        e.record_queuing(Duration::from_millis(wait_ms));
    }
    e.clock().advance(Duration::from_secs(1));
    e.tick();
    admitted
}

#[test]
fn window_closes_after_window_requests_samples() {
    let e = engine(Law::Dagor, Mode::Enforce);
    for _ in 0..1999 {
        e.admit(user(1));
        e.record_queuing(Duration::from_millis(1));
    }
    assert_eq!(e.windows_closed(), 0);
    e.admit(user(1));
    e.record_queuing(Duration::from_millis(1));
    assert_eq!(e.windows_closed(), 1);
    let w = e.status().last_window.expect("closed window");
    assert_eq!((w.arrivals, w.admitted, w.dispatched), (2000, 2000, 2000));
    assert_eq!(w.mean_queuing_ns, 1_000_000);
}

#[test]
fn window_closes_after_its_duration_even_without_traffic() {
    let e = engine(Law::Dagor, Mode::Enforce);
    e.clock().advance(Duration::from_millis(999));
    e.tick();
    assert_eq!(e.windows_closed(), 0);
    e.clock().advance(Duration::from_millis(1));
    e.tick();
    assert_eq!(e.windows_closed(), 1);
    let w = e.status().last_window.expect("closed window");
    assert_eq!(w.duration_ns, 1_000_000_000);
    assert_eq!(w.arrivals, 0);
    assert_eq!(e.level(), AdmissionLevel::FULLY_OPEN);
}

#[test]
fn last_window_histogram_counts_arrivals_by_level() {
    let e = engine(Law::Dagor, Mode::Enforce);
    e.admit(Priority { business: 2, user: 5 });
    e.admit(Priority { business: 2, user: 5 });
    e.admit(Priority { business: 0, user: 0 });
    e.clock().advance(Duration::from_secs(1));
    e.tick();
    e.with_last_window(|w, h| {
        assert_eq!(w.map(|w| w.arrivals), Some(3));
        assert_eq!(h[Priority { business: 2, user: 5 }.compound() as usize], 2);
        assert_eq!(h[0], 1);
        assert_eq!(h.iter().map(|&n| n as u64).sum::<u64>(), 3);
    });
}

#[test]
fn level_moves_down_under_overload_and_relaxes_after() {
    for law in [Law::Dagor, Law::Goodput] {
        let e = engine(law, Mode::Enforce);
        // 3x overload: 1280 arrive per second, the app finishes 427, each waited 100 ms.
        let mut levels = vec![];
        for _ in 0..40 {
            run_window(&e, 1280, 427, 100);
            levels.push(e.level());
        }
        assert!(e.overloaded(), "{law:?}");
        assert!(levels.windows(2).all(|w| w[1] <= w[0]), "{law:?} cut must be monotonic");
        let admitted_now = run_window(&e, 1280, 0, 0);
        assert!(admitted_now < 600, "{law:?} still admits {admitted_now} of 1280 at 3x");
        // Load gone: queues empty, the level opens back up.
        for _ in 0..200 {
            run_window(&e, 1280, 400, 1);
        }
        assert!(!e.overloaded(), "{law:?}");
        assert_eq!(e.level(), AdmissionLevel::FULLY_OPEN, "{law:?} did not relax");
    }
}

#[test]
fn hysteresis_holds_the_level_between_thresholds() {
    let e = engine(Law::Dagor, Mode::Enforce);
    run_window(&e, 1280, 400, 100);
    let cut = e.level();
    assert!(cut < AdmissionLevel::FULLY_OPEN);
    run_window(&e, 1280, 400, 15);
    assert_eq!(e.level(), cut, "between 10 and 20 ms: hold");
    assert!(e.overloaded());
}

#[test]
fn shadow_mode_never_sheds_but_reports_would_shed() {
    let e = engine(Law::Dagor, Mode::Shadow);
    for _ in 0..10 {
        let admitted = run_window(&e, 1280, 427, 100);
        assert_eq!(admitted, 1280, "shadow refused something");
    }
    assert!(e.level() < AdmissionLevel::FULLY_OPEN, "shadow still computes the level");
    assert_eq!(e.admit(Priority::LEAST_IMPORTANT), Decision::WouldShed);
    assert_eq!(e.admit(Priority::MOST_IMPORTANT), Decision::Admit);
    assert_eq!(e.status().mode, Mode::Shadow);
}

#[test]
fn enforce_sheds_below_level_only() {
    let e = engine(Law::Dagor, Mode::Enforce);
    for _ in 0..5 {
        run_window(&e, 1280, 427, 100);
    }
    let level = e.level();
    let p = level.priority();
    assert_eq!(e.admit(p), Decision::Admit);
    assert_eq!(e.admit(Priority::MOST_IMPORTANT), Decision::Admit);
    let below = Priority::from_compound(level.compound() + 1).expect("not fully open");
    assert_eq!(e.admit(below), Decision::Shed);
}

#[test]
fn status_reports_the_goodput_capacity_estimate() {
    let e = engine(Law::Goodput, Mode::Enforce);
    run_window(&e, 1280, 427, 100);
    let s = e.status();
    assert_eq!(s.windows_closed, 1);
    assert!(s.overloaded);
    let cap = s.capacity_per_sec.expect("measured while saturated");
    assert!((420.0..=430.0).contains(&cap), "capacity {cap}");
}

#[test]
fn the_level_binds_only_while_arrivals_lie_beyond_it() {
    let e = engine(Law::Dagor, Mode::Enforce);
    assert!(!e.level_binds(), "fully open refuses nothing");
    // 3x overload over all 128 user levels: the level cuts and refuses much of it.
    for _ in 0..10 {
        run_window(&e, 1280, 427, 100);
    }
    assert_ne!(e.level(), AdmissionLevel::FULLY_OPEN);
    assert!(e.level_binds());
    // Behind callers that refuse beyond the level for it, only what it admits arrives: the
    // level is still cut, yet it refuses nothing here.
    let cut = e.level().priority().user;
    for _ in 0..3 {
        for i in 0..1000u32 {
            assert_ne!(e.admit(user((i % (u32::from(cut) + 1)) as u8)), Decision::Shed);
        }
        for _ in 0..400 {
            e.record_queuing(Duration::from_millis(15));
        }
        e.clock().advance(Duration::from_secs(1));
        e.tick();
    }
    assert_ne!(e.level(), AdmissionLevel::FULLY_OPEN, "dagor holds between the thresholds");
    assert!(!e.level_binds(), "level {} refuses nothing that arrives", e.level());
}

#[test]
fn a_cut_behind_propagating_callers_honours_the_old_level_briefly() {
    let e = engine(Law::Dagor, Mode::Enforce);
    for _ in 0..10 {
        run_window(&e, 1280, 427, 100);
    }
    // Callers now send only what the level admits: it refuses nothing that arrives.
    let censored = |e: &AdmissionEngine<ManualClock>, wait_ms: u64| {
        let cut = e.level().priority().user;
        for i in 0..1000u32 {
            e.admit(user((i % (u32::from(cut) + 1)) as u8));
        }
        for _ in 0..400 {
            e.record_queuing(Duration::from_millis(wait_ms));
        }
        e.clock().advance(Duration::from_secs(1));
        e.tick();
    };
    censored(&e, 15);
    assert!(!e.level_binds());
    let before = e.level();
    // Overloaded again: the level cuts...
    censored(&e, 100);
    let after = e.level();
    assert!(after < before, "cut from {before} to {after}");
    // The window that closed holds what the callers sent under the old level, so the new
    // level would bind on it; but the callers refuse beyond the new level from their next
    // response on, so it does not bind (the queue's max wait stays off): binding on that
    // window refused, for a whole window, what the callers had already filtered.
    assert!(!e.level_binds(), "a cut behind filtering callers does not bind");
    // ...yet what the callers sent under the old level before they heard is admitted for
    // the grace, and refused after it.
    let between = user(before.priority().user);
    assert!(between.compound() > after.compound());
    assert_eq!(e.admit(between), Decision::Admit);
    e.clock().advance(Duration::from_millis(30));
    assert_eq!(e.admit(between), Decision::Shed);
    // A lone sidecar's first cut from fully open gets no grace.
    let lone = engine(Law::Dagor, Mode::Enforce);
    run_window(&lone, 1280, 427, 100);
    assert_ne!(lone.level(), AdmissionLevel::FULLY_OPEN);
    assert_eq!(lone.admit(user(127)), Decision::Shed);
}

/// After an overload, silence: the timer (every 50 ms, as the proxy's) closes windows with
/// nothing in them, and within about a second of the last request the level is open and the
/// engine no longer overloaded, whatever the law; the next request of every class is
/// admitted.
#[test]
fn an_idle_engine_reopens_within_a_second_of_silence() {
    for law in [Law::Capacity, Law::Dagor, Law::Goodput] {
        let e = engine(law, Mode::Enforce);
        // Three overloaded seconds: 6000 arrivals over six classes, 400 served after
        // waiting 80 ms each (the proxy reports a queue too).
        for _ in 0..3 {
            for i in 0..6_000u32 {
                let p = Priority { business: (i % 6) as u8, user: (i % 128) as u8 };
                e.admit(p);
            }
            for _ in 0..400 {
                e.record_queuing(Duration::from_millis(80));
                e.record_completion();
            }
            for _ in 0..20 {
                e.observe_queue(200, Duration::from_millis(80));
                e.clock().advance(Duration::from_millis(50));
            }
        }
        assert!(e.level() < AdmissionLevel::FULLY_OPEN, "{law:?}: cut by the overload");
        // The queue drains; then nothing.
        let mut open_after = None;
        for tick in 1..=60u64 {
            e.observe_queue(0, Duration::ZERO);
            e.clock().advance(Duration::from_millis(50));
            if e.level() == AdmissionLevel::FULLY_OPEN && !e.overloaded() {
                open_after = Some(tick * 50);
                break;
            }
        }
        // One window with the end of the load in it, then at most one of silence; the
        // capacity law's early re-opens make it a few of its early closes.
        let bound = if law == Law::Capacity { 1_000 } else { 2_100 };
        assert!(open_after.is_some_and(|ms| ms <= bound), "{law:?}: open after {open_after:?} ms");
        assert!(!e.status().overloaded, "{law:?}");
        for b in 0..6u8 {
            let p = Priority { business: b, user: 127 };
            assert_eq!(e.admit(p), Decision::Admit, "{law:?}: class {b} after the silence");
        }
    }
}

// === bursts on the manual clock ===

/// A fluid app of `capacity` requests per second in front of the engine, driven 1 ms at a
/// time: arrivals at `rate(ms)` times capacity (spread over three business classes and the
/// user levels), a FIFO pending queue, the app serving up to its capacity each millisecond,
/// the 50 ms timer reporting the queue. Returns the refusals by the level per millisecond
/// range `[from, to)` asked for in `count`.
struct FluidApp {
    e: AdmissionEngine<ManualClock>,
    capacity: f64,
    queue: std::collections::VecDeque<u64>,
    ms: u64,
    owed: f64,
    served: f64,
    next: u32,
    /// The engine's level each millisecond, newest last (what a caller learns late).
    levels: std::collections::VecDeque<AdmissionLevel>,
}

/// What a run of [`FluidApp::run_behind`] saw.
#[derive(Debug, Default)]
struct FluidCounts {
    /// Refused by the caller's egress (above its cached level), never sent.
    upstream: u64,
    /// Sent, and refused here by the level.
    refused: u64,
    /// Sent.
    arrived: u64,
    /// Completed by the app.
    served: u64,
}

impl FluidApp {
    fn new(capacity: f64) -> Self {
        FluidApp {
            e: engine(Law::Capacity, Mode::Enforce),
            capacity,
            queue: Default::default(),
            ms: 0,
            owed: 0.0,
            served: 0.0,
            next: 0,
            levels: Default::default(),
        }
    }

    /// Runs `ms` milliseconds at `multiple(ms since the start of the run)` times capacity;
    /// returns how many arrivals the level refused.
    fn run(&mut self, ms: u64, multiple: impl Fn(u64) -> f64) -> u64 {
        self.run_behind(ms, multiple, None).refused
    }

    /// As [`FluidApp::run`], behind a caller whose egress refuses above the engine's level
    /// as it was `lag_ms` ago (it learns the level from responses), if `lag_ms` is given.
    fn run_behind(
        &mut self,
        ms: u64,
        multiple: impl Fn(u64) -> f64,
        lag_ms: Option<u64>,
    ) -> FluidCounts {
        let mut counts = FluidCounts::default();
        for t in 0..ms {
            self.levels.push_back(self.e.level());
            while self.levels.len() > lag_ms.unwrap_or(0) as usize + 1 {
                self.levels.pop_front();
            }
            let cached = lag_ms.and_then(|_| self.levels.front().copied());
            self.owed += multiple(t) * self.capacity / 1000.0;
            while self.owed >= 1.0 {
                self.owed -= 1.0;
                self.next = self.next.wrapping_add(1);
                let p = Priority {
                    business: (self.next % 10).min(2) as u8 % 3,
                    user: (self.next.wrapping_mul(37) % 128) as u8,
                };
                if cached.is_some_and(|level| !level.admits(p)) {
                    counts.upstream += 1;
                    continue;
                }
                counts.arrived += 1;
                if self.e.admit(p) == Decision::Shed {
                    counts.refused += 1;
                } else {
                    self.queue.push_back(self.ms);
                }
            }
            self.served += self.capacity / 1000.0;
            while self.served >= 1.0 {
                let Some(at) = self.queue.pop_front() else { break };
                self.served -= 1.0;
                counts.served += 1;
                self.e.record_queuing(Duration::from_millis(self.ms - at));
                self.e.record_completion();
            }
            // An idle app's unused capacity is gone.
            self.served = self.served.min(1.0);
            self.ms += 1;
            self.e.clock().set(self.ms * 1_000_000);
            if self.ms % 50 == 0 {
                let oldest = self.queue.front().map_or(0, |&at| self.ms - at);
                self.e.observe_queue(self.queue.len(), Duration::from_millis(oldest));
                self.e.tick();
            }
        }
        counts
    }
}

/// Behind a caller whose egress refuses above this engine's level (learnt 40 ms late), the
/// histogram is censored: only what the level admits arrives. The level must not keep
/// falling on that (admitting a fraction of the censored arrivals, window after window):
/// at 3x for 15 s it holds within a few user levels, the app serves what the capacity law
/// aims at behind such callers (10% under its rate, plus what the queue holds), and next to
/// nothing that arrives is refused here. (Measured: 95.5% served, 0.9% refused, the level
/// from 2.17 down to 2.10 at most.)
#[test]
fn behind_a_filtering_caller_the_level_does_not_keep_falling() {
    let mut app = FluidApp::new(1_000.0);
    app.run_behind(2_000, |_| 0.5, Some(40));
    app.run_behind(5_000, |_| 3.0, Some(40));
    let settled = app.e.level();
    let mut lowest = AdmissionLevel::FULLY_OPEN;
    let mut total = FluidCounts::default();
    for _ in 0..15 {
        let c = app.run_behind(1_000, |_| 3.0, Some(40));
        lowest = lowest.min(app.e.level());
        total.upstream += c.upstream;
        total.refused += c.refused;
        total.arrived += c.arrived;
        total.served += c.served;
    }
    assert!(total.served >= 13_800, "the app served {} of 15000: {total:?}", total.served);
    assert!(total.refused * 50 <= total.arrived, "refused here: {total:?}");
    assert!(
        lowest.compound() + 12 >= settled.compound(),
        "the level fell from {settled} to {lowest}"
    );
    assert!(total.upstream > 25_000, "the caller refused the surplus: {total:?}");
}

/// On/off bursts above capacity whose load over any nominal window (1 s) fits the app: the
/// queue absorbs each burst and drains in the lull, so nothing is refused by the level, in
/// whatever phase the windows fall. The same app then at 3x sustained is cut within a second.
fn bursts_queue_and_a_sustained_step_is_cut(multiple: f64, on_ms: u64, offset_ms: u64) {
    let mut app = FluidApp::new(1_000.0);
    // The capacity is measured (a saturating second), then the load goes away.
    app.run(2_000, |_| 2.0);
    app.run(1_000 + offset_ms, |_| 0.0);
    let period = 2 * on_ms;
    let refused = app.run(8_000, |t| if t % period < on_ms { multiple } else { 0.0 });
    assert_eq!(refused, 0, "{multiple}x for {on_ms} ms on, {on_ms} off: refused {refused}");
    let refused = app.run(1_000, |_| 3.0);
    assert!(refused > 0, "3x sustained for a second was never cut");
}

#[test]
fn bursts_that_fit_a_window_queue_and_are_not_refused() {
    for offset_ms in [0, 150, 300, 450] {
        bursts_queue_and_a_sustained_step_is_cut(1.5, 500, offset_ms);
    }
}

/// The most milliseconds of load any 1 s span holds, bursts of `on_ms` every `2 * on_ms`.
fn most_on_in_a_second(on_ms: u64) -> u64 {
    let period = 2 * on_ms;
    let whole = 1_000 / period;
    whole * on_ms + (1_000 - whole * period).min(on_ms)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
    /// Bursts of 1.1-1.6x for 100-500 ms, each followed by as long a lull, at any phase
    /// against the windows, as long as no 1 s span holds more than 0.75x of the app (the
    /// capacity law's unit; 500 ms at 1.5x holds 0.75x): never refused by the level.
    /// (Not up to 0.85x: 431 ms at 1.49x, 569 ms of load in a 1 s span, was refused 97 of
    /// ~5,000 at one phase; kept in proptest-regressions under the 0.75x bound.)
    #[test]
    fn bursts_that_fit_every_second_are_never_refused_at_any_phase(
        multiple in 1.1f64..1.6,
        on_ms in 100u64..=500,
        offset_ms in 0u64..1_000,
    ) {
        let multiple = multiple.min(750.0 / most_on_in_a_second(on_ms) as f64);
        bursts_queue_and_a_sustained_step_is_cut(multiple, on_ms, offset_ms);
    }
}

// === bursts the budget absorbs, overloads cut (the detector's line, end to end) ===

/// A fresh fluid app of 1,000 requests per second whose capacity the engine has measured
/// (two saturating seconds), then a second of silence: the level is open again.
fn measured_fluid_app(silence_ms: u64) -> FluidApp {
    let mut app = FluidApp::new(1_000.0);
    app.run(2_000, |_| 2.0);
    app.run(1_000 + silence_ms, |_| 0.0);
    assert_eq!(app.e.level(), AdmissionLevel::FULLY_OPEN, "silence re-opens the level");
    app
}

/// Runs `ms` at `multiple(t)`; returns the first millisecond (since the start of the run)
/// at which the level was below fully open, if any.
fn first_cut(app: &mut FluidApp, ms: u64, multiple: impl Fn(u64) -> f64) -> Option<u64> {
    let mut first = None;
    for t in 0..ms {
        app.run(1, |_| multiple(t));
        if first.is_none() && app.e.level() < AdmissionLevel::FULLY_OPEN {
            first = Some(t);
        }
    }
    first
}

/// The bursts of the no-harm suite that the window-span credit alone did not save on the
/// real sidecar: 1.5x for 500 ms every second, phase-locked to the 1 s window. Its queue
/// peaks at ~250 ms (within the budget) and drains in the lull: never cut, never an
/// overload. The same app at 1.5x sustained is cut once its queue stands.
#[test]
fn on_off_bursts_of_half_a_second_are_absorbed_at_every_phase() {
    for offset_ms in [0, 100, 250, 400, 500, 750, 900] {
        let mut app = measured_fluid_app(offset_ms);
        let cut = first_cut(&mut app, 10_000, |t| if t % 1_000 < 500 { 1.5 } else { 0.0 });
        assert_eq!(cut, None, "1.5x 500/500 ms at offset {offset_ms} ms was cut at {cut:?}");
        assert!(!app.e.overloaded());
        let cut = first_cut(&mut app, 2_000, |_| 1.5);
        assert!(cut.is_some_and(|t| t <= 1_200), "1.5x sustained cut at {cut:?}");
    }
}

/// A step from half the app's capacity to 3x is cut within 250 ms of the step, whatever the
/// phase of the windows (the projected queue passes the burst allowance within an early
/// window or two). (149-199 ms here at 50 ms phases, the same as without the burst rule:
/// the law's span credit held the first early window already; 2x: 299-349 ms, the same;
/// 1.5x: 699-749 ms, from 499-599 ms.)
#[test]
fn a_step_to_three_times_capacity_is_cut_within_two_early_windows() {
    for offset_ms in [0, 30, 60, 110, 170, 240, 330, 500, 810] {
        let mut app = measured_fluid_app(0);
        assert_eq!(first_cut(&mut app, 2_000 + offset_ms, |_| 0.5), None);
        let cut = first_cut(&mut app, 1_000, |_| 3.0);
        assert!(cut.is_some_and(|t| t <= 250), "offset {offset_ms} ms: 3x cut at {cut:?}");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
    /// A train of bursts that fits the budget is never cut: `multiple` x capacity for
    /// `on_ms`, then a lull long enough to drain the burst's queue and be seen empty, at any
    /// phase against the windows. Fits: the queue, grown by the look-ahead at the burst's
    /// pace, stays under the allowance with 50 ms to spare ((m - 1)(on + 100) <= 350 ms), and
    /// the queue never stands for a nominal window.
    #[test]
    fn a_burst_train_that_fits_the_budget_is_never_cut(
        multiple in 1.2f64..4.0,
        on_frac in 0.2f64..=1.0,
        lull_extra_ms in 100u64..600,
        offset_ms in 0u64..1_000,
    ) {
        let longest = ((350.0 / (multiple - 1.0)) - 100.0).min(800.0 / multiple);
        let on_ms = ((longest * on_frac) as u64).max(20);
        let drain_ms = ((multiple - 1.0) * on_ms as f64).ceil() as u64;
        let period = on_ms + drain_ms + lull_extra_ms;
        let mut app = measured_fluid_app(offset_ms);
        let cut = first_cut(&mut app, 8_000, |t| if t % period < on_ms { multiple } else { 0.0 });
        proptest::prop_assert_eq!(
            cut, None, "{:.2}x for {} ms every {} ms, offset {}", multiple, on_ms, period, offset_ms
        );
    }

    /// Sustained arrivals above the app's capacity are always cut: within 1.2 s of the step
    /// from half the capacity (the queue stood a window), within 400 ms from 2x (the
    /// projection passes the allowance), at any phase against the windows.
    #[test]
    fn sustained_arrivals_above_capacity_are_always_cut(
        multiple in 1.2f64..10.0,
        offset_ms in 0u64..1_000,
    ) {
        let mut app = measured_fluid_app(0);
        proptest::prop_assert_eq!(first_cut(&mut app, 2_000 + offset_ms, |_| 0.5), None);
        let cut = first_cut(&mut app, 3_000, |_| multiple);
        let within = if multiple >= 2.0 { 400 } else { 1_200 };
        proptest::prop_assert!(
            cut.is_some_and(|t| t <= within),
            "{:.2}x, offset {}: cut at {:?} (within {} ms expected)", multiple, offset_ms, cut, within
        );
    }
}

/// While the level already refuses, a window closes early on a queue at twice the threshold
/// only once it is three early-close periods old (a dial's noise is no reason for a short
/// window, a level far off is), and on one far past the threshold at once.
#[test]
fn a_dialled_window_closes_early_only_on_a_queue_that_stays_far_off() {
    let period = EngineConfig::default().early_close_after;
    let threshold = EngineConfig::default().queuing_threshold;
    // From a level that refuses (3x for 3 s), at the window's age `age`, a stalled app
    // (nothing dispatched yet) whose oldest waiter is `oldest` old (the signal is half).
    let closes_at = |age: Duration, oldest: Duration| {
        let mut app = FluidApp::new(1_000.0);
        app.run(2_000, |_| 0.5);
        app.run(3_000, |_| 3.0);
        let e = &app.e;
        assert!(e.overloaded() && e.level_binds(), "3x for 3 s: the level refuses");
        // A window that has just begun, with nothing dispatched in it yet.
        let before = e.windows_closed();
        e.try_rollover(e.clock().now().saturating_add(e.window_ns), false);
        assert_eq!(e.windows_closed(), before + 1);
        let start = e.window_start.load(Relaxed);
        e.clock().set(start + age.as_nanos() as u64);
        e.observe_queue(50, oldest);
        e.windows_closed() > before + 1
    };
    let twice = 2 * (2 * threshold + Duration::from_millis(2));
    assert!(!closes_at(period, twice), "at one early period: a dial's noise");
    assert!(!closes_at(2 * period, twice), "at two early periods");
    assert!(closes_at(3 * period, twice), "still far off at three: closes");
    assert!(!closes_at(3 * period, 2 * threshold), "under twice the threshold: never");
    let far = 2 * (8 * threshold + Duration::from_millis(2));
    assert!(closes_at(period, far), "far past the threshold: at once");
}
