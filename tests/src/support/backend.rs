//! The app behind the sidecar: hyper 1 serving HTTP/1.1 and h2c (prior knowledge) on one
//! port ([`weir_workload::backend::HttpServer`], the capacity model's server). Routes:
//! - `/status/<code>`: that status, a short body.
//! - `/bytes/<n>`: `n` bytes streamed in 64 KiB chunks (chunked, no content-length).
//! - `/trailers`: a body and the trailers `x-checksum: done`.
//! - `/hold`: waits until [`Backend::release`] (for queue tests without timing).
//! - `/slow`: waits the configured service time.
//! - anything else: echoes the request body back, streaming.
//!
//! Every request's method, path, headers and arrival time are recorded.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use tokio::sync::Semaphore;
use weir_workload::backend::HttpServer;
pub use weir_workload::unix_micros;

/// Header the tests put the client's send time in (microseconds since the Unix epoch).
pub const SENT_AT: &str = "x-test-sent-us";
/// Header with the budget the client granted, ms (the app checks it was kept).
pub const BUDGET: &str = "x-test-budget-ms";

#[derive(Debug, Clone)]
pub struct Seen {
    pub method: http::Method,
    pub path: String,
    pub headers: HeaderMap,
    pub version: http::Version,
}

pub struct State {
    pub seen: Mutex<Vec<Seen>>,
    pub arrivals: AtomicU64,
    pub completed: AtomicU64,
    /// Requests that arrived after the deadline their client granted (plus slack).
    pub late: AtomicU64,
    pub service_ms: AtomicU64,
    /// Requests being handled now, and the most at once.
    pub inside: AtomicU64,
    pub peak_inside: AtomicU64,
    hold: Semaphore,
}

impl Default for State {
    fn default() -> Self {
        State {
            seen: Mutex::default(),
            arrivals: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            late: AtomicU64::new(0),
            service_ms: AtomicU64::new(0),
            inside: AtomicU64::new(0),
            peak_inside: AtomicU64::new(0),
            hold: Semaphore::new(0),
        }
    }
}

pub struct Backend {
    pub addr: SocketAddr,
    pub state: Arc<State>,
    _server: HttpServer,
}

type Body = BoxBody<Bytes, hyper::Error>;

/// How late past its client's deadline a request may reach the app: the gate decides at
/// dequeue, and the hop from the gate to the app takes a little time on a busy 2-core box.
pub const LATE_SLACK: Duration = Duration::from_millis(25);

impl Backend {
    pub async fn start() -> Backend {
        let state = Arc::new(State::default());
        let st = state.clone();
        let server =
            HttpServer::bind(([127, 0, 0, 1], 0).into(), move |req| handle(st.clone(), req))
                .await
                .expect("bind 127.0.0.1:0");
        Backend { addr: server.addr(), state, _server: server }
    }

    pub fn set_service_time(&self, t: Duration) {
        self.state.service_ms.store(t.as_millis() as u64, Relaxed);
    }

    /// Lets `n` held requests (`/hold`) finish.
    pub fn release(&self, n: usize) {
        self.state.hold.add_permits(n);
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    pub fn seen_path(&self, path: &str) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.path == path).collect()
    }

    pub fn arrivals(&self) -> u64 {
        self.state.arrivals.load(Relaxed)
    }
}

async fn handle(st: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let arrived = unix_micros();
    st.arrivals.fetch_add(1, Relaxed);
    let header_u64 = |name: &str| {
        req.headers().get(name).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok())
    };
    if let (Some(sent), Some(budget)) = (header_u64(SENT_AT), header_u64(BUDGET)) {
        if arrived > sent + budget * 1000 + LATE_SLACK.as_micros() as u64 {
            st.late.fetch_add(1, Relaxed);
        }
    }
    let path = req.uri().path().to_string();
    st.seen.lock().unwrap().push(Seen {
        method: req.method().clone(),
        path: path.clone(),
        headers: req.headers().clone(),
        version: req.version(),
    });
    let now_inside = st.inside.fetch_add(1, Relaxed) + 1;
    st.peak_inside.fetch_max(now_inside, Relaxed);
    // The app keeps working even if its caller hangs up (most apps do): the work runs in its
    // own task, which does the accounting whether or not anyone still waits for it.
    let work = tokio::spawn({
        let st = st.clone();
        async move {
            let resp = route(&st, &path, req).await;
            st.inside.fetch_sub(1, Relaxed);
            st.completed.fetch_add(1, Relaxed);
            resp
        }
    });
    work.await.expect("route does not panic")
}

async fn route(st: &State, path: &str, req: Request<Incoming>) -> Response<Body> {
    if let Some(code) = path.strip_prefix("/status/") {
        let status = code.parse::<u16>().ok().and_then(|c| StatusCode::from_u16(c).ok());
        let status = status.unwrap_or(StatusCode::BAD_REQUEST);
        let body = if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
            Bytes::new()
        } else {
            Bytes::from_static(b"status")
        };
        return Response::builder()
            .status(status)
            .header("x-backend", "yes")
            .body(full(body))
            .unwrap();
    }
    if let Some(n) = path.strip_prefix("/bytes/") {
        let total: usize = n.parse().unwrap_or(0);
        let chunks = (0..total.div_ceil(CHUNK)).map(move |i| {
            let len = CHUNK.min(total - i * CHUNK);
            Ok::<_, hyper::Error>(Frame::data(Bytes::from(vec![pattern(i); len])))
        });
        let body = StreamBody::new(futures_stream(chunks));
        return Response::builder().header("x-backend", "yes").body(BodyExt::boxed(body)).unwrap();
    }
    if path == "/trailers" {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-checksum", "done".parse().unwrap());
        let frames = vec![
            Ok::<_, hyper::Error>(Frame::data(Bytes::from_static(b"with trailers"))),
            Ok(Frame::trailers(trailers)),
        ];
        let body = StreamBody::new(futures_stream(frames.into_iter()));
        return Response::builder().body(BodyExt::boxed(body)).unwrap();
    }
    if path == "/hold" {
        if let Ok(permit) = st.hold.acquire().await {
            permit.forget();
        }
        return Response::builder().body(full(Bytes::from_static(b"held"))).unwrap();
    }
    if path == "/slow" {
        let ms = st.service_ms.load(Relaxed);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        return Response::builder().body(full(Bytes::from_static(b"slow"))).unwrap();
    }
    // Echo, streaming the request body straight back.
    let method = req.method().to_string();
    let body = req.into_body().boxed();
    Response::builder()
        .header("x-echo-method", method)
        .header("x-backend", "yes")
        .body(body)
        .unwrap()
}

const CHUNK: usize = 64 * 1024;

/// The byte chunk `i` of `/bytes/<n>` is filled with.
pub fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

fn full(b: Bytes) -> Body {
    http_body_util::Full::new(b).map_err(|never| match never {}).boxed()
}

fn futures_stream<I, T>(iter: I) -> futures_util::stream::Iter<I>
where
    I: Iterator<Item = T>,
{
    futures_util::stream::iter(iter)
}

/// Elapsed since `t`, for reports.
pub fn since(t: Instant) -> Duration {
    t.elapsed()
}
