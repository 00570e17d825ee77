//! The control loop v2 through the real sidecar: a queued request is refused when its
//! budget runs out (not when it reaches the head), a request that would wait longer than
//! its budget is refused at the door, a stalled app reads as overloaded, and the adaptive
//! in-flight limit (the default) is in force.

use crate::support;

use std::time::{Duration, Instant};

use support::backend::Backend;
use support::client::Http1;
use support::eventually;

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
        let (resp, took) = q.await.unwrap();
        assert_eq!(resp.status, 503, "{resp:?}");
        assert_eq!(resp.header("x-weir-shed"), Some("deadline"));
        // Refused when the budget ran out, not at the head after the stall (margin for a
        // busy machine: the stall itself lasts until the end of this test).
        assert!(took < Duration::from_millis(300 + 700), "answered after {took:?}");
    }
    // Refused by the sidecar while queued, not callers who left. (The counter is
    // process-wide; no other test of this binary abandons a waiter.)
    let text = support::metrics_text(weir.admin_addr()).await;
    let abandoned = support::sample(&text, "weir_queue_abandoned_total{role=\"inbound\"}");
    assert!(abandoned < 4.0, "the 4 refusals counted as {abandoned} abandoned");
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
/// once with `overload` rather than queued and refused later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_cannot_wait_long_enough_is_refused_at_the_door() {
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
    // Twenty waiters at 50 ms each: about a second of queue.
    let waiters: Vec<_> = (0..20)
        .map(|i| {
            let (c, url) = (client.clone(), format!("{base}/slow?w={i}"));
            tokio::spawn(async move { c.get(&url, &[]).await })
        })
        .collect();
    assert!(eventually(WAIT, || weir.status().queue_depth >= 10).await, "a queue formed");
    let started = Instant::now();
    let refused =
        client.get(&format!("{base}/echo?door"), &[("x-request-timeout-ms", "100")]).await;
    let took = started.elapsed();
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(refused.header("x-weir-shed"), Some("overload"));
    assert!(took < Duration::from_millis(90), "refused at the door, not after a wait: {took:?}");
    for w in waiters {
        let resp = w.await.unwrap();
        assert!(resp.status == 200 || resp.status == 503, "{resp:?}");
    }
}

/// By default the limit adapts: an app that answers at once at low concurrency keeps a
/// limit at most the ceiling and at least one, and everything is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adaptive_limit_is_on_by_default_and_serves_everything_below_capacity() {
    let app = Backend::start().await;
    app.set_service_time(Duration::from_millis(5));
    let weir = support::sidecar(app.addr, |c| {
        c.inbound.adaptive_inflight = true;
        c.inbound.max_inflight = 64;
    });
    let base = format!("http://{}", weir.inbound_addr());
    let client = Http1::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1500) {
        let batch: Vec<_> = (0..4)
            .map(|i| {
                let (c, url) = (client.clone(), format!("{base}/slow?b={i}"));
                tokio::spawn(async move { c.get(&url, &[]).await })
            })
            .collect();
        for b in batch {
            assert_eq!(b.await.unwrap().status, 200);
        }
    }
    let limit = weir.status().max_inflight;
    assert!((1..=64).contains(&limit), "limit {limit}");
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
