use super::*;
use crate::load::Ending;

/// Evenly spaced requests of one class and ending.
fn run(class: u16, from: f64, to: f64, rate: f64, ending: Ending, latency_ms: f64) -> Vec<Event> {
    let n = ((to - from) * rate).round() as usize;
    (0..n).map(|i| Event { class, at_secs: from + i as f64 / rate, latency_ms, ending }).collect()
}

fn phases() -> Vec<Phase> {
    [50.0, 300.0, 50.0]
        .into_iter()
        .map(|rate_per_sec| Phase { rate_per_sec, duration: Duration::from_secs(5) })
        .collect()
}

/// Capacity 100/s, S = 10 ms. Low phase clean; in the spike the critical class is all
/// served; the first 0.5 s of the spike queue (slow answers, some time out), then the
/// cut holds; after the drop background is refused for 0.7 s more.
fn synthetic_step() -> Vec<Event> {
    let mut e = run(0, 0.0, 5.0, 10.0, Ending::Ok, 12.0);
    e.extend(run(2, 0.0, 5.0, 40.0, Ending::Ok, 12.0));
    // Spike: critical 30/s all ok; background 270/s: 70/s ok, the rest refused.
    e.extend(run(0, 5.0, 10.0, 30.0, Ending::Ok, 15.0));
    e.extend(run(2, 5.0, 5.5, 70.0, Ending::Ok, 250.0));
    e.extend(run(2, 5.0, 5.5, 40.0, Ending::TimedOut, 500.0));
    e.extend(run(2, 5.0, 5.5, 160.0, Ending::Refused, 1.0));
    e.extend(run(2, 5.5, 10.0, 70.0, Ending::Ok, 20.0));
    e.extend(run(2, 5.5, 10.0, 200.0, Ending::Refused, 1.0));
    // After the drop.
    e.extend(run(0, 10.0, 15.0, 10.0, Ending::Ok, 12.0));
    e.extend(run(2, 10.0, 10.7, 40.0, Ending::Refused, 1.0));
    e.extend(run(2, 10.7, 15.0, 40.0, Ending::Ok, 12.0));
    e
}

#[test]
fn step_metrics_of_a_synthetic_step() {
    let m = step_metrics(&synthetic_step(), &phases(), 100.0, 10.0, 3);
    let settle = m.settle_secs.expect("settles");
    assert!((0.45..=0.65).contains(&settle), "settle {settle}");
    let recovery = m.recovery_secs.expect("recovers");
    assert!((0.65..=0.75).contains(&recovery), "recovery {recovery}");
    // 20 timeouts against 80 + 900 + 28 refusals.
    let share = m.timeout_share.unwrap();
    assert!((share - 20.0 / 1028.0).abs() < 1e-3, "timeout share {share}");
    assert_eq!((m.timed_out, m.refused), (20, 1008));
    // From the 2nd second of the spike only the fast answers count.
    assert_eq!(m.admitted_p99_ms, Some(20.0));
    assert_eq!(m.admitted_p50_ms, Some(20.0));
    // 150 critical + 35 + 315 background served over 5 s at capacity 100/s.
    assert!((m.high_goodput_ratio - 1.0).abs() < 0.01, "goodput {}", m.high_goodput_ratio);
    assert_eq!(m.top_class_success_high, 1.0);
    assert_eq!(m.classes[0].recovery_secs, Some(0.0));
    assert_eq!(m.classes[1].success_after_drop, 1.0, "a class that sent nothing");
    assert_eq!(m.worst_after_drop(), 1.0);
    assert!(m.classes[2].success_high < 0.3);
}

#[test]
fn a_class_refused_after_the_drop_shows() {
    let mut events = synthetic_step();
    // Background stays a third refused to the end, as with the dagor law.
    events.extend(run(2, 10.0, 15.0, 20.0, Ending::Refused, 1.0));
    let m = step_metrics(&events, &phases(), 100.0, 10.0, 3);
    assert_eq!(m.recovery_secs, None);
    assert_eq!(m.classes[2].recovery_secs, None);
    assert!(m.worst_after_drop() < 0.7, "{}", m.worst_after_drop());
    assert_eq!(fmt_secs(m.recovery_secs), "never");
}

#[test]
fn timeline_buckets_by_scheduled_time() {
    let t = timeline(&synthetic_step(), 3, 0.25);
    assert_eq!(t.len(), 60);
    let spike_start = &t[20];
    assert_eq!(spike_start.at_secs, 5.0);
    assert!(spike_start.timed_out[2] > 0 && spike_start.refused[2] > 0);
    assert_eq!(t[0].refused.iter().sum::<u64>(), 0);
    assert!((t[0].ok_mean_ms - 12.0).abs() < 1e-9);
}

#[test]
fn mixes_are_named_by_their_shares() {
    assert_eq!(Mix::new([0.2, 0.3, 0.5]).name, "20/30/50");
}
