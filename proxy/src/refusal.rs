//! Refusals exactly as DESIGN §4 puts them on the wire, and the `x-admission-level` value
//! every response carries.

use std::sync::Arc;
use std::time::Duration;

use admission_core::AdmissionLevel;
use arc_swap::ArcSwap;
use http::{HeaderName, HeaderValue, StatusCode};
use pingora::http::ResponseHeader;

use crate::wire_name::WireName;

/// Why a request was refused (the `x-weir-shed` value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShedReason {
    /// Below the admission level, or the pending queue is full.
    Overload,
    /// Its deadline passed, or it waited longer than the task timeout, while queued.
    Deadline,
}

/// Prebuilt pieces of refusal responses.
#[derive(Debug)]
pub struct Refusals {
    level_name: WireName,
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

// === impl ShedReason ===

impl ShedReason {
    pub const fn as_str(self) -> &'static str {
        match self {
            ShedReason::Overload => "overload",
            ShedReason::Deadline => "deadline",
        }
    }

    const fn grpc_message(self) -> &'static str {
        match self {
            ShedReason::Overload => "weir: overloaded, retry after the pushback",
            ShedReason::Deadline => "weir: deadline passed while queued",
        }
    }
}

// === impl Refusals ===

impl Refusals {
    pub fn new(level_name: HeaderName, shed_name: HeaderName, retry_after: Duration) -> Self {
        let level_name = WireName::new(level_name);
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

    pub fn level_name(&self) -> &WireName {
        &self.level_name
    }

    /// The `x-admission-level` value for `level`.
    #[inline]
    pub fn level_value(&self, level: AdmissionLevel) -> HeaderValue {
        self.level.value(level)
    }

    /// The refusal: HTTP 503, or gRPC trailers-only `RESOURCE_EXHAUSTED` (sent as one
    /// end-of-stream HEADERS frame).
    pub fn response(
        &self,
        grpc: bool,
        reason: ShedReason,
        level: AdmissionLevel,
    ) -> Box<ResponseHeader> {
        let status = if grpc { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
        let mut resp = ResponseHeader::build(status, Some(6)).expect("static status is valid");
        let _ = resp.insert_header(self.level_name.wire(), self.level_value(level));
        let _ =
            resp.insert_header(self.shed_name.clone(), HeaderValue::from_static(reason.as_str()));
        if grpc {
            let _ = resp.insert_header(http::header::CONTENT_TYPE, "application/grpc");
            let _ = resp.insert_header("grpc-status", GRPC_STATUS_RESOURCE_EXHAUSTED);
            let _ = resp.insert_header("grpc-message", reason.grpc_message());
            let _ = resp.insert_header("grpc-retry-pushback-ms", self.pushback_ms.clone());
        } else {
            let _ = resp.insert_header(http::header::RETRY_AFTER, self.retry_after.clone());
            let _ = resp.insert_header(http::header::CONTENT_LENGTH, "0");
        }
        Box::new(resp)
    }

    /// An error response of our own (upstream unreachable and the like), with the level.
    pub fn error_response(&self, status: u16, level: AdmissionLevel) -> Box<ResponseHeader> {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
        let mut resp = ResponseHeader::build(status, Some(3)).expect("status is valid");
        let _ = resp.insert_header(self.level_name.wire(), self.level_value(level));
        let _ = resp.insert_header(http::header::CONTENT_LENGTH, "0");
        Box::new(resp)
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
