//! The egress role against a scripted downstream (a real hyper server on 127.0.0.1 that
//! answers with whatever `x-admission-level` values the test sets and counts what reaches
//! it): the level is learnt and below-level requests are refused locally, fast, and never
//! reach the downstream; the level expires; bad level values are ignored and counted; the
//! three ways of naming a downstream (absolute-form, `:authority`, fixed route); the
//! remaining budget; spent budgets; a downstream that is down or silent.

use crate::support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::backend::Backend;
use support::client::Http1;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weir_proxy::egress::EgressOutcome;
use weir_proxy::Sidecar;

/// A downstream whose level header is scripted.
struct Downstream {
    addr: SocketAddr,
    state: Arc<DownState>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct DownState {
    /// The `x-admission-level` values of every response (none: no header).
    levels: Mutex<Vec<&'static str>>,
    /// Requests that reached it.
    seen: AtomicU64,
    /// The last request's head.
    last: Mutex<Option<(String, HeaderMap)>>,
    /// Never answer (a silent downstream).
    silent: std::sync::atomic::AtomicBool,
}

impl Downstream {
    async fn start(level: &'static str) -> Downstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(DownState::default());
        state.levels.lock().unwrap().push(level);
        let st = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let st = st.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| answer(st.clone(), req));
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Downstream { addr, state, task }
    }

    fn set_levels(&self, levels: &[&'static str]) {
        *self.state.levels.lock().unwrap() = levels.to_vec();
    }

    fn seen(&self) -> u64 {
        self.state.seen.load(Relaxed)
    }

    fn last(&self) -> (String, HeaderMap) {
        self.state.last.lock().unwrap().clone().expect("a request reached the downstream")
    }
}

impl Drop for Downstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    st: Arc<DownState>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    st.seen.fetch_add(1, Relaxed);
    *st.last.lock().unwrap() = Some((req.uri().to_string(), req.headers().clone()));
    let grpc = req
        .headers()
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    let _ = req.into_body().collect().await;
    if st.silent.load(Relaxed) {
        std::future::pending::<()>().await;
    }
    let mut resp = Response::new(Full::new(Bytes::from_static(b"downstream says hi")));
    for v in st.levels.lock().unwrap().iter() {
        resp.headers_mut().append("x-admission-level", v.parse().unwrap());
    }
    if grpc {
        resp.headers_mut().insert("content-type", "application/grpc".parse().unwrap());
        resp.headers_mut().insert("grpc-status", "0".parse().unwrap());
    }
    Ok(resp)
}

/// A sidecar with the egress role on an ephemeral port (its inbound app is unused here).
fn egress_sidecar(app: SocketAddr, tweak: impl FnOnce(&mut weir_proxy::SidecarConfig)) -> Sidecar {
    support::sidecar(app, |c| {
        c.egress.enabled = true;
        c.egress.listen = "127.0.0.1:0".parse().unwrap();
        tweak(c);
    })
}

fn egress_addr(s: &Sidecar) -> SocketAddr {
    s.egress().expect("egress enabled").addr()
}

fn prio(business: &'static str, user: &'static str) -> [(&'static str, &'static str); 2] {
    [("x-business-priority", business), ("x-user-priority", user)]
}

/// `GET /x` for `down`, sent to the egress with `Host: down` (routing by Host).
async fn call(
    client: &support::client::TestClient,
    egress: SocketAddr,
    down: SocketAddr,
    extra: &[(&str, &str)],
) -> support::client::Resp {
    let host = down.to_string();
    let mut headers: Vec<(&str, &str)> = vec![("host", host.as_str())];
    headers.extend_from_slice(extra);
    client
        .send(http::Method::GET, &format!("http://{egress}/x"), &headers, support::client::empty())
        .await
        .expect("request completes")
}

/// How long a local refusal may take, seen by the client. The default run's bound is far
/// below the 10 s budget the refused requests carry (a refusal that waited on the
/// downstream or the budget would take that); the soak run, alone on the machine, holds it
/// to 20 ms (microseconds inside weir, plus the loopback round trip).
const LOCAL_REFUSAL: Duration = Duration::from_secs(1);
const LOCAL_REFUSAL_SOAK: Duration = Duration::from_millis(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learnt_level_refuses_below_it_locally_and_fast() {
    learnt_level_refuses_locally(LOCAL_REFUSAL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "soak"]
async fn a_learnt_level_refuses_below_it_locally_and_fast_soak() {
    learnt_level_refuses_locally(LOCAL_REFUSAL_SOAK).await;
}

async fn learnt_level_refuses_locally(bound: Duration) {
    let app = Backend::start().await;
    let down = Downstream::start("3.64").await;
    let weir = egress_sidecar(app.addr, |_| {});
    let egress = egress_addr(&weir);
    let client = Http1::new();

    // Nothing known yet: sent, and the answer teaches the level.
    let first = call(&client, egress, down.addr, &prio("5", "0")).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.level(), "3.64", "the downstream's level reaches the app unchanged");
    assert_eq!(down.seen(), 1);

    // Below the level: refused by the egress, never sent.
    let mut slowest = Duration::ZERO;
    let below = [prio("5", "0")[0], prio("5", "0")[1], ("x-request-timeout-ms", "10000")];
    for _ in 0..50 {
        let t = Instant::now();
        let r = call(&client, egress, down.addr, &below).await;
        slowest = slowest.max(t.elapsed());
        assert_eq!(r.status, 503);
        assert_eq!(r.header("x-weir-shed"), Some("downstream-level"));
        assert_eq!(r.header("retry-after"), Some("1"));
        assert_eq!(r.level(), "3.64");
    }
    assert_eq!(down.seen(), 1, "refused requests never reached the downstream");
    assert!(slowest < bound, "slowest local refusal took {slowest:?}");

    // At or above the level: sent.
    for p in [prio("3", "64"), prio("3", "0"), prio("0", "127")] {
        assert_eq!(call(&client, egress, down.addr, &p).await.status, 200);
    }
    assert_eq!(down.seen(), 4);

    // gRPC callers get the trailers-only refusal.
    let grpc = call(
        &client,
        egress,
        down.addr,
        &[("x-business-priority", "9"), ("content-type", "application/grpc")],
    )
    .await;
    assert_eq!(grpc.status, 200);
    assert_eq!(grpc.header("grpc-status"), Some("8"));
    assert_eq!(grpc.header("x-weir-shed"), Some("downstream-level"));
    assert!(grpc.header("grpc-retry-pushback-ms").is_some());
    assert_eq!(down.seen(), 4);

    let stats = weir.egress().unwrap().service().stats();
    assert_eq!(stats.count(5, EgressOutcome::ShedDownstream), 50);
    assert_eq!(stats.count(9, EgressOutcome::ShedDownstream), 1);
    assert_eq!(stats.total(EgressOutcome::Admitted), 4);

    // The same counts on /metrics (the recorder is shared by every sidecar of this test
    // process, hence at least), one HELP/TYPE for the family, and the level per authority.
    let series = format!("weir_downstream_level{{authority=\"{}\"}}", down.addr);
    let mut text = String::new();
    for _ in 0..100 {
        text = support::metrics_text(weir.admin_addr()).await;
        if support::sample(&text, &series) == 448.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(support::sample(&text, &series), 448.0, "3.64 = 3 * 128 + 64\n{text}");
    let shed = r#"weir_requests_total{role="egress",business="5",outcome="shed_downstream"}"#;
    assert!(support::sample(&text, shed) >= 50.0, "{text}");
    assert_eq!(text.matches("# TYPE weir_requests_total ").count(), 1, "{text}");
    weir.stop();
}

/// After the expiry, the next request is the probe: the default run allows a second and a
/// half for its round trip on a busy machine (a cache that never expired, or expired only on
/// some later event, fails it); the soak run 300 ms.
const PROBED_WITHIN: Duration = Duration::from_millis(1500);
const PROBED_WITHIN_SOAK: Duration = Duration::from_millis(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_downstream_is_probed_again_after_the_expiry() {
    probed_again_after_the_expiry(PROBED_WITHIN).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "soak"]
async fn a_recovered_downstream_is_probed_again_after_the_expiry_soak() {
    probed_again_after_the_expiry(PROBED_WITHIN_SOAK).await;
}

async fn probed_again_after_the_expiry(within: Duration) {
    let app = Backend::start().await;
    let down = Downstream::start("1.0").await;
    let expiry = Duration::from_millis(400);
    let weir = egress_sidecar(app.addr, |c| c.egress.level_expiry = expiry);
    let egress = egress_addr(&weir);
    let client = Http1::new();

    // Taken before the response that carries the level, so the cache's clock starts later.
    let learnt = Instant::now();
    assert_eq!(call(&client, egress, down.addr, &prio("1", "0")).await.status, 200);
    assert_eq!(call(&client, egress, down.addr, &prio("2", "0")).await.status, 503);
    down.set_levels(&["255.127"]);

    // Refused until the news is old, then probed, and open again.
    let mut reopened = None;
    while learnt.elapsed() < expiry + within + Duration::from_secs(2) {
        let r = call(&client, egress, down.addr, &prio("2", "0")).await;
        if r.status == 200 {
            reopened = Some(learnt.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let reopened = reopened.expect("the refused class flows again");
    assert!(reopened >= expiry, "no probe before the expiry ({reopened:?})");
    assert!(reopened < expiry + within, "reopened after {reopened:?}");
    assert_eq!(call(&client, egress, down.addr, &prio("200", "127")).await.status, 200);
    weir.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_level_values_are_ignored_counted_and_the_request_completes() {
    let app = Backend::start().await;
    let down = Downstream::start("0.0").await;
    let weir = egress_sidecar(app.addr, |_| {});
    let egress = egress_addr(&weir);
    let client = Http1::new();
    let levels = || weir.egress().unwrap().service().levels().counters();

    for bad in [
        &["garbage"][..],
        &["256.0"],
        &["1.128"],
        &["-1.0"],
        &["3"],
        &["0.0, 0.0"],
        &["0.0", "0.0"],
        &["0.0", "9.9"],
    ] {
        down.set_levels(bad);
        let r = call(&client, egress, down.addr, &prio("200", "100")).await;
        assert_eq!(r.status, 200, "{bad:?}: the request completes");
        assert_eq!(&r.body[..], b"downstream says hi");
    }
    let c = levels();
    assert_eq!(c.malformed, 6);
    assert_eq!(c.repeated, 2);
    assert_eq!(c.cached, 0);
    // Nothing was cached: nothing is refused.
    assert_eq!(call(&client, egress, down.addr, &prio("255", "127")).await.status, 200);
    assert_eq!(down.seen(), 9);
    weir.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_form_authority_and_routes_reach_the_downstream_with_the_remaining_budget() {
    let app = Backend::start().await;
    let down = Downstream::start("255.127").await;
    let route_down = Downstream::start("255.127").await;
    let route_target = route_down.addr.to_string();
    let weir = egress_sidecar(app.addr, |c| {
        c.egress.routes.push(weir_proxy::egress::EgressRoute {
            listen: "127.0.0.1:0".parse().unwrap(),
            target: route_target,
        });
    });
    let egress = egress_addr(&weir);

    // HTTP_PROXY style: an absolute-form request line.
    let mut s = tokio::net::TcpStream::connect(egress).await.unwrap();
    let req = format!(
        "GET http://{}/abs?q=1 HTTP/1.1\r\nHost: {}\r\nx-business-priority: 7\r\nx-user-priority: 9\r\nx-request-timeout-ms: 300\r\nProxy-Connection: keep-alive\r\nConnection: close\r\n\r\n",
        down.addr, down.addr
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let (uri, headers) = down.last();
    assert_eq!(uri, "/abs?q=1", "origin-form towards the downstream");
    assert_eq!(headers["host"], down.addr.to_string().as_str());
    assert_eq!(headers["x-business-priority"], "7", "priority passes unchanged");
    assert_eq!(headers["x-user-priority"], "9");
    assert!(!headers.contains_key("proxy-connection"));
    let budget: u64 = headers["x-request-timeout-ms"].to_str().unwrap().parse().unwrap();
    assert!((1..=290).contains(&budget), "the remaining budget, not more: {budget}");

    // h2c with `:authority` naming the downstream (a gRPC client pointed at the egress).
    let tcp = tokio::net::TcpStream::connect(egress).await.unwrap();
    let (mut h2, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = Request::builder()
        .uri(format!("http://{}/pkg.Svc/Call", down.addr))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", "250m")
        .header("x-business-priority", "4")
        .body(Full::new(Bytes::from_static(b"\0\0\0\0\0")))
        .unwrap();
    let resp =
        tokio::time::timeout(Duration::from_secs(5), h2.send_request(req)).await.unwrap().unwrap();
    assert_eq!(resp.status(), 200);
    let (uri, headers) = down.last();
    assert!(uri.ends_with("/pkg.Svc/Call"), "{uri}");
    assert_eq!(headers["x-business-priority"], "4");
    let grpc_timeout = headers["grpc-timeout"].to_str().unwrap();
    let ms: u64 = grpc_timeout.trim_end_matches('m').parse().unwrap();
    assert!(grpc_timeout.ends_with('m') && (1..=240).contains(&ms), "{grpc_timeout}");

    // A fixed route: whatever the Host says, the route's target gets it.
    let route = weir.egress().unwrap().route_addrs()[0];
    let r =
        Http1::new().get(&format!("http://{route}/routed"), &[("host", "elsewhere.invalid")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(route_down.seen(), 1);
    assert_eq!(route_down.last().0, "/routed");
    weir.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spent_budgets_are_not_sent_and_a_dead_or_silent_downstream_gets_inbound_errors() {
    let app = Backend::start().await;
    let down = Downstream::start("255.127").await;
    let weir = egress_sidecar(app.addr, |_| {});
    let egress = egress_addr(&weir);
    let client = Http1::new();

    for spent in [("x-request-timeout-ms", "0"), ("grpc-timeout", "0m")] {
        let r = call(&client, egress, down.addr, &[spent]).await;
        assert_eq!(r.status, 503, "{spent:?}");
        assert_eq!(r.header("x-weir-shed"), Some("deadline"));
    }
    assert_eq!(down.seen(), 0, "a spent budget is never sent");

    // Nobody listening: 502 with the level header.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let r = call(&client, egress, dead, &[]).await;
    assert_eq!(r.status, 502);
    assert_eq!(r.level(), "255.127");
    assert_eq!(r.header("x-weir-error"), Some("downstream-unreachable"));

    // Answers garbage, or resets the connection: 502 with the level header.
    let garbage = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let garbage_addr = garbage.local_addr().unwrap();
    let resetting = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let resetting_addr = resetting.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = garbage.accept().await {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(b"\x16\x03\x01 this is not HTTP\r\n\r\n").await;
        }
    });
    tokio::spawn(async move {
        while let Ok((s, _)) = resetting.accept().await {
            // Zero linger: the close is a RST. (Deprecated because a non-zero linger blocks
            // the thread on drop; a zero one does not.)
            #[allow(deprecated)]
            let _ = s.set_linger(Some(Duration::ZERO));
            drop(s);
        }
    });
    for broken in [garbage_addr, resetting_addr] {
        let r = call(&client, egress, broken, &[]).await;
        assert_eq!(r.status, 502, "{broken}");
        assert_eq!(r.level(), "255.127");
        // Garbage is a failed exchange; a reset right after accept may land while the
        // connect is still completing (then the downstream was never reached).
        let want: &[&str] = if broken == garbage_addr {
            &["downstream-failed"]
        } else {
            &["downstream-failed", "downstream-unreachable"]
        };
        assert!(want.contains(&r.header("x-weir-error").unwrap_or("")), "{broken}: {r:?}");
    }

    // Never answers: 504 when the budget runs out, not later.
    down.state.silent.store(true, Relaxed);
    let t = Instant::now();
    let r = call(&client, egress, down.addr, &[("x-request-timeout-ms", "200")]).await;
    assert_eq!(r.status, 504);
    assert!(r.header("x-admission-level").is_some());
    assert_eq!(r.header("x-weir-error"), Some("downstream-timeout"));
    assert!(t.elapsed() < Duration::from_secs(2), "took {:?}", t.elapsed());
    weir.stop();
}
