//! Property tests of the engine, the controller and the header parsers.

use std::sync::Arc;
use std::time::Duration;

use admission_core::priority::{parse_business, parse_user, COMPOUND_LEVELS};
use admission_core::{
    AdmissionEngine, AdmissionLevel, Controller, Decision, EngineConfig, HeaderValueError, Law,
    ManualClock, Priority, WindowSummary, Zone,
};
use proptest::prelude::*;

fn priority() -> impl Strategy<Value = Priority> {
    (any::<u8>(), 0u8..128).prop_map(|(business, user)| Priority { business, user })
}

fn law() -> impl Strategy<Value = Law> {
    prop_oneof![Just(Law::Dagor), Just(Law::Goodput), Just(Law::Capacity)]
}

/// One simulated window: arrivals at a few priorities, dispatches with a wait.
#[derive(Debug, Clone)]
struct Window {
    arrivals: Vec<Priority>,
    dispatched: u16,
    wait_ms: u16,
    length_ms: u16,
}

fn window() -> impl Strategy<Value = Window> {
    (prop::collection::vec(priority(), 0..300), 0u16..400, 0u16..200, 1u16..1500).prop_map(
        |(arrivals, dispatched, wait_ms, length_ms)| Window {
            arrivals,
            dispatched,
            wait_ms,
            length_ms,
        },
    )
}

fn engine(law: Law, window_requests: u32) -> AdmissionEngine<ManualClock> {
    let cfg = EngineConfig { law, window_requests, ..EngineConfig::default() };
    AdmissionEngine::new(&cfg, ManualClock::new())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Whatever history moved the level, an admitted priority implies that every more
    /// important one is admitted too (the grace after a cut included), and the level is a
    /// valid compound level.
    #[test]
    fn admission_is_monotonic_in_priority_and_level_in_bounds(
        law in law(),
        windows in prop::collection::vec(window(), 1..12),
        probes in prop::collection::vec((priority(), priority()), 1..50),
    ) {
        let e = engine(law, 2000);
        for w in &windows {
            for &p in &w.arrivals {
                e.admit(p);
            }
            for _ in 0..w.dispatched {
                e.record_queuing(Duration::from_millis(w.wait_ms as u64));
            }
            e.clock().advance(Duration::from_millis(w.length_ms as u64));
            e.tick();
            let level = e.status().level;
            prop_assert!((level.compound() as usize) < COMPOUND_LEVELS);
            for &(a, b) in &probes {
                let (more, less) = if a <= b { (a, b) } else { (b, a) };
                if e.admit(less) == Decision::Admit {
                    prop_assert_eq!(e.admit(more), Decision::Admit, "{} admitted, {} not", less, more);
                }
                // Beyond the level, only the grace after a cut admits (the level before it).
                prop_assert_eq!(e.admit(a) == Decision::Admit, level.admits(a) || e.in_cut_grace(a));
            }
        }
    }

    /// The controller never leaves the level space, a cut never admits more and a relax
    /// never admits less.
    #[test]
    fn controller_moves_in_the_right_direction(
        law in law(),
        current in 0u16..COMPOUND_LEVELS as u16,
        buckets in prop::collection::vec((0u16..COMPOUND_LEVELS as u16, 1u32..500), 0..40),
        dispatched in 0u64..5000,
        mean_queuing_ms in 0u64..500,
        zone in prop_oneof![Just(Zone::Cut), Just(Zone::Hold), Just(Zone::Relax), Just(Zone::Absorb)],
    ) {
        let mut h = vec![0u32; COMPOUND_LEVELS];
        for &(c, n) in &buckets {
            h[c as usize] += n;
        }
        let arrivals: u64 = h.iter().map(|&n| n as u64).sum();
        let current = AdmissionLevel::from_compound(current).expect("in range");
        let admitted: u64 = h[..=current.compound() as usize].iter().map(|&n| n as u64).sum();
        let w = WindowSummary {
            duration_ns: 1_000_000_000,
            arrivals,
            admitted,
            dispatched,
            dropped: 0,
            mean_queuing_ns: mean_queuing_ms * 1_000_000,
            ..WindowSummary::default()
        };
        let mut c = Controller::new(&EngineConfig { law, ..EngineConfig::default() });
        let next = c.next_level(current, zone, &w, &h);
        prop_assert!((next.compound() as usize) < COMPOUND_LEVELS);
        match zone {
            Zone::Cut => prop_assert!(next <= current, "cut raised {} to {}", current, next),
            Zone::Relax => prop_assert!(next >= current, "relax lowered {} to {}", current, next),
            // The goodput law re-aims at capacity inside the band; dagor holds.
            Zone::Hold if law == Law::Dagor => prop_assert_eq!(next, current),
            Zone::Hold => {}
            // A burst the budget absorbs never moves the level.
            Zone::Absorb => prop_assert_eq!(next, current),
        }
    }

    /// Every admit call lands in exactly one drained window histogram.
    #[test]
    fn histogram_counts_are_conserved_across_rollovers(
        law in law(),
        window_requests in 1u32..300,
        ops in prop::collection::vec(
            prop_oneof![
                4 => priority().prop_map(Op::Admit),
                2 => (0u16..100).prop_map(Op::Dispatch),
                1 => (0u16..1500).prop_map(Op::Advance),
            ],
            0..2000,
        ),
    ) {
        let e = engine(law, window_requests);
        let mut admits = 0u64;
        let mut drained = 0u64;
        let mut seen_windows = 0;
        let mut drain = |e: &AdmissionEngine<ManualClock>, drained: &mut u64| {
            let closed = e.windows_closed();
            if closed != seen_windows {
                prop_assert_eq!(closed, seen_windows + 1, "missed a window");
                seen_windows = closed;
                e.with_last_window(|w, h| {
                    let sum: u64 = h.iter().map(|&n| n as u64).sum();
                    *drained += sum;
                    prop_assert_eq!(Some(sum), w.map(|w| w.arrivals));
                    Ok(())
                })?;
            }
            Ok(())
        };
        for op in &ops {
            match *op {
                Op::Admit(p) => {
                    e.admit(p);
                    admits += 1;
                }
                Op::Dispatch(ms) => e.record_queuing(Duration::from_millis(ms as u64)),
                Op::Advance(ms) => {
                    e.clock().advance(Duration::from_millis(ms as u64));
                    e.tick();
                }
            }
            drain(&e, &mut drained)?;
        }
        e.clock().advance(Duration::from_secs(2));
        e.tick();
        drain(&e, &mut drained)?;
        prop_assert_eq!(drained, admits);
    }

    #[test]
    fn parsers_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..12)) {
        let _ = parse_business(&bytes);
        let _ = parse_user(&bytes);
        let _ = AdmissionLevel::parse(&bytes);
    }

    #[test]
    fn valid_values_round_trip(b in any::<u8>(), u in 0u8..128, zeros in 0usize..3) {
        let padded = format!("{}{b}", "0".repeat(zeros));
        prop_assert_eq!(parse_business(padded.as_bytes()), Ok(b));
        prop_assert_eq!(parse_user(u.to_string().as_bytes()), Ok(u));
        let level = AdmissionLevel::new(Priority { business: b, user: u });
        prop_assert_eq!(AdmissionLevel::parse(level.encode().as_bytes()), Ok(level));
    }

    #[test]
    fn out_of_range_values_are_rejected(n in 256u64..u64::MAX, u in 128u64..100_000) {
        prop_assert_eq!(parse_business(n.to_string().as_bytes()), Err(HeaderValueError::OutOfRange { max: 255 }));
        prop_assert_eq!(parse_user(u.to_string().as_bytes()), Err(HeaderValueError::OutOfRange { max: 127 }));
    }

    #[test]
    fn negative_values_are_rejected(n in 1u32..1000) {
        prop_assert_eq!(parse_business(format!("-{n}").as_bytes()), Err(HeaderValueError::Negative));
        prop_assert_eq!(parse_user(format!("-{n}").as_bytes()), Err(HeaderValueError::Negative));
    }

    #[test]
    fn padded_values_are_rejected(n in any::<u8>(), pad in prop::sample::select(vec![" ", "\t", "\r\n", "  "]), front in any::<bool>()) {
        let v = if front { format!("{pad}{n}") } else { format!("{n}{pad}") };
        prop_assert_eq!(parse_business(v.as_bytes()), Err(HeaderValueError::Padded));
        prop_assert_eq!(parse_user(v.as_bytes()), Err(HeaderValueError::Padded));
    }

    #[test]
    fn non_numeric_values_are_rejected(s in "[0-9]{0,2}[a-zA-Z.,+_/][0-9a-z]{0,3}") {
        prop_assume!(!s.starts_with('-'));
        prop_assert_eq!(parse_business(s.as_bytes()), Err(HeaderValueError::NotNumeric));
        prop_assert_eq!(parse_user(s.as_bytes()), Err(HeaderValueError::NotNumeric));
    }
}

#[derive(Debug, Clone)]
enum Op {
    Admit(Priority),
    Dispatch(u16),
    Advance(u16),
}

/// Two threads admit while a third closes windows: no arrival is lost, even when an admit
/// races a rollover and lands in the set being drained.
#[test]
fn histogram_counts_are_conserved_under_contention() {
    let e = Arc::new(engine(Law::Goodput, u32::MAX));
    let per_thread = 200_000u64;
    let admitters: Vec<_> = (0..2)
        .map(|t| {
            let e = e.clone();
            std::thread::spawn(move || {
                for i in 0..per_thread {
                    e.admit(Priority { business: t, user: (i % 128) as u8 });
                }
            })
        })
        .collect();
    let mut drained = 0u64;
    let mut closed = 0;
    let mut close_one = |e: &AdmissionEngine<ManualClock>| {
        e.clock().advance(Duration::from_secs(1));
        e.tick();
        assert_eq!(e.windows_closed(), closed + 1, "only this thread closes windows");
        closed += 1;
        e.with_last_window(|_, h| h.iter().map(|&n| n as u64).sum::<u64>())
    };
    while admitters.iter().any(|t| !t.is_finished()) {
        drained += close_one(&e);
    }
    for t in admitters {
        t.join().expect("admitter");
    }
    // Stragglers wrote the set drained two windows ago; two more rollovers catch them.
    drained += close_one(&e);
    drained += close_one(&e);
    assert_eq!(drained, 2 * per_thread);
}

mod gate_and_limit {
    use std::time::Duration;

    use admission_core::adaptive_limit::{AdaptiveLimit, AdaptiveLimitConfig};
    use admission_core::gate::{deadline_gate, give_up_at, DeadlineCheck, Stage, Verdict};
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    fn check() -> impl Strategy<Value = DeadlineCheck> {
        (
            0u64..2_000,
            0u64..2_000,
            1u64..1_000,
            0u64..200,
            0u64..2_000,
            any::<bool>(),
            0u64..300,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(
                |(
                    now,
                    budget,
                    timeout,
                    typical,
                    wait,
                    overloaded,
                    max_wait,
                    less,
                    queued,
                    marginal,
                )| {
                    DeadlineCheck {
                        arrival: 0,
                        now: now * MS,
                        deadline: budget * MS,
                        task_timeout: timeout * MS,
                        typical_app: typical * MS,
                        expected_wait: wait * MS,
                        overloaded,
                        overload_max_wait: max_wait * MS,
                        less_important_waiting: less,
                        queued,
                        marginal,
                    }
                },
            )
    }

    fn stage() -> impl Strategy<Value = Stage> {
        prop_oneof![Just(Stage::Door), Just(Stage::Waiting), Just(Stage::Dequeue)]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Whatever is forwarded is within its deadline; what leaves the queue for the app
        /// is within the task timeout and, if it waited, can still finish in the app's time.
        #[test]
        fn forwarded_requests_are_within_their_bounds(c in check(), stage in stage()) {
            if deadline_gate(stage, &c) == Verdict::Forward {
                prop_assert!(c.now < c.deadline);
                if stage != Stage::Door {
                    prop_assert!(c.now - c.arrival <= c.task_timeout);
                    prop_assert!(!c.queued || c.deadline - c.now >= c.typical_app);
                }
            }
        }

        /// A class the level admits whole is never refused for the max wait.
        #[test]
        fn the_max_wait_spares_classes_the_level_admits_whole(c in check(), stage in stage()) {
            let c = DeadlineCheck { marginal: false, ..c };
            let v = deadline_gate(stage, &c);
            prop_assert_ne!(v, Verdict::WaitedOut);
            if v == Verdict::ExpectedWaitTooLong {
                prop_assert!(c.expected_wait.saturating_add(c.typical_app) > c.deadline - c.now);
            }
        }

        /// A more important waiter is never dropped by the max wait while a less important
        /// one waits.
        #[test]
        fn max_wait_never_drops_while_someone_less_important_waits(c in check(), stage in stage()) {
            let c = DeadlineCheck { less_important_waiting: true, ..c };
            prop_assert_ne!(deadline_gate(stage, &c), Verdict::WaitedOut);
        }

        /// Under overload, nothing of the cut class let in at the door expects to wait past
        /// the max wait.
        #[test]
        fn the_door_bounds_the_expected_wait_under_overload(c in check()) {
            if c.overloaded && c.marginal && c.overload_max_wait > 0
                && deadline_gate(Stage::Door, &c).is_forward()
            {
                prop_assert!(c.expected_wait <= c.overload_max_wait);
            }
        }

        /// At the door: a longer expected wait or a shorter budget never turns a refusal into
        /// an admission.
        #[test]
        fn the_door_is_monotonic(c in check(), more_wait in 0u64..500, less_budget in 0u64..500) {
            if !deadline_gate(Stage::Door, &c).is_forward() {
                let worse = DeadlineCheck {
                    expected_wait: c.expected_wait + more_wait * MS,
                    deadline: c.deadline.saturating_sub(less_budget * MS),
                    ..c
                };
                prop_assert!(!deadline_gate(Stage::Door, &worse).is_forward());
            }
        }

        /// A waiter is still worth keeping just before its give-up time and not at it
        /// (unless the task timeout or the max wait took it first).
        #[test]
        fn give_up_time_is_where_the_wait_gate_turns(
            budget in 1u64..2_000, timeout in 1u64..1_000, typical in 0u64..200,
        ) {
            let (deadline, timeout, typical) = (budget * MS, timeout * MS, typical * MS);
            let at = give_up_at(0, deadline, timeout, typical);
            prop_assert!(at <= deadline);
            let c = |now| DeadlineCheck {
                arrival: 0, now, deadline, task_timeout: timeout, typical_app: typical,
                queued: true, ..DeadlineCheck::default()
            };
            prop_assert!(!deadline_gate(Stage::Waiting, &c(at)).is_forward());
            // (A budget shorter than the app's time cannot finish from the start.)
            if at > 0 && deadline > typical {
                prop_assert!(deadline_gate(Stage::Waiting, &c(at - 1)).is_forward());
            }
        }

        /// The adaptive limit stays within its floor and ceiling whatever it is told.
        #[test]
        fn the_adaptive_limit_stays_in_bounds(
            ceiling in 1usize..300,
            floor in 1usize..10,
            ops in prop::collection::vec((0u8..4, 0u64..500), 0..400),
        ) {
            let cfg = AdaptiveLimitConfig { ceiling, floor, ..AdaptiveLimitConfig::default() };
            let mut l = AdaptiveLimit::new(cfg, 0);
            let mut now = 0u64;
            for (op, x) in ops {
                match op {
                    0 => {
                        let (own, route) = (Duration::from_micros(x * 100), Some(x % 3));
                        l.on_response(now, own, Duration::ZERO, x as usize, route);
                    }
                    1 => {
                        let held = l.limit();
                        let (rtt, downstream) =
                            (Duration::from_micros(x * 100), Duration::from_micros(x * 37));
                        l.on_response(now, rtt, downstream, held, None);
                    }
                    2 => l.on_waiting(),
                    _ => now += x * MS,
                }
                let limit = l.tick(now);
                prop_assert!(limit >= floor.min(ceiling) && limit <= ceiling, "{limit}");
            }
        }
    }
}
