//! The webhook's HTTPS server: hyper 1 (HTTP/1.1 and HTTP/2 by ALPN) over tokio-rustls.
//!
//! Every wait is bounded by a named limit ([`Limits`]): accepted connections at once (and
//! per peer address), the TLS handshake, reading a request head, reading the body, the
//! body's size. The API server gives up on the webhook after the webhook's `timeoutSeconds`
//! (5 by default), so the defaults here are generous for a real API server and tight for
//! anything else: the handshake bound (2 s) is well under the API server's whole wait, so a
//! connection that never says anything gives its slot back before a review could time out.
//!
//! Routes: `POST /inject/namespace`, `POST /inject/pod` (see [`crate::patch::Scope`]);
//! `GET /live`, `GET /ready` (the kubelet's HTTPS probes), `GET /metrics`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::metrics::{Metrics, Refused};
use crate::patch::{Exclusions, Outcome, Scope};
use crate::review::{self, ReviewError};
use crate::template::Template;
use crate::tls::{self, CertStore};
use peers::PeerConnections;

/// The server's bounds.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest AdmissionReview body accepted (413 beyond).
    pub max_body_bytes: usize,
    /// From accept to a complete TLS handshake.
    pub handshake_timeout: Duration,
    /// From the end of the handshake (or of the previous request) to a complete request head.
    pub header_read_timeout: Duration,
    /// From the request head to the whole body (408 beyond).
    pub body_read_timeout: Duration,
    /// Connections served at once; more are closed on accept.
    pub max_connections: usize,
    /// Connections served at once from one peer address; more from it are closed on accept
    /// (one host cannot take every slot).
    pub max_connections_per_peer: usize,
    /// On shutdown, how long open connections may finish their requests.
    pub shutdown_grace: Duration,
}

/// The `--handshake-timeout` default.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// The `--max-connections-per-peer` default: 1/16 of the connection slots. An API server
/// multiplexes reviews over HTTP/2 (64 streams a connection here), so this carries 4,096
/// concurrent reviews from one address.
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: usize = 64;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // A pod object is limited to ~1.5 MiB by etcd; the review wraps one object on CREATE.
            max_body_bytes: 4 * 1024 * 1024,
            // A real API server completes it in milliseconds; its whole wait is 5 s.
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            max_connections: 1024,
            max_connections_per_peer: DEFAULT_MAX_CONNECTIONS_PER_PEER,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// What a request handler needs.
#[derive(Debug)]
pub struct State {
    pub template: Template,
    pub exclusions: Exclusions,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
    /// Set on SIGTERM: `/ready` fails so endpoints drop this pod while it still serves.
    pub draining: AtomicBool,
    pub warn_gate: WarnGate,
}

/// Lets one warning a second through.
#[derive(Debug, Default)]
pub struct WarnGate {
    last: std::sync::atomic::AtomicU64,
    epoch: std::sync::OnceLock<Instant>,
}

impl WarnGate {
    pub fn allow(&self) -> bool {
        let epoch = *self.epoch.get_or_init(Instant::now);
        // Seconds since the first call, plus one so the first call passes.
        let now = epoch.elapsed().as_secs() + 1;
        let last = self.last.load(Ordering::Relaxed);
        now > last
            && self.last.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }
}

/// Serves until `shutdown` turns true, then lets open connections finish for
/// `limits.shutdown_grace`. Accepting is weir-net's bounded loop (`limits.max_connections`);
/// the per-peer cap and the TLS handshake are this server's own.
pub async fn serve(
    listener: TcpListener,
    certs: Arc<CertStore>,
    state: Arc<State>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), rustls::Error> {
    let acceptor = TlsAcceptor::from(Arc::new(tls::server_config(certs)?));
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(state.limits.header_read_timeout)
        .keep_alive(true);
    // Pings reap HTTP/2 connections whose peer vanished (idle HTTP/1.1 ones end at the
    // header read timeout).
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(64)
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(10));
    let server = Server {
        acceptor,
        state: state.clone(),
        peers: Arc::new(PeerConnections::default()),
        builder: Arc::new(builder),
        graceful: &graceful,
    };
    let stop = async move {
        let mut shutdown = shutdown;
        // An error is the sender dropped: stop too.
        let _ = shutdown.wait_for(|stop| *stop).await;
    };
    weir_net::accept_loop(listener, "webhook", state.limits.max_connections, stop, server).await;
    if tokio::time::timeout(state.limits.shutdown_grace, graceful.shutdown()).await.is_err() {
        tracing::warn!("shutdown grace ended with connections still open");
    }
    Ok(())
}

/// What the accept loop hands each connection to.
struct Server<'a> {
    acceptor: TlsAcceptor,
    state: Arc<State>,
    peers: Arc<PeerConnections>,
    builder: Arc<auto::Builder<TokioExecutor>>,
    graceful: &'a GracefulShutdown,
}

impl weir_net::Serve for Server<'_> {
    fn refused(&mut self, _peer: SocketAddr) {
        self.state.metrics.connection_refused(Refused::MaxConnections);
    }

    fn serve(&mut self, conn: weir_net::Accepted) {
        let weir_net::Accepted { stream, peer, permit } = conn;
        let state = &self.state;
        let Some(peer_slot) = self.peers.enter(peer.ip(), state.limits.max_connections_per_peer)
        else {
            state.metrics.connection_refused(Refused::PerPeer);
            if state.warn_gate.allow() {
                tracing::warn!(%peer, limit = state.limits.max_connections_per_peer, "connection refused: the peer already has --max-connections-per-peer open (further ones this second at debug)");
            } else {
                tracing::debug!(%peer, "connection refused: per-peer limit");
            }
            return;
        };
        let acceptor = self.acceptor.clone();
        let state = state.clone();
        let builder = self.builder.clone();
        let watcher = self.graceful.watcher();
        tokio::spawn(async move {
            let _slots = (permit, peer_slot);
            let tls =
                match tokio::time::timeout(state.limits.handshake_timeout, acceptor.accept(stream))
                    .await
                {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                };
            // hyper's header_read_timeout does not cover the wait for the first bytes (the
            // HTTP/1.1 vs HTTP/2 detection, or an HTTP/2 preface): a connection that sends
            // no request within header_read_timeout is closed here.
            let header_read_timeout = state.limits.header_read_timeout;
            let requested = Arc::new(AtomicBool::new(false));
            let seen = requested.clone();
            let service = service_fn(move |req| {
                let state = state.clone();
                seen.store(true, Ordering::Relaxed);
                async move { Ok::<_, Infallible>(handle(&state, req).await) }
            });
            let conn = builder.serve_connection(TokioIo::new(tls), service);
            let mut conn = std::pin::pin!(watcher.watch(conn.into_owned()));
            let ended = tokio::select! {
                ended = &mut conn => Some(ended),
                _ = tokio::time::sleep(header_read_timeout) => None,
            };
            let ended = match ended {
                Some(ended) => ended,
                None if requested.load(Ordering::Relaxed) => conn.await,
                None => {
                    tracing::debug!(%peer, "no request within the header read timeout");
                    return;
                }
            };
            if let Err(e) = ended {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}

async fn handle(state: &State, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let scope = match req.uri().path() {
        "/inject/namespace" => Some(Scope::Namespace),
        "/inject/pod" => Some(Scope::Pod),
        _ => None,
    };
    match (req.method(), req.uri().path(), scope) {
        (&Method::POST, _, Some(scope)) => admit(state, scope, req).await,
        (_, _, Some(_)) => {
            let mut r = error(StatusCode::METHOD_NOT_ALLOWED, "reviews are POSTed");
            r.headers_mut().insert(header::ALLOW, http::HeaderValue::from_static("POST"));
            r
        }
        (&Method::GET, "/live", _) => text(StatusCode::OK, "live\n"),
        // Serving means a certificate and a template are loaded: both happen before bind.
        (&Method::GET, "/ready", _) if state.draining.load(Ordering::Relaxed) => {
            text(StatusCode::SERVICE_UNAVAILABLE, "draining\n")
        }
        (&Method::GET, "/ready", _) => text(StatusCode::OK, "ready\n"),
        (&Method::GET, "/metrics", _) => {
            let mut r = text(StatusCode::OK, state.metrics.render());
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        _ => error(
            StatusCode::NOT_FOUND,
            "no such endpoint; reviews go to /inject/namespace or /inject/pod",
        ),
    }
}

async fn admit(state: &State, scope: Scope, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let started = Instant::now();
    let limits = &state.limits;
    let bad = |status: StatusCode, message: String| {
        state.metrics.review(Outcome::BadReview);
        // Anyone who reaches the port can send garbage: at most one warning a second.
        if state.warn_gate.allow() {
            tracing::warn!(%status, %message, "review refused (further ones this second at debug)");
        } else {
            tracing::debug!(%status, %message, "review refused");
        }
        let mut r = error(status, &message);
        // The body may be partly unread: do not reuse the connection (HTTP/1.1; hyper
        // drops the header on HTTP/2, where the stream is reset instead).
        r.headers_mut().insert(header::CONNECTION, http::HeaderValue::from_static("close"));
        r
    };
    if let Some(ct) = req.headers().get(header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or("");
        if !ct.split(';').next().unwrap_or("").trim().eq_ignore_ascii_case("application/json") {
            return bad(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("content-type {ct:?}: want application/json"),
            );
        }
    }
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body_bytes as u64) {
        return bad(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "review of {} bytes exceeds the limit of {} bytes",
                declared.unwrap_or(0),
                limits.max_body_bytes
            ),
        );
    }
    let body = Limited::new(req.into_body(), limits.max_body_bytes);
    let body = match tokio::time::timeout(limits.body_read_timeout, body.collect()).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return bad(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("review exceeds the limit of {} bytes", limits.max_body_bytes),
            );
        }
        Ok(Err(e)) => {
            return bad(
                StatusCode::BAD_REQUEST,
                format!("review body truncated or unreadable: {e}"),
            )
        }
        Err(_) => {
            return bad(
                StatusCode::REQUEST_TIMEOUT,
                format!("review body not received within {:?}", limits.body_read_timeout),
            )
        }
    };
    match review::review(&body, scope, &state.template, &state.exclusions) {
        Ok(reply) => {
            let d = &reply.decision;
            state.metrics.review(d.outcome);
            let elapsed_us = started.elapsed().as_micros() as u64;
            if d.outcome == Outcome::CannotInject {
                // A pod that asked for weir runs without it: someone must read this.
                tracing::warn!(
                    uid = %reply.uid, namespace = %reply.namespace, pod = %reply.pod,
                    outcome = d.outcome.label(), reason = %d.reason, elapsed_us,
                    "pod admitted without the weir sidecar it asked for"
                );
            } else if d.outcome == Outcome::Injected || !d.warnings.is_empty() {
                tracing::info!(
                    uid = %reply.uid, namespace = %reply.namespace, pod = %reply.pod,
                    outcome = d.outcome.label(), reason = %d.reason, elapsed_us, "review"
                );
            } else {
                tracing::debug!(
                    uid = %reply.uid, namespace = %reply.namespace, pod = %reply.pod,
                    outcome = d.outcome.label(), reason = %d.reason, elapsed_us, "review"
                );
            }
            json(StatusCode::OK, &reply.body)
        }
        Err(e) => {
            let status = match e {
                ReviewError::Malformed(_) | ReviewError::NoRequest | ReviewError::NoUid => {
                    StatusCode::BAD_REQUEST
                }
                ReviewError::WrongVersion { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            };
            bad(status, e.to_string())
        }
    }
}

fn json(status: StatusCode, body: &serde_json::Value) -> Response<Full<Bytes>> {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut r = Response::new(Full::new(Bytes::from(bytes)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    r
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, http::HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

/// Every error: a JSON object with one `error` line.
fn error(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    json(status, &serde_json::json!({ "error": message }))
}

/// A running server (tests, and `weir inject`).
#[derive(Debug)]
pub struct Running {
    pub addr: SocketAddr,
    pub metrics: Arc<Metrics>,
    pub certs: Arc<CertStore>,
    state: Arc<State>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), rustls::Error>>,
    watcher: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Binds `addr` and serves; the certificate files are re-read every `reload_every`.
    pub async fn start(
        addr: SocketAddr,
        certs: CertStore,
        template: Template,
        exclusions: Exclusions,
        limits: Limits,
        reload_every: Duration,
    ) -> std::io::Result<Running> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let metrics = Arc::new(Metrics::default());
        let certs = Arc::new(certs);
        let state = Arc::new(State {
            template,
            exclusions,
            metrics: metrics.clone(),
            limits,
            draining: AtomicBool::new(false),
            warn_gate: WarnGate::default(),
        });
        let (stop, stopped) = watch::channel(false);
        let watcher = tokio::spawn(certs.clone().watch(reload_every, metrics.clone()));
        let task = tokio::spawn(serve(listener, certs.clone(), state.clone(), stopped));
        Ok(Running { addr, metrics, certs, state, stop, task, watcher })
    }

    /// Keeps serving reviews but fails `/ready`, so the Service stops routing here before
    /// the listener closes (the API server would otherwise meet a refused connection and
    /// admit pods without their sidecar).
    pub fn begin_drain(&self) {
        self.state.draining.store(true, Ordering::Relaxed);
    }

    /// Stops accepting, lets open connections finish (bounded), and returns.
    pub async fn shutdown(self) -> Result<(), rustls::Error> {
        let _ = self.stop.send(true);
        self.watcher.abort();
        match self.task.await {
            Ok(result) => result,
            Err(e) => {
                tracing::error!(error = %e, "server task failed");
                Ok(())
            }
        }
    }
}

mod peers;
#[cfg(test)]
mod tests;
