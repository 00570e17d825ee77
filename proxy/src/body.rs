//! Bodies on the way through, each wait bounded:
//!
//! - [`CallerBody`]: the caller's request body as the request path takes it: hyper's own
//!   (moved, not boxed) or any other [`Body`] (boxed; in-process tests drive the path with
//!   their own bodies).
//! - [`RequestBody`]: the caller's request body as the app reads it; the longest gap between
//!   two pieces is `timeouts.body_read`, and the whole body must arrive within the request's
//!   budget, so a body that never ends (or trickles) fails instead of holding the exchange
//!   (and its in-flight slot) open.
//! - [`ResponseBody`]: the app's response as the caller reads it. The in-flight slot belongs
//!   to the app's exchange, not to delivery: a small response of known length is read whole
//!   before it is sent on, and anything else is moved by a pump task into a short channel,
//!   so the slot is released when the app has finished, even if the caller has stopped
//!   reading. A caller that lets the channel stay full for `timeouts.write` loses the
//!   response.

use std::collections::VecDeque;
use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};

use crate::inflight::InflightLimit;

/// Errors of bodies passed between the caller and the app.
pub type BoxError = Box<dyn StdError + Send + Sync>;

/// Frames the pump may run ahead of a caller that reads slowly.
const PUMP_FRAMES: usize = 16;

/// Why a body ended early.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyStall {
    #[error("request body: nothing received for longer than timeouts.body_read")]
    RequestBodyRead,
    #[error("request body: not complete within the request's budget")]
    RequestBodyDeadline,
    #[error("request body: malformed, or the caller reset it")]
    RequestBodyMalformed,
    #[error("app response body: nothing received for longer than timeouts.body_read")]
    ResponseBodyRead,
    #[error("response not delivered: the caller read nothing for longer than timeouts.write")]
    CallerWrite,
    #[error("the app's response ended early")]
    Aborted,
}

// === CallerBody ===

/// The caller's request body: hyper's [`Incoming`], as the server skeleton hands it over
/// (moved, no allocation), or any other body, boxed ([`CallerBody::new`]): the request path
/// takes either, so its rules can be driven in-process without a socket.
#[derive(Debug)]
pub enum CallerBody {
    Incoming(Incoming),
    Boxed(http_body_util::combinators::BoxBody<Bytes, BoxError>),
}

impl CallerBody {
    /// Any body (boxed once per request): for callers other than hyper's server.
    pub fn new<B>(body: B) -> Self
    where
        B: Body<Data = Bytes> + Send + Sync + 'static,
        B::Error: Into<BoxError>,
    {
        use http_body_util::BodyExt;
        CallerBody::Boxed(body.map_err(Into::into).boxed())
    }
}

impl From<Incoming> for CallerBody {
    #[inline]
    fn from(body: Incoming) -> Self {
        CallerBody::Incoming(body)
    }
}

impl Body for CallerBody {
    type Data = Bytes;
    type Error = BoxError;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            CallerBody::Incoming(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            CallerBody::Boxed(body) => Pin::new(body).poll_frame(cx),
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match self {
            CallerBody::Incoming(body) => body.is_end_stream(),
            CallerBody::Boxed(body) => body.is_end_stream(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match self {
            CallerBody::Incoming(body) => body.size_hint(),
            CallerBody::Boxed(body) => body.size_hint(),
        }
    }
}

/// Reads `body` to its end: its data (as it came when it came in one piece, the usual case
/// for a small response: no copy, no list of pieces) and its trailers (several trailer
/// frames are merged).
pub async fn read_whole<B>(mut body: B) -> Result<(Bytes, Option<HeaderMap>), B::Error>
where
    B: Body<Data = Bytes> + Unpin,
{
    use http_body_util::BodyExt;
    let mut first = Bytes::new();
    let mut joined: Option<bytes::BytesMut> = None;
    let mut trailers: Option<HeaderMap> = None;
    while let Some(frame) = body.frame().await {
        let frame = match frame?.into_data() {
            Ok(data) if data.is_empty() => continue,
            Ok(data) if first.is_empty() => {
                first = data;
                continue;
            }
            Ok(data) => {
                let joined = joined.get_or_insert_with(|| {
                    let mut all = bytes::BytesMut::with_capacity(first.len() + data.len());
                    all.extend_from_slice(&first);
                    all
                });
                joined.extend_from_slice(&data);
                continue;
            }
            Err(frame) => frame,
        };
        if let Ok(more) = frame.into_trailers() {
            match trailers.as_mut() {
                Some(all) => all.extend(more),
                None => trailers = Some(more),
            }
        }
    }
    let data = joined.map_or(first, bytes::BytesMut::freeze);
    Ok((data, trailers))
}

// === RequestBody ===

/// The caller's body, forwarded to the app with a bound on each gap and, once
/// [`RequestBody::until`] names it, on its whole: it must end by the request's deadline
/// (a body trickling one byte per gap would otherwise hold the exchange, and its in-flight
/// slot, for as long as it likes). What was read while the request was queued
/// ([`EarlyBody`]) goes first.
///
/// No body at all (the usual request) is a null pointer: the request moves through the
/// path's layers and hyper's client channel many times, and a body's state is large.
#[derive(Debug)]
pub struct RequestBody(Option<Box<BodyState>>);

/// A [`RequestBody`] that has (or had) something to send.
#[derive(Debug)]
struct BodyState {
    read_ahead: VecDeque<Frame<Bytes>>,
    read_ahead_bytes: u64,
    inner: Option<CallerBody>,
    gap: Duration,
    /// The whole body must have arrived by then.
    deadline: Option<Instant>,
    timer: Option<Pin<Box<Sleep>>>,
    /// When the current gap ends: set at the first wait after a frame arrived.
    gap_end: Option<Instant>,
    /// A frame arrived since the gap's end was last set.
    progressed: bool,
    /// Why the body failed, for whoever answers the caller (see [`RequestBodyFailure`]).
    /// (`None` for a body weir holds whole already: it cannot fail.)
    failure: Option<Arc<OnceLock<RequestBodyFailure>>>,
    /// The app's wait on the caller, and the exchange's slot it lends (see
    /// [`RequestBody::lending`]); `None` once the body has ended.
    caller_wait: Option<CallerWait>,
}

/// How long the app has asked for more of a request body that the caller had not sent yet.
/// Once that adds up to `grace`, the exchange's in-flight slot is lent
/// ([`InflightLimit::lend`]) until the body ends: the app is waiting on the caller then, not
/// working, and the limit bounds the requests the app works on (within the ceiling,
/// `max_inflight`, which lent slots still count against). Without it, callers that trickle
/// their bodies hold the app's slots for their whole budget while everyone else queues.
#[derive(Debug)]
struct CallerWait {
    grace: Duration,
    /// The app has waited on the caller since then.
    since: Option<Instant>,
    /// Its waits before `since`.
    waited: Duration,
    limit: Arc<InflightLimit>,
    lent: bool,
    /// `waited`, in nanoseconds, for the exchange (published as each wait ends).
    total: Arc<AtomicU64>,
}

impl CallerWait {
    /// When the grace runs out if the current wait goes on (`None`: not waiting, or lent).
    fn lend_at(&self) -> Option<Instant> {
        match (self.lent, self.since) {
            (false, Some(since)) => Some(since + self.grace.saturating_sub(self.waited)),
            _ => None,
        }
    }

    fn waiting(&mut self, now: Instant) {
        self.since.get_or_insert(now);
    }

    fn caught_up(&mut self, now: Instant) {
        if let Some(since) = self.since.take() {
            self.waited += now.saturating_duration_since(since);
            let nanos = u64::try_from(self.waited.as_nanos()).unwrap_or(u64::MAX);
            self.total.store(nanos, Relaxed);
        }
    }

    fn lend(&mut self) {
        if !std::mem::replace(&mut self.lent, true) {
            self.limit.lend();
        }
    }
}

impl Drop for CallerWait {
    /// The body ended (or failed, or was dropped): the app works on the request again, or
    /// the exchange is over; the slot counts against the limit again.
    fn drop(&mut self) {
        self.caught_up(Instant::now());
        if self.lent {
            self.limit.unlend();
        }
    }
}

/// How long, in all, the app has waited on a request body's caller (see
/// [`RequestBody::lending`]): not the app's own time.
#[derive(Debug, Clone)]
pub struct CallerWaited(Arc<AtomicU64>);

impl CallerWaited {
    pub fn get(&self) -> Duration {
        Duration::from_nanos(self.0.load(Relaxed))
    }
}

/// Why a caller's request body failed on its way to the app: the status the caller gets
/// when the app's response never came because of it (the app is not to blame, so not 502).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestBodyFailure {
    /// The caller's framing was malformed (a bad chunk size, a body shorter than its
    /// `content-length`) or the caller reset its stream: `400`.
    Malformed,
    /// Nothing arrived for longer than `timeouts.body_read`: `408`.
    Stalled,
    /// The body did not end within the request's budget: `504`, as for a late response.
    PastDeadline,
}

impl RequestBodyFailure {
    /// weir's error for it (`x-weir-error` and the status: 400, 408, 504).
    pub fn error(self) -> crate::refusal::WeirError {
        use crate::refusal::WeirError;
        match self {
            RequestBodyFailure::Malformed => WeirError::CallerBodyMalformed,
            RequestBodyFailure::Stalled => WeirError::CallerBodyStalled,
            RequestBodyFailure::PastDeadline => WeirError::CallerBodyLate,
        }
    }
}

/// Reads how a [`RequestBody`] failed after it was handed to the client.
#[derive(Debug, Clone)]
pub struct RequestBodyProbe(Option<Arc<OnceLock<RequestBodyFailure>>>);

impl RequestBodyProbe {
    /// How the body failed, if it did.
    pub fn failure(&self) -> Option<RequestBodyFailure> {
        self.0.as_ref().and_then(|failure| failure.get().copied())
    }
}

impl RequestBody {
    pub fn new(inner: impl Into<CallerBody>, gap: Duration) -> Self {
        EarlyBody::new(inner.into()).into_request_body(gap)
    }

    /// No body at all.
    pub fn empty() -> Self {
        RequestBody(None)
    }

    /// The whole body must have arrived by `deadline`; past it the body fails.
    pub fn until(mut self, deadline: impl Into<Instant>) -> Self {
        if let Some(state) = self.0.as_mut() {
            state.deadline = Some(deadline.into());
        }
        self
    }

    /// Once the app has waited `grace` in all for this body's caller, lends the exchange's
    /// slot in `limit` until the body ends (see [`CallerWait`]). Nothing for a body weir
    /// already holds whole.
    pub fn lending(mut self, limit: &Arc<InflightLimit>, grace: Duration) -> Self {
        if let Some(state) = self.0.as_mut().filter(|state| state.inner.is_some()) {
            state.caller_wait = Some(CallerWait {
                grace,
                since: None,
                waited: Duration::ZERO,
                limit: limit.clone(),
                lent: false,
                total: Arc::default(),
            });
        }
        self
    }

    /// How long the app has waited on the caller so far (`None`: not [`RequestBody::lending`]).
    pub fn caller_waited(&self) -> Option<CallerWaited> {
        let wait = self.0.as_ref()?.caller_wait.as_ref()?;
        Some(CallerWaited(wait.total.clone()))
    }

    /// Tells how the body failed once it has been sent on.
    pub fn probe(&self) -> RequestBodyProbe {
        RequestBodyProbe(self.0.as_ref().and_then(|state| state.failure.clone()))
    }

    /// No body at all: nothing read ahead, nothing left with the caller.
    pub fn is_none(&self) -> bool {
        self.0.as_ref().is_none_or(|state| state.inner.is_none() && state.read_ahead.is_empty())
    }

    /// A copy that can be sent again, when weir holds the whole body (none at all, or one
    /// read ahead to its end while the request was queued); `None` while part of it is
    /// still with the caller.
    pub fn replay(&self) -> Option<RequestBody> {
        let Some(state) = self.0.as_ref() else { return Some(RequestBody::empty()) };
        if state.inner.is_some() {
            return None;
        }
        let mut read_ahead = VecDeque::with_capacity(state.read_ahead.len());
        for frame in &state.read_ahead {
            if let Some(data) = frame.data_ref() {
                read_ahead.push_back(Frame::data(data.clone()));
            } else if let Some(trailers) = frame.trailers_ref() {
                read_ahead.push_back(Frame::trailers(trailers.clone()));
            }
        }
        let read_ahead_bytes = state.read_ahead_bytes;
        Some(RequestBody(Some(Box::new(BodyState {
            read_ahead,
            read_ahead_bytes,
            ..BodyState::empty(Duration::ZERO)
        }))))
    }
}

impl BodyState {
    fn empty(gap: Duration) -> Self {
        BodyState {
            read_ahead: VecDeque::new(),
            read_ahead_bytes: 0,
            inner: None,
            gap,
            deadline: None,
            timer: None,
            gap_end: None,
            progressed: false,
            failure: None,
            caller_wait: None,
        }
    }

    fn fail(&mut self, why: RequestBodyFailure) -> BoxError {
        if let Some(failure) = &self.failure {
            let _ = failure.set(why);
        }
        self.inner = None;
        self.timer = None;
        self.caller_wait = None;
        match why {
            RequestBodyFailure::Stalled => BodyStall::RequestBodyRead.into(),
            RequestBodyFailure::PastDeadline => BodyStall::RequestBodyDeadline.into(),
            RequestBodyFailure::Malformed => BodyStall::RequestBodyMalformed.into(),
        }
    }

    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self;
        if let Some(frame) = this.read_ahead.pop_front() {
            if let Some(data) = frame.data_ref() {
                this.read_ahead_bytes -= data.len() as u64;
            }
            return Poll::Ready(Some(Ok(frame)));
        }
        let Some(inner) = this.inner.as_mut() else { return Poll::Ready(None) };
        let now = Instant::now();
        if this.deadline.is_some_and(|d| now >= d) {
            return Poll::Ready(Some(Err(this.fail(RequestBodyFailure::PastDeadline))));
        }
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.progressed = true;
                if let Some(wait) = this.caller_wait.as_mut() {
                    wait.caught_up(now);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                tracing::debug!(error = %e, "caller's request body failed");
                Poll::Ready(Some(Err(this.fail(RequestBodyFailure::Malformed))))
            }
            Poll::Ready(None) => {
                this.inner = None;
                this.timer = None;
                this.caller_wait = None;
                Poll::Ready(None)
            }
            Poll::Pending => {
                // The app asks for more and the caller has sent nothing yet.
                if let Some(wait) = this.caller_wait.as_mut() {
                    wait.waiting(now);
                }
                if this.progressed || this.gap_end.is_none() {
                    this.gap_end = Some(now + this.gap);
                    this.progressed = false;
                }
                // One timer per body, not one per frame, reset only when what it waits for
                // changes: the gap's end, the deadline, or the end of the caller's grace,
                // whichever is first.
                loop {
                    let gap_end = this.gap_end.unwrap_or(now + this.gap);
                    let fail_at = this.deadline.map_or(gap_end, |d| d.min(gap_end));
                    let lend_at = this.caller_wait.as_ref().and_then(CallerWait::lend_at);
                    let at = lend_at.map_or(fail_at, |l| l.min(fail_at));
                    let timer = match this.timer.as_mut() {
                        None => this.timer.insert(Box::pin(tokio::time::sleep_until(at))),
                        Some(timer) => {
                            if timer.deadline() != at {
                                timer.as_mut().reset(at);
                            }
                            timer
                        }
                    };
                    ready!(timer.as_mut().poll(cx));
                    let now = Instant::now();
                    let lending = lend_at.is_some() && now < fail_at;
                    if let (Some(wait), true) = (this.caller_wait.as_mut(), lending) {
                        // The grace is over: the app waits on the caller (lent once, so the
                        // next turn waits for the gap's end or the deadline).
                        wait.lend();
                        continue;
                    }
                    let why = if this.deadline.is_some_and(|d| now >= d) {
                        RequestBodyFailure::PastDeadline
                    } else {
                        RequestBodyFailure::Stalled
                    };
                    return Poll::Ready(Some(Err(this.fail(why))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.read_ahead.is_empty() && self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.inner.as_ref().map_or_else(|| SizeHint::with_exact(0), Body::size_hint);
        match rest.exact() {
            Some(n) => SizeHint::with_exact(n + self.read_ahead_bytes),
            None => {
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower() + self.read_ahead_bytes);
                hint
            }
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    #[inline]
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.0.as_mut() {
            Some(state) => state.poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.0.as_ref().is_none_or(|state| state.is_end_stream())
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.0.as_ref().map_or_else(|| SizeHint::with_exact(0), |state| state.size_hint())
    }
}

// === EarlyBody ===

/// A queued request's body, read ahead while it waits (up to [`READ_AHEAD_LIMIT`]) so that
/// an HTTP/1.1 caller who leaves is seen leaving: hyper reads the socket only as far as the
/// body is consumed, and notices a closed connection only after that.
#[derive(Debug)]
pub struct EarlyBody {
    read_ahead: VecDeque<Frame<Bytes>>,
    read_ahead_bytes: u64,
    inner: Option<CallerBody>,
}

/// How much of a queued request's body is read ahead; past it, the body waits in the
/// socket (and a caller leaving is seen only once the request is dispatched).
pub const READ_AHEAD_LIMIT: u64 = 64 * 1024;

impl EarlyBody {
    pub fn new(inner: CallerBody) -> Self {
        let inner = if inner.is_end_stream() { None } else { Some(inner) };
        EarlyBody { read_ahead: VecDeque::new(), read_ahead_bytes: 0, inner }
    }

    pub fn is_end_stream(&self) -> bool {
        self.inner.is_none()
    }

    /// Reads the body ahead; resolves only when the caller is gone (the body failed). Once
    /// the body has ended or the limit is reached it waits forever, for a `select!` against
    /// the queue.
    pub async fn caller_gone(&mut self) {
        use http_body_util::BodyExt;
        while self.read_ahead_bytes <= READ_AHEAD_LIMIT {
            let Some(inner) = self.inner.as_mut() else { break };
            match inner.frame().await {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        self.read_ahead_bytes += data.len() as u64;
                    }
                    self.read_ahead.push_back(frame);
                }
                None => self.inner = None,
                Some(Err(_)) => return,
            }
        }
        std::future::pending().await
    }

    /// The body's length, when its head declares one.
    pub fn declared_len(&self) -> Option<u64> {
        self.inner.as_ref().and_then(|inner| inner.size_hint().exact())
    }

    /// Reads the body ahead until it has ended or `want` bytes of it are here: each gap at
    /// most `gap`, the whole by `deadline`. What the request path waits for before a body of
    /// declared length may take an in-flight slot (see `Inbound::body_before_slot`).
    pub async fn arrive(
        &mut self,
        want: u64,
        gap: Duration,
        deadline: Instant,
    ) -> Result<(), RequestBodyFailure> {
        use http_body_util::BodyExt;
        while self.read_ahead_bytes < want {
            let Some(inner) = self.inner.as_mut() else { break };
            let by = (Instant::now() + gap).min(deadline);
            match tokio::time::timeout_at(by, inner.frame()).await {
                Ok(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        self.read_ahead_bytes += data.len() as u64;
                    }
                    self.read_ahead.push_back(frame);
                    if inner.is_end_stream() {
                        self.inner = None;
                    }
                }
                Ok(None) => self.inner = None,
                Ok(Some(Err(e))) => {
                    tracing::debug!(error = %e, "caller's request body failed");
                    self.inner = None;
                    return Err(RequestBodyFailure::Malformed);
                }
                Err(_) if Instant::now() >= deadline => {
                    return Err(RequestBodyFailure::PastDeadline)
                }
                Err(_) => return Err(RequestBodyFailure::Stalled),
            }
        }
        Ok(())
    }

    pub fn into_request_body(self, gap: Duration) -> RequestBody {
        if self.inner.is_none() && self.read_ahead.is_empty() {
            return RequestBody::empty();
        }
        RequestBody(Some(Box::new(BodyState {
            read_ahead: self.read_ahead,
            read_ahead_bytes: self.read_ahead_bytes,
            failure: self.inner.is_some().then(Arc::default),
            inner: self.inner,
            ..BodyState::empty(gap)
        })))
    }
}

// === StreamWatch ===

tokio::task_local! {
    /// The watch of the h2 stream whose task is running (set by the listener's stream
    /// executor), for the response body created inside it.
    pub static STREAM_WATCH: Arc<StreamWatch>;
}

/// Whether an h2 response is stuck on the caller's flow control: hyper takes a frame from
/// the body, then waits for send capacity before it asks for the next. A frame handed out
/// and not followed by the next request for longer than `timeouts.write` means the caller
/// is not reading (a zero window); the listener then resets the stream. hyper's task is
/// only woken by the caller in that state, so the body cannot notice it alone.
#[derive(Debug, Default)]
pub struct StreamWatch {
    /// When the last frame was handed out and not yet followed by a new poll, in
    /// nanoseconds since [`watch_epoch`] plus one; 0 = not waiting on the caller.
    handed_out_at: AtomicU64,
}

impl StreamWatch {
    fn handed_out(&self) {
        let now = Instant::now().saturating_duration_since(watch_epoch());
        self.handed_out_at.store(now.as_nanos() as u64 + 1, Release);
    }

    fn pulled(&self) {
        self.handed_out_at.store(0, Release);
    }

    /// Since when hyper has held a frame it could not send, if it does.
    pub fn waiting_on_caller_since(&self) -> Option<Instant> {
        match self.handed_out_at.load(Acquire) {
            0 => None,
            n => Some(watch_epoch() + Duration::from_nanos(n - 1)),
        }
    }
}

fn watch_epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

// === ResponseBody ===

/// A response body from the app (or a downstream) that a [`ResponseBody`] can move to the
/// caller: hyper's [`Incoming`] from the pooled client, or a test double's.
pub trait AppBody:
    Body<Data = Bytes, Error: Into<BoxError> + Send> + Send + Unpin + 'static
{
}

impl<B> AppBody for B where
    B: Body<Data = Bytes, Error: Into<BoxError> + Send> + Send + Unpin + 'static
{
}

/// What the caller receives.
#[derive(Debug)]
pub struct ResponseBody {
    kind: Kind,
    watch: Option<Arc<StreamWatch>>,
    /// Told when the body is dropped (see [`ResponseBody::hold`]).
    held: Option<Arc<dyn BodyEnd>>,
}

/// Told when a response body it watches ([`ResponseBody::hold`]) is dropped: sent, or
/// abandoned. An `Arc` the watcher already has, so watching a body allocates nothing.
pub trait BodyEnd: std::fmt::Debug + Send + Sync + 'static {
    fn body_ended(&self);
}

#[derive(Debug)]
enum Kind {
    /// Nothing (refusals, HEAD, 204, 304, errors): end of stream at once, so an HTTP/2
    /// response is one HEADERS frame with END_STREAM (a gRPC trailers-only response).
    Empty,
    /// Read whole from the app already. (The trailers boxed: most responses have none, and
    /// every response moves through the path's layers, a copy each time.)
    Buffered { data: Option<Bytes>, trailers: Option<Box<HeaderMap>> },
    /// Fed by a pump task.
    Pumped { frames: mpsc::Receiver<Item>, hint: SizeHint, ended: bool },
}

#[derive(Debug)]
enum Item {
    Frame(Frame<Bytes>),
    End,
    Failed(BodyStall),
}

impl ResponseBody {
    pub fn empty() -> Self {
        ResponseBody { kind: Kind::Empty, watch: None, held: None }
    }

    pub fn full(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        let data = (!data.is_empty()).then_some(data);
        let trailers = trailers.map(Box::new);
        ResponseBody { kind: Kind::Buffered { data, trailers }, watch: None, held: None }
    }

    /// Tells `watcher` when the body is dropped (sent, or abandoned): how the listener
    /// counts the bodies still being sent on a connection.
    pub fn hold(&mut self, watcher: Arc<dyn BodyEnd>) {
        if let Some(previous) = self.held.replace(watcher) {
            previous.body_ended();
        }
    }

    /// Weir holds all of the body (nothing, or what was read whole from the app).
    pub fn is_whole(&self) -> bool {
        matches!(self.kind, Kind::Empty | Kind::Buffered { .. })
    }

    /// Reports progress to the h2 stream's watch, if this response runs on one.
    pub fn watched(mut self) -> Self {
        if !matches!(self.kind, Kind::Empty) {
            self.watch = STREAM_WATCH.try_with(Arc::clone).ok();
        }
        self
    }

    /// Moves `body` to the caller through a pump task; `finished` runs as soon as the app's
    /// body has ended (or failed), whether or not the caller has read it yet.
    pub fn pumped<B: AppBody>(
        body: B,
        gap: Duration,
        write: Duration,
        finished: impl FnOnce(bool) + Send + 'static,
    ) -> Self {
        let mut finished = Some(finished);
        Self::pumped_with_events(body, gap, write, write, None, move |event| {
            if let PumpEvent::Ended { ok } = event {
                if let Some(f) = finished.take() {
                    f(ok)
                }
            }
        })
    }

    /// [`ResponseBody::pumped`], also telling when the caller has taken nothing for
    /// `stall_grace` ([`PumpEvent::CallerStalled`], at most once, before `Ended`). Once
    /// stalled, the exchange is abandoned as soon as `yield_to` is notified (another
    /// request waits for what this one holds), not only after `write`.
    pub fn pumped_with_events<B: AppBody>(
        body: B,
        gap: Duration,
        write: Duration,
        stall_grace: Duration,
        yield_to: Option<Arc<YieldSignal>>,
        on_event: impl FnMut(PumpEvent) + Send + 'static,
    ) -> Self {
        let hint = body.size_hint();
        let (tx, frames) = mpsc::channel(PUMP_FRAMES);
        let stall = Stall { grace: stall_grace.min(write), yield_to };
        tokio::spawn(pump(body, tx, gap, write, stall, on_event));
        ResponseBody { kind: Kind::Pumped { frames, hint, ended: false }, watch: None, held: None }
    }
}

/// What the pump reports about the exchange it moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PumpEvent {
    /// The pump has waited `stall_grace` for the caller to take a frame: the app is now
    /// waiting on the caller, not the other way round.
    CallerStalled,
    /// The app's body ended cleanly (`ok`), or it failed, or the caller is gone or took
    /// nothing for `timeouts.write` (the exchange is abandoned).
    Ended { ok: bool },
}

/// Tells stalled responses that another request waits for what they hold (an h2c stream's
/// place on a shared connection). Only a response already waiting on its caller hears it,
/// one per [`YieldSignal::want`]; with none waiting, nothing is stored for later.
#[derive(Debug, Default)]
pub struct YieldSignal {
    notify: tokio::sync::Notify,
    /// Stalled responses listening now.
    listening: AtomicU64,
}

impl YieldSignal {
    /// A request waits: one stalled response, if any is listening, gives way.
    pub fn want(&self) {
        if self.listening.load(Acquire) > 0 {
            self.notify.notify_one();
        }
    }

    /// Resolves when [`YieldSignal::want`] picks this listener.
    async fn wanted(&self) {
        struct Listening<'a>(&'a AtomicU64);
        impl Drop for Listening<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, AcqRel);
            }
        }
        let notified = self.notify.notified();
        let mut notified = std::pin::pin!(notified);
        // Registered before it is counted, so a `want` that sees the count finds it.
        notified.as_mut().enable();
        self.listening.fetch_add(1, AcqRel);
        let _listening = Listening(&self.listening);
        notified.await;
    }
}

/// When a pump counts its caller as stalled, and what it then yields to.
struct Stall {
    grace: Duration,
    yield_to: Option<Arc<YieldSignal>>,
}

/// Reads the app's body to its end into the channel, reporting [`PumpEvent`]s.
async fn pump<B: AppBody, E: FnMut(PumpEvent)>(
    mut body: B,
    tx: mpsc::Sender<Item>,
    gap: Duration,
    write: Duration,
    stall: Stall,
    on_event: E,
) {
    use http_body_util::BodyExt;
    let mut report = Reporter { on_event, stalled: false, ended: false };
    loop {
        let item = match tokio::time::timeout(gap, body.frame()).await {
            Ok(Some(Ok(frame))) => Item::Frame(frame),
            Ok(None) => {
                // The app is done: release its slot before waiting on the caller.
                report.ended(true);
                let _ = tokio::time::timeout(write, tx.send(Item::End)).await;
                return;
            }
            Ok(Some(Err(e))) => {
                let e: BoxError = e.into();
                tracing::debug!(error = %e, "app response body failed");
                report.ended(false);
                let _ = tx.try_send(Item::Failed(BodyStall::Aborted));
                return;
            }
            Err(_) => {
                report.ended(false);
                let _ = tx.try_send(Item::Failed(BodyStall::ResponseBodyRead));
                return;
            }
        };
        // Room for the frame within `write`; past `stall_grace` of it, the caller is the one
        // holding the exchange up.
        let room = match tokio::time::timeout(stall.grace, tx.reserve()).await {
            Ok(room) => room,
            Err(_) => {
                report.stalled();
                let wanted = async {
                    match &stall.yield_to {
                        Some(signal) => signal.wanted().await,
                        None => std::future::pending().await,
                    }
                };
                let room = tokio::select! {
                    room = tokio::time::timeout(write - stall.grace, tx.reserve()) => room,
                    () = wanted => {
                        tracing::debug!("response abandoned: its caller stalled and a request waits for its place");
                        report.ended(false);
                        return;
                    }
                };
                match room {
                    Ok(room) => room,
                    Err(_) => {
                        // Nothing taken for `write`: the exchange is abandoned.
                        report.ended(false);
                        return;
                    }
                }
            }
        };
        match room {
            Ok(room) => room.send(item),
            // The caller is gone.
            Err(_) => {
                report.ended(false);
                return;
            }
        }
    }
}

/// Reports each [`PumpEvent`] at most once, `CallerStalled` never after `Ended`.
struct Reporter<E> {
    on_event: E,
    stalled: bool,
    ended: bool,
}

impl<E: FnMut(PumpEvent)> Reporter<E> {
    fn stalled(&mut self) {
        if !self.ended && !std::mem::replace(&mut self.stalled, true) {
            (self.on_event)(PumpEvent::CallerStalled);
        }
    }

    fn ended(&mut self, ok: bool) {
        if !std::mem::replace(&mut self.ended, true) {
            (self.on_event)(PumpEvent::Ended { ok });
        }
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        if let Some(watcher) = self.held.take() {
            watcher.body_ended();
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(watch) = self.watch.clone() else { return self.poll_next(cx) };
        watch.pulled();
        let polled = self.poll_next(cx);
        if matches!(polled, Poll::Ready(Some(Ok(_)))) {
            watch.handed_out();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Empty => true,
            Kind::Buffered { data, trailers } => data.is_none() && trailers.is_none(),
            Kind::Pumped { ended, .. } => *ended,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Empty => SizeHint::with_exact(0),
            Kind::Buffered { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Pumped { hint, .. } => *hint,
        }
    }
}

impl ResponseBody {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.kind {
            Kind::Empty => Poll::Ready(None),
            Kind::Buffered { data, trailers } => {
                if let Some(data) = data.take() {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(*t))))
            }
            Kind::Pumped { frames, ended, .. } => {
                if *ended {
                    return Poll::Ready(None);
                }
                match ready!(frames.poll_recv(cx)) {
                    Some(Item::Frame(frame)) => Poll::Ready(Some(Ok(frame))),
                    Some(Item::End) => {
                        *ended = true;
                        Poll::Ready(None)
                    }
                    Some(Item::Failed(why)) => {
                        *ended = true;
                        Poll::Ready(Some(Err(why.into())))
                    }
                    // The pump gave up without saying why: the caller was too slow.
                    None => {
                        *ended = true;
                        Poll::Ready(Some(Err(BodyStall::CallerWrite.into())))
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::StreamBody;

    type Piece = Result<Frame<Bytes>, BoxError>;

    fn frames(
        frames: Vec<Frame<Bytes>>,
    ) -> StreamBody<futures_util::stream::Iter<std::vec::IntoIter<Piece>>> {
        let items: Vec<Piece> = frames.into_iter().map(Ok).collect();
        StreamBody::new(futures_util::stream::iter(items))
    }

    #[tokio::test]
    async fn read_whole_keeps_one_piece_joins_several_and_merges_trailers() {
        let one = Bytes::from_static(b"ok");
        let (data, trailers) = read_whole(frames(vec![Frame::data(one.clone())])).await.unwrap();
        assert_eq!(data, one);
        assert_eq!(data.as_ptr(), one.as_ptr(), "one piece is passed on, not copied");
        assert!(trailers.is_none());

        let mut first = HeaderMap::new();
        first.insert("grpc-status", "0".parse().unwrap());
        let mut second = HeaderMap::new();
        second.insert("x-more", "1".parse().unwrap());
        let body = frames(vec![
            Frame::data(Bytes::from_static(b"he")),
            Frame::data(Bytes::new()),
            Frame::data(Bytes::from_static(b"ll")),
            Frame::data(Bytes::from_static(b"o")),
            Frame::trailers(first),
            Frame::trailers(second),
        ]);
        let (data, trailers) = read_whole(body).await.unwrap();
        assert_eq!(data, Bytes::from_static(b"hello"));
        let trailers = trailers.unwrap();
        assert_eq!(trailers["grpc-status"], "0");
        assert_eq!(trailers["x-more"], "1");

        let (data, trailers) = read_whole(frames(vec![])).await.unwrap();
        assert!(data.is_empty() && trailers.is_none());
    }
}
