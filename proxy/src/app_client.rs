//! The client towards one upstream address (the app, for the inbound role; any authority,
//! for the egress role: one [`Endpoint`] per address), sized for a sidecar:
//!
//! - HTTP/1.1: idle keep-alive connections are reused last-in first-out (the warmest one,
//!   and the cold ones age out), an idle connection is closed after [`ClientSettings::
//!   idle_timeout`], and at most [`ClientSettings::max_idle_http1`] are kept. A connection
//!   goes back to the pool only once its response body has been read to the end. A request
//!   that a pooled connection could not even start (the app closed it meanwhile) is retried
//!   once on another.
//! - h2c (prior knowledge): a few shared connections, streams multiplexed on them.
//! - Connecting is bounded by `timeouts.app_connect`; the caller bounds the response head
//!   by the request's remaining budget.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;

use crate::body::RequestBody;

/// How the pool is sized and bounded.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    /// TCP connect to the upstream.
    pub connect_timeout: Duration,
    /// Idle HTTP/1.1 connections kept for reuse.
    pub max_idle_http1: usize,
    /// An idle HTTP/1.1 connection older than this is closed instead of reused.
    pub idle_timeout: Duration,
    /// Shared h2c connections.
    pub h2_connections: usize,
}

/// The protocol to the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    H2c,
}

/// Why no response came.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connect to {addr}: {source}")]
    Connect { addr: SocketAddr, source: std::io::Error },
    #[error("connect to {addr}: no answer within timeouts.app_connect")]
    ConnectTimeout { addr: SocketAddr },
    #[error("{0}")]
    Http(#[from] hyper::Error),
}

/// One upstream address and its connections.
#[derive(Debug)]
pub struct Endpoint {
    addr: SocketAddr,
    settings: ClientSettings,
    http1: Arc<Http1Pool>,
    h2: H2Connections,
}

/// The response head, and the connection lease to settle once its body has been read.
pub struct Exchange {
    pub response: Response<Incoming>,
    pub lease: Lease,
}

/// An HTTP/1.1 connection busy with one exchange: back to the pool when [`Lease::reusable`]
/// is called after the body ended; closed when dropped otherwise.
#[derive(Debug)]
pub struct Lease {
    held: Option<(http1::SendRequest<RequestBody>, Arc<Http1Pool>)>,
}

#[derive(Debug)]
struct Http1Pool {
    idle: Mutex<VecDeque<Idle>>,
    max_idle: usize,
    idle_timeout: Duration,
}

#[derive(Debug)]
struct Idle {
    sender: http1::SendRequest<RequestBody>,
    since: Instant,
}

#[derive(Debug)]
struct H2Connections {
    slots: Box<[tokio::sync::Mutex<Option<http2::SendRequest<RequestBody>>>]>,
    next: AtomicUsize,
}

// === impl Endpoint ===

impl Endpoint {
    pub fn new(addr: SocketAddr, settings: ClientSettings) -> Self {
        let h2_slots = (0..settings.h2_connections.max(1)).map(|_| Default::default()).collect();
        Endpoint {
            addr,
            http1: Arc::new(Http1Pool {
                idle: Mutex::new(VecDeque::new()),
                max_idle: settings.max_idle_http1,
                idle_timeout: settings.idle_timeout,
            }),
            h2: H2Connections { slots: h2_slots, next: AtomicUsize::new(0) },
            settings,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sends `req` (its URI already in the form `protocol` needs) and waits for the head.
    pub async fn send(
        &self,
        protocol: Protocol,
        req: Request<RequestBody>,
    ) -> Result<Exchange, ClientError> {
        match protocol {
            Protocol::Http1 => self.send_http1(req).await,
            Protocol::H2c => self.send_h2(req).await,
        }
    }

    async fn send_http1(&self, mut req: Request<RequestBody>) -> Result<Exchange, ClientError> {
        loop {
            let (mut sender, pooled) = match self.http1.checkout().await {
                Some(sender) => (sender, true),
                None => (self.connect_http1().await?, false),
            };
            match sender.try_send_request(req).await {
                Ok(response) => {
                    let lease = Lease { held: Some((sender, self.http1.clone())) };
                    return Ok(Exchange { response, lease });
                }
                Err(mut e) => match e.take_message() {
                    // Never written: the pooled connection was closed under us. Try another.
                    Some(unsent) if pooled => req = unsent,
                    _ => return Err(e.into_error().into()),
                },
            }
        }
    }

    async fn send_h2(&self, mut req: Request<RequestBody>) -> Result<Exchange, ClientError> {
        let slot = self.h2.next.fetch_add(1, Relaxed) % self.h2.slots.len();
        for attempt in 0..2 {
            let mut sender = {
                let mut conn = self.h2.slots[slot].lock().await;
                match conn.as_ref() {
                    Some(s) if !s.is_closed() => s.clone(),
                    _ => conn.insert(self.connect_h2().await?).clone(),
                }
            };
            match sender.try_send_request(req).await {
                Ok(response) => return Ok(Exchange { response, lease: Lease { held: None } }),
                Err(mut e) => match e.take_message() {
                    Some(unsent) if attempt == 0 => req = unsent,
                    _ => return Err(e.into_error().into()),
                },
            }
        }
        unreachable!("the second attempt returns")
    }

    async fn connect(&self) -> Result<TokioIo<TcpStream>, ClientError> {
        let addr = self.addr;
        let stream = tokio::time::timeout(self.settings.connect_timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| ClientError::ConnectTimeout { addr })?
            .map_err(|source| ClientError::Connect { addr, source })?;
        let _ = stream.set_nodelay(true);
        Ok(TokioIo::new(stream))
    }

    async fn connect_http1(&self) -> Result<http1::SendRequest<RequestBody>, ClientError> {
        let io = self.connect().await?;
        let (sender, conn) = http1::Builder::new().handshake(io).await?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "app connection (HTTP/1.1) ended");
            }
        });
        Ok(sender)
    }

    async fn connect_h2(&self) -> Result<http2::SendRequest<RequestBody>, ClientError> {
        let io = self.connect().await?;
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .adaptive_window(true)
            .handshake(io)
            .await?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "app connection (h2c) ended");
            }
        });
        Ok(sender)
    }
}

// === impl Http1Pool ===

impl Http1Pool {
    /// The most recently used idle connection that is still open, ready for a request.
    async fn checkout(&self) -> Option<http1::SendRequest<RequestBody>> {
        loop {
            let mut idle = {
                let mut pool = self.idle.lock().unwrap_or_else(|p| p.into_inner());
                pool.pop_back()?
            };
            if idle.sender.is_closed() || idle.since.elapsed() > self.idle_timeout {
                continue;
            }
            // Returned right after its body ended, the connection may still be finishing
            // that exchange; this is immediate once it has (and fails if it closed).
            if idle.sender.ready().await.is_ok() {
                return Some(idle.sender);
            }
        }
    }

    fn checkin(&self, sender: http1::SendRequest<RequestBody>) {
        if sender.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut pool = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        // The oldest sit at the front: drop those past the idle timeout, then keep the bound.
        while pool.front().is_some_and(|i| now.duration_since(i.since) > self.idle_timeout) {
            pool.pop_front();
        }
        if pool.len() >= self.max_idle {
            pool.pop_front();
        }
        pool.push_back(Idle { sender, since: now });
    }
}

// === impl Lease ===

impl Lease {
    /// The body was read to its end: the connection may serve the next request.
    pub fn reusable(mut self) {
        if let Some((sender, pool)) = self.held.take() {
            pool.checkin(sender);
        }
    }
}
