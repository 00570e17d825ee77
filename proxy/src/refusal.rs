//! Refusals exactly as docs/design.md ("Wire contract") puts them on the wire, and the
//! `x-admission-level` value every response carries.

use std::sync::Arc;
use std::time::Duration;

use admission_core::AdmissionLevel;
use arc_swap::ArcSwap;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

/// Why a request was refused (the `x-weir-shed` value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShedReason {
    /// Below the admission level, or the pending queue is full.
    Overload,
    /// Its deadline passed, or it waited longer than the task timeout, while queued.
    Deadline,
    /// Its route depends on a downstream whose cached level refuses it (per-route levels).
    RouteLevel,
}

/// Which of weir's own errors a response is: the `x-weir-error` value, so a 502/504 made
/// by weir is told apart from one the app (or a downstream's proxy) sent, and says why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeirError {
    /// 502: no connection to the app (refused, or no answer within
    /// `timeouts.app_connect`).
    AppUnreachable,
    /// 502: the app's connection broke, or it sent no valid response head, or its
    /// response body broke off while weir buffered it.
    AppFailed,
    /// 504: the request's budget ran out before the app's response (head, or a small body
    /// weir buffers).
    AppTimeout,
    /// 502 (egress): the downstream's name did not resolve.
    DownstreamUnresolved,
    /// 502 (egress): no connection to the downstream.
    DownstreamUnreachable,
    /// 502 (egress): the downstream's connection broke, or it sent no valid response.
    DownstreamFailed,
    /// 504 (egress): the budget ran out resolving, connecting to or waiting for the
    /// downstream.
    DownstreamTimeout,
    /// 405: `CONNECT` (weir forwards requests; it is not a tunnel).
    MethodNotAllowed,
    /// 400: a request weir will not forward (a path that cannot be normalised; egress: no
    /// target authority).
    BadRequest,
    /// 400: the caller closed its request body while the request waited in the queue.
    CallerGone,
    /// 400 (egress): a scheme other than `http` (it would go out as cleartext).
    UnsupportedScheme,
    /// 508 (egress): the request is addressed to one of weir's own listeners, or carries
    /// this egress's `Via`: forwarding it would loop.
    LoopDetected,
    /// 400: the request names more than one authority (two `Host`s, an h2 `host` other
    /// than `:authority`), none on HTTP/1.1, or an invalid one.
    AmbiguousAuthority,
    /// 501: a transfer coding other than `chunked` (weir cannot pass it on).
    UnsupportedTransferCoding,
    /// 400: the caller's body framing was malformed, or it reset its stream.
    CallerBodyMalformed,
    /// 408: nothing of the caller's body arrived for `timeouts.body_read`.
    CallerBodyStalled,
    /// 504: the caller's body did not end within the request's budget.
    CallerBodyLate,
}

/// The header naming weir's own error; fixed (not configurable), documented in
/// docs/design.md ("Wire contract").
pub const WEIR_ERROR: HeaderName = HeaderName::from_static("x-weir-error");

/// Carried by every refusal: Envoy's router never retries a response that has it.
pub const ENVOY_OVERLOADED: HeaderName = HeaderName::from_static("x-envoy-overloaded");

impl WeirError {
    pub const ALL: [WeirError; 17] = [
        WeirError::AppUnreachable,
        WeirError::AppFailed,
        WeirError::AppTimeout,
        WeirError::DownstreamUnresolved,
        WeirError::DownstreamUnreachable,
        WeirError::DownstreamFailed,
        WeirError::DownstreamTimeout,
        WeirError::MethodNotAllowed,
        WeirError::BadRequest,
        WeirError::CallerGone,
        WeirError::UnsupportedScheme,
        WeirError::LoopDetected,
        WeirError::AmbiguousAuthority,
        WeirError::UnsupportedTransferCoding,
        WeirError::CallerBodyMalformed,
        WeirError::CallerBodyStalled,
        WeirError::CallerBodyLate,
    ];

    /// The `x-weir-error` value.
    pub const fn as_str(self) -> &'static str {
        match self {
            WeirError::AppUnreachable => "app-unreachable",
            WeirError::AppFailed => "app-failed",
            WeirError::AppTimeout => "app-timeout",
            WeirError::DownstreamUnresolved => "downstream-unresolved",
            WeirError::DownstreamUnreachable => "downstream-unreachable",
            WeirError::DownstreamFailed => "downstream-failed",
            WeirError::DownstreamTimeout => "downstream-timeout",
            WeirError::MethodNotAllowed => "method-not-allowed",
            WeirError::BadRequest => "bad-request",
            WeirError::CallerGone => "caller-gone",
            WeirError::UnsupportedScheme => "unsupported-scheme",
            WeirError::LoopDetected => "loop-detected",
            WeirError::AmbiguousAuthority => "ambiguous-authority",
            WeirError::UnsupportedTransferCoding => "unsupported-transfer-coding",
            WeirError::CallerBodyMalformed => "caller-body-malformed",
            WeirError::CallerBodyStalled => "caller-body-stalled",
            WeirError::CallerBodyLate => "caller-body-late",
        }
    }

    pub const fn status(self) -> StatusCode {
        match self {
            WeirError::AppTimeout | WeirError::DownstreamTimeout | WeirError::CallerBodyLate => {
                StatusCode::GATEWAY_TIMEOUT
            }
            WeirError::CallerBodyStalled => StatusCode::REQUEST_TIMEOUT,
            WeirError::UnsupportedTransferCoding => StatusCode::NOT_IMPLEMENTED,
            WeirError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            WeirError::BadRequest
            | WeirError::CallerGone
            | WeirError::UnsupportedScheme
            | WeirError::AmbiguousAuthority
            | WeirError::CallerBodyMalformed => StatusCode::BAD_REQUEST,
            WeirError::LoopDetected => StatusCode::LOOP_DETECTED,
            _ => StatusCode::BAD_GATEWAY,
        }
    }
}

/// Prebuilt pieces of refusal responses.
#[derive(Debug)]
pub struct Refusals {
    level_name: HeaderName,
    shed_name: HeaderName,
    retry_after: HeaderValue,
    pushback_ms: HeaderValue,
    level: LevelHeader,
}

/// The current level as a header value, rebuilt only when the level changes.
#[derive(Debug)]
pub struct LevelHeader {
    current: ArcSwap<(u16, HeaderValue)>,
}

const GRPC_STATUS_RESOURCE_EXHAUSTED: &str = "8";
const GRPC_STATUS_DEADLINE_EXCEEDED: &str = "4";
const GRPC_STATUS_UNAVAILABLE: &str = "14";
const GRPC_STATUS_INTERNAL: &str = "13";

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_PUSHBACK: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

// === impl ShedReason ===

impl ShedReason {
    pub const fn as_str(self) -> &'static str {
        match self {
            ShedReason::Overload => "overload",
            ShedReason::Deadline => "deadline",
            ShedReason::RouteLevel => "route-level",
        }
    }

    const fn grpc_message(self) -> &'static str {
        match self {
            ShedReason::Overload => "weir: overloaded, retry after the pushback",
            ShedReason::Deadline => "weir: deadline passed while queued",
            ShedReason::RouteLevel => {
                "weir: a downstream of this route sheds this priority now, retry after the pushback"
            }
        }
    }
}

// === impl Refusals ===

impl Refusals {
    pub fn new(level_name: HeaderName, shed_name: HeaderName, retry_after: Duration) -> Self {
        // retry-after is whole seconds; never 0, which invites an immediate retry.
        let secs = retry_after.as_secs_f64().ceil().max(1.0) as u64;
        let ms = retry_after.as_millis().max(1) as u64;
        Refusals {
            level_name,
            shed_name,
            retry_after: HeaderValue::from(secs),
            pushback_ms: HeaderValue::from(ms),
            level: LevelHeader::new(),
        }
    }

    pub fn level_name(&self) -> &HeaderName {
        &self.level_name
    }

    /// The `x-admission-level` value for `level`.
    #[inline]
    pub fn level_value(&self, level: AdmissionLevel) -> HeaderValue {
        self.level.value(level)
    }

    /// The refusal's status and headers, without the level (stamped on every response by
    /// the level layer). gRPC callers get `200` with `grpc-status` in the headers and no
    /// body at all: a trailers-only response, one HEADERS frame with END_STREAM.
    pub fn refusal_head(&self, grpc: bool, reason: ShedReason) -> (StatusCode, HeaderMap) {
        self.refusal_head_after(grpc, reason, None)
    }

    /// As [`Refusals::refusal_head`], asking the caller to wait `wait` (whole seconds in
    /// `retry-after`, rounded down, at least 1: a wait that grows from the configured one
    /// reads the same until it has grown by a second; milliseconds in the pushback) instead
    /// of the configured `retry_after`.
    pub fn refusal_head_after(
        &self,
        grpc: bool,
        reason: ShedReason,
        wait: Option<Duration>,
    ) -> (StatusCode, HeaderMap) {
        let (retry_after, pushback_ms) = match wait {
            Some(w) => (
                HeaderValue::from(w.as_secs().max(1)),
                HeaderValue::from(w.as_millis().max(1) as u64),
            ),
            None => (self.retry_after.clone(), self.pushback_ms.clone()),
        };
        let mut headers = HeaderMap::with_capacity(7);
        headers.insert(self.shed_name.clone(), HeaderValue::from_static(reason.as_str()));
        // Envoy (Istio's sidecar) never retries a response carrying this header, whatever its
        // retry policy says: Istio's default policy retries every 503 twice, which would
        // triple the load a refusal was meant to take away (docs/mesh.md, "Retries").
        headers.insert(ENVOY_OVERLOADED, HeaderValue::from_static("true"));
        if grpc {
            headers
                .insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            headers.insert(GRPC_STATUS, HeaderValue::from_static(GRPC_STATUS_RESOURCE_EXHAUSTED));
            headers.insert(GRPC_MESSAGE, HeaderValue::from_static(reason.grpc_message()));
            headers.insert(GRPC_PUSHBACK, pushback_ms);
            return (StatusCode::OK, headers);
        }
        headers.insert(http::header::RETRY_AFTER, retry_after);
        headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from_static("0"));
        (StatusCode::SERVICE_UNAVAILABLE, headers)
    }

    /// weir's own error (`400`, `405`, `502`, `504`) with `x-weir-error` naming it, without
    /// the level. gRPC callers get the matching status as a trailers-only response.
    pub fn error_head(&self, error: WeirError, grpc: bool) -> (StatusCode, HeaderMap) {
        let status = error.status();
        let mut headers = HeaderMap::with_capacity(5);
        headers.insert(WEIR_ERROR, HeaderValue::from_static(error.as_str()));
        if grpc {
            let code = match status {
                StatusCode::GATEWAY_TIMEOUT => GRPC_STATUS_DEADLINE_EXCEEDED,
                StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE => {
                    GRPC_STATUS_UNAVAILABLE
                }
                _ => GRPC_STATUS_INTERNAL,
            };
            headers
                .insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            headers.insert(GRPC_STATUS, HeaderValue::from_static(code));
            if let Some(reason) = status.canonical_reason() {
                headers.insert(GRPC_MESSAGE, HeaderValue::from_static(reason));
            }
            return (StatusCode::OK, headers);
        }
        headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from_static("0"));
        (status, headers)
    }
}

// === impl LevelHeader ===

impl LevelHeader {
    fn new() -> Self {
        let open = AdmissionLevel::FULLY_OPEN;
        LevelHeader { current: ArcSwap::from_pointee((open.compound(), encode(open))) }
    }

    #[inline]
    fn value(&self, level: AdmissionLevel) -> HeaderValue {
        let cached = self.current.load();
        if cached.0 == level.compound() {
            return cached.1.clone();
        }
        let value = encode(level);
        self.current.store(Arc::new((level.compound(), value.clone())));
        value
    }
}

fn encode(level: AdmissionLevel) -> HeaderValue {
    let encoded = level.encode();
    HeaderValue::from_bytes(encoded.as_bytes()).expect("B.U is a valid header value")
}

#[cfg(test)]
mod tests;
