//! The control loop through the real sidecar: a queued request is refused when its budget
//! runs out (not when it reaches the head), a request that would wait longer than its
//! budget is refused at the door, a stalled app reads as overloaded; and, with the shipped
//! defaults (the adaptive in-flight limit on, no `max_inflight`): a healthy app is never
//! limited, a burst on a quiet app is queued and served, an idle sidecar opens its level
//! after an overload, and a middle hop with the egress role on sheds its own overload at its
//! door (the limit stays on, on the app's own time) instead of timing out.

use crate::support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::backend::Backend;
use support::client::{Http1, TestClient};
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

/// The shipped default really is adaptive (not set here), and it costs a healthy app
/// nothing: an app of 8 workers x 10 ms under bursts of up to 8 at once, well within its
/// capacity, is never limited (the limit stays at the 256 ceiling) and nothing is refused.
/// (827f65b started at 64 and drifted down to twice the busiest concurrency it saw: a
/// limit measuring demand.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_limit_is_adaptive_and_never_limits_a_healthy_app() {
    let defaults = weir_proxy::SidecarConfig::load(None).unwrap();
    assert!(defaults.inbound.adaptive_inflight, "adaptive by default");
    let app =
        CapacityBackend::start(BackendConfig::new(8, Duration::from_millis(10))).await.unwrap();
    let weir = support::sidecar_with_defaults(app.addr(), |_| {});
    let base = format!("http://{}", weir.inbound_addr());
    let client = Http1::new();
    let started = Instant::now();
    let mut lowest = usize::MAX;
    let mut round = 0;
    while started.elapsed() < Duration::from_millis(1500) {
        let batch: Vec<_> = (0..1 + round % 8)
            .map(|i| {
                let (c, url) = (client.clone(), format!("{base}/work?r={round}&i={i}"));
                tokio::spawn(async move { c.get(&url, &[]).await })
            })
            .collect();
        for b in batch {
            assert_eq!(b.await.unwrap().status, 200, "nothing refused");
        }
        lowest = lowest.min(weir.status().max_inflight as usize);
        round += 1;
    }
    assert_eq!(lowest, 256, "the limit never moved below the ceiling");
    let text = support::metrics_text(weir.admin_addr()).await;
    assert_eq!(support::sample(&text, "weir_inflight_limit"), 256.0, "metric exported");
}

/// The burst: an app of 64 workers x 100 ms, warmed by ten sequential requests,
/// then 20 at once, three times: all served, each burst in about one service time (827f65b
/// refused 17 of 20: its limit had shrunk to the traffic's own concurrency).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_on_a_quiet_app_is_served_not_refused() {
    let _turn = support::CPU_HEAVY.lock().await;
    let app =
        CapacityBackend::start(BackendConfig::new(64, Duration::from_millis(100))).await.unwrap();
    let weir = support::sidecar_with_defaults(app.addr(), |_| {});
    let base = format!("http://{}", weir.inbound_addr());
    let client = Http1::new();
    for i in 0..10 {
        assert_eq!(client.get(&format!("{base}/warm?{i}"), &[]).await.status, 200);
    }
    for burst in 0..3 {
        let started = Instant::now();
        let batch: Vec<_> = (0..20)
            .map(|i| {
                let (c, url) = (client.clone(), format!("{base}/burst?b={burst}&i={i}"));
                tokio::spawn(async move { c.get(&url, &[]).await })
            })
            .collect();
        for b in batch {
            let resp = b.await.unwrap();
            assert_eq!(resp.status, 200, "burst {burst}: {resp:?}");
        }
        // Twenty at once take one service time (100 ms), not twenty: a margin for a busy
        // machine, far under the 2 s a one-at-a-time limit would take.
        let took = started.elapsed();
        assert!(took < Duration::from_millis(1000), "burst {burst} took {took:?}");
    }
    assert_eq!(app.snapshot().received, 70);
}

/// Three classes at 3x an app's capacity cut the level; then a second of silence: the idle
/// sidecar reports an open level and not overloaded, and the next request of every class,
/// the least important user of each, is served (827f65b kept the level cut until traffic
/// came back and got refused first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_overload_a_second_of_silence_opens_the_level() {
    let _turn = support::CPU_HEAVY.lock().await;
    let app =
        CapacityBackend::start(BackendConfig::new(4, Duration::from_millis(20))).await.unwrap();
    let weir = support::sidecar_with_defaults(app.addr(), |_| {});
    let base = format!("http://{}", weir.inbound_addr());
    let client = Http1::new();
    // 600 requests/s (3x of 200) for 2 s, classes 0, 1, 2 in equal shares.
    let counts = offer(&client, &base, 600.0, Duration::from_secs(2), 3, "/work").await;
    let refused: u64 = counts.iter().map(|c| c.refused.load(Relaxed)).sum();
    assert!(refused > 100, "the overload was refused in part: {counts:?}");
    let cut = weir.status().engine.level;
    // (By the end of the load the level may already be re-opening; it was cut.)
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let status = weir.status();
    assert_eq!(status.engine.level.to_string(), "255.127", "open after silence (was {cut})");
    assert!(!status.engine.overloaded, "not overloaded when idle");
    for business in ["0", "1", "2"] {
        let headers = [("x-business-priority", business), ("x-user-priority", "127")];
        let resp = client.get(&format!("{base}/after?{business}"), &headers).await;
        assert_eq!(resp.status, 200, "class {business} after the silence: {resp:?}");
    }
}

/// Requests per outcome of one class.
#[derive(Debug, Default)]
struct Counts {
    ok: AtomicU64,
    refused: AtomicU64,
    /// Timed out (504, or no answer within the 500 ms budget plus a margin) or failed.
    failed: AtomicU64,
}

/// Offers `rate` requests/s of `path` for `length`, classes `0..classes` in equal shares,
/// users spread over the 128 levels, each with a 500 ms budget; per-class counts.
async fn offer(
    client: &TestClient,
    base: &str,
    rate: f64,
    length: Duration,
    classes: u64,
    path: &str,
) -> Vec<Arc<Counts>> {
    let counts: Vec<Arc<Counts>> = (0..classes).map(|_| Arc::default()).collect();
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let end = Instant::now() + length;
    let mut inflight = Vec::new();
    let mut n = 0u64;
    while Instant::now() < end {
        ticks.tick().await;
        n += 1;
        let class = n % classes;
        let (client, counts) = (client.clone(), counts[class as usize].clone());
        let url = format!("{base}{path}?n={n}");
        let user = ((n * 37) % 128).to_string();
        inflight.push(tokio::spawn(async move {
            let headers = [
                ("x-business-priority", class.to_string()),
                ("x-user-priority", user),
                ("x-request-timeout-ms", "500".to_string()),
            ];
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let sent = client.send(http::Method::GET, &url, &headers, support::client::empty());
            match tokio::time::timeout(Duration::from_millis(1500), sent).await {
                Ok(Ok(resp)) if resp.status == 200 => counts.ok.fetch_add(1, Relaxed),
                Ok(Ok(resp)) if resp.status == 503 && resp.header("x-weir-shed").is_some() => {
                    counts.refused.fetch_add(1, Relaxed)
                }
                _ => counts.failed.fetch_add(1, Relaxed),
            };
        }));
    }
    for t in inflight {
        let _ = t.await;
    }
    counts
}

/// App A of a middle hop: `workers` workers of `work` each (a thread per request, as most
/// apps); a request to `/x` then calls B through A's egress, holding its worker, forwarding
/// its priority, budget and `x-request-id`, as a traced app does.
struct MiddleApp {
    workers: tokio::sync::Semaphore,
    work: Duration,
    egress: OnceLock<SocketAddr>,
    downstream: String,
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl MiddleApp {
    async fn start(
        workers: usize,
        work: Duration,
        downstream: SocketAddr,
    ) -> (Arc<Self>, SocketAddr) {
        let app = Arc::new(MiddleApp {
            workers: tokio::sync::Semaphore::new(workers),
            work,
            egress: OnceLock::new(),
            downstream: downstream.to_string(),
            client: Client::builder(TokioExecutor::new()).build(HttpConnector::new()),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let serving = app.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let app = serving.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let app = app.clone();
                        async move { Ok::<_, std::convert::Infallible>(app.handle(req).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (app, addr)
    }

    async fn handle(
        &self,
        req: hyper::Request<hyper::body::Incoming>,
    ) -> hyper::Response<Full<Bytes>> {
        let answer = |status: u16| {
            let mut resp = hyper::Response::new(Full::new(Bytes::new()));
            *resp.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
            resp
        };
        let forwarded: Vec<(String, String)> =
            ["x-business-priority", "x-user-priority", "x-request-timeout-ms", "x-request-id"]
                .iter()
                .filter_map(|h| {
                    Some((h.to_string(), req.headers().get(*h)?.to_str().ok()?.to_string()))
                })
                .collect();
        let Ok(_worker) = self.workers.acquire().await else { return answer(503) };
        tokio::time::sleep(self.work).await;
        if req.uri().path() != "/x" {
            return answer(200);
        }
        let egress = self.egress.get().expect("egress known");
        let mut call = http::Request::get(format!("http://{egress}/work"))
            .header(http::header::HOST, &self.downstream);
        for (name, value) in &forwarded {
            call = call.header(name.as_str(), value.as_str());
        }
        let exchange = async {
            let resp = self.client.request(call.body(Empty::new()).unwrap()).await.ok()?;
            let status = resp.status().as_u16();
            resp.into_body().collect().await.ok()?;
            Some(status)
        };
        match tokio::time::timeout(Duration::from_millis(500), exchange).await {
            Ok(Some(status)) => answer(status),
            Ok(None) => answer(502),
            Err(_) => answer(504),
        }
    }
}

/// A middle hop with the egress role on, the shipped defaults: app A's own work (4 workers
/// x 20 ms, 200 requests/s) is offered at twice what it can do, half of it calling B
/// through A's egress (B healthy). A's overload is shed at A's door by priority: next to
/// nothing times out and the most important class is served. (827f65b turned the adaptive
/// limit off whenever the egress role was on: A's own queue hid the overload and requests
/// timed out.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_middle_hop_sheds_its_own_overload_at_its_door_with_the_egress_role_on() {
    let _turn = support::CPU_HEAVY.lock().await;
    let app_b = Backend::start().await;
    app_b.set_service_time(Duration::from_millis(5));
    let b = support::sidecar_with_defaults(app_b.addr, |_| {});
    let (app_a, a_addr) = MiddleApp::start(4, Duration::from_millis(20), b.inbound_addr()).await;
    let a = support::sidecar_with_defaults(a_addr, |c| {
        c.egress.enabled = true;
        c.egress.listen = "127.0.0.1:0".parse().unwrap();
    });
    app_a.egress.set(a.egress().unwrap().addr()).unwrap();
    let base = format!("http://{}", a.inbound_addr());
    let client = Http1::new();
    let x = offer(&client, &base, 200.0, Duration::from_secs(3), 3, "/x");
    let y = offer(&client, &base, 200.0, Duration::from_secs(3), 3, "/y");
    let (x, y) = tokio::join!(x, y);
    let total = |f: fn(&Counts) -> u64| x.iter().chain(&y).map(|c| f(c)).sum::<u64>();
    let (ok, refused, failed) = (
        total(|c| c.ok.load(Relaxed)),
        total(|c| c.refused.load(Relaxed)),
        total(|c| c.failed.load(Relaxed)),
    );
    eprintln!(
        "x {x:?}\ny {y:?}\nlimit {:?}, ceiling {}, spared {:?}",
        a.shared().control.status(),
        a.shared().limit.ceiling(),
        a.shared().waits.as_ref().and_then(|w| w.routes()).map(|r| r.holds.spared()),
    );
    let all = ok + refused + failed;
    assert!(all > 1_000, "the load was offered: {all}");
    // Margin for a busy 2-core machine: a handful of late answers, not a collapse.
    assert!(failed * 50 <= all, "{failed} of {all} timed out or failed (x {x:?}, y {y:?})");
    assert!(refused > all / 5, "A's overload was shed at its door: {refused} of {all}");
    let top = |c: &[Arc<Counts>]| {
        let c = &c[0];
        let n = c.ok.load(Relaxed) + c.refused.load(Relaxed) + c.failed.load(Relaxed);
        c.ok.load(Relaxed) as f64 / n.max(1) as f64
    };
    // Margin for a busy 2-core machine: 0.88 was seen under a load average of 3-4 (0.95 on
    // a quiet one, where the least important class got 0.11); a collapse or a shed that
    // ignores priority serves the top class like the rest.
    assert!(top(&x) >= 0.8 && top(&y) >= 0.8, "the most important class is served: {x:?} {y:?}");
    let paired = a.shared().waits.as_ref().expect("egress on").counts().paired;
    assert!(paired > 100, "A's calls were paired with its requests: {paired}");
}

/// A middle hop whose downstream is slow (300 ms) but healthy, A itself quick: nothing is
/// refused at A, and its limit is not cut for B's slowness (it sees A's own time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_downstream_never_makes_a_healthy_middle_hop_shed() {
    let _turn = support::CPU_HEAVY.lock().await;
    let app_b = Backend::start().await;
    app_b.set_service_time(Duration::from_millis(300));
    let b = support::sidecar_with_defaults(app_b.addr, |_| {});
    let (app_a, a_addr) = MiddleApp::start(256, Duration::from_millis(2), b.inbound_addr()).await;
    let a = support::sidecar_with_defaults(a_addr, |c| {
        c.egress.enabled = true;
        c.egress.listen = "127.0.0.1:0".parse().unwrap();
        c.inbound.task_timeout = Duration::from_secs(2);
    });
    app_a.egress.set(a.egress().unwrap().addr()).unwrap();
    let base = format!("http://{}", a.inbound_addr());
    let client = Http1::new();
    let mut lowest = usize::MAX;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(2) {
        let batch: Vec<_> = (0..40)
            .map(|i| {
                let (c, url) = (client.clone(), format!("{base}/x?i={i}"));
                tokio::spawn(async move { c.get(&url, &[("x-request-timeout-ms", "1500")]).await })
            })
            .collect();
        for b in batch {
            let resp = b.await.unwrap();
            assert_eq!(resp.status, 200, "{resp:?}");
        }
        lowest = lowest.min(a.status().max_inflight as usize);
    }
    // 40 requests are in flight at once. Margin for a busy 2-core machine: under a load
    // average of 3-4 the limit was seen at 39 while A's own 2 ms grew noisy; what this test
    // guards is a limit sized on B's 300 ms, and every answer above was a 200.
    assert!(
        lowest >= 30,
        "A's limit went to {lowest} for B's slowness: {:?}",
        a.shared().control.status()
    );
    assert_eq!(a.status().engine.level.to_string(), "255.127");
}
