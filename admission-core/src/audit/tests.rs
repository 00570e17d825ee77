use super::*;
use crate::priority::{AdmissionLevel, Priority};

fn level(b: u8, u: u8) -> AdmissionLevel {
    AdmissionLevel::new(Priority::new(b, u).expect("user in range"))
}

fn window(counts: &[(u8, u64)]) -> AuditSnapshot {
    let audit = AuditCounters::new();
    for &(b, n) in counts {
        for _ in 0..n {
            audit.record(b, Outcome::Admitted);
        }
    }
    audit.snapshot()
}

#[test]
fn records_every_outcome_and_sums_seen() {
    let audit = AuditCounters::new();
    for o in Outcome::ALL {
        audit.record(7, o);
    }
    audit.record(7, Outcome::Admitted);
    audit.record(255, Outcome::ShedOverload);
    let snap = audit.snapshot();
    let c = snap.classes[7];
    assert_eq!(
        c,
        ClassCounts {
            seen: 6,
            admitted: 2,
            shed_overload: 1,
            shed_deadline: 1,
            shed_downstream: 1,
            would_shed: 1
        }
    );
    assert_eq!(c.get(Outcome::Admitted), 2);
    assert_eq!(snap.classes[255].shed_overload, 1);
    assert_eq!(snap.total_seen(), 7);
    assert_eq!(snap.top_class(), Some(7));
    assert_eq!(snap.active_classes().map(|(b, _)| b).collect::<Vec<_>>(), vec![7, 255]);
}

#[test]
fn outcome_labels_match_the_metric_contract() {
    let labels: Vec<_> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
    assert_eq!(
        labels,
        ["admitted", "shed_overload", "shed_deadline", "shed_downstream", "would_shed"]
    );
}

#[test]
fn delta_is_the_traffic_between_snapshots() {
    let audit = AuditCounters::new();
    audit.record(1, Outcome::Admitted);
    let before = audit.snapshot();
    audit.record(1, Outcome::Admitted);
    audit.record(2, Outcome::ShedDeadline);
    let d = audit.snapshot().delta(&before);
    assert_eq!(d.classes[1].admitted, 1);
    assert_eq!(d.classes[1].seen, 1);
    assert_eq!(d.classes[2].shed_deadline, 1);
    assert_eq!(d.total_seen(), 2);
    // Reversed order saturates instead of wrapping.
    assert_eq!(before.delta(&audit.snapshot()).total_seen(), 0);
}

#[test]
fn counts_from_many_threads_are_not_lost() {
    let audit = std::sync::Arc::new(AuditCounters::new());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let audit = audit.clone();
            std::thread::spawn(move || {
                for i in 0..10_000u32 {
                    audit.record((i % 3) as u8, Outcome::ALL[t % 5]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("recorder thread");
    }
    assert_eq!(audit.snapshot().total_seen(), 40_000);
}

#[test]
fn empty_window_has_no_findings() {
    let f =
        inflation_findings(&window(&[]), |_| false, level(0, 0), true, &InflationPolicy::default());
    assert!(f.is_empty(), "{f:?}");
}

#[test]
fn healthy_mix_has_no_findings() {
    let w = window(&[(0, 100), (1, 100), (2, 100)]);
    let f = inflation_findings(&w, |b| b <= 2, level(1, 64), true, &InflationPolicy::default());
    assert!(f.is_empty(), "{f:?}");
}

#[test]
fn top_class_share_above_policy_is_flagged() {
    let w = window(&[(3, 60), (9, 40)]);
    let f =
        inflation_findings(&w, |_| true, AdmissionLevel::FULLY_OPEN, false, &Default::default());
    assert_eq!(f, vec![Finding::TopClassShare { business: 3, share: 0.6 }]);
    assert_eq!(f[0].name(), "top_class_share");
    // Exactly at the limit is allowed.
    let w = window(&[(3, 50), (9, 50)]);
    let f =
        inflation_findings(&w, |_| true, AdmissionLevel::FULLY_OPEN, false, &Default::default());
    assert!(f.is_empty(), "{f:?}");
    // A stricter policy flags it.
    let strict = InflationPolicy { top_class_share_max: 0.3 };
    let f = inflation_findings(&w, |_| true, AdmissionLevel::FULLY_OPEN, false, &strict);
    assert_eq!(f.len(), 1);
}

#[test]
fn idle_trickle_does_not_fire_share() {
    let w = window(&[(0, MIN_SEEN_FOR_SHARE - 1)]);
    let f =
        inflation_findings(&w, |_| true, AdmissionLevel::FULLY_OPEN, false, &Default::default());
    assert!(f.is_empty(), "{f:?}");
    let w = window(&[(0, MIN_SEEN_FOR_SHARE)]);
    let f =
        inflation_findings(&w, |_| true, AdmissionLevel::FULLY_OPEN, false, &Default::default());
    assert_eq!(f, vec![Finding::TopClassShare { business: 0, share: 1.0 }]);
}

#[test]
fn nothing_left_to_cut_when_level_inside_top_class() {
    let w = window(&[(2, 10), (5, 10)]);
    let p = InflationPolicy::default();
    let inside = inflation_findings(&w, |_| true, level(2, 40), true, &p);
    assert_eq!(inside, vec![Finding::NothingLeftToCut { level: level(2, 40) }]);
    assert_eq!(inside[0].name(), "nothing_left_to_cut");
    // Above the top class (everything arriving is already shed) counts too.
    assert_eq!(inflation_findings(&w, |_| true, level(1, 127), true, &p).len(), 1);
    // Still cutting a lower class: fine.
    assert!(inflation_findings(&w, |_| true, level(3, 0), true, &p).is_empty());
    // Not overloaded: fine wherever the level is.
    assert!(inflation_findings(&w, |_| true, level(2, 40), false, &p).is_empty());
}

#[test]
fn classes_no_rule_produces_are_listed_in_order() {
    let w = window(&[(0, 5), (7, 5), (200, 5), (201, 5)]);
    let f = inflation_findings(
        &w,
        |b| b == 200,
        AdmissionLevel::FULLY_OPEN,
        false,
        &InflationPolicy { top_class_share_max: 1.0 },
    );
    assert_eq!(f, vec![Finding::UnknownClasses { classes: vec![0, 7, 201] }]);
    assert_eq!(f[0].name(), "unknown_classes");
}

#[test]
fn policy_deserialises_with_default_and_rejects_unknown_fields() {
    let p: InflationPolicy = serde_json::from_str("{}").expect("empty policy");
    assert_eq!(p, InflationPolicy { top_class_share_max: 0.5 });
    let p: InflationPolicy = serde_yaml::from_str("top_class_share_max: 0.8").expect("yaml policy");
    assert_eq!(p.top_class_share_max, 0.8);
    assert!(serde_json::from_str::<InflationPolicy>(r#"{"top_share": 1}"#).is_err());
    assert!(p.validate().is_ok());
    assert!(InflationPolicy { top_class_share_max: 0.0 }.validate().is_err());
    assert!(InflationPolicy { top_class_share_max: f64::NAN }.validate().is_err());
}
