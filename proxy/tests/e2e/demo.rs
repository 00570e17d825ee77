//! `weir demo`, shortened: backend, sidecar and load start in-process, the run ends on
//! its own, and the load reaches the app through the sidecar in every phase.

use weir_proxy::demo::{execute, DemoArgs};

#[test]
fn demo_runs_to_completion() {
    let args = DemoArgs { seconds: 6, capacity: 200, no_tty: true };
    let report = execute(&args).expect("the demo starts and finishes");
    // 6 s at 0.5x / 3x / 0.5x of 200 rps offers ~1000 requests.
    assert!((500..2000).contains(&report.sent()), "sent {}", report.sent());
    assert!(report.ok() > 100, "{report:?}");
    assert_eq!(report.series.len(), 6);
    // The first, calm phase is served in full whatever the build profile.
    let calm: u64 = report.series[..2].iter().map(|s| s.ok.iter().sum::<u64>()).sum();
    assert!(calm > 100, "{report:?}");
}
