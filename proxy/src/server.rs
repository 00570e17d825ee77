//! The inbound listener: accepting (at most `max_connections` at once; beyond that a new
//! connection is closed at once), telling HTTP/1.1 from h2c prior knowledge within
//! `timeouts.header_read`, serving each connection with hyper, closing it after
//! `timeouts.idle` without a request inside, and draining: on a graceful stop, accepting
//! ends and every connection finishes what it has (HTTP/1.1: the request in progress; h2:
//! GOAWAY, then the open streams). A connection asked to close is dropped once it has had
//! nothing inside (no request, no response body still streaming) for
//! `timeouts.graceful_close`: h2's graceful close waits for the peer to acknowledge a PING,
//! and a peer that never does would otherwise keep the connection, and its permit, for ever.

use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering::AcqRel, Ordering::Acquire};
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::config::InboundConfig;
use crate::service::{ConnState, Inbound};

pub(crate) mod caller_io;
pub(crate) mod detect;
mod h2_streams;

use caller_io::CallerIo;
use detect::Detected;
use h2_streams::StreamExecutor;

/// The per-connection settings.
#[derive(Debug, Clone)]
pub struct ConnSettings {
    pub max_connections: usize,
    pub header_read: Duration,
    pub idle: Duration,
    pub write: Duration,
    pub graceful_close: Duration,
    pub h2_max_concurrent_streams: u32,
}

impl ConnSettings {
    pub fn from_config(inbound: &InboundConfig) -> Self {
        ConnSettings {
            max_connections: inbound.max_connections,
            header_read: inbound.timeouts.header_read,
            idle: inbound.timeouts.idle,
            write: inbound.timeouts.write,
            graceful_close: inbound.timeouts.graceful_close,
            h2_max_concurrent_streams: inbound.h2.max_concurrent_streams,
        }
    }
}

/// Accepts until `drain` turns true, then returns (dropping the listener).
pub async fn accept_loop(
    listener: TcpListener,
    inbound: Arc<Inbound>,
    settings: Arc<ConnSettings>,
    drain: watch::Receiver<bool>,
) {
    let max_connections = settings.max_connections;
    let stop = drain.clone();
    accept_bounded(listener, max_connections, stop, "inbound", |stream, permit| {
        let conn = Connection {
            inbound: inbound.clone(),
            settings: settings.clone(),
            drain: drain.clone(),
            _permit: permit,
        };
        tokio::spawn(conn.serve(stream));
    })
    .await
}

/// The accept loop every listener shares: accepts until `stop` turns true, with at most
/// `max_connections` connections at once. Beyond that a new connection is closed at once (the
/// caller sees a reset, not a hang); `serve` gets each other one with the permit it holds
/// until it ends.
pub(crate) async fn accept_bounded(
    listener: TcpListener,
    max_connections: usize,
    mut stop: watch::Receiver<bool>,
    role: &'static str,
    mut serve: impl FnMut(TcpStream, OwnedSemaphorePermit),
) {
    let permits = Arc::new(Semaphore::new(max_connections));
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: back off a little instead of spinning.
                tracing::warn!(error = %e, role, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        match permits.clone().try_acquire_owned() {
            Ok(permit) => serve(stream, permit),
            Err(_) => drop(stream),
        }
    }
}

struct Connection {
    inbound: Arc<Inbound>,
    settings: Arc<ConnSettings>,
    drain: watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
}

impl Connection {
    async fn serve(mut self, stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        let settings = self.settings.clone();
        let detect_by = Instant::now() + settings.header_read;
        let detected = match detect::protocol(&stream, detect_by).await {
            Ok(Some(detected)) => detected,
            // Closed, failed, or nothing decisive within `header_read`.
            Ok(None) | Err(_) => return,
        };
        let state = Arc::new(ConnState::new());
        let streaming = Streaming::default();
        let service = {
            let (inbound, state, streaming) =
                (self.inbound.clone(), state.clone(), streaming.clone());
            service_fn(move |req| {
                let served = inbound.clone().serve(state.clone(), req);
                let streaming = streaming.clone();
                async move {
                    let mut response = served.await?;
                    if !hyper::body::Body::is_end_stream(response.body()) {
                        response.body_mut().hold(streaming.start());
                    }
                    Ok::<_, std::convert::Infallible>(response)
                }
            })
        };
        match detected {
            Detected::Http1 => {
                let io = TokioIo::new(CallerIo::http1(
                    stream,
                    settings.write,
                    self.inbound.clone(),
                    state.clone(),
                ));
                let conn = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(settings.header_read)
                    .serve_connection(io, service);
                self.drive(conn, &state, &streaming).await;
            }
            Detected::H2 => {
                let io = TokioIo::new(CallerIo::h2(stream, settings.write));
                let conn = http2::Builder::new(StreamExecutor { write: settings.write })
                    .timer(TokioTimer::new())
                    .max_concurrent_streams(settings.h2_max_concurrent_streams)
                    .serve_connection(io, service);
                self.drive(conn, &state, &streaming).await;
            }
        }
    }

    /// Runs the connection to its end, asking it to finish gracefully when it has been idle
    /// for `timeouts.idle` or the sidecar drains, and dropping it when that has not finished
    /// after `timeouts.graceful_close` with nothing inside.
    async fn drive<C>(&mut self, conn: C, state: &ConnState, streaming: &Streaming)
    where
        C: GracefulConnection,
        C::Error: std::fmt::Display,
    {
        let (idle, graceful_close) = (self.settings.idle, self.settings.graceful_close);
        let mut conn = pin!(conn);
        let timer = tokio::time::sleep(idle);
        let mut timer = pin!(timer);
        let mut closing = false;
        loop {
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "caller connection ended");
                    }
                    return;
                }
                () = timer.as_mut() => {
                    let now = Instant::now();
                    if closing {
                        // Asked to close at least `graceful_close` ago: done if nothing is
                        // inside; otherwise what is inside has its own bounds, look again.
                        if state.idle_deadline(idle).is_some() && streaming.none() {
                            tracing::debug!(
                                "caller connection dropped: its graceful close did not finish \
                                 within timeouts.graceful_close"
                            );
                            return;
                        }
                        timer.as_mut().reset(now + graceful_close);
                        continue;
                    }
                    match state.idle_deadline(idle).map(Instant::from_std) {
                        Some(at) if at <= now => {
                            conn.as_mut().graceful_shutdown();
                            closing = true;
                            timer.as_mut().reset(now + graceful_close);
                        }
                        Some(at) => timer.as_mut().reset(at),
                        None => timer.as_mut().reset(now + idle),
                    }
                }
                _ = self.drain.wait_for(|d| *d), if !closing => {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                    timer.as_mut().reset(Instant::now() + graceful_close);
                }
            }
        }
    }
}

/// Response bodies of one connection still being sent after their request left the
/// service (a request is counted inside only until its response head).
#[derive(Debug, Clone, Default)]
struct Streaming(Arc<AtomicUsize>);

/// One response body being sent; dropped with the body.
#[derive(Debug)]
struct StreamingBody(Arc<AtomicUsize>);

impl Streaming {
    fn start(&self) -> StreamingBody {
        self.0.fetch_add(1, AcqRel);
        StreamingBody(self.0.clone())
    }

    fn none(&self) -> bool {
        self.0.load(Acquire) == 0
    }
}

impl Drop for StreamingBody {
    fn drop(&mut self) {
        self.0.fetch_sub(1, AcqRel);
    }
}
