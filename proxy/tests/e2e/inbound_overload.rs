//! Under overload (a slow app, three business classes, 1.5x its capacity) weir refuses the
//! least important class first and keeps the most important one whole; in shadow mode it
//! refuses nothing but counts what it would have refused. Bounded: ~4 s of load each. The
//! tight figures (99.5% of the most important class kept) are the soak group's.

use crate::support;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use admission_core::Mode;
use support::backend::Backend;
use support::client::Http1;

/// App: 4 workers x 20 ms = 200 requests/s.
const SERVICE: Duration = Duration::from_millis(20);
const WORKERS: usize = 4;
/// Offered load per class (business 1, 2, 3): 50 + 100 + 150 = 300 requests/s, 1.5x the
/// capacity; classes 1 and 2 together fit, so the cut belongs inside class 3.
const INTERVALS: [Duration; 3] =
    [Duration::from_millis(20), Duration::from_millis(10), Duration::from_micros(6667)];

#[derive(Default)]
struct ClassCounts {
    ok: AtomicU64,
    refused: AtomicU64,
    other: AtomicU64,
}

/// Offers the three-class load for `length`; returns per-class counts (index = business - 1)
/// and whether any response lacked `x-admission-level` or showed a cut level.
async fn offer(base: &str, length: Duration) -> (Vec<Arc<ClassCounts>>, bool) {
    let client = Http1::new();
    let counts: Vec<Arc<ClassCounts>> = (0..3).map(|_| Arc::default()).collect();
    let level_cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (class, counts) in counts.iter().enumerate() {
        let (client, counts, base, level_cut) =
            (client.clone(), counts.clone(), base.to_string(), level_cut.clone());
        tasks.push(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(INTERVALS[class]);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let end = Instant::now() + length;
            let mut inflight = Vec::new();
            let mut n = 0u64;
            while Instant::now() < end {
                ticks.tick().await;
                n += 1;
                let (client, counts, level_cut) =
                    (client.clone(), counts.clone(), level_cut.clone());
                let url = format!("{base}/slow");
                let business = (class + 1).to_string();
                // Users spread over all 128 user levels so the dial has fine steps.
                let user = ((n * 37 + class as u64 * 11) % 128).to_string();
                inflight.push(tokio::spawn(async move {
                    let headers = [
                        ("x-business-priority", business.as_str()),
                        ("x-user-priority", user.as_str()),
                    ];
                    match client
                        .send(http::Method::GET, &url, &headers, support::client::empty())
                        .await
                    {
                        Ok(resp) => {
                            if resp.level() != "255.127" {
                                level_cut.store(true, Relaxed);
                            }
                            match (resp.status, resp.header("x-weir-shed")) {
                                (200, None) => counts.ok.fetch_add(1, Relaxed),
                                (503, Some(_)) => counts.refused.fetch_add(1, Relaxed),
                                _ => counts.other.fetch_add(1, Relaxed),
                            };
                        }
                        Err(_) => {
                            counts.other.fetch_add(1, Relaxed);
                        }
                    }
                }));
            }
            for t in inflight {
                let _ = t.await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    (counts, level_cut.load(Relaxed))
}

fn ratio(c: &ClassCounts) -> f64 {
    let total = c.ok.load(Relaxed) + c.refused.load(Relaxed) + c.other.load(Relaxed);
    c.ok.load(Relaxed) as f64 / total.max(1) as f64
}

/// What the ordering assertions below allow: the soak run's tight figures, or the default
/// run's generous ones (which still fail when priorities are ignored or inverted: then every
/// class is refused alike, or the important one most).
struct Bounds {
    /// The most important class's success ratio at least this.
    important_kept: f64,
    /// The least important class's success ratio at least this far below it.
    gap: f64,
    /// Class 3 refused at least this many times as often as class 2.
    three_over_two: u64,
    /// Class 3 refusals at least this many.
    three_refused: u64,
    /// Answers other than 200 and a refusal (a 504: a budget spent on a stalled machine) at
    /// most this share of a class.
    other_share: f64,
}

/// The default run's: an ordering, with margins for a busy 2-core machine running other
/// tests beside this one.
const ROBUST: Bounds = Bounds {
    important_kept: 0.9,
    gap: 0.1,
    three_over_two: 1,
    three_refused: 20,
    other_share: 0.02,
};

/// The soak group's: the figures the design promises at 1.5x (run alone: `scripts/soak`).
const TIGHT: Bounds = Bounds {
    important_kept: 0.995,
    gap: 0.3,
    three_over_two: 2,
    three_refused: 100,
    other_share: 0.0,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_important_class_is_refused_first_and_the_most_important_is_kept() {
    refused_in_priority_order(ROBUST).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "soak"]
async fn least_important_class_is_refused_first_and_the_most_important_is_kept_soak() {
    refused_in_priority_order(TIGHT).await;
}

async fn refused_in_priority_order(bounds: Bounds) {
    let app = Backend::start().await;
    app.set_service_time(SERVICE);
    let weir = support::sidecar(app.addr, |c| {
        c.inbound.max_inflight = WORKERS;
        // Short windows so the test settles in a few seconds.
        c.admission.window = Duration::from_millis(200);
    });
    let base = format!("http://{}", weir.inbound_addr());
    let (counts, level_cut) = offer(&base, Duration::from_secs(4)).await;
    let report: Vec<_> = counts
        .iter()
        .map(|c| (c.ok.load(Relaxed), c.refused.load(Relaxed), c.other.load(Relaxed)))
        .collect();
    eprintln!("per class (ok, refused, other): {report:?}");
    for (ok, refused, other) in &report {
        let total = (ok + refused + other) as f64;
        assert!(*other as f64 <= bounds.other_share * total, "successes and refusals: {report:?}");
        assert!(ok + refused > 150, "the load was offered");
    }
    assert!(level_cut, "the admission level moved and responses said so");
    let (c1, c2, c3) = (ratio(&counts[0]), ratio(&counts[1]), ratio(&counts[2]));
    assert!(c1 >= bounds.important_kept, "most important class kept: {c1:.4}");
    assert!(c3 < c1 - bounds.gap, "least important class refused: {c3:.3} vs {c1:.3}");
    assert!(
        report[2].1 > bounds.three_over_two * report[1].1,
        "class 3 refused before class 2: {report:?}"
    );
    assert!(report[2].1 > bounds.three_refused, "class 3 carries the cut: {report:?}");
    assert!(c2 > c3, "class 2 fares better than class 3: {c2:.3} vs {c3:.3}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_refuses_nothing_but_counts() {
    let app = Backend::start().await;
    app.set_service_time(SERVICE);
    let weir = support::sidecar(app.addr, |c| {
        c.inbound.max_inflight = WORKERS;
        c.inbound.max_queued = 4;
        c.admission.window = Duration::from_millis(200);
        c.admission.mode = Mode::Shadow;
    });
    let base = format!("http://{}", weir.inbound_addr());
    let (counts, _) = offer(&base, Duration::from_secs(2)).await;
    for c in &counts {
        assert_eq!(c.refused.load(Relaxed), 0, "shadow refuses nothing");
        assert_eq!(c.other.load(Relaxed), 0);
    }
    let audit = weir.shared().audit.snapshot();
    let would: u64 = audit.classes.iter().map(|c| c.would_shed).sum();
    let shed: u64 = audit.classes.iter().map(|c| c.shed_overload + c.shed_deadline).sum();
    assert!(would > 0, "would-shed decisions were counted");
    assert_eq!(shed, 0);
    let metrics = support::metrics_text(weir.admin_addr()).await;
    assert!(metrics.contains("outcome=\"would_shed\""), "exported");
}
