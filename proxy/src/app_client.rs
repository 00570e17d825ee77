//! The client towards one upstream address (the app, for the inbound role; any authority,
//! for the egress role: one [`Endpoint`] per address), sized for a sidecar:
//!
//! - HTTP/1.1: idle keep-alive connections are reused last-in first-out (the warmest one,
//!   and the cold ones age out), an idle connection is closed after [`ClientSettings::
//!   idle_timeout`], and at most [`ClientSettings::max_idle_http1`] are kept. A connection
//!   goes back to the pool only once its response body has been read to the end. A
//!   connection has no task of its own: the request's task drives it while it waits for the
//!   response head, and the response body ([`UpstreamBody`]) drives it as it is read (one
//!   task woken per response, not two). An idle connection is driven by nobody: that the
//!   app closed it meanwhile is found when it is next taken (it is then closed), or it ages
//!   out at the next return to the pool. A request that a pooled connection could not even
//!   start (the app closed it meanwhile) is tried on another; an idempotent one that weir
//!   holds whole (no body, or one read ahead to its end) and that a reused connection lost
//!   before its response came (the app closed it as the request went out) is sent once
//!   more, on a fresh connection.
//! - h2c (prior knowledge): a few shared connections, streams multiplexed on them, and no
//!   stream can hold up the others. Each stream's receive window is [`H2_STREAM_WINDOW`]
//!   and a connection carries at most [`H2_STREAMS_PER_CONNECTION`] streams, while its
//!   connection window is larger than all their stream windows together: a response whose
//!   caller stopped reading stops at its own window and can never use up the window the
//!   other streams' data needs. (With one window for both, one unread 20 MB response
//!   stalled every stream on its connection until `timeouts.write`.) Its caller's
//!   `timeouts.write` then ends it, or sooner a request waiting for a place on its
//!   connection ([`Lease::place_wanted`]): stalled streams cannot take every place either.
//! - Connecting is bounded by `timeouts.app_connect`; the caller bounds the response head
//!   by the request's remaining budget.
//!
//! The inbound request path reaches the app through [`AppClient`], which [`Endpoint`]
//! implements; its tests drive the path with an app of their own (one that answers after a
//! virtual delay, stalls or fails), in-process and on tokio's paused clock.

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::body::{AppBody, RequestBody, YieldSignal};
use crate::refusal::WeirError;

/// An h2c stream's receive window: the most of one response the upstream may send ahead of
/// what weir has read (the pump then holds up to 16 more frames). 256 KiB moves a 20 MB
/// response as fast as the adaptive window did on loopback (docs/design.md, "Timeouts").
pub const H2_STREAM_WINDOW: u32 = 256 * 1024;

/// Streams one shared h2c connection carries at once; a request beyond that waits (within
/// its budget) for one to end. Above the in-flight limit's default (256) over two
/// connections, and above what most h2 servers allow per connection (nginx 128).
pub const H2_STREAMS_PER_CONNECTION: usize = 256;

/// The connection's receive window: every stream's window full, with room for two more,
/// is still less than it, so the streams that are read always have window left.
pub const H2_CONNECTION_WINDOW: u32 = (H2_STREAMS_PER_CONNECTION as u32 + 2) * H2_STREAM_WINDOW;

/// What the request path needs of its upstream: send one request (its URI already in the
/// form `protocol` needs) and answer its response head, or why none came. The caller bounds
/// the wait by the request's budget; the [`Lease`] is settled once the body has been read.
pub trait AppClient: Send + Sync + 'static {
    /// The response body.
    type Body: AppBody;

    /// Where requests go (the `Host` of a request that names none).
    fn addr(&self) -> SocketAddr;

    /// `now`: a clock read the caller made a moment ago (the pool's idle check needs no
    /// other).
    fn send(
        &self,
        protocol: Protocol,
        req: Request<RequestBody>,
        now: Instant,
    ) -> impl Future<Output = Result<Exchange<Self::Body>, ClientError>> + Send;
}

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

impl ClientError {
    /// 502 for a failed exchange with the app: unreachable when the connection was never
    /// made, failed otherwise.
    pub fn app_error(&self) -> WeirError {
        match self {
            ClientError::Http(_) => WeirError::AppFailed,
            _ => WeirError::AppUnreachable,
        }
    }

    /// The same for a downstream (egress).
    pub fn downstream_error(&self) -> WeirError {
        match self {
            ClientError::Http(_) => WeirError::DownstreamFailed,
            _ => WeirError::DownstreamUnreachable,
        }
    }
}

/// An HTTP/1.1 connection to the upstream, as hyper's client hands it over.
type Http1Conn = http1::Connection<TokioIo<TcpStream>, RequestBody>;

/// One HTTP/1.1 connection: its sender, and the connection itself, which whoever holds the
/// link drives (the request's task; see the module doc). Boxed once per connection, so it
/// moves in and out of the pool as a pointer.
struct Http1Link {
    sender: http1::SendRequest<RequestBody>,
    conn: Http1Conn,
    /// Where it goes back once its response has been read (weak: the pool holds its links).
    pool: std::sync::Weak<Http1Pool>,
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
pub struct Exchange<B = UpstreamBody> {
    pub response: Response<B>,
    pub lease: Lease,
}

/// What an exchange holds until its response body has been read: an h2c stream's place on
/// its connection. (An HTTP/1.1 connection is held by the response body itself, which
/// drives it: see [`UpstreamBody`].)
#[derive(Debug)]
pub struct Lease {
    stream: Option<StreamPlace>,
}

/// The upstream's response body. An HTTP/1.1 one carries the connection it arrives on and
/// drives it as it is read; once read to its end, the connection goes back to the pool (at
/// once, or when the body is dropped having seen its last byte); dropped before that, the
/// connection is closed.
pub struct UpstreamBody {
    inner: Incoming,
    link: Option<Box<Http1Link>>,
}

/// An h2c stream's place on its shared connection, and how that connection says a request
/// is waiting for one.
#[derive(Debug)]
struct StreamPlace {
    _permit: OwnedSemaphorePermit,
    wanted: Arc<YieldSignal>,
}

#[derive(Debug)]
struct Http1Pool {
    idle: Mutex<VecDeque<Idle>>,
    max_idle: usize,
    idle_timeout: Duration,
}

#[derive(Debug)]
struct Idle {
    link: Box<Http1Link>,
    since: Instant,
}

#[derive(Debug)]
struct H2Connections {
    slots: Box<[tokio::sync::Mutex<Option<http2::SendRequest<RequestBody>>>]>,
    /// Per slot, its [`H2_STREAMS_PER_CONNECTION`] stream places.
    streams: Box<[Arc<Semaphore>]>,
    /// Per slot, told (once per waiter) when a request has to wait for a place: a stream
    /// whose caller has stalled gives its place up then (see [`Lease::place_wanted`]).
    wanted: Box<[Arc<YieldSignal>]>,
    next: AtomicUsize,
}

// === impl Endpoint ===

impl Endpoint {
    pub fn new(addr: SocketAddr, settings: ClientSettings) -> Self {
        Self::with_stream_places(addr, settings, H2_STREAMS_PER_CONNECTION)
    }

    /// With `places` streams per h2c connection (tests use a few).
    fn with_stream_places(addr: SocketAddr, settings: ClientSettings, places: usize) -> Self {
        let h2_count = settings.h2_connections.max(1);
        let h2_slots = (0..h2_count).map(|_| Default::default()).collect();
        let h2_streams = (0..h2_count).map(|_| Arc::new(Semaphore::new(places))).collect();
        let h2_wanted = (0..h2_count).map(|_| Arc::new(YieldSignal::default())).collect();
        Endpoint {
            addr,
            http1: Arc::new(Http1Pool {
                idle: Mutex::new(VecDeque::new()),
                max_idle: settings.max_idle_http1,
                idle_timeout: settings.idle_timeout,
            }),
            h2: H2Connections {
                slots: h2_slots,
                streams: h2_streams,
                wanted: h2_wanted,
                next: AtomicUsize::new(0),
            },
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
        self.send_at(protocol, req, Instant::now()).await
    }

    /// [`Self::send`], `now` being a clock read made a moment ago.
    pub async fn send_at(
        &self,
        protocol: Protocol,
        req: Request<RequestBody>,
        now: Instant,
    ) -> Result<Exchange, ClientError> {
        match protocol {
            Protocol::Http1 => self.send_http1(req, now).await,
            Protocol::H2c => self.send_h2(req).await,
        }
    }

    async fn send_http1(
        &self,
        mut req: Request<RequestBody>,
        now: Instant,
    ) -> Result<Exchange, ClientError> {
        // Once a reused connection lost a request, only a fresh one is tried.
        let mut retried = false;
        loop {
            let pooled = if retried { None } else { self.http1.checkout(now) };
            let (link, pooled) = match pooled {
                Some(link) => (link, true),
                // Boxed (here and for h2c): a new connection is rare, and its handshake's
                // state would otherwise size every request's future.
                None => (Box::pin(self.connect_http1()).await?, false),
            };
            // Only a reused connection can have been closed by the app as the request went
            // out; a copy is kept for that case alone.
            let again = if pooled { replay(&req) } else { None };
            let (sent, link) = link.round_trip(req).await;
            match sent {
                Ok(response) => {
                    let response = response.map(|inner| UpstreamBody { inner, link });
                    return Ok(Exchange { response, lease: Lease::detached() });
                }
                Err(mut e) => {
                    if let Some(unsent) = e.take_message() {
                        // Never written: the pooled connection was closed under us.
                        if !pooled {
                            return Err(e.into_error().into());
                        }
                        req = unsent;
                        continue;
                    }
                    let error = e.into_error();
                    match again {
                        Some(again) if lost_before_response(&error) => {
                            tracing::debug!(error = %error, "reused app connection lost a request; sending it once more on a fresh one");
                            req = again.into_request();
                            retried = true;
                        }
                        _ => return Err(error.into()),
                    }
                }
            }
        }
    }

    /// A place for one more stream on a shared connection: on the next slot in turn with
    /// one free, or (every connection full) the first to free one on that slot, whose
    /// stalled streams are told a request is waiting.
    async fn h2_stream_place(&self) -> (usize, StreamPlace) {
        let first = self.h2.next.fetch_add(1, Relaxed);
        let count = self.h2.slots.len();
        let place = |slot: usize, permit| StreamPlace {
            _permit: permit,
            wanted: self.h2.wanted[slot].clone(),
        };
        for i in 0..count {
            let slot = (first + i) % count;
            if let Ok(permit) = self.h2.streams[slot].clone().try_acquire_owned() {
                return (slot, place(slot, permit));
            }
        }
        let slot = first % count;
        self.h2.wanted[slot].want();
        let permit = self.h2.streams[slot].clone().acquire_owned().await;
        (slot, place(slot, permit.expect("the stream semaphores are never closed")))
    }

    async fn send_h2(&self, mut req: Request<RequestBody>) -> Result<Exchange, ClientError> {
        let (slot, place) = self.h2_stream_place().await;
        for attempt in 0..2 {
            let mut sender = {
                let mut conn = self.h2.slots[slot].lock().await;
                match conn.as_ref() {
                    Some(s) if !s.is_closed() => s.clone(),
                    _ => conn.insert(Box::pin(self.connect_h2()).await?).clone(),
                }
            };
            match sender.try_send_request(req).await {
                Ok(response) => {
                    let lease = Lease { stream: Some(place) };
                    let response = response.map(|inner| UpstreamBody { inner, link: None });
                    return Ok(Exchange { response, lease });
                }
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

    async fn connect_http1(&self) -> Result<Box<Http1Link>, ClientError> {
        let io = self.connect().await?;
        // Flattened writes: a request's head and body are copied into one buffer and sent
        // with one `write`. hyper's vectored strategy instead fills an array of 64
        // `IoSlice`s on every flush, for a `writev` of (usually) the head alone: requests to
        // the app mostly have no body or a small one, so the copy costs less (measured:
        // ~500 fewer instructions per request with the caller side flattened too). The
        // caller side keeps vectored writes: responses can be large, and a copy of each
        // would cost more than it saves.
        let (sender, conn) = http1::Builder::new().writev(false).handshake(io).await?;
        Ok(Box::new(Http1Link { sender, conn, pool: Arc::downgrade(&self.http1) }))
    }

    async fn connect_h2(&self) -> Result<http2::SendRequest<RequestBody>, ClientError> {
        let io = self.connect().await?;
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .initial_stream_window_size(H2_STREAM_WINDOW)
            .initial_connection_window_size(H2_CONNECTION_WINDOW)
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

/// What it takes to send `req` again: only for an idempotent method (RFC 9110 9.2.2: a
/// client may repeat it automatically) whose body weir holds whole.
fn replay(req: &Request<RequestBody>) -> Option<Replay> {
    let idempotent = matches!(
        *req.method(),
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    );
    if !idempotent {
        return None;
    }
    // No body at all (the usual idempotent request): nothing to copy but the head.
    let body = match req.body().is_none() {
        true => None,
        false => Some(req.body().replay()?),
    };
    let headers = req.headers();
    let mut copy = Vec::with_capacity(headers.len());
    copy.extend(headers.iter().map(|(name, value)| (name.clone(), value.clone())));
    Some(Replay {
        method: req.method().clone(),
        uri: req.uri().clone(),
        version: req.version(),
        headers: copy,
        body,
    })
}

/// A request kept to be sent again (see [`replay`]), as plain lists: taken for every
/// request on a reused connection and almost never used, so it is made cheap to take (one
/// allocation) and turned back into a request only when it is sent again.
struct Replay {
    method: Method,
    uri: http::Uri,
    version: http::Version,
    /// In the order the map iterates them (each name's values together, in order), which
    /// `append` restores as it was.
    headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// `None`: no body.
    body: Option<RequestBody>,
}

impl Replay {
    fn into_request(self) -> Request<RequestBody> {
        let mut req = Request::new(self.body.unwrap_or_else(RequestBody::empty));
        *req.method_mut() = self.method;
        *req.uri_mut() = self.uri;
        *req.version_mut() = self.version;
        let headers = req.headers_mut();
        headers.reserve(self.headers.len());
        for (name, value) in self.headers {
            headers.append(name, value);
        }
        req
    }
}

/// Whether a request written on a reused connection was lost because the connection
/// closed before its response came (the app timed the idle connection out as the request
/// went out), rather than answered with garbage.
fn lost_before_response(error: &hyper::Error) -> bool {
    use std::error::Error as _;
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    if error.is_incomplete_message() || error.is_canceled() {
        return true;
    }
    let mut source = error.source();
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                BrokenPipe | ConnectionAborted | ConnectionReset | UnexpectedEof
            );
        }
        source = e.source();
    }
    false
}

// === impl AppClient for Endpoint ===

impl AppClient for Endpoint {
    type Body = UpstreamBody;

    #[inline]
    fn addr(&self) -> SocketAddr {
        self.addr
    }

    #[inline]
    fn send(
        &self,
        protocol: Protocol,
        req: Request<RequestBody>,
        now: Instant,
    ) -> impl Future<Output = Result<Exchange, ClientError>> + Send {
        Endpoint::send_at(self, protocol, req, now)
    }
}

// === impl Http1Pool ===

impl Http1Pool {
    /// The most recently used idle connection that is still open, ready for a request; `now`
    /// (a moment ago) judges its idle time.
    fn checkout(&self, now: Instant) -> Option<Box<Http1Link>> {
        loop {
            let mut idle = {
                let mut pool = self.idle.lock().unwrap_or_else(|p| p.into_inner());
                pool.pop_back()?
            };
            if now.saturating_duration_since(idle.since) > self.idle_timeout {
                continue;
            }
            // Nobody drove it while it was idle. Ready as its last exchange ended, it is taken
            // as it is: the request's first drive reads the app's close, if it came, before
            // it writes (and the request then goes to another connection, unsent).
            if idle.link.sender.is_ready() {
                return Some(idle.link);
            }
            // Still finishing its last exchange: driven once (without a waker: the request's
            // own drive registers its task next), then closed if that did not finish it (it
            // is still writing the last request's body, whose response came first).
            let quiet = &mut Context::from_waker(std::task::Waker::noop());
            if idle.link.poll_conn(quiet).is_pending() && idle.link.sender.is_ready() {
                return Some(idle.link);
            }
        }
    }

    fn checkin(&self, link: Box<Http1Link>) {
        let now = Instant::now();
        let mut pool = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        // The oldest sit at the front: drop those past the idle timeout, then keep the bound.
        while pool.front().is_some_and(|i| now.duration_since(i.since) > self.idle_timeout) {
            pool.pop_front();
        }
        if pool.len() >= self.max_idle {
            pool.pop_front();
        }
        pool.push_back(Idle { link, since: now });
    }
}

// === impl Lease ===

impl Lease {
    /// A lease that holds nothing (an HTTP/1.1 exchange, whose body holds its connection, or
    /// a test's app).
    pub fn detached() -> Self {
        Lease { stream: None }
    }

    /// For an h2c stream: resolves when a request is waiting for a place on this stream's
    /// connection. A response whose caller has stalled then gives up its place (and its
    /// caller the response) rather than hold up a caller who reads.
    pub fn place_wanted(&self) -> Option<Arc<YieldSignal>> {
        self.stream.as_ref().map(|s| s.wanted.clone())
    }

    /// The body was read to its end: the h2c stream's place is free. (An HTTP/1.1
    /// connection went back to its pool as the body ended.)
    pub fn reusable(self) {}
}

// === impl Http1Link ===

impl Http1Link {
    /// Drives the connection; `Ready` once it has ended (closed, or failed), after which it
    /// must not be driven again.
    fn poll_conn(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.conn).poll(cx).map(|ended| {
            if let Err(e) = ended {
                tracing::debug!(error = %e, "app connection (HTTP/1.1) ended");
            }
        })
    }

    /// Sends `req` and drives the connection until the response head is here; the link
    /// comes back unless the connection has ended.
    async fn round_trip(
        mut self: Box<Self>,
        req: Request<RequestBody>,
    ) -> (
        Result<Response<Incoming>, hyper::client::conn::TrySendError<Request<RequestBody>>>,
        Option<Box<Self>>,
    ) {
        let mut sent = pin!(self.sender.try_send_request(req));
        let mut link = Some(self);
        let mut written = false;
        let result = std::future::poll_fn(|cx| {
            // Only the connection answers, as this task drives it (or drops it): the answer
            // is looked for after each drive, without a waker (one would only wake this
            // task again, for nothing, as it drives the connection).
            let quiet = &mut Context::from_waker(std::task::Waker::noop());
            let Some(driven) = link.as_mut() else { return sent.as_mut().poll(cx) };
            // Once the request is out, the task is woken when the answer is readable: it is
            // read without a waker first, so that what reading it registers (the body's
            // hand-over) wakes nobody later; the task is registered again only if the
            // answer is not all here.
            let mut ended = false;
            if std::mem::replace(&mut written, true) {
                ended = driven.poll_conn(quiet).is_ready();
                if !ended {
                    if let Poll::Ready(answer) = sent.as_mut().poll(quiet) {
                        return Poll::Ready(answer);
                    }
                }
            }
            if !ended {
                ended = driven.poll_conn(cx).is_ready();
            }
            let answered = sent.as_mut().poll(quiet);
            if ended {
                // It answers a request it took before it ends; dropping it answers one it
                // never took.
                link = None;
                if answered.is_pending() {
                    return sent.as_mut().poll(cx);
                }
            }
            answered
        })
        .await;
        (result, link)
    }

    /// Back to the pool, if it is ready for the next request. One still writing the last
    /// request's body (the app answered first) is closed instead: nobody would drive it in
    /// the pool, and the caller sending that body would wait on it.
    fn settle(mut self: Box<Self>) {
        if !self.sender.is_ready() {
            let quiet = &mut Context::from_waker(std::task::Waker::noop());
            if self.poll_conn(quiet).is_ready() || !self.sender.is_ready() {
                return;
            }
        }
        if let Some(pool) = self.pool.upgrade() {
            pool.checkin(self);
        }
    }
}

impl std::fmt::Debug for Http1Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Http1Link").finish_non_exhaustive()
    }
}

// === impl UpstreamBody ===

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let Some(link) = this.link.as_mut() else {
            return Pin::new(&mut this.inner).poll_frame(cx);
        };
        // Only the connection feeds the body, as it is driven here: the body is read
        // without a waker (one would only wake this task again as it drives the connection).
        let quiet = &mut Context::from_waker(std::task::Waker::noop());
        let mut polled = Pin::new(&mut this.inner).poll_frame(quiet);
        if polled.is_pending() {
            // Nothing here yet: the connection reads more into the body (or ends it).
            if link.poll_conn(cx).is_ready() {
                this.link = None;
            }
            polled = Pin::new(&mut this.inner).poll_frame(quiet);
        }
        if let Poll::Ready(None) = polled {
            if let Some(link) = this.link.take() {
                link.settle();
            }
        }
        polled
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for UpstreamBody {
    /// A body dropped having seen its last byte (a HEAD response's, one of length 0, or one
    /// of known length read whole) leaves its connection reusable; any other closes it.
    fn drop(&mut self) {
        if let Some(link) = self.link.take() {
            if self.inner.is_end_stream() {
                link.settle();
            }
        }
    }
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody").field("inner", &self.inner).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::{PumpEvent, ResponseBody};

    /// An h2c app answering every request with 4 MiB.
    async fn h2_app() -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(|_req| async {
                        let body =
                            http_body_util::Full::new(bytes::Bytes::from(vec![7u8; 4 << 20]));
                        Ok::<_, std::convert::Infallible>(Response::new(body))
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        addr
    }

    /// An app on an ephemeral port that serves each connection it accepts with `serve`, and
    /// counts them.
    async fn counting_app<F, Fut>(serve: F) -> (SocketAddr, Arc<AtomicUsize>)
    where
        F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                count.fetch_add(1, Relaxed);
                tokio::spawn(serve(stream));
            }
        });
        (addr, accepted)
    }

    /// An HTTP/1.1 app answering `/big` with 1 MiB and anything else with `ok`, counting the
    /// connections it accepted; `/bye` answers and then closes its connection (no
    /// `Connection: close`: as an app whose idle timer fires right after a response).
    async fn http1_app() -> (SocketAddr, Arc<AtomicUsize>, Arc<tokio::sync::Notify>) {
        let closed = Arc::new(tokio::sync::Notify::new());
        let signal = closed.clone();
        let (addr, accepted) = counting_app(move |stream| {
            let closed = signal.clone();
            async move {
            let (bye_tx, bye_rx) = tokio::sync::oneshot::channel::<()>();
            let bye_tx = Mutex::new(Some(bye_tx));
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let body = match req.uri().path() {
                    "/big" => vec![7u8; 1 << 20],
                    "/bye" => {
                        bye_tx.lock().unwrap().take().map(|tx| tx.send(()));
                        b"ok".to_vec()
                    }
                    _ => b"ok".to_vec(),
                };
                let body = http_body_util::Full::new(bytes::Bytes::from(body));
                async { Ok::<_, std::convert::Infallible>(Response::new(body)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            let said_bye = {
                let mut conn = std::pin::pin!(conn);
                tokio::select! {
                    _ = conn.as_mut() => false,
                    _ = bye_rx => {
                        // Let the response go out, then close.
                        let _ = tokio::time::timeout(Duration::from_millis(50), conn.as_mut()).await;
                        true
                    }
                }
            };
            // The connection is dropped (closed) by now.
            if said_bye {
                closed.notify_one();
            }
            }
        })
        .await;
        (addr, accepted, closed)
    }

    fn get_path(addr: SocketAddr, path: &str) -> Request<RequestBody> {
        Request::get(format!("http://{addr}{path}"))
            .header(http::header::HOST, addr.to_string())
            .body(RequestBody::empty())
            .unwrap()
    }

    #[tokio::test]
    async fn an_http1_connection_is_reused_once_read_closed_if_not_and_a_closed_one_is_skipped() {
        use http_body_util::BodyExt;
        let (addr, accepted, closed) = http1_app().await;
        let settings = ClientSettings {
            connect_timeout: Duration::from_secs(1),
            max_idle_http1: 4,
            idle_timeout: Duration::from_secs(10),
            h2_connections: 1,
        };
        let endpoint = Endpoint::new(addr, settings);
        let send = |path: &'static str| endpoint.send(Protocol::Http1, get_path(addr, path));
        // Read to the end, one after the other: one connection serves them all.
        for _ in 0..5 {
            let body = send("/").await.unwrap().response.into_body();
            assert_eq!(body.collect().await.unwrap().to_bytes(), "ok");
        }
        // A large body is driven by its reader alone (no task of the connection's own).
        let body = send("/big").await.unwrap().response.into_body();
        assert_eq!(body.collect().await.unwrap().to_bytes().len(), 1 << 20);
        assert_eq!(accepted.load(Relaxed), 1);
        // Dropped before its end: that connection is closed, the next request opens another.
        let mut body = send("/big").await.unwrap().response.into_body();
        let first = body.frame().await.unwrap().unwrap();
        assert!(first.is_data());
        drop(body);
        let body = send("/").await.unwrap().response.into_body();
        assert_eq!(body.collect().await.unwrap().to_bytes(), "ok");
        assert_eq!(accepted.load(Relaxed), 2);
        // The app closes the pooled connection while it is idle (nobody drives it then): the
        // next request still gets its answer, on a new connection.
        let body = send("/bye").await.unwrap().response.into_body();
        assert_eq!(body.collect().await.unwrap().to_bytes(), "ok");
        tokio::time::timeout(Duration::from_secs(5), closed.notified())
            .await
            .expect("the app closed the connection after /bye");
        let body = send("/").await.unwrap().response.into_body();
        assert_eq!(body.collect().await.unwrap().to_bytes(), "ok");
        assert_eq!(accepted.load(Relaxed), 3);
    }

    /// A request body sent as its test sends it.
    struct Sent(tokio::sync::mpsc::Receiver<Bytes>);

    impl Body for Sent {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            self.0.poll_recv(cx).map(|piece| piece.map(|data| Ok(Frame::data(data))))
        }
    }

    #[tokio::test]
    async fn an_http1_connection_the_app_answered_before_the_request_body_ended_is_closed() {
        use http_body_util::BodyExt;
        let settings = ClientSettings {
            connect_timeout: Duration::from_secs(1),
            max_idle_http1: 4,
            idle_timeout: Duration::from_secs(10),
            h2_connections: 1,
        };
        // An app that answers as soon as the head is here and keeps reading what follows (the
        // connection stays open: nothing ends the exchange but weir).
        let (addr, accepted) = counting_app(|mut stream| async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            let mut answered = 0;
            while let Ok(n @ 1..) = stream.read(&mut buf).await {
                seen.extend_from_slice(&buf[..n]);
                let heads = seen.windows(4).filter(|w| w == b"\r\n\r\n").count();
                for _ in answered..heads {
                    let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    let _ = stream.write_all(ok).await;
                }
                answered = answered.max(heads);
            }
        })
        .await;
        let endpoint = Endpoint::new(addr, settings);
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(Bytes::from_static(b"part")).await.unwrap();
        let body =
            RequestBody::new(crate::body::CallerBody::new(Sent(rx)), Duration::from_secs(30));
        let req = Request::post(format!("http://{addr}/"))
            .header(http::header::HOST, addr.to_string())
            .body(body)
            .unwrap();
        // The app answers without reading the body, which has not ended.
        let answer = endpoint.send(Protocol::Http1, req).await.unwrap().response.into_body();
        assert_eq!(answer.collect().await.unwrap().to_bytes(), "ok");
        // Not pooled with the body still on its way: the caller's body is let go of at once
        // (a pooled connection is driven by nobody, and the caller would wait on it).
        tokio::time::timeout(Duration::from_secs(2), tx.closed())
            .await
            .expect("the request body is dropped with its connection");
        let body = endpoint.send(Protocol::Http1, get_path(addr, "/")).await.unwrap();
        assert_eq!(body.response.into_body().collect().await.unwrap().to_bytes(), "ok");
        assert_eq!(accepted.load(Relaxed), 2);
    }

    fn get(addr: SocketAddr) -> Request<RequestBody> {
        Request::get(format!("http://{addr}/")).body(RequestBody::empty()).unwrap()
    }

    #[tokio::test]
    async fn a_stalled_response_gives_its_place_to_a_waiting_request() {
        let addr = h2_app().await;
        let settings = ClientSettings {
            connect_timeout: Duration::from_secs(1),
            max_idle_http1: 1,
            idle_timeout: Duration::from_secs(1),
            h2_connections: 1,
        };
        let endpoint = Endpoint::with_stream_places(addr, settings, 2);
        let long = Duration::from_secs(30);
        let mut stalled = Vec::new();
        for _ in 0..2 {
            let Exchange { response, lease } =
                endpoint.send(Protocol::H2c, get(addr)).await.unwrap();
            let (wanted, events) = (lease.place_wanted(), Arc::new(Mutex::new(Vec::new())));
            let (seen, mut lease) = (events.clone(), Some(lease));
            let grace = Duration::from_millis(10);
            let body = ResponseBody::pumped_with_events(
                response.into_body(),
                long,
                long,
                grace,
                wanted,
                move |event| {
                    seen.lock().unwrap().push(event);
                    if matches!(event, PumpEvent::Ended { .. }) {
                        lease.take();
                    }
                },
            );
            stalled.push((body, events));
        }
        // Nobody reads either response: both stall and hold the connection's two places.
        tokio::time::sleep(Duration::from_millis(200)).await;
        for (_, events) in &stalled {
            assert_eq!(events.lock().unwrap().as_slice(), [PumpEvent::CallerStalled]);
        }
        let started = Instant::now();
        let third =
            tokio::time::timeout(Duration::from_secs(5), endpoint.send(Protocol::H2c, get(addr)))
                .await
                .expect("a place long before the stalled responses' write timeout")
                .unwrap();
        assert_eq!(third.response.status(), 200);
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        let gave_way = stalled
            .iter()
            .filter(|(_, e)| e.lock().unwrap().contains(&PumpEvent::Ended { ok: false }))
            .count();
        assert_eq!(gave_way, 1, "exactly one stalled response gave its place up");
    }
}
