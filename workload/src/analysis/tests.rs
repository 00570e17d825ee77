use super::*;

/// `rate` requests per second of `class` over `[from, to)`, evenly spaced, all ending
/// with `ending` after `latency_ms`.
fn run(class: u16, from: f64, to: f64, rate: f64, ending: Ending, latency_ms: f64) -> Vec<Event> {
    let n = ((to - from) * rate).round() as usize;
    (0..n).map(|i| Event { class, at_secs: from + i as f64 / rate, latency_ms, ending }).collect()
}

#[test]
fn counts_and_timeout_share() {
    let mut events = run(0, 0.0, 1.0, 10.0, Ending::Ok, 5.0);
    events.extend(run(1, 0.0, 1.0, 10.0, Ending::Refused, 0.2));
    events.extend(run(1, 0.0, 0.5, 6.0, Ending::TimedOut, 500.0));
    let all = counts(&events, 0.0, 1.0, None);
    assert_eq!(all, Counts { sent: 23, ok: 10, refused: 10, timed_out: 3, errors: 0 });
    assert!((all.timeout_share().unwrap() - 3.0 / 13.0).abs() < 1e-9);
    assert_eq!(counts(&events, 0.0, 1.0, Some(0)).timeout_share(), None);
    assert_eq!(counts(&events, 0.0, 1.0, Some(0)).success(), 1.0);
    // The span is half-open and selects by scheduled time.
    assert_eq!(counts(&events, 0.5, 1.0, Some(1)).timed_out, 0);
    assert_eq!(counts(&events, 5.0, 6.0, None).success(), 1.0);
}

#[test]
fn quantiles_are_nearest_rank_over_the_span() {
    let mut events: Vec<Event> = (1..=100)
        .map(|i| Event { class: 0, at_secs: 1.0, latency_ms: i as f64, ending: Ending::Ok })
        .collect();
    events.push(Event { class: 0, at_secs: 1.0, latency_ms: 9999.0, ending: Ending::TimedOut });
    events.push(Event { class: 0, at_secs: 0.5, latency_ms: 9999.0, ending: Ending::Ok });
    assert_eq!(admitted_latency_ms(&events, 1.0, 2.0, 0.5), Some(50.0));
    assert_eq!(admitted_latency_ms(&events, 1.0, 2.0, 0.9), Some(90.0));
    assert_eq!(admitted_latency_ms(&events, 1.0, 2.0, 0.99), Some(99.0));
    assert_eq!(admitted_latency_ms(&events, 1.0, 2.0, 1.0), Some(100.0));
    assert_eq!(admitted_latency_ms(&events, 2.0, 3.0, 0.5), None);
}

/// Background (class 2) is refused for 1.5 s after the drop at 10 s, normal for 0.4 s;
/// critical never. Recovery is the slowest class.
#[test]
fn recovery_is_when_every_class_is_served_again() {
    let mut events = run(0, 10.0, 20.0, 20.0, Ending::Ok, 10.0);
    events.extend(run(1, 10.0, 10.4, 50.0, Ending::Refused, 0.1));
    events.extend(run(1, 10.4, 20.0, 50.0, Ending::Ok, 10.0));
    events.extend(run(2, 10.0, 11.5, 100.0, Ending::Refused, 0.1));
    events.extend(run(2, 11.5, 20.0, 100.0, Ending::Ok, 10.0));
    let all = recovery_secs(&events, 10.0, 20.0, 3, None, 0.99, 1.0).unwrap();
    assert!((all - 1.5).abs() < 0.11, "recovery {all}");
    let normal = recovery_secs(&events, 10.0, 20.0, 3, Some(1), 0.99, 1.0).unwrap();
    assert!((normal - 0.4).abs() < 0.11, "normal {normal}");
    assert_eq!(recovery_secs(&events, 10.0, 20.0, 3, Some(0), 0.99, 1.0), Some(0.0));
}

#[test]
fn no_recovery_when_a_class_stays_refused() {
    let mut events = run(0, 10.0, 20.0, 20.0, Ending::Ok, 10.0);
    // Background: a third refused to the end (the dagor law's slow re-opening).
    events.extend(run(2, 10.0, 20.0, 100.0, Ending::Ok, 10.0));
    events.extend(run(2, 10.0, 20.0, 50.0, Ending::Refused, 0.1));
    assert_eq!(recovery_secs(&events, 10.0, 20.0, 3, None, 0.99, 1.0), None);
    // Timeouts count as failures too.
    let late = run(0, 10.0, 20.0, 20.0, Ending::TimedOut, 500.0);
    assert_eq!(recovery_secs(&late, 10.0, 20.0, 1, None, 0.99, 1.0), None);
}

fn rule() -> SettleRule {
    SettleRule { capacity: 100.0, min_goodput: 0.9, max_p90_ms: 50.0, window: 0.5 }
}

/// From 5 s: 0.8 s of slow answers (a queue built up), then capacity served fast.
#[test]
fn settle_is_when_goodput_and_latency_hold() {
    let mut events = run(0, 5.0, 5.8, 100.0, Ending::Ok, 300.0);
    events.extend(run(0, 5.8, 10.0, 100.0, Ending::Ok, 20.0));
    events.extend(run(0, 5.0, 10.0, 200.0, Ending::Refused, 0.1));
    let settle = settle_secs(&events, 5.0, 10.0, rule()).unwrap();
    assert!((settle - 0.8).abs() < 0.11, "settle {settle}");
}

#[test]
fn settle_fails_on_low_goodput_or_a_late_relapse() {
    // Fast but only half of capacity served.
    let thin = run(0, 5.0, 10.0, 50.0, Ending::Ok, 20.0);
    assert_eq!(settle_secs(&thin, 5.0, 10.0, rule()), None);
    // Good until 9 s, then slow to the end of the phase: never settled for good.
    let mut relapse = run(0, 5.0, 9.0, 100.0, Ending::Ok, 20.0);
    relapse.extend(run(0, 9.0, 10.0, 100.0, Ending::Ok, 400.0));
    assert_eq!(settle_secs(&relapse, 5.0, 10.0, rule()), None);
    // Good from the first window.
    let clean = run(0, 5.0, 10.0, 100.0, Ending::Ok, 20.0);
    assert_eq!(settle_secs(&clean, 5.0, 10.0, rule()), Some(0.0));
}

#[test]
fn follow_is_when_a_series_stays_in_its_band() {
    // A limit at 4 that dips to 1 at 10 s and is back from 11.2 s.
    let samples: Vec<(f64, f64)> = (0..200)
        .map(|i| {
            let t = i as f64 * 0.1;
            (t, if (10.0..11.2).contains(&t) { 1.0 } else { 4.0 })
        })
        .collect();
    let follow = follow_secs(&samples, 10.0, 20.0, 4.0, 1.0).unwrap();
    assert!((follow - 1.2).abs() < 0.05, "follow {follow}");
    assert_eq!(follow_secs(&samples, 0.0, 9.9, 4.0, 1.0), Some(0.0));
    assert_eq!(follow_secs(&samples, 10.0, 11.0, 4.0, 1.0), None);
    assert_eq!(median_in(&samples, 12.0, 20.0), Some(4.0));
}
