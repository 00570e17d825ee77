//! Do no harm (issue 20): weir with its shipped defaults (the embedded configuration; only
//! the addresses are set, plus the one runtime flavour several sidecars in one process
//! need) in front of a healthy app costs it nothing.
//!
//! - `app_protocol: auto` finds out what the app speaks: HTTP/2 callers of an HTTP/1.1-only
//!   app (nginx) get 200, of an h2c app get 200 over h2c, gRPC reaches a tonic app, and
//!   gRPC to an HTTP/1.1-only app gets a clear UNIMPLEMENTED (never a 502); the egress role
//!   does the same per downstream.
//! - A burst on a quiet app is queued, not refused; after an overload and a second of
//!   silence every class is admitted again. (These need the no-harm control loop.)
//!
//! The exact figures (throughput and p99 against direct, the limit over time) are the
//! no-harm benchmark's (`noharm-bench`, BENCHMARKS.md "No harm").

use crate::support;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::client::{bytes_body, H2};
use support::grpc_codec::RawCodec;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::server::{NamedService, UnaryService};
use weir_harness::backend::{BackendConfig, CapacityBackend};
use weir_harness::load::{self, LoadSpec, Phase};
use weir_harness::noharm::nginx_app::{Listener, NginxApp};
use weir_proxy::{Sidecar, SidecarConfig};

/// The shipped defaults in front of `app`: the embedded configuration with ephemeral
/// addresses. (`work_stealing`: several sidecars in one test process; the request path and
/// every default that matters here are the same.)
fn defaults(app: SocketAddr) -> Sidecar {
    let mut config = SidecarConfig::load(None).expect("embedded default");
    config.inbound.listen = "127.0.0.1:0".parse().unwrap();
    config.admin.listen = "127.0.0.1:0".parse().unwrap();
    config.inbound.app = app;
    config.inbound.work_stealing = true;
    config.inbound.shutdown_grace = Duration::from_secs(2);
    config.log.filter = "warn".into();
    weir_proxy::telemetry::init_logging(&config.log);
    Sidecar::start(config).expect("sidecar starts")
}

// === app_protocol: auto ===

/// An HTTP/1.1-only hyper app that echoes the request body and says what it saw.
async fn http1_echo_app() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let service =
                hyper::service::service_fn(|req: http::Request<hyper::body::Incoming>| {
                    let version = format!("{:?}", req.version());
                    let host = req.headers().get("host").cloned();
                    async move {
                        let body = req.into_body().collect().await.map(|b| b.to_bytes());
                        let mut resp = http::Response::new(Full::new(body.unwrap_or_default()));
                        resp.headers_mut().insert("x-app-saw", version.parse().unwrap());
                        if let Some(host) = host {
                            resp.headers_mut().insert("x-app-host", host);
                        }
                        Ok::<_, Infallible>(resp)
                    }
                });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_callers_of_an_http1_only_app_get_200() {
    // nginx: the HTTP/1.1-only app most services sit behind.
    let nginx = NginxApp::start(Listener::Http1, None).expect("nginx (./scripts/setup)");
    let weir = defaults(nginx.addr);
    let url = format!("http://{}/", weir.inbound_addr());
    let client = H2::new();
    let answers: Vec<_> = (0..50)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move { client.get(&url, &[]).await })
        })
        .collect();
    for answer in answers {
        let resp = answer.await.unwrap();
        assert_eq!(resp.status, 200, "{resp:?}");
        assert_eq!(&resp.body[..], b"ok");
        resp.level();
    }

    // A body goes through the translation both ways, with the caller's authority as Host.
    let app = http1_echo_app().await;
    let weir = defaults(app);
    let url = format!("http://{}/echo", weir.inbound_addr());
    let body = bytes_body(Bytes::from(vec![b'x'; 100_000]));
    let resp = client.send(http::Method::POST, &url, &[], body).await.unwrap();
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.body.len(), 100_000);
    assert_eq!(resp.header("x-app-saw"), Some("HTTP/1.1"));
    assert_eq!(resp.header("x-app-host"), Some(weir.inbound_addr().to_string().as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_callers_of_an_h2c_app_get_200() {
    // nginx's `listen ... http2` without TLS speaks h2c only: HTTP/1.1 would fail here.
    let nginx = NginxApp::start(Listener::H2c, None).expect("nginx (./scripts/setup)");
    let weir = defaults(nginx.addr);
    let url = format!("http://{}/", weir.inbound_addr());
    let client = H2::new();
    for _ in 0..20 {
        let resp = client.get(&url, &[]).await;
        assert_eq!(resp.status, 200, "{resp:?}");
        assert_eq!(&resp.body[..], b"ok");
    }
}

/// The egress role chooses the same way per downstream: an app's h2c call through its
/// egress to an HTTP/1.1-only downstream (nginx) is translated, not failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_call_through_the_egress_to_an_http1_only_downstream_gets_200() {
    let nginx = NginxApp::start(Listener::Http1, None).expect("nginx (./scripts/setup)");
    let app = http1_echo_app().await;
    let mut config = SidecarConfig::load(None).expect("embedded default");
    config.inbound.listen = "127.0.0.1:0".parse().unwrap();
    config.admin.listen = "127.0.0.1:0".parse().unwrap();
    config.inbound.app = app;
    config.inbound.work_stealing = true;
    config.egress.enabled = true;
    config.egress.listen = "127.0.0.1:0".parse().unwrap();
    config.log.filter = "warn".into();
    let weir = Sidecar::start(config).expect("sidecar starts");
    let egress = weir.egress().expect("egress role on").addr();

    // The app's HTTP/2 client pointed at the egress, the downstream in `:authority`.
    let stream = tokio::net::TcpStream::connect(egress).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    for _ in 0..10 {
        let req = http::Request::get(format!("http://{}/", nginx.addr))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = sender.send_request(req).await.expect("answered");
        assert_eq!(resp.status(), 200, "{resp:?}");
        assert_eq!(resp.version(), http::Version::HTTP_2);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"ok");
    }
}

// === gRPC ===

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

#[derive(Clone)]
struct Echo;

impl NamedService for Echo {
    const NAME: &'static str = "weir.test.Echo";
}

impl tonic::codegen::Service<http::Request<tonic::body::Body>> for Echo {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(RawCodec);
            Ok(grpc.unary(Echo, req).await)
        })
    }
}

impl UnaryService<Bytes> for Echo {
    type Response = Bytes;
    type Future = BoxFuture<Result<tonic::Response<Bytes>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        Box::pin(async move { Ok(tonic::Response::new(request.into_inner())) })
    }
}

async fn tonic_app() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        tonic::transport::Server::builder().add_service(Echo).serve_with_incoming(incoming),
    );
    addr
}

async fn grpc_call(target: SocketAddr, payload: &'static [u8]) -> Result<Bytes, tonic::Status> {
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{target}")).unwrap().connect_lazy();
    let mut client = tonic::client::Grpc::new(channel);
    client.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let path = PathAndQuery::from_static("/weir.test.Echo/Echo");
    let req = tonic::Request::new(Bytes::from_static(payload));
    client.unary(req, path, RawCodec).await.map(tonic::Response::into_inner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_reaches_a_tonic_app_and_gets_a_clear_error_from_an_http1_app() {
    let app = tonic_app().await;
    let weir = defaults(app);
    for _ in 0..5 {
        let echoed = grpc_call(weir.inbound_addr(), b"hello").await.expect("call succeeds");
        assert_eq!(&echoed[..], b"hello");
    }

    let nginx = NginxApp::start(Listener::Http1, None).expect("nginx (./scripts/setup)");
    let weir = defaults(nginx.addr);
    for _ in 0..3 {
        let err = grpc_call(weir.inbound_addr(), b"hello").await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unimplemented, "{err:?}");
        assert!(err.message().contains("HTTP/1.1"), "{err:?}");
    }
}

// === bursts and silence (the no-harm control loop) ===

/// One GET with priority `business.user` and a budget, as a client of the capacity app
/// sends it; returns the status.
async fn get(
    client: &hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        Full<Bytes>,
    >,
    target: SocketAddr,
    business: u8,
    user: u8,
    budget: Duration,
) -> u16 {
    let deadline = weir_harness::unix_micros() + budget.as_micros() as u64;
    let req = http::Request::get(format!("http://{target}/work"))
        .header("x-business-priority", business.to_string())
        .header("x-user-priority", user.to_string())
        .header("x-request-timeout-ms", budget.as_millis().to_string())
        .header(weir_harness::DEADLINE_HEADER, deadline.to_string())
        .body(Full::new(Bytes::new()))
        .unwrap();
    match tokio::time::timeout(budget + Duration::from_secs(1), client.request(req)).await {
        Ok(Ok(resp)) => {
            let status = resp.status().as_u16();
            let _ = resp.into_body().collect().await;
            status
        }
        _ => 0,
    }
}

fn client() -> hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
> {
    hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(usize::MAX)
        .build_http()
}

/// The case: 64 workers of 100 ms, warmed by 10 sequential requests, then bursts
/// of 20 concurrent requests with idle spells between: the app can serve every burst at
/// once, so nothing may be refused (on 827f65b, 17 of 20 were).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursts_on_a_quiet_app_are_queued_not_refused() {
    let app =
        CapacityBackend::start(BackendConfig::new(64, Duration::from_millis(100))).await.unwrap();
    let weir = defaults(app.addr());
    let target = weir.inbound_addr();
    let client = client();
    let budget = Duration::from_millis(500);
    for _ in 0..10 {
        assert_eq!(get(&client, target, 1, 64, budget).await, 200, "warm-up");
    }
    let mut refused = Vec::new();
    for burst in 0..3 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let answers: Vec<_> = (0..20)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move { get(&client, target, 1, (i * 6) as u8, budget).await })
            })
            .collect();
        for answer in answers {
            let status = answer.await.unwrap();
            if status != 200 {
                refused.push((burst, status));
            }
        }
    }
    assert!(refused.is_empty(), "(burst, status) not served: {refused:?}");
}

/// An overload of three classes, then a second and a half of silence: the idle sidecar
/// says it is not overloaded, and the next request of every class (its least important
/// user) is admitted. (On 827f65b the level stayed cut after 3 s of silence.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_overload_and_a_second_of_silence_every_class_is_admitted() {
    let app_config = BackendConfig::new(4, Duration::from_millis(20));
    let capacity = app_config.nominal_capacity();
    let app = CapacityBackend::start(app_config).await.unwrap();
    let weir = defaults(app.addr());
    let target = weir.inbound_addr();
    let phases = vec![Phase { rate_per_sec: 3.0 * capacity, duration: Duration::from_secs(3) }];
    let report = load::run(LoadSpec::new(target, phases)).await.unwrap();
    assert!(report.refused() > 0, "the overload was shed: {:?}", report.classes);
    // Every request of the load has been answered (the run waits for them): silence now.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let status = weir.status();
    assert!(!status.engine.overloaded, "an idle sidecar is not overloaded: {status:?}");
    let client = client();
    for business in 0..3 {
        let code = get(&client, target, business, 127, Duration::from_millis(500)).await;
        assert_eq!(code, 200, "class {business}'s first request after the silence");
    }
}

// === an underfed app under a cut level ===

/// Three classes at 3x the app's capacity for 3 s, so the level cuts and the in-flight
/// limit finds the app's knee; then the arrivals drop to 0.4x. Until the level's windows
/// catch up, it still refuses classes the app now has workers for: each such refusal would
/// leave a worker idle and protect no one, so while the app answers under nine tenths of
/// its capacity the refused request takes the idle worker instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_takes_an_idle_worker_while_the_app_is_underfed() {
    let _turn = support::CPU_HEAVY.lock().await;
    let app_config = BackendConfig::new(4, Duration::from_millis(20));
    let capacity = app_config.nominal_capacity();
    let app = CapacityBackend::start(app_config).await.unwrap();
    let weir = defaults(app.addr());
    let phases = vec![
        Phase { rate_per_sec: 3.0 * capacity, duration: Duration::from_secs(3) },
        Phase { rate_per_sec: 0.4 * capacity, duration: Duration::from_millis(1500) },
    ];
    let report = load::run(LoadSpec::new(weir.inbound_addr(), phases)).await.unwrap();
    let text = support::metrics_text(weir.admin_addr()).await;
    let taken = support::sample(&text, "weir_idle_slot_admitted_total{role=\"inbound\"}");
    assert!(report.refused() > 0, "the overload was shed: {:?}", report.classes);
    assert!(taken >= 1.0, "no refused request took an idle worker in the lull");
    // The lull is served (its first requests may still meet the high phase's queue).
    let lull: Vec<_> = report.events.iter().filter(|e| e.at_secs >= 3.0).collect();
    let served = lull.iter().filter(|e| e.ending == load::Ending::Ok).count();
    assert!(served as f64 >= 0.8 * lull.len() as f64, "{served} of {} served", lull.len());
}
