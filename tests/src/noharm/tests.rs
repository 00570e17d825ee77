use super::*;

fn run(
    contender: &str,
    sent: u64,
    ok: u64,
    refused: u64,
    rps: f64,
    p50: f64,
    p99: f64,
) -> RunStats {
    RunStats {
        contender: contender.into(),
        sent,
        ok,
        refused,
        throughput_rps: rps,
        p50_ms: p50,
        p99_ms: p99,
        ..RunStats::default()
    }
}

#[test]
fn the_p99_bound_is_five_ms_or_ten_percent_whichever_is_larger() {
    assert_eq!(p99_bound_ms(1.0), 6.0);
    assert!((p99_bound_ms(50.0) - 55.0).abs() < 1e-9);
    assert!((p99_bound_ms(200.0) - 220.0).abs() < 1e-9);
}

#[test]
fn the_verdict_needs_every_target() {
    let direct = run("direct", 1000, 1000, 0, 100.0, 10.0, 40.0);
    let good = run("weir", 1000, 1000, 0, 99.0, 10.2, 44.0);
    let v = verdict(&direct, &good, true);
    assert!(v.pass, "{v:?}");
    assert_eq!(v.unserved_over_direct, 0);

    let refused = run("weir", 1000, 999, 1, 99.9, 10.0, 40.0);
    let v = verdict(&direct, &refused, true);
    assert!(!v.zero_refusals && !v.pass);
    assert_eq!(v.unserved_over_direct, 1);

    let slow = run("weir", 1000, 1000, 0, 100.0, 10.0, 46.0);
    assert!(!verdict(&direct, &slow, true).p99_ok);

    let fewer = run("weir", 1000, 1000, 0, 97.0, 10.0, 40.0);
    assert!(!verdict(&direct, &fewer, true).throughput_ok);
    // 0.98 as reported is 0.98.
    let edge = run("weir", 1000, 1000, 0, 97.96, 10.0, 40.0);
    assert!(verdict(&direct, &edge, true).throughput_ok);
    // Idle-then-burst: the rate is not judged.
    assert!(verdict(&direct, &fewer, false).pass);
}

#[test]
fn rounds_combine_into_medians_and_sums() {
    let a = run("weir", 10, 9, 1, 100.0, 1.0, 5.0);
    let b = run("weir", 10, 10, 0, 110.0, 2.0, 7.0);
    let c = run("weir", 10, 10, 0, 90.0, 3.0, 6.0);
    let all = combine(&[&a, &b, &c]);
    assert_eq!((all.sent, all.ok, all.refused), (30, 29, 1));
    assert_eq!(all.throughput_rps, 100.0);
    assert_eq!(all.p50_ms, 2.0);
    assert_eq!(all.p99_ms, 6.0);
    assert_eq!(combine(&[]).sent, 0);
}

#[test]
fn labels_and_bursts() {
    assert_eq!(app_label(8, Duration::from_millis(10)), "8x10ms");
    assert_eq!(app_label(64, Duration::from_secs(1)), "64x1s");
    assert_eq!(
        LoadCase::idle_burst_for(64),
        LoadCase::IdleBurst { warmup: 10, burst: 20, bursts: 3, idle_ms: 1000 }
    );
    assert!(matches!(LoadCase::idle_burst_for(1), LoadCase::IdleBurst { burst: 2, .. }));
    assert_eq!(fmt_level(LEVEL_OPEN), "255.127");
    let slow = AppCase::model(64, Duration::from_secs(1), vec![]);
    assert_eq!(slow.budget(), Duration::from_secs(4));
    assert_eq!(
        AppCase::model(1, Duration::from_millis(1), vec![]).budget(),
        Duration::from_millis(500)
    );
}

#[test]
fn the_middle_hop_ideal_is_all_of_y_and_bs_capacity_of_x() {
    let c =
        middle_hop::MiddleHopConfig::issue_20(Duration::from_secs(10), Duration::from_secs(2), 7);
    assert_eq!(c.a_capacity(), 400.0);
    assert_eq!(c.b_capacity(), 50.0);
    assert_eq!(c.x_rate(), 150.0);
    assert_eq!(c.y_rate(), 200.0);
    assert_eq!(c.ideal_goodput(), 250.0);
}

fn sample(at: f64, limit: u64, level: u16, overloaded: bool) -> StatusSample {
    let doc = serde_json::json!({
        "level": fmt_level(level), "level_compound": level, "overloaded": overloaded,
        "mode": "enforce", "mean_queuing_ms": null, "window": null, "windows_closed": 0,
        "capacity_per_sec": null, "inflight": 1, "max_inflight": limit, "queue_depth": 2,
        "max_queued": 1024, "draining": false, "table_version": 1
    });
    StatusSample::parse(at, &serde_json::to_vec(&doc).unwrap()).unwrap()
}

#[test]
fn the_limit_is_summarised_from_status_samples() {
    assert!(LimitStats::from_samples(&[]).is_none());
    let samples = [
        sample(0.1, 256, LEVEL_OPEN, false),
        sample(0.2, 1, 300, true),
        sample(0.3, 8, LEVEL_OPEN, false),
    ];
    let l = LimitStats::from_samples(&samples).unwrap();
    assert_eq!((l.min, l.median, l.max), (1, 8, 256));
    assert!((l.overloaded_share - 1.0 / 3.0).abs() < 1e-9);
    assert_eq!(l.min_level, 300);
    assert_eq!(l.max_queue_depth, 2);
    assert_eq!(l.series.len(), 3);
}

#[test]
fn the_report_renders_every_part() {
    let direct = run("direct", 100, 100, 0, 10.0, 1.0, 2.0);
    let mut weir = run("weir", 100, 97, 3, 9.7, 1.0, 9.0);
    weir.refused_by_reason.insert("overload".into(), 3);
    weir.limit = LimitStats::from_samples(&[sample(0.1, 1, 300, true)]);
    let case = CaseResult {
        app: "8x10ms".into(),
        load: LoadCase::Steady { multiple: 0.5 },
        offered_rps: 400.0,
        budget: Duration::from_millis(500),
        verdict: verdict(&direct, &weir, true),
        rounds: vec![direct.clone(), weir.clone()],
        direct,
        weir,
    };
    let result = NoHarmResult {
        config: NoHarmConfig {
            apps: vec![],
            run: Duration::from_secs(4),
            warmup: Duration::from_secs(1),
            rounds: 1,
            protocol: Protocol::Http1,
            mix: [0.1, 0.3, 0.6],
            seed: 7,
            middle_hop: None,
            async_middle_hop: None,
            silence: None,
            weir_extra: String::new(),
            weir_bin: PathBuf::from("weir"),
        },
        cases: vec![case],
        middle_hop: None,
        async_middle_hop: None,
        silence: None,
    };
    let md = markdown(&result);
    assert!(md.contains("**0 of 1 cases meet every target.**"), "{md}");
    assert!(md.contains("| 8x10ms | steady 0.5x | 400 | 3 (overload 3) |"), "{md}");
    assert!(md.contains("| 1/1/1 | 100% | 2.44 | **no** |"), "{md}");
}

#[test]
fn the_async_middle_hop_bursts_y_after_the_calm_and_reads_the_ceiling_from_weirs_log() {
    use super::async_middle_hop::{log_series, AsyncMiddleHopConfig};
    use std::time::UNIX_EPOCH;
    let c = AsyncMiddleHopConfig::standard(Duration::from_secs(12), Duration::from_secs(2), 7);
    let phases = c.y_phases();
    let total: Duration = phases.iter().map(|p| p.duration).sum();
    assert_eq!(total, c.run);
    assert_eq!(phases[0].rate_per_sec, c.y_calm_rps);
    assert_eq!(phases[1].rate_per_sec, c.y_burst_rps);
    assert!(!c.in_burst(3.9) && c.in_burst(4.0) && c.in_burst(4.49) && !c.in_burst(4.5));
    assert!(c.in_burst(5.6) && !c.in_burst(6.1));
    // 07:12:13.5 UTC on some day; the log line half a second later.
    let start = UNIX_EPOCH + Duration::from_secs_f64(20_000.0 * 86_400.0 + 7.0 * 3600.0 + 733.5);
    let log = "2026-12-02T07:12:14.000000Z DEBUG weir::limit: worker bound ceiling=22 lent=3 held=9 queued=0\n\
               2026-12-02T07:12:14.100000Z DEBUG weir::limit: on=\"tick\" from=256 to=23 held=8\n";
    assert_eq!(log_series(log, start, "worker bound", "ceiling="), vec![(0.5, 22)]);
    assert_eq!(log_series(log, start, " from=", " to="), vec![(0.6, 23)]);
}
