use proptest::prelude::*;

use super::*;

const TICK: Duration = Duration::from_millis(50);

/// `answers_per_tick` answers at each of `ticks` ticks 50 ms apart: what the span returns
/// at the last.
fn span_after(ticks: usize, answers_per_tick: u64) -> Option<(u64, Duration)> {
    let start = Instant::now();
    let mut span = AnswerSpan::default();
    let mut last = None;
    for tick in 0..ticks {
        last = span.observe(start + TICK * tick as u32, answers_per_tick * tick as u64);
    }
    last
}

#[test]
fn the_span_is_whole_after_its_ticks_and_slides_with_them() {
    assert_eq!(span_after(UNDERFED_TICKS, 10), None, "four ticks are no span yet");
    assert_eq!(span_after(UNDERFED_TICKS + 1, 10), Some((40, TICK * 4)));
    // Later ticks slide it: always the last four intervals, never all of them.
    assert_eq!(span_after(UNDERFED_TICKS + 20, 10), Some((40, TICK * 4)));
}

#[test]
fn a_lull_is_seen_within_the_span_and_forgotten_after_it() {
    let start = Instant::now();
    let mut span = AnswerSpan::default();
    let mut count = 0;
    let mut verdicts = Vec::new();
    // 1,000 answers/s for 10 ticks, none for 6, then 1,000/s again; capacity 1,000/s.
    for tick in 0..24u32 {
        if !(10..16).contains(&tick) {
            count += 50;
        }
        let answered = span.observe(start + TICK * tick, count);
        verdicts.push(underfed(true, Some(1_000.0), answered));
    }
    assert!(verdicts[..10].iter().all(|fed| !fed), "fed throughout: {verdicts:?}");
    assert!(verdicts[10], "one silent tick of the span's four: 750/s: {verdicts:?}");
    assert!(verdicts[15], "a silent span: {verdicts:?}");
    assert!(!verdicts[20], "the lull has left the span: {verdicts:?}");
}

#[test]
fn underfed_needs_a_refusing_level_an_estimate_and_a_whole_span() {
    let span = Some((100, Duration::from_millis(200))); // 500/s
    assert!(underfed(true, Some(1_000.0), span));
    assert!(!underfed(false, Some(1_000.0), span), "a level that refuses nothing");
    assert!(!underfed(true, None, span), "no capacity estimate yet");
    assert!(!underfed(true, Some(0.0), span));
    assert!(!underfed(true, Some(1_000.0), None), "the span is not whole");
    assert!(!underfed(true, Some(1_000.0), Some((0, Duration::ZERO))));
}

#[test]
fn underfed_means_under_nine_tenths_of_the_estimate() {
    let over = |count| underfed(true, Some(1_000.0), Some((count, Duration::from_millis(200))));
    assert!(!over(200), "at the estimate");
    assert!(!over(180), "at nine tenths: a saturated app's own variation");
    assert!(over(179));
}

fn status(limit: usize, ceiling: usize, rate: f64, baseline_ms: u64) -> LimitStatus {
    LimitStatus {
        limit,
        ceiling,
        floor: 1,
        completions_per_sec: rate,
        baseline: Duration::from_millis(baseline_ms),
        trying: false,
        cuts: 0,
        costly: 0,
        undone: 0,
    }
}

#[test]
fn idle_workers_are_what_the_app_serves_at_once_below_the_limit() {
    // 400/s at 10 ms each: four workers busy at once.
    assert_eq!(idle_workers(false, &status(6, 256, 400.0, 10)), 4);
    // The limit's headroom is the app's queue: never the limit itself.
    assert_eq!(idle_workers(false, &status(4, 256, 400.0, 10)), 3);
    assert_eq!(idle_workers(false, &status(1, 256, 400.0, 10)), 0);
    // A limit at its ceiling knows nothing of the app's workers.
    assert_eq!(idle_workers(false, &status(256, 256, 400.0, 10)), 0);
    // A middle hop's workers also wait on its downstreams.
    assert_eq!(idle_workers(true, &status(6, 256, 400.0, 10)), 0);
    // Nothing measured yet.
    assert_eq!(idle_workers(false, &status(6, 256, 0.0, 0)), 0);
}

proptest! {
    #[test]
    fn idle_workers_stay_below_the_limit_and_off_at_the_ceiling(
        limit in 1usize..300,
        ceiling in 1usize..300,
        rate in 0.0f64..100_000.0,
        baseline_ms in 0u64..2_000,
        middle_hop: bool,
    ) {
        let bound = idle_workers(middle_hop, &status(limit, ceiling, rate, baseline_ms));
        prop_assert!(bound < limit.max(1));
        if middle_hop || limit >= ceiling {
            prop_assert_eq!(bound, 0);
        }
    }

    #[test]
    fn fewer_answers_never_make_a_fed_app_of_an_underfed_one(
        capacity in 1.0f64..100_000.0,
        count in 0u64..50_000,
        fewer in 0u64..50_000,
        span_ms in 1u64..1_000,
    ) {
        let span = Duration::from_millis(span_ms);
        let less = count.saturating_sub(fewer);
        if underfed(true, Some(capacity), Some((count, span))) {
            prop_assert!(underfed(true, Some(capacity), Some((less, span))));
        }
    }
}
