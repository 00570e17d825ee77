//! Header rules shared by every forwarded exchange, inbound (caller -> app) and egress
//! (app -> downstream): no hop-by-hop headers either way, one `content-length` (the length
//! weir will send), `Expect` answered by weir itself, and the remaining budget in both
//! deadline forms the request used.

use std::time::Duration;

use http::header::{
    CONNECTION, CONTENT_LENGTH, EXPECT, PROXY_AUTHENTICATE, TE, TRANSFER_ENCODING, UPGRADE,
};
use http::{HeaderMap, HeaderName, HeaderValue};
use hyper::body::Body;

use crate::body::RequestBody;
use crate::deadline::{self, GRPC_TIMEOUT};

const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// Prepares a request's headers for the next hop. `remaining` is what is left of the
/// caller's budget: the next hop gets that, not the budget the request arrived with
/// (`timeout_header` always, `grpc-timeout` when the caller sent one).
pub(crate) fn prepare_request(
    headers: &mut HeaderMap,
    body: &RequestBody,
    remaining: Duration,
    timeout_header: &HeaderName,
) {
    strip_hop_by_hop(headers);
    // weir answers `Expect: 100-continue` itself (when it starts reading the body).
    headers.remove(EXPECT);
    // One value (`Content-Length: 5,5` was accepted as 5): the length weir will send.
    if headers.contains_key(CONTENT_LENGTH) {
        match body.size_hint().exact() {
            Some(n) => {
                headers.insert(CONTENT_LENGTH, HeaderValue::from(n));
            }
            None => {
                headers.remove(CONTENT_LENGTH);
            }
        }
    }
    let mut buf = [0u8; 20];
    if let Ok(v) = HeaderValue::from_bytes(deadline::format_ms(remaining, &mut buf)) {
        headers.insert(timeout_header.clone(), v);
    }
    if headers.contains_key(GRPC_TIMEOUT) {
        if let Ok(v) = HeaderValue::from_bytes(deadline::format_grpc_ms(remaining, &mut buf)) {
            headers.insert(GRPC_TIMEOUT, v);
        }
    }
}

/// A response's headers for the previous hop: framing is that connection's business.
pub(crate) fn clean_response(headers: &mut HeaderMap) {
    strip_hop_by_hop(headers);
    headers.remove(PROXY_AUTHENTICATE);
}

/// Removes the headers that describe one connection, not the message (RFC 9110 7.6.1).
/// `te: trailers` stays: gRPC needs it end to end.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if headers.contains_key(CONNECTION) {
        let listed: Vec<HeaderValue> = headers.get_all(CONNECTION).iter().cloned().collect();
        headers.remove(CONNECTION);
        for value in &listed {
            let Ok(names) = value.to_str() else { continue };
            for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                if !name.eq_ignore_ascii_case("te") {
                    headers.remove(name);
                }
            }
        }
    }
    for name in [KEEP_ALIVE, PROXY_CONNECTION, TRANSFER_ENCODING, UPGRADE] {
        headers.remove(name);
    }
    if headers.get(TE).is_some_and(|te| te.as_bytes() != b"trailers") {
        headers.remove(TE);
    }
}
