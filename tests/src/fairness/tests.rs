use super::*;

fn event(user: u32, sent_unix_us: u64, ok: bool) -> UserEvent {
    UserEvent { user, sent_unix_us, ending: if ok { Ending::Ok } else { Ending::Refused } }
}

#[test]
fn the_table_of_the_run_parses_with_its_schedule() {
    for (schedule, expected) in [
        (Schedule::Balanced, admission_core::table::UserSchedule::Balanced),
        (Schedule::Independent, admission_core::table::UserSchedule::Independent),
    ] {
        let yaml = table_yaml(schedule, Duration::from_secs(4), 30);
        let table = admission_core::table::PriorityTable::from_yaml(&yaml).unwrap();
        assert_eq!(table.user.schedule, expected);
        assert_eq!(table.user.cycle_periods, 30);
        assert_eq!(table.user.rekey_every, Duration::from_secs(4));
        assert!(table.rules.is_empty(), "one business class");
    }
}

#[test]
fn the_window_starts_on_a_boundary_after_the_lead_in() {
    let s = |now: f64, lead: u64, unit: u64| {
        window_start(
            Duration::from_secs_f64(now),
            Duration::from_secs(lead),
            Duration::from_secs(unit),
        )
        .as_secs_f64()
    };
    assert_eq!(s(1000.5, 10, 120), 1080.0);
    assert_eq!(s(1070.0, 10, 120), 1080.0);
    assert_eq!(s(1070.5, 10, 120), 1200.0);
    assert_eq!(s(1000.5, 10, 4), 1012.0);
}

#[test]
fn per_user_ratios_and_refused_sets() {
    let s = 1_000_000u64; // one second in microseconds
    let from = 100 * s;
    let mut events = Vec::new();
    // Period 0: user 0 refused, user 1 admitted; period 1: the other way round; period 2:
    // both admitted. Two requests per user and period, half a second apart.
    for (p, refused) in [(0u64, [true, false]), (1, [false, true]), (2, [false, false])] {
        for (u, r) in refused.iter().enumerate() {
            for k in 0..2 {
                events.push(event(u as u32, from + p * 2 * s + 200_000 + k * s, !r));
            }
        }
    }
    // Outside the window and an unknown user: ignored.
    events.push(event(0, from - 1, false));
    events.push(event(7, from + 1, false));
    // Within the guard of a boundary: counts for the ratio, not for the sets.
    events.push(event(1, from + 2 * s - 10_000, true));
    let a = analyse(&events, 2, Duration::from_micros(from), Duration::from_secs(2), 3);
    assert_eq!(a.sent, 13);
    assert_eq!(a.user_success, [4.0 / 6.0, 5.0 / 7.0]);
    assert_eq!(a.boundaries.len(), 2);
    assert_eq!(a.boundaries[0].jaccard, 0.0, "the refused user swapped");
    assert_eq!((a.boundaries[1].refused_before, a.boundaries[1].refused_after), (1, 0));
    assert_eq!(a.period_success, [0.5, 0.5, 1.0]);
    assert_eq!(a.jaccard_quantiles, [0.0, 0.0, 0.0]);
}

#[test]
fn spread_quantiles_and_the_largest_deviation() {
    let ratios: Vec<f64> = (0..=100).map(|i| 0.30 + 0.001 * f64::from(i)).collect();
    let s = spread(&ratios);
    assert_eq!(s.users, 101);
    assert!((s.mean_pct - 35.0).abs() < 1e-9);
    assert!((s.min_pct - 30.0).abs() < 1e-9 && (s.max_pct - 40.0).abs() < 1e-9);
    assert!((s.median_pct - 35.0).abs() < 1e-9 && (s.p5_pct - 30.5).abs() < 1e-9);
    assert!((s.max_abs_dev_pp - 5.0).abs() < 1e-9);
    assert_eq!(s.users_beyond_5pp, 0);
    assert_eq!(spread(&[0.2, 0.5]).users_beyond_5pp, 2);
}
