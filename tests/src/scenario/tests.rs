use super::*;
use crate::load::SecondReport;

fn second(s: u32, ok: u64, mean_ms: f64, unserved: u64) -> SecondReport {
    SecondReport {
        second: s,
        sent: vec![ok + unserved],
        ok: vec![ok],
        refused: vec![unserved],
        timed_out: vec![0],
        errors: vec![0],
        ok_mean_ms: mean_ms,
    }
}

fn config() -> ScenarioConfig {
    ScenarioConfig {
        backend: BackendConfig::new(8, Duration::from_millis(20)),
        loads: vec![],
        load_duration: Duration::from_secs(1),
        warmup: Duration::ZERO,
        step: vec![0.5, 3.0, 0.5],
        step_phase: Duration::from_secs(5),
        contenders: vec![],
        protocol: Protocol::Http1,
        deadline: Duration::from_millis(500),
        queuing_threshold: Duration::from_millis(20),
        options: contender::Options {
            weir_bin: "weir".into(),
            max_inflight: 8,
            pin_cpu: None,
            protocol: Protocol::Http1,
            queue_timeout: Duration::from_millis(500),
        },
    }
}

#[test]
fn step_analysis_finds_settle_and_recovery() {
    let capacity = 400.0;
    let mut series = Vec::new();
    for s in 0..5 {
        series.push(second(s, 200, 21.0, 0));
    }
    // Step up: two seconds of deep queuing, then good.
    series.push(second(5, 400, 300.0, 800));
    series.push(second(6, 390, 90.0, 810));
    for s in 7..10 {
        series.push(second(s, 395, 30.0, 805));
    }
    // Step down: one second still refusing, then clean.
    series.push(second(10, 200, 25.0, 20));
    for s in 11..15 {
        series.push(second(s, 200, 21.0, 0));
    }
    let phases: Vec<Phase> = [0.5, 3.0, 0.5]
        .iter()
        .map(|m| Phase { rate_per_sec: capacity * m, duration: Duration::from_secs(5) })
        .collect();
    let a = StepAnalysis::of(&series, &phases, capacity, &config());
    assert_eq!(a.goodput_settle_secs, Some(0.0));
    assert_eq!(a.settle_secs, Some(2.0));
    assert_eq!(a.recover_secs, Some(1.0));
    assert!(a.high_phase_goodput_ratio > 0.95);
}

#[test]
fn proxy_configs_carry_the_priority_queue_and_the_law() {
    let c = config();
    let listen = "127.0.0.1:1".parse().unwrap();
    let app = "127.0.0.1:2".parse().unwrap();
    let haproxy = contender::haproxy_config(listen, app, &c.options);
    assert!(haproxy.contains("set-priority-class req.hdr_val(x-business-priority)"));
    assert!(haproxy.contains("maxconn 8") && haproxy.contains("timeout queue 500ms"));
    let weir = contender::weir_config(
        Kind::WeirDagor,
        listen,
        app,
        "127.0.0.1:3".parse().unwrap(),
        &c.options,
    );
    assert!(weir.contains("law: dagor") && weir.contains("max_inflight: 8"));
    let default =
        contender::weir_config(Kind::Weir, listen, app, "127.0.0.1:3".parse().unwrap(), &c.options);
    assert!(!default.contains("law:"));
}
