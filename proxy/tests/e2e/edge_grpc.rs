//! gRPC refusals at the protocol edge: a refusal must be a real trailers-only response (one
//! HEADERS frame with END_STREAM, `grpc-status: 8`), checked on the wire with the `h2` crate
//! and seen as `RESOURCE_EXHAUSTED` by tonic and by grpcio (Python over gRPC's C core, which
//! reads anything else as UNKNOWN).
//!
//! grpcio runs from a virtualenv: `WEIR_GRPCIO_PYTHON` names its python, else
//! `tests/grpcio/.venv/bin/python`, which `.ci/run` creates (README: one-time local setup).
//! Without it the grpcio test is skipped loudly, unless `CI` is set, where it fails.
//! Refusals are forced deterministically: one in-flight slot held by the app, no queue.

use crate::support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes};
use http::{HeaderMap, Request, Response};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::client::Http1;
use support::eventually;
use support::grpc_codec::RawCodec;
use support::misbehaving::{edge_sidecar, h2_connect, MARGIN};
use tokio::sync::Semaphore;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Endpoint;
use tonic::{Code, Status};
use weir_proxy::Sidecar;

const WAIT: Duration = Duration::from_secs(10);
const METHOD: &str = "/weir.test.Echo/Echo";

// === the app: a hand-rolled gRPC echo on hyper, plus `/hold` to take the only slot ===

type Body = BoxBody<Bytes, hyper::Error>;

struct GrpcApp {
    addr: SocketAddr,
    hold: Arc<Semaphore>,
}

async fn grpc_app() -> GrpcApp {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hold = Arc::new(Semaphore::new(0));
    let held = hold.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let held = held.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| serve(held.clone(), req));
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    GrpcApp { addr, hold }
}

async fn serve(hold: Arc<Semaphore>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    if req.uri().path() == "/hold" {
        if let Ok(permit) = hold.acquire().await {
            permit.forget();
        }
        let body = Full::new(Bytes::from_static(b"held")).map_err(|n| match n {}).boxed();
        return Ok(Response::new(body));
    }
    // The request's one length-prefixed message, echoed back, then `grpc-status: 0`.
    let message = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", "0".parse().unwrap());
    let frames = vec![Ok(Frame::data(message)), Ok(Frame::trailers(trailers))];
    let body = StreamBody::new(futures_util::stream::iter(frames)).boxed();
    Ok(Response::builder().header("content-type", "application/grpc").body(body).unwrap())
}

/// `payload` as one gRPC message (uncompressed, 4-byte big-endian length).
fn grpc_message(payload: &[u8]) -> Bytes {
    let mut b = bytes::BytesMut::with_capacity(5 + payload.len());
    b.put_u8(0);
    b.put_u32(payload.len() as u32);
    b.put_slice(payload);
    b.freeze()
}

/// A sidecar with one in-flight slot and no queue, and that slot taken by a held request:
/// every further call is refused with `x-weir-shed: overload`. Drop the guard to release.
async fn refusing_sidecar(app: &GrpcApp) -> (Sidecar, tokio::task::JoinHandle<()>) {
    let weir = edge_sidecar(app.addr, |c| {
        c.inbound.max_inflight = 1;
        c.inbound.max_queued = 0;
        c.inbound.retry_after = Duration::from_millis(750);
    });
    let url = format!("http://{}/hold", weir.inbound_addr());
    let holder = tokio::spawn(async move {
        let resp = Http1::new().get(&url, &[]).await;
        assert_eq!(resp.status, 200);
    });
    assert!(eventually(WAIT, || weir.status().inflight == 1).await, "the slot is held");
    (weir, holder)
}

/// One gRPC call over a raw h2 connection: the response head, whether the stream ended with
/// the head (trailers-only), and what followed.
struct WireCall {
    head: http::response::Parts,
    ended_with_head: bool,
    data_frames: usize,
    trailers: Option<HeaderMap>,
}

async fn wire_call(addr: SocketAddr, extra: &[(&str, &str)]) -> WireCall {
    let h2 = h2_connect(addr, |_| {}).await;
    let mut send = h2.ready().await.unwrap();
    let mut req = Request::post(format!("http://{addr}{METHOD}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("x-business-priority", "2");
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    let (response, mut body_out) = send.send_request(req.body(()).unwrap(), false).unwrap();
    // weir may answer before reading the body, so a failed send is fine.
    let _ = body_out.send_data(grpc_message(b"hello"), true);
    let response = tokio::time::timeout(MARGIN, response).await.expect("answered").unwrap();
    let (head, mut body) = response.into_parts();
    let ended_with_head = body.is_end_stream();
    let mut data_frames = 0;
    while let Some(chunk) = tokio::time::timeout(MARGIN, body.data()).await.expect("body ends") {
        chunk.expect("body frame");
        data_frames += 1;
    }
    let trailers = tokio::time::timeout(MARGIN, body.trailers()).await.expect("ends").unwrap();
    WireCall { head, ended_with_head, data_frames, trailers }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_refusals_are_trailers_only_on_the_wire() {
    let app = grpc_app().await;
    let (weir, holder) = refusing_sidecar(&app).await;
    let addr = weir.inbound_addr();

    let check = |call: &WireCall, shed: &str| {
        let h = &call.head.headers;
        assert_eq!(call.head.status, 200);
        assert_eq!(h["grpc-status"], "8", "{h:?}");
        assert_eq!(h["x-weir-shed"], shed);
        assert!(h.get("x-admission-level").is_some());
        assert!(h.get("grpc-retry-pushback-ms").is_some());
        assert!(
            h.get("content-type").is_some_and(|v| v.as_bytes().starts_with(b"application/grpc")),
            "{h:?}"
        );
        assert!(call.ended_with_head, "END_STREAM on the HEADERS frame (trailers-only)");
        assert_eq!(call.data_frames, 0, "no DATA frame after a trailers-only response");
        assert!(call.trailers.is_none(), "no second HEADERS frame");
    };
    // Overload: no slot and no queue.
    check(&wire_call(addr, &[]).await, "overload");
    app.hold.add_permits(1);
    holder.await.unwrap();
    // Deadline: a budget already spent, refused although a slot is free.
    check(&wire_call(addr, &[("grpc-timeout", "0m")]).await, "deadline");

    // The same call is forwarded with a budget: message, then trailers.
    let ok = wire_call(addr, &[]).await;
    assert_eq!(ok.head.status, 200);
    assert!(ok.head.headers.get("x-admission-level").is_some());
    assert!(!ok.ended_with_head);
    assert!(ok.data_frames >= 1);
    assert_eq!(ok.trailers.expect("trailers")["grpc-status"], "0");
}

// === tonic ===

async fn tonic_call(addr: SocketAddr, payload: &'static [u8]) -> Result<Bytes, Status> {
    let channel = Endpoint::from_shared(format!("http://{addr}")).unwrap().connect_lazy();
    let mut client = tonic::client::Grpc::new(channel);
    client.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
    let mut req = tonic::Request::new(Bytes::from_static(payload));
    req.metadata_mut().insert("x-business-priority", "2".parse().unwrap());
    let resp = client.unary(req, PathAndQuery::from_static(METHOD), RawCodec).await?;
    Ok(resp.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic_sees_refusals_as_resource_exhausted() {
    let app = grpc_app().await;
    let (weir, holder) = refusing_sidecar(&app).await;
    let refused = tonic_call(weir.inbound_addr(), b"hello").await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    // The configured 750 ms, grown by half the time the class has been refused (at most 8x).
    let pushback: u64 = refused
        .metadata()
        .get("grpc-retry-pushback-ms")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((750..=6000).contains(&pushback), "{pushback}");
    app.hold.add_permits(1);
    holder.await.unwrap();
    let ok = tonic_call(weir.inbound_addr(), b"hello").await.expect("served once free");
    assert_eq!(&ok[..], b"hello");
}

// === grpcio (C core) ===

/// The python with grpcio, or `None` (skip) when it is missing outside CI.
fn grpcio_python() -> Option<PathBuf> {
    let python = std::env::var_os("WEIR_GRPCIO_PYTHON").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/grpcio/.venv/bin/python")
    });
    if python.is_file() {
        return Some(python);
    }
    let setup = "python3 -m venv tests/grpcio/.venv && \
                 tests/grpcio/.venv/bin/pip install -r tests/grpcio/requirements.txt";
    if std::env::var("CI").is_ok_and(|v| !v.is_empty()) {
        panic!("CI: no grpcio python at {} (.ci/run creates it: {setup})", python.display());
    }
    eprintln!(
        "\n!!! SKIPPING the grpcio test: no python at {}.\n!!! One-time setup: {setup}\n\
         !!! (or point WEIR_GRPCIO_PYTHON at a python with grpcio)\n",
        python.display()
    );
    None
}

/// Runs `tests/grpcio/unary_call.py` for `payloads`; one JSON outcome per call.
async fn grpcio_calls(
    python: &PathBuf,
    addr: SocketAddr,
    payloads: &[&str],
) -> Vec<serde_json::Value> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/grpcio/unary_call.py");
    let run = tokio::process::Command::new(python)
        .arg(&script)
        .arg(addr.to_string())
        .arg(METHOD)
        .args(payloads)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("grpcio client finished within 60 s")
        .expect("grpcio client runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "grpcio client failed: {}", String::from_utf8_lossy(&out.stderr));
    let outcomes: Vec<serde_json::Value> =
        stdout.lines().map(|l| serde_json::from_str(l).expect("one JSON line per call")).collect();
    assert_eq!(outcomes.len(), payloads.len(), "{stdout}");
    outcomes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_sees_refusals_as_resource_exhausted() {
    let Some(python) = grpcio_python() else { return };
    let app = grpc_app().await;
    let (weir, holder) = refusing_sidecar(&app).await;
    let addr = weir.inbound_addr();

    let refused = grpcio_calls(&python, addr, &["hello", "again"]).await;
    for outcome in &refused {
        assert_eq!(outcome["code"], "RESOURCE_EXHAUSTED", "{outcome}");
        // C-core hands a trailers-only response's headers over as trailing metadata.
        assert_eq!(outcome["trailing"]["x-weir-shed"], "overload", "{outcome}");
        // The configured 750 ms, grown by half the time the class has been refused.
        let pushback: u64 = outcome["trailing"]["grpc-retry-pushback-ms"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("a numeric pushback: {outcome}"));
        assert!((750..=6000).contains(&pushback), "{outcome}");
    }

    app.hold.add_permits(1);
    holder.await.unwrap();
    let served = grpcio_calls(&python, addr, &["hello"]).await;
    assert_eq!(served[0]["code"], "OK", "{}", served[0]);
    assert_eq!(served[0]["response"], "hello");
    assert!(served[0]["initial"]["x-admission-level"].is_string(), "{}", served[0]);
}
