//! The request stack both roles share, so each rule is written once (docs/design.md,
//! "Server skeleton"): what the inbound role ([`crate::service`]) and the egress role
//! ([`crate::egress`]) do alike to a request before their own policy, and to the response
//! they make.
//!
//! - [`Names`]: the configured wire names (`inbound.headers`), parsed once into
//!   [`HeaderName`]s at start;
//! - [`is_grpc`]: a gRPC call gets its refusals and errors as gRPC statuses;
//! - [`check_method`]: `CONNECT` is refused (weir forwards requests, it is not a tunnel);
//! - the head's own checks and the forwarded headers: [`crate::forward_headers`];
//! - the budget: [`budget`] (`grpc-timeout`, else the timeout header, else the role's
//!   default; parsed in [`crate::deadline`]);
//! - HTTP/1.1 or h2c towards the app or the downstream: [`crate::app_protocol`] (probed
//!   under `auto`, one `Upstream` per address);
//! - [`respond`]: a response of weir's own (refusals and errors: [`crate::refusal`]).
//!
//! Named `http` like the crate it builds on: paths in this crate say `crate::http::` for
//! this module and `http::` for the crate.

use std::time::Duration;

use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, Method, Response, StatusCode};

use crate::body::ResponseBody;
use crate::config::HeaderNames;
use crate::refusal::WeirError;

/// The wire names of `inbound.headers` (both roles read and write the same ones).
#[derive(Debug, Clone)]
pub struct Names {
    pub business: HeaderName,
    pub user: HeaderName,
    pub timeout: HeaderName,
    pub level: HeaderName,
    pub shed: HeaderName,
}

impl Names {
    /// Parses the configured names (validated already: `SidecarConfig::validate`).
    pub fn new(names: &HeaderNames) -> Result<Self, String> {
        let parse = |s: &str| HeaderName::from_bytes(s.as_bytes()).map_err(|e| e.to_string());
        Ok(Names {
            business: parse(&names.business)?,
            user: parse(&names.user)?,
            timeout: parse(&names.timeout)?,
            level: parse(&names.level)?,
            shed: parse(&names.shed)?,
        })
    }
}

/// A gRPC call (`content-type: application/grpc...`).
#[inline]
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers.get(CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// `CONNECT` is refused (`405`): weir forwards requests, it is not a tunnel (and a tunnel
/// would hide a downstream's responses, so the egress could not learn its level).
#[inline]
pub fn check_method(method: &Method) -> Result<(), WeirError> {
    if *method == Method::CONNECT {
        return Err(WeirError::MethodNotAllowed);
    }
    Ok(())
}

/// The caller's remaining budget: `grpc-timeout`, else `timeout_header`, else `default`
/// (an unparsable value counts as absent), at most `max` (see
/// [`crate::deadline::caller_budget`]).
#[inline]
pub fn budget(
    headers: &HeaderMap,
    timeout_header: &HeaderName,
    default: Duration,
    max: Duration,
) -> Duration {
    crate::deadline::caller_budget(headers, timeout_header, default, max)
}

/// A response of weir's own: `status`, `headers`, no body.
pub fn respond(status: StatusCode, headers: HeaderMap) -> Response<ResponseBody> {
    let mut resp = Response::new(ResponseBody::empty());
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_is_told_by_its_content_type() {
        let mut h = HeaderMap::new();
        assert!(!is_grpc(&h));
        h.insert(CONTENT_TYPE, "application/grpc+proto".parse().unwrap());
        assert!(is_grpc(&h));
        h.insert(CONTENT_TYPE, "application/json".parse().unwrap());
        assert!(!is_grpc(&h));
    }

    #[test]
    fn connect_is_refused() {
        assert_eq!(check_method(&Method::CONNECT), Err(WeirError::MethodNotAllowed));
        assert_eq!(check_method(&Method::GET), Ok(()));
    }
}
