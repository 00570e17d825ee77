use admission_core::audit::{AuditCounters, Outcome};

use super::*;

const SECOND: Duration = Duration::from_secs(1);

#[test]
fn windows_reach_back_to_the_right_sample() {
    let t0 = Instant::now();
    let counters = AuditCounters::new();
    let history = AuditHistory::new(10 * SECOND, t0);
    // One request per second for 15 minutes, sampled every 10 s.
    for s in 1..=900u32 {
        counters.record(200, Outcome::Admitted);
        if s % 10 == 0 {
            history.record(t0 + s * SECOND, counters.snapshot());
        }
    }
    let now = t0 + 900 * SECOND;
    let current = counters.snapshot();
    let (minute, covered) = history.window(&current, now, WINDOWS[0].1);
    assert_eq!((minute.total_seen(), covered), (60, 60 * SECOND));
    let (ten, covered) = history.window(&current, now, WINDOWS[1].1);
    assert_eq!((ten.total_seen(), covered), (600, 600 * SECOND));
    // Bounded memory: about 10 min / 10 s samples, not 15 min worth.
    let kept = history.samples.lock().unwrap().len();
    assert!((61..=63).contains(&kept), "kept {kept} samples");
}

#[test]
fn young_history_covers_everything_since_start() {
    let t0 = Instant::now();
    let counters = AuditCounters::new();
    let history = AuditHistory::new(10 * SECOND, t0);
    for _ in 0..5 {
        counters.record(3, Outcome::ShedDeadline);
    }
    history.record(t0 + 10 * SECOND, counters.snapshot());
    counters.record(3, Outcome::Admitted);
    let (w, covered) = history.window(&counters.snapshot(), t0 + 15 * SECOND, WINDOWS[0].1);
    assert_eq!((w.total_seen(), covered), (6, 15 * SECOND));
    assert_eq!(w.classes[3].shed_deadline, 5);
}
