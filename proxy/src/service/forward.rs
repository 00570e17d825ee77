//! The request as the app receives it and the response as the caller receives it: the
//! request line in the form the app's protocol needs, a `Host`, one `content-length`, no
//! hop-by-hop headers, and the remaining budget.

use std::net::SocketAddr;
use std::time::Duration;

use http::header::{
    CONNECTION, CONTENT_LENGTH, EXPECT, HOST, PROXY_AUTHENTICATE, TE, TRANSFER_ENCODING, UPGRADE,
};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Uri, Version};
use hyper::body::Body;

use super::GRPC_TIMEOUT;
use crate::app_client::Protocol;
use crate::body::RequestBody;
use crate::deadline;

const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// The request for the app.
pub(super) fn app_request(
    mut parts: http::request::Parts,
    body: RequestBody,
    protocol: Protocol,
    app: SocketAddr,
    remaining: Duration,
    timeout_header: &HeaderName,
) -> Request<RequestBody> {
    let headers = &mut parts.headers;
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

    // The app gets what is left of the caller's budget, not the budget it arrived with.
    let mut buf = [0u8; 20];
    if let Ok(v) = HeaderValue::from_bytes(deadline::format_ms(remaining, &mut buf)) {
        headers.insert(timeout_header.clone(), v);
    }
    if headers.contains_key(GRPC_TIMEOUT) {
        if let Ok(v) = HeaderValue::from_bytes(deadline::format_grpc_ms(remaining, &mut buf)) {
            headers.insert(GRPC_TIMEOUT, v);
        }
    }

    match protocol {
        Protocol::Http1 => {
            parts.version = Version::HTTP_11;
            if !headers.contains_key(HOST) {
                // HTTP/2 callers name the authority in the URI; HTTP/1.0 ones may not at all.
                let host = match parts.uri.authority() {
                    Some(a) => HeaderValue::from_str(a.as_str()).ok(),
                    None => None,
                };
                let host = host.unwrap_or_else(|| app_host(app));
                headers.insert(HOST, host);
            }
            if parts.uri.scheme().is_some() || parts.uri.authority().is_some() {
                let path = parts.uri.path_and_query().cloned().unwrap_or_else(root);
                parts.uri = Uri::from(path);
            }
        }
        Protocol::H2c => {
            parts.version = Version::HTTP_2;
            if parts.uri.scheme().is_none() || parts.uri.authority().is_none() {
                let authority = headers
                    .get(HOST)
                    .and_then(|h| Authority::try_from(h.as_bytes()).ok())
                    .unwrap_or_else(|| app_authority(app));
                let mut uri = std::mem::take(&mut parts.uri).into_parts();
                uri.scheme = Some(Scheme::HTTP);
                uri.authority = Some(authority);
                uri.path_and_query = uri.path_and_query.or_else(|| Some(root()));
                parts.uri = Uri::from_parts(uri).unwrap_or_else(|_| Uri::from_static("/"));
            }
            // `:authority` carries it.
            headers.remove(HOST);
        }
    }
    Request::from_parts(parts, body)
}

/// The response for the caller: framing is the caller's connection's business.
pub(super) fn clean_response_headers(headers: &mut HeaderMap) {
    strip_hop_by_hop(headers);
    headers.remove(PROXY_AUTHENTICATE);
}

/// Replaces the path (and query) of `uri`, keeping scheme and authority.
pub(super) fn replace_path(uri: &mut Uri, path: PathAndQuery) {
    let mut parts = std::mem::take(uri).into_parts();
    parts.path_and_query = Some(path);
    *uri = Uri::from_parts(parts).unwrap_or_else(|_| Uri::from_static("/"));
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

fn root() -> PathAndQuery {
    PathAndQuery::from_static("/")
}

fn app_host(app: SocketAddr) -> HeaderValue {
    HeaderValue::from_str(&app.to_string()).expect("a socket address is a valid header value")
}

fn app_authority(app: SocketAddr) -> Authority {
    Authority::try_from(app.to_string()).expect("a socket address is a valid authority")
}

#[cfg(test)]
mod tests;
