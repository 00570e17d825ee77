//! Response builders shared by the endpoints and the error mapping.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;

pub(crate) fn etag(version: u64) -> String {
    format!("\"{version}\"")
}

pub(crate) fn body_response(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

pub(crate) fn json_response(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    body_response(status, "application/json", body)
}
