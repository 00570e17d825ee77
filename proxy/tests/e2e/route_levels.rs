//! Per-route levels (docs/design.md, "Per-route levels") with real sidecars on 127.0.0.1,
//! the shipped defaults plus the egress role on:
//!
//! ```text
//! test client -> [E inbound] -> app E (relays every path) -> [E egress]
//!             -> [A inbound] -> app A (/x/... calls B, /y/... answers alone) -> [A egress]
//!             -> app B (a stand-in that answers with the x-admission-level the test sets)
//! ```
//!
//! The apps forward the request's `x-request-id` (what the sidecars pair calls by). B is a
//! stand-in so that its level is exact and the test does not hang on timing: what is
//! tested is what the sidecars do with the level, not how B's controller finds it.

use crate::support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::client::{Http1, Resp};
use weir_proxy::{Sidecar, SidecarConfig};

/// The stand-in downstream: answers 200 with the level the test set (and, if set, route
/// headers the test chose, to feed the egress bad values).
#[derive(Default)]
struct FakeB {
    level: Mutex<String>,
    route_headers: Mutex<Vec<(String, String)>>,
    /// Answer every request with a weir-like refusal (503, `x-envoy-overloaded`).
    refuse: AtomicBool,
    seen: AtomicU64,
}

/// An app that relays to one downstream through its sidecar's egress (by `Host`), with the
/// caller's priority and request id, and answers what the downstream answered.
struct Relay {
    /// Set once the sidecar (whose address the app needs) has started.
    egress: Mutex<Option<SocketAddr>>,
    downstream: String,
    /// Which paths call the downstream (the others are answered at once).
    calls: fn(&str) -> bool,
    /// Off: no path calls (the route stops depending on the downstream).
    calling: AtomicBool,
    served: AtomicU64,
    client: Client<HttpConnector, Empty<Bytes>>,
}

type Answer = hyper::Response<Full<Bytes>>;

async fn serve<F, Fut>(handler: F) -> SocketAddr
where
    F: Fn(hyper::Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Answer> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let handler = handler.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let handler = handler.clone();
                    async move { Ok::<_, Infallible>(handler(req).await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

impl FakeB {
    async fn start(level: &str) -> (Arc<FakeB>, SocketAddr) {
        let b = Arc::new(FakeB::default());
        *b.level.lock().unwrap() = level.into();
        let me = b.clone();
        let addr = serve(move |_req| {
            let me = me.clone();
            async move {
                me.seen.fetch_add(1, Relaxed);
                let mut resp = hyper::Response::builder()
                    .status(200)
                    .header("x-admission-level", me.level.lock().unwrap().as_str());
                if me.refuse.load(Relaxed) {
                    resp = resp
                        .status(503)
                        .header("x-envoy-overloaded", "true")
                        .header("x-weir-shed", "overload")
                        .header("retry-after", "1");
                }
                for (k, v) in me.route_headers.lock().unwrap().iter() {
                    resp = resp.header(k.as_str(), v.as_str());
                }
                resp.body(Full::new(Bytes::from_static(b"b"))).unwrap()
            }
        })
        .await;
        (b, addr)
    }

    fn set_level(&self, level: &str) {
        *self.level.lock().unwrap() = level.into();
    }
}

impl Relay {
    fn new(downstream: String, calls: fn(&str) -> bool) -> Arc<Relay> {
        Arc::new(Relay {
            egress: Mutex::new(None),
            downstream,
            calls,
            calling: AtomicBool::new(true),
            served: AtomicU64::new(0),
            client: Client::builder(TokioExecutor::new()).build(HttpConnector::new()),
        })
    }

    async fn handle(&self, req: hyper::Request<Incoming>) -> Answer {
        self.served.fetch_add(1, Relaxed);
        let path = req.uri().path().to_string();
        if !((self.calls)(&path) && self.calling.load(Relaxed)) {
            return hyper::Response::new(Full::new(Bytes::from_static(b"alone")));
        }
        let egress = self.egress.lock().unwrap().expect("the sidecar has started");
        let mut out = hyper::Request::get(format!("http://{egress}{path}"))
            .header("host", self.downstream.as_str());
        for name in ["x-business-priority", "x-user-priority", "x-request-id"] {
            if let Some(v) = req.headers().get(name) {
                out = out.header(name, v);
            }
        }
        let answer = self.client.request(out.body(Empty::new()).unwrap()).await.unwrap();
        let (parts, body) = answer.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        let mut resp = hyper::Response::builder().status(parts.status);
        // A polite app passes a refusal's reason on.
        for name in ["x-weir-shed", "retry-after"] {
            if let Some(v) = parts.headers.get(name) {
                resp = resp.header(name, v);
            }
        }
        resp.body(Full::new(body)).unwrap()
    }
}

/// A sidecar with the shipped defaults plus the egress role on (and `tweak`).
fn with_egress(app: SocketAddr, tweak: impl FnOnce(&mut SidecarConfig)) -> Sidecar {
    support::sidecar_with_defaults(app, |c| {
        c.egress.enabled = true;
        c.egress.listen = "127.0.0.1:0".parse().unwrap();
        tweak(c);
    })
}

struct Graph {
    b: Arc<FakeB>,
    app_a: Arc<Relay>,
    app_e: Arc<Relay>,
    a: Sidecar,
    e: Sidecar,
    b_addr: SocketAddr,
}

/// Starts E -> A -> B. `tweak_a` is applied to A's configuration. Each app listens first
/// (port 0), its sidecar starts in front of it, then the app learns its egress address.
async fn graph(tweak_a: impl FnOnce(&mut SidecarConfig)) -> Graph {
    let (b, b_addr) = FakeB::start("255.127").await;
    let app_a = Relay::new(b_addr.to_string(), |p| p.starts_with("/x"));
    let a = with_egress(serve_relay(&app_a).await, tweak_a);
    *app_a.egress.lock().unwrap() = Some(a.egress().unwrap().addr());
    let app_e = Relay::new(a.inbound_addr().to_string(), |_| true);
    let e = with_egress(serve_relay(&app_e).await, |_| {});
    *app_e.egress.lock().unwrap() = Some(e.egress().unwrap().addr());
    Graph { b, app_a, app_e, a, e, b_addr }
}

async fn serve_relay(relay: &Arc<Relay>) -> SocketAddr {
    let me = relay.clone();
    serve(move |req| {
        let me = me.clone();
        async move { me.handle(req).await }
    })
    .await
}

async fn get(to: SocketAddr, path: &str, business: u8) -> Resp {
    let b = business.to_string();
    let headers = [("x-business-priority", b.as_str()), ("x-user-priority", "0")];
    Http1::new().get(&format!("http://{to}{path}"), &headers).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_that_calls_an_overloaded_downstream_is_refused_at_the_entry_and_others_are_not() {
    let g = graph(|_| {}).await;
    let e = g.e.inbound_addr();

    // Open: everything flows; the routes learn their dependencies from the paired calls.
    let r = get(e, "/x/op", 2).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("x-weir-route"), Some("/x/op"));
    assert_eq!(r.header("x-weir-route-level"), Some("255.127"));
    let deps = g.a.egress().unwrap().service().routes().deps.dependencies("/x/op");
    assert_eq!(deps, vec![(g.b_addr.to_string(), "/x/op".to_string())], "A learnt /x/op -> B");
    let deps = g.e.egress().unwrap().service().routes().deps.dependencies("/x/op");
    assert_eq!(deps, vec![(g.a.inbound_addr().to_string(), "/x/op".to_string())]);
    assert!(g.a.egress().unwrap().service().routes().deps.dependencies("/y/op").is_empty());
    assert_eq!(get(e, "/y/op", 2).await.status, 200);

    // B cuts to 1.0. One request B admits brings the news up: A caches B's level, stamps
    // the aggregated level on /x/op, and E's egress caches it per (A, /x/op).
    g.b.set_level("1.0");
    let r = get(e, "/x/op", 0).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-weir-route-level"), Some("1.0"), "min(E, A, B) reached the entry");
    assert_eq!(r.header("x-admission-level"), Some("255.127"), "E's own level is open");

    // Below B's level: refused at E's door, before E's or A's app did anything.
    // (Once the news is older than an eighth of the expiry, one request in 250 ms goes
    // through as a probe to bring news; on a busy machine some of these may be probes.)
    let (served_e, served_a, seen_b) =
        (g.app_e.served.load(Relaxed), g.app_a.served.load(Relaxed), g.b.seen.load(Relaxed));
    let t = Instant::now();
    let mut probes = 0;
    for _ in 0..5 {
        let r = get(e, "/x/op", 2).await;
        if r.status == 200 {
            probes += 1;
            continue;
        }
        assert_eq!(r.status, 503, "{r:?}");
        assert_eq!(r.header("x-weir-shed"), Some("route-level"));
        assert!(r.header("retry-after").is_some());
    }
    let allowed = (t.elapsed().as_millis() / 250) as u64 + 1;
    assert!(probes <= allowed, "{probes} probes in {:?}", t.elapsed());
    let work = |now: u64, before: u64| now - before;
    assert!(work(g.app_e.served.load(Relaxed), served_e) <= probes, "E's app did no other work");
    assert!(work(g.app_a.served.load(Relaxed), served_a) <= probes, "A's app did no other work");
    assert!(g.b.seen.load(Relaxed) - seen_b <= probes);

    // The route that does not call B keeps its own (open) level, at every class.
    for business in [0, 2, 200] {
        let r = get(e, "/y/op", business).await;
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.header("x-weir-route-level"), Some("255.127"));
    }

    // A's door refuses the same for a caller without a per-route cache (straight to A):
    // fresh news first (a request B admits), then below it.
    assert_eq!(get(g.a.inbound_addr(), "/x/op", 0).await.status, 200);
    let r = get(g.a.inbound_addr(), "/x/op", 2).await;
    assert_eq!((r.status, r.header("x-weir-shed")), (503, Some("route-level")));

    // Expiry: B says nothing for the level's expiry (2 s): the cached levels lapse and the
    // route is probed again; B open again, it flows.
    g.b.set_level("255.127");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let r = get(e, "/x/op", 2).await;
    assert_eq!(r.status, 200, "probed again once the news is old: {r:?}");
    assert_eq!(r.header("x-weir-route-level"), Some("255.127"));
    g.e.stop();
    g.a.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependency_not_confirmed_expires_and_the_route_keeps_its_own_level() {
    let g = graph(|c| c.egress.per_route.dependency_expiry = Duration::from_millis(800)).await;
    let a = g.a.inbound_addr();
    g.b.set_level("1.0");
    assert_eq!(get(a, "/x/op", 0).await.status, 200);
    assert_eq!(get(a, "/x/op", 2).await.header("x-weir-shed"), Some("route-level"));
    // The app stops calling B on /x; B's level stays fresh (the test calls B through A's
    // egress as an app would, unpaired), but the dependency is not confirmed.
    g.app_a.calling.store(false, Relaxed);
    let egress = g.a.egress().unwrap().addr();
    let host = g.b_addr.to_string();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(1000) {
        let r = Http1::new()
            .get(
                &format!("http://{egress}/z"),
                &[("host", host.as_str()), ("x-business-priority", "0")],
            )
            .await;
        assert_eq!(r.status, 200);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let routes = g.a.egress().unwrap().service().routes().clone();
    assert_eq!(routes.cached(&host, "/z"), weir_proxy_level("1.0"), "B's level is fresh");
    let r = get(a, "/x/op", 2).await;
    assert_eq!(r.status, 200, "the expired dependency no longer refuses: {r:?}");
    assert_eq!(r.header("x-weir-route-level"), Some("255.127"), "its own level again");
    g.e.stop();
    g.a.stop();
}

fn weir_proxy_level(s: &str) -> Option<admission_core::AdmissionLevel> {
    admission_core::AdmissionLevel::parse(s.as_bytes()).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_state_is_bounded_and_bad_values_are_counted() {
    let g = graph(|c| {
        c.egress.per_route.max_routes = 2;
        c.egress.per_route.max_dependencies = 1;
        c.egress.per_route.max_routes_per_authority = 2;
    })
    .await;
    let a = g.a.inbound_addr();
    for path in ["/x/1", "/x/2", "/x/3", "/x/4"] {
        assert_eq!(get(a, path, 0).await.status, 200);
    }
    let routes = g.a.egress().unwrap().service().routes().clone();
    assert_eq!(routes.deps.routes(), 2, "two routes tracked");
    assert_eq!(routes.deps.counters().route_overflow, 2, "the others counted");
    // B cuts: the tracked routes are refused at A's door; the untracked ones keep A's own
    // level at the door (B's cached level still refuses them at A's egress, after A's app).
    g.b.set_level("1.0");
    assert_eq!(get(a, "/x/1", 0).await.status, 200);
    assert_eq!(get(a, "/x/1", 2).await.header("x-weir-shed"), Some("route-level"));
    let r = get(a, "/x/3", 2).await;
    assert_eq!(r.header("x-weir-shed"), Some("downstream-level"), "refused at the egress: {r:?}");
    assert_eq!(r.header("x-weir-route-level"), Some("255.127"), "untracked: A's own level");

    // Bad route headers from B are counted, never cached.
    *g.b.route_headers.lock().unwrap() =
        vec![("x-weir-route".into(), "/x/1".into()), ("x-weir-route-level".into(), "1.x".into())];
    g.b.set_level("255.127");
    assert_eq!(get(a, "/x/1", 0).await.status, 200);
    *g.b.route_headers.lock().unwrap() = vec![
        ("x-weir-route".into(), "/elsewhere".into()),
        ("x-weir-route-level".into(), "0.0".into()),
    ];
    assert_eq!(get(a, "/x/1", 0).await.status, 200);
    let level = routes.route_levels.level_counters();
    assert_eq!(level.malformed, 1, "{level:?}");
    assert_eq!(routes.route_levels.counters().route_mismatch, 1);
    assert_eq!(routes.route_levels.len(), 0, "nothing bad was cached");
    assert_eq!(routes.deps.counters().route_overflow, 3, "/x/3 again");
    // And on /metrics (exported every 250 ms; the recorder is one per process, shared by
    // every sidecar of this test binary, so only the series are checked).
    tokio::time::sleep(Duration::from_millis(400)).await;
    let text = support::metrics_text(g.a.admin_addr()).await;
    for series in [
        "weir_route_slots{kind=\"routes\"}",
        "weir_route_dependencies_learnt_total{result=\"route_overflow\"}",
        "weir_route_level_headers_total{result=\"malformed\"}",
        "weir_egress_retries_refused_total",
    ] {
        assert!(text.contains(series), "{series} exported");
    }
    g.e.stop();
    g.a.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_of_a_refused_call_waits_for_the_level_to_change() {
    let (b, b_addr) = FakeB::start("3.0").await;
    let app = Relay::new(b_addr.to_string(), |_| false);
    let a = with_egress(serve_relay(&app).await, |_| {});
    let egress = a.egress().unwrap().addr();
    let host = b_addr.to_string();
    let call = |id: &'static str| {
        let host = host.clone();
        async move {
            let headers =
                [("host", host.as_str()), ("x-business-priority", "2"), ("x-request-id", id)];
            Http1::new().get(&format!("http://{egress}/p"), &headers).await
        }
    };
    // B admits class 2 by its level but refuses anyway (its queue is full, say).
    b.refuse.store(true, Relaxed);
    assert_eq!(call("r1").await.status, 503);
    assert_eq!(b.seen.load(Relaxed), 1);
    // The same call again, the level unchanged: refused locally, never sent.
    for _ in 0..3 {
        let r = call("r1").await;
        assert_eq!((r.status, r.header("x-weir-shed")), (503, Some("downstream-level")));
    }
    assert_eq!(b.seen.load(Relaxed), 1, "retries did not reach B");
    let routes = a.egress().unwrap().service().routes().clone();
    assert_eq!(routes.retries.refused_retries(), 3);
    // Another call goes out; its answer brings a new level, and the first call's retry
    // goes out again.
    b.set_level("4.0");
    assert_eq!(call("r2").await.status, 503);
    assert_eq!(b.seen.load(Relaxed), 2);
    b.refuse.store(false, Relaxed);
    assert_eq!(call("r1").await.status, 200, "the level changed: the retry is sent");
    assert_eq!(b.seen.load(Relaxed), 3);
    a.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_refused_wholly_probes_and_sees_the_recovery_before_the_expiry() {
    // A long expiry (8 s: a probe every second) so the test tells the probe from the expiry
    // with a wide margin on a busy machine.
    let expiry = Duration::from_secs(8);
    let g = graph(|c| c.egress.level_expiry = expiry).await;
    let a = g.a.inbound_addr();
    g.b.set_level("1.0");
    assert_eq!(get(a, "/x/op", 0).await.status, 200);
    assert_eq!(get(a, "/x/op", 2).await.header("x-weir-shed"), Some("route-level"));
    // B recovers; only class 2 is offered, which the door refuses: no news but the probes.
    g.b.set_level("255.127");
    let t = Instant::now();
    let reopened = loop {
        let r = get(a, "/x/op", 2).await;
        if r.status == 200 {
            break t.elapsed();
        }
        assert!(t.elapsed() < expiry, "never reopened: {r:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(reopened < expiry / 2, "a probe brought the news in {reopened:?}");
    g.e.stop();
    g.a.stop();
}
