//! A capacity-model app: `workers` requests in service at a time, each taking
//! `service_time`, the rest waiting in a FIFO queue. Its capacity is therefore
//! `workers / service_time` requests per second, whatever is offered.
//!
//! Like a real app it does the work it accepted even when the client has gone
//! (a thread does not notice a closed socket), so overload without control shows up
//! as work spent on answers nobody reads. The backend counts that work using the
//! absolute deadline the load generator sends in [`crate::DEADLINE_HEADER`].

use bytes::Bytes;
use http_body_util::Full;
use hyper::{body::Incoming, Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Serialize;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

#[cfg(test)]
mod tests;

#[derive(Clone, Debug, Serialize)]
pub struct BackendConfig {
    pub workers: usize,
    #[serde(serialize_with = "crate::ser_millis")]
    pub service_time: Duration,
    /// Burn CPU for the service time instead of sleeping (models a CPU-bound app; on a
    /// 2-core machine it competes with everything else, so the sleeping model is the default).
    pub busy_wait: bool,
    /// Abandon a request (waiting or in service) when its connection closes, like an app
    /// that cancels work on disconnect. Off by default: most apps finish what they took.
    #[serde(default)]
    pub cancel_on_disconnect: bool,
    /// Changes of the service time over the run: from each `at` (since start or the last
    /// reset) on, requests take `service_time` (an app that becomes slower, then recovers).
    #[serde(default)]
    pub service_changes: Vec<ServiceChange>,
    /// The app stops answering for a while: nothing starts or finishes service inside it.
    #[serde(default)]
    pub stall: Option<Stall>,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct ServiceChange {
    #[serde(serialize_with = "crate::ser_secs")]
    pub at: Duration,
    #[serde(serialize_with = "crate::ser_millis")]
    pub service_time: Duration,
}

/// `[from, to)` since start or the last reset.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Stall {
    #[serde(serialize_with = "crate::ser_secs")]
    pub from: Duration,
    #[serde(serialize_with = "crate::ser_secs")]
    pub to: Duration,
}

impl BackendConfig {
    /// Sleeping workers that finish what they took.
    pub fn new(workers: usize, service_time: Duration) -> Self {
        BackendConfig {
            workers,
            service_time,
            busy_wait: false,
            cancel_on_disconnect: false,
            service_changes: Vec::new(),
            stall: None,
        }
    }

    /// The service time at `elapsed` since start (or the last reset).
    pub fn service_time_at(&self, elapsed: Duration) -> Duration {
        self.service_changes
            .iter()
            .filter(|c| c.at <= elapsed)
            .max_by_key(|c| c.at)
            .map_or(self.service_time, |c| c.service_time)
    }

    /// When service that would end at `finish` (since start) ends once a stall that
    /// overlaps `[start, finish)` has passed.
    fn finish_after_stall(&self, start: Duration, finish: Duration) -> Duration {
        match self.stall {
            Some(stall) if stall.from < finish && stall.to > start => {
                finish + (stall.to - stall.from.max(start))
            }
            _ => finish,
        }
    }

    /// The model's nominal capacity (requests per second).
    pub fn nominal_capacity(&self) -> f64 {
        if self.service_time.is_zero() {
            return f64::INFINITY;
        }
        self.workers as f64 / self.service_time.as_secs_f64()
    }
}

/// Counters since start or the last [`CapacityBackend::reset`].
#[derive(Clone, Debug, Default, Serialize)]
pub struct BackendSnapshot {
    pub received: u64,
    pub completed: u64,
    /// Service started after the client's deadline had already passed.
    pub started_late: u64,
    /// Completed after the client's deadline: work nobody could use.
    pub completed_late: u64,
    pub busy_seconds: f64,
    pub wasted_busy_seconds: f64,
    /// Mean time requests waited for a worker.
    pub mean_queue_wait_ms: f64,
    /// Most requests inside the app at once (waiting or in service). Above `workers`, the
    /// proxy in front forwarded more than the app can serve at once.
    pub peak_outstanding: u64,
}

#[derive(Default)]
struct Counters {
    received: AtomicU64,
    completed: AtomicU64,
    started_late: AtomicU64,
    completed_late: AtomicU64,
    busy_ns: AtomicU64,
    wasted_ns: AtomicU64,
    queue_wait_ns: AtomicU64,
    outstanding: AtomicU64,
    peak_outstanding: AtomicU64,
}

/// One generation of the backend: its worker pool and its counters. A reset closes the
/// pool (abandoning the queued backlog at once) and starts a fresh generation.
struct Epoch {
    workers: Arc<Semaphore>,
    counters: Counters,
    /// What service changes and stalls are timed from.
    started: Instant,
}

struct Shared {
    config: BackendConfig,
    epoch: Mutex<Arc<Epoch>>,
}

pub struct CapacityBackend {
    server: HttpServer,
    shared: Arc<Shared>,
}

// === impl CapacityBackend ===

impl CapacityBackend {
    /// Binds 127.0.0.1 on an ephemeral port and serves HTTP/1.1 and h2c (prior knowledge).
    pub async fn start(config: BackendConfig) -> std::io::Result<Self> {
        Self::start_on(config, SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    pub async fn start_on(config: BackendConfig, addr: SocketAddr) -> std::io::Result<Self> {
        let shared = Arc::new(Shared { epoch: Mutex::new(Epoch::new(&config)), config });
        let server = HttpServer::bind(addr, {
            let shared = shared.clone();
            move |req| serve(shared.clone(), req)
        })
        .await?;
        Ok(CapacityBackend { server, shared })
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    pub fn config(&self) -> &BackendConfig {
        &self.shared.config
    }

    pub fn snapshot(&self) -> BackendSnapshot {
        self.shared.current().snapshot()
    }

    /// Drops the queued backlog (those requests get a 503 at once), zeroes the counters.
    pub fn reset(&self) {
        let mut epoch = self.shared.epoch.lock().unwrap_or_else(|e| e.into_inner());
        epoch.workers.close();
        *epoch = Epoch::new(&self.shared.config);
    }
}

impl Drop for CapacityBackend {
    fn drop(&mut self) {
        self.server.stop();
        self.shared.current().workers.close();
    }
}

impl Shared {
    fn current(&self) -> Arc<Epoch> {
        self.epoch.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

// === impl Epoch ===

impl Epoch {
    fn new(config: &BackendConfig) -> Arc<Self> {
        let permits = config.workers.clamp(1, Semaphore::MAX_PERMITS);
        Arc::new(Epoch {
            workers: Arc::new(Semaphore::new(permits)),
            counters: Counters::default(),
            started: Instant::now(),
        })
    }

    fn snapshot(&self) -> BackendSnapshot {
        let c = &self.counters;
        let received = c.received.load(Relaxed);
        let waited = c.queue_wait_ns.load(Relaxed) as f64;
        BackendSnapshot {
            received,
            completed: c.completed.load(Relaxed),
            started_late: c.started_late.load(Relaxed),
            completed_late: c.completed_late.load(Relaxed),
            busy_seconds: c.busy_ns.load(Relaxed) as f64 / 1e9,
            wasted_busy_seconds: c.wasted_ns.load(Relaxed) as f64 / 1e9,
            mean_queue_wait_ms: if received == 0 { 0.0 } else { waited / received as f64 / 1e6 },
            peak_outstanding: c.peak_outstanding.load(Relaxed),
        }
    }
}

/// An HTTP/1.1 and h2c (prior knowledge) server on 127.0.0.1: each request goes to one
/// handler function. The capacity model above and the test harness's apps (`weir_harness`)
/// all serve through it. Dropping it stops the accept loop and closes its connections.
pub struct HttpServer {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
}

impl HttpServer {
    /// Binds `addr` (port 0: an ephemeral port, see [`HttpServer::addr`]) and serves every
    /// request with `handler`.
    pub async fn bind<H, F, B>(addr: SocketAddr, handler: H) -> std::io::Result<HttpServer>
    where
        H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
        F: Future<Output = Response<B>> + Send + 'static,
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(accept_loop(listener, handler, stopped));
        Ok(HttpServer { addr, stop })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and closes every connection (also done on drop).
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Connections a server serves at once (weir-net's bounded accept loop closes any beyond):
/// far above what a benchmark or test opens, and finite.
const MAX_CONNECTIONS: usize = 65_536;

async fn accept_loop<H, F, B>(listener: TcpListener, handler: H, stopped: watch::Receiver<bool>)
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stop = {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.changed().await;
        }
    };
    weir_net::accept_loop(listener, "backend", MAX_CONNECTIONS, stop, |conn: weir_net::Accepted| {
        let handler = handler.clone();
        let mut stopped = stopped.clone();
        tokio::spawn(async move {
            let _permit = conn.permit;
            let service = hyper::service::service_fn(move |req| {
                let answer = handler(req);
                async move { Ok::<_, std::convert::Infallible>(answer.await) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(conn.stream), service);
            tokio::select! {
                _ = conn => {}
                _ = stopped.changed() => {}
            }
        });
    })
    .await
}

async fn serve(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let deadline_us = deadline_of(&req);
    let epoch = shared.current();
    let config = shared.config.clone();
    epoch.counters.received.fetch_add(1, Relaxed);
    let served = if config.cancel_on_disconnect {
        // hyper drops this future when the peer closes the connection.
        do_work(epoch, config, deadline_us).await
    } else {
        // Its own task, so a client hanging up does not cancel it.
        tokio::spawn(do_work(epoch, config, deadline_us)).await.unwrap_or(false)
    };
    let status = if served { http::StatusCode::OK } else { http::StatusCode::SERVICE_UNAVAILABLE };
    let mut resp = Response::new(Full::new(Bytes::from_static(b"ok\n")));
    *resp.status_mut() = status;
    resp
}

/// Returns false when the backend was reset while the request waited.
async fn do_work(epoch: Arc<Epoch>, config: BackendConfig, deadline_us: Option<u64>) -> bool {
    let inside = Inside::enter(&epoch.counters);
    let served = serve_one(&epoch, &config, deadline_us).await;
    drop(inside);
    served
}

/// Counts a request inside the app, also when its future is dropped (cancelled).
struct Inside<'a>(&'a Counters);

impl<'a> Inside<'a> {
    fn enter(c: &'a Counters) -> Self {
        let inside = c.outstanding.fetch_add(1, Relaxed) + 1;
        c.peak_outstanding.fetch_max(inside, Relaxed);
        Inside(c)
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Relaxed);
    }
}

async fn serve_one(epoch: &Epoch, config: &BackendConfig, deadline_us: Option<u64>) -> bool {
    let queued = Instant::now();
    let permit = match epoch.workers.clone().acquire_owned().await {
        Ok(permit) => permit,
        Err(_) => return false,
    };
    let c = &epoch.counters;
    c.queue_wait_ns.fetch_add(queued.elapsed().as_nanos() as u64, Relaxed);
    let late = |d: Option<u64>| d.is_some_and(|d| crate::unix_micros() > d);
    if late(deadline_us) {
        c.started_late.fetch_add(1, Relaxed);
    }
    let started = Instant::now();
    let since = started.saturating_duration_since(epoch.started);
    let service_time = config.service_time_at(since);
    let finish = config.finish_after_stall(since, since + service_time);
    if config.busy_wait {
        let _ = tokio::task::spawn_blocking(move || {
            while started.elapsed() < service_time {
                std::hint::spin_loop();
            }
        })
        .await;
        tokio::time::sleep_until((epoch.started + finish).into()).await;
    } else if !finish.is_zero() {
        tokio::time::sleep_until((epoch.started + finish).into()).await;
    }
    drop(permit);
    let busy = started.elapsed().as_nanos() as u64;
    c.busy_ns.fetch_add(busy, Relaxed);
    c.completed.fetch_add(1, Relaxed);
    if late(deadline_us) {
        c.completed_late.fetch_add(1, Relaxed);
        c.wasted_ns.fetch_add(busy, Relaxed);
    }
    true
}

fn deadline_of(req: &Request<Incoming>) -> Option<u64> {
    let header = |name: &str| req.headers().get(name)?.to_str().ok()?.trim().parse::<u64>().ok();
    // Fall back to the relative budget, counted from arrival here (an underestimate of
    // lateness when something queued the request before it reached us).
    header(crate::DEADLINE_HEADER)
        .or_else(|| header("x-request-timeout-ms").map(|ms| crate::unix_micros() + ms * 1000))
}
