//! The request as the app receives it and the response as the caller receives it: the
//! request line in the form the app's protocol needs, a `Host`, one `content-length`, no
//! hop-by-hop headers, and the remaining budget.

use std::net::SocketAddr;
use std::time::Duration;

use http::header::HOST;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderName, HeaderValue, Request, Uri, Version};

use crate::app_client::Protocol;
use crate::body::RequestBody;
use crate::forward_headers::{prepare_checked_request, prepare_request, Carried};

/// The request for the app; `checked`: what [`check_scanned_request_head`] found in the head
/// (`None`: a head no check has passed).
///
/// [`check_scanned_request_head`]: crate::forward_headers::check_scanned_request_head
pub(super) fn app_request(
    mut parts: http::request::Parts,
    body: RequestBody,
    protocol: Protocol,
    app: SocketAddr,
    remaining: Duration,
    timeout_header: &HeaderName,
    checked: Option<Carried>,
) -> Request<RequestBody> {
    let headers = &mut parts.headers;
    match checked {
        Some(checked) => {
            prepare_checked_request(headers, &body, remaining, timeout_header, checked)
        }
        None => prepare_request(headers, &body, remaining, timeout_header),
    }
    let headers = &mut parts.headers;

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

/// Replaces the path (and query) of `uri`, keeping scheme and authority.
pub(super) fn replace_path(uri: &mut Uri, path: PathAndQuery) {
    let mut parts = std::mem::take(uri).into_parts();
    parts.path_and_query = Some(path);
    *uri = Uri::from_parts(parts).unwrap_or_else(|_| Uri::from_static("/"));
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
