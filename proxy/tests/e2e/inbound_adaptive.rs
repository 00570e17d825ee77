//! The control loop v2 through the real sidecar: a queued request is refused when its
//! budget runs out (not when it reaches the head), a request that would wait longer than
//! its budget is refused at the door, a stalled app reads as overloaded, and the adaptive
//! in-flight limit is the default and moves (a sidecar with the shipped configuration).

use crate::support;

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::backend::Backend;
use support::client::Http1;
use support::eventually;
use weir_harness::backend::{BackendConfig, CapacityBackend};

const WAIT: Duration = Duration::from_secs(10);

/// The app stalls (every slot held): queued requests with a 300 ms budget get their 503
/// by their deadline, not after the stall; `/v1/status` says overloaded; when the app is
/// back, requests are served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_app_answers_queued_requests_by_their_deadline() {
    let app = Backend::start().await;
    let weir = support::sidecar(app.addr, |c| {
        c.inbound.max_inflight = 2;
        c.inbound.task_timeout = Duration::from_secs(10);
    });
    let base = format!("http://{}", weir.inbound_addr());
    let client = Http1::new();
    let holders: Vec<_> = (0..2)
        .map(|i| {
            let (c, url) = (client.clone(), format!("{base}/hold?h={i}"));
            tokio::spawn(async move { c.get(&url, &[]).await })
        })
        .collect();
    assert!(eventually(WAIT, || app.seen_path("/hold").len() == 2).await, "app stalled");
    let started = Instant::now();
    let queued: Vec<_> = (0..4)
        .map(|i| {
            let (c, url) = (client.clone(), format!("{base}/echo?q={i}"));
            tokio::spawn(async move {
                let resp = c.get(&url, &[("x-request-timeout-ms", "300")]).await;
                (resp, started.elapsed())
            })
        })
        .collect();
    for q in queued {
        // Refused when the budget ran out, not at the head after the stall: the stall lasts
        // until the holders are released below, so one that waited for it never comes.
        let (resp, took) = tokio::time::timeout(WAIT, q)
            .await
            .expect("refused by the budget, not after the stall")
            .unwrap();
        assert_eq!(resp.status, 503, "{resp:?}");
        assert_eq!(resp.header("x-weir-shed"), Some("deadline"));
        eprintln!("a queued request with a 300 ms budget refused after {took:?}");
    }
    // Refused by this sidecar while queued (its own audit counters), not callers who left.
    let refused: u64 = weir.shared().audit.snapshot().classes.iter().map(|c| c.shed_deadline).sum();
    assert_eq!(refused, 4, "the 4 refusals counted as shed at their deadline");
    // Nothing left the queue for the app, yet the sidecar sees the stall: waiters aged
    // past the threshold count in the window.
    let more: Vec<_> = (0..3)
        .map(|i| {
            let (c, url) = (client.clone(), format!("{base}/echo?more={i}"));
            tokio::spawn(async move { c.get(&url, &[("x-request-timeout-ms", "3000")]).await })
        })
        .collect();
    assert!(eventually(WAIT, || weir.status().engine.overloaded).await, "stall seen");
    app.release(2);
    for h in holders {
        assert_eq!(h.await.unwrap().status, 200);
    }
    for m in more {
        let resp = m.await.unwrap();
        assert!(resp.status == 200 || resp.status == 503, "{resp:?}");
    }
    let after = client.get(&format!("{base}/echo?after"), &[]).await;
    assert_eq!(after.status, 200, "served once the app is back: {after:?}");
}

/// With a queue in front of it, a request whose budget cannot cover the wait is refused at
/// once with `overload` rather than queued and refused later (`deadline`, once its budget has
/// run out). The default run: a 500 ms budget against about 2 s of queue, refused within
/// half the budget; the soak run: 100 ms against 1 s, within 90 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_cannot_wait_long_enough_is_refused_at_the_door() {
    refused_at_the_door(Door { waiters: 40, queued: 20, budget_ms: 500, within_ms: 250 }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "soak"]
async fn a_request_that_cannot_wait_long_enough_is_refused_at_the_door_soak() {
    refused_at_the_door(Door { waiters: 20, queued: 10, budget_ms: 100, within_ms: 90 }).await;
}

/// Waiters at 50 ms each, at least `queued` of them in the queue, then one request with a
/// `budget_ms` budget, which must be refused within `within_ms`.
struct Door {
    waiters: usize,
    queued: u64,
    budget_ms: u64,
    within_ms: u64,
}

async fn refused_at_the_door(door: Door) {
    let app = Backend::start().await;
    app.set_service_time(Duration::from_millis(50));
    let weir = support::sidecar(app.addr, |c| {
        c.inbound.max_inflight = 1;
        c.inbound.task_timeout = Duration::from_secs(10);
    });
    let base = format!("http://{}", weir.inbound_addr());
    let client = Http1::new();
    // Teach weir the app's rate and time: 50 ms per request, one at a time.
    for i in 0..6 {
        let resp = client.get(&format!("{base}/slow?warm={i}"), &[]).await;
        assert_eq!(resp.status, 200);
    }
    // The waiters at 50 ms each: `queued` of them waiting is `queued` x 50 ms of queue.
    let waiters: Vec<_> = (0..door.waiters)
        .map(|i| {
            let (c, url) = (client.clone(), format!("{base}/slow?w={i}"));
            tokio::spawn(async move { c.get(&url, &[]).await })
        })
        .collect();
    let queued = door.queued;
    assert!(eventually(WAIT, || weir.status().queue_depth >= queued).await, "a queue formed");
    let started = Instant::now();
    let budget = door.budget_ms.to_string();
    let url = format!("{base}/echo?door");
    let refused = client.get(&url, &[("x-request-timeout-ms", &budget)]).await;
    let took = started.elapsed();
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(refused.header("x-weir-shed"), Some("overload"), "{refused:?}");
    let bound = Duration::from_millis(door.within_ms);
    assert!(took < bound, "refused at the door, not after a wait: {took:?}");
    for w in waiters {
        let resp = w.await.unwrap();
        assert!(resp.status == 200 || resp.status == 503, "{resp:?}");
    }
}

/// The adaptive limit is the shipped default: a sidecar started from the embedded default
/// configuration (nothing about the limit changed: `max_inflight` 256 is its ceiling) serves
/// everything an app below its capacity gets, and, once the app queues work inside itself (32
/// callers, 2 workers), holds the limit below the ceiling so the queue forms in weir, where
/// its signal sees it. A fixed limit, the default were it off, stays at the ceiling: the
/// second half fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adaptive_limit_is_on_by_default_and_serves_everything_below_capacity() {
    // 2 workers x 20 ms: 100 requests/s, a FIFO inside the app beyond two at once.
    let app =
        CapacityBackend::start(BackendConfig::new(2, Duration::from_millis(20))).await.unwrap();
    let weir = support::sidecar_with_defaults(app.addr(), |_| {});
    let shipped = weir_proxy::SidecarConfig::load(None).expect("embedded default");
    let ceiling = shipped.inbound.max_inflight as u64;
    let base = format!("http://{}", weir.inbound_addr());
    let client = Http1::new();
    // One caller at a time: at most half the app's capacity, nothing queues anywhere.
    let started = Instant::now();
    let mut served = 0;
    while started.elapsed() < Duration::from_millis(1000) {
        let resp = client.get(&format!("{base}/below?n={served}"), &[]).await;
        assert_eq!(resp.status, 200, "below capacity everything is served: {resp:?}");
        served += 1;
    }
    // 32 callers in closed loops: 30 of them wait inside the app unless weir's limit holds
    // them back. Refusals and spent budgets are expected here; only the limit is watched.
    let stop = Arc::new(AtomicBool::new(false));
    let callers: Vec<_> = (0..32)
        .map(|i| {
            let (c, stop, url) = (client.clone(), stop.clone(), format!("{base}/busy?c={i}"));
            tokio::spawn(async move {
                while !stop.load(Relaxed) {
                    let _ = c.send(http::Method::GET, &url, &[], support::client::empty()).await;
                }
            })
        })
        .collect();
    let cut = eventually(Duration::from_secs(20), || weir.status().max_inflight < ceiling).await;
    stop.store(true, Relaxed);
    for c in callers {
        c.await.unwrap();
    }
    let limit = weir.status().max_inflight;
    eprintln!("{served} served one at a time; with 32 callers the limit went to {limit}");
    assert!(cut, "the limit stayed at the ceiling {ceiling} while the app queued 30 requests");
    let text = support::metrics_text(weir.admin_addr()).await;
    assert!(support::sample(&text, "weir_inflight_limit") >= 1.0, "metric exported");
}

/// With the egress role on, the app calls downstreams and its response time includes
/// theirs: the in-flight limit stays at `max_inflight` instead of shrinking (and shedding
/// here) when they are slow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adaptive_limit_is_off_when_the_egress_role_is_on() {
    let app = Backend::start().await;
    app.set_service_time(Duration::from_millis(20));
    let weir = support::sidecar(app.addr, |c| {
        c.inbound.adaptive_inflight = true;
        c.inbound.max_inflight = 40;
        c.egress.enabled = true;
        c.egress.listen = "127.0.0.1:0".parse().unwrap();
    });
    let base = format!("http://{}", weir.inbound_addr());
    let client = Http1::new();
    for round in 0..10 {
        let batch: Vec<_> = (0..4)
            .map(|i| {
                let (c, url) = (client.clone(), format!("{base}/slow?r={round}&b={i}"));
                tokio::spawn(async move { c.get(&url, &[]).await })
            })
            .collect();
        for b in batch {
            assert_eq!(b.await.unwrap().status, 200);
        }
    }
    assert_eq!(weir.status().max_inflight, 40, "the limit is max_inflight, not inferred");
}
