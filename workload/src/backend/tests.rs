use super::*;
use crate::load::{self, LoadSpec, Phase};

fn config(workers: usize, service_ms: u64) -> BackendConfig {
    BackendConfig::new(workers, Duration::from_millis(service_ms))
}

/// 4 workers x 20 ms = 200 rps. Offered 2x for 2 s, the backend completes about its
/// capacity, no more, and works on requests whose clients already gave up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_its_capacity_and_counts_wasted_work() {
    let backend = CapacityBackend::start(config(4, 20)).await.unwrap();
    let phases = vec![Phase { rate_per_sec: 400.0, duration: Duration::from_secs(2) }];
    let report = load::run(LoadSpec::new(backend.addr(), phases)).await.unwrap();
    let s = backend.snapshot();
    // The run lasts ~2.5 s (last requests time out after 500 ms): at most 200 x 2.5.
    assert!((240..=520).contains(&s.completed), "completed {}", s.completed);
    assert!(report.ok() <= s.completed);
    assert!(
        report.classes.iter().map(|c| c.timed_out).sum::<u64>() > 0,
        "2x overload must time out"
    );
    assert!(s.started_late > 0 && s.completed_late > 0, "{s:?}");
    assert!(s.wasted_busy_seconds > 0.0 && s.wasted_busy_seconds <= s.busy_seconds);
    assert!(s.peak_outstanding > 4, "a direct overload queues in the app: {s:?}");
}

/// Below capacity everything succeeds and nothing is wasted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_capacity_wastes_nothing() {
    let backend = CapacityBackend::start(config(8, 10)).await.unwrap();
    let phases = vec![Phase { rate_per_sec: 100.0, duration: Duration::from_secs(1) }];
    let report = load::run(LoadSpec::new(backend.addr(), phases)).await.unwrap();
    let s = backend.snapshot();
    assert_eq!(report.ok(), report.sent(), "{report:?}");
    assert_eq!(s.completed, report.sent());
    assert_eq!(s.completed_late, 0);
    assert!(s.mean_queue_wait_ms < 10.0, "{s:?}");
    assert!(s.peak_outstanding >= 1 && s.peak_outstanding <= report.sent(), "{s:?}");
}

/// A reset abandons the queued backlog at once and zeroes the counters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_drops_backlog() {
    let backend = CapacityBackend::start(config(1, 200)).await.unwrap();
    let phases = vec![Phase { rate_per_sec: 200.0, duration: Duration::from_millis(200) }];
    let run = load::LoadRun::start(LoadSpec::new(backend.addr(), phases)).unwrap();
    // Bounded poll until the backlog has formed.
    for _ in 0..100 {
        if backend.snapshot().received >= 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    backend.reset();
    let report = run.finish().await.unwrap();
    assert!(report.refused() > 0, "backlog answered 503 after reset: {report:?}");
    // The fresh generation counts only what arrived after the reset.
    assert!(backend.snapshot().received < report.sent());
}

#[test]
fn service_changes_and_stalls_shift_the_finish() {
    let ms = Duration::from_millis;
    let mut c = config(4, 10);
    c.service_changes = vec![
        ServiceChange { at: ms(10_000), service_time: ms(20) },
        ServiceChange { at: ms(20_000), service_time: ms(10) },
    ];
    assert_eq!(c.service_time_at(ms(9_999)), ms(10));
    assert_eq!(c.service_time_at(ms(10_000)), ms(20));
    assert_eq!(c.service_time_at(ms(25_000)), ms(10));
    c.stall = Some(Stall { from: ms(5_000), to: ms(15_000) });
    // Before, across the start of, inside and after the stall.
    assert_eq!(c.finish_after_stall(ms(1_000), ms(1_010)), ms(1_010));
    assert_eq!(c.finish_after_stall(ms(4_995), ms(5_005)), ms(15_005));
    assert_eq!(c.finish_after_stall(ms(7_000), ms(7_010)), ms(15_010));
    assert_eq!(c.finish_after_stall(ms(15_000), ms(15_010)), ms(15_010));
}
