//! Real clients: hyper HTTP/1.1 (pooled keep-alive) and h2c prior knowledge.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

pub type Body = BoxBody<Bytes, std::io::Error>;

/// A complete response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Every response through weir carries its admission level.
    pub fn level(&self) -> &str {
        self.header("x-admission-level")
            .unwrap_or_else(|| panic!("no x-admission-level on {self:?}"))
    }
}

pub fn bytes_body(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

pub fn empty() -> Body {
    bytes_body(Bytes::new())
}

/// A body streamed in `chunks` pieces of `size` bytes (sent chunked on HTTP/1.1).
pub fn chunked_body(chunks: usize, size: usize) -> Body {
    let frames = (0..chunks).map(move |i| {
        Ok::<_, std::io::Error>(hyper::body::Frame::data(Bytes::from(vec![(i % 13) as u8; size])))
    });
    http_body_util::StreamBody::new(futures_util::stream::iter(frames)).boxed()
}

/// A pooled hyper client speaking one protocol; built by [`Http1::new`] or [`H2::new`].
#[derive(Clone)]
pub struct TestClient {
    client: Client<HttpConnector, Body>,
}

/// HTTP/1.1 with keep-alive.
pub struct Http1;

/// HTTP/2 with prior knowledge (h2c).
pub struct H2;

impl Http1 {
    #[allow(clippy::new_ret_no_self)]
    pub fn new() -> TestClient {
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(HttpConnector::new());
        TestClient { client }
    }
}

impl H2 {
    #[allow(clippy::new_ret_no_self)]
    pub fn new() -> TestClient {
        let client =
            Client::builder(TokioExecutor::new()).http2_only(true).build(HttpConnector::new());
        TestClient { client }
    }
}

// === impl TestClient ===

impl TestClient {
    pub async fn get(&self, url: &str, headers: &[(&str, &str)]) -> Resp {
        self.send(Method::GET, url, headers, empty()).await.expect("request completes")
    }

    pub async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Body,
    ) -> Result<Resp, String> {
        send(&self.client, method, url, headers, body).await
    }
}

async fn send(
    client: &Client<HttpConnector, Body>,
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Body,
) -> Result<Resp, String> {
    let mut req = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(body).map_err(|e| e.to_string())?;
    let resp = client.request(req).await.map_err(|e| format!("{e:?}"))?;
    let (parts, body) = resp.into_parts();
    let collected = body.collect().await.map_err(|e| format!("{e:?}"))?;
    let trailers = collected.trailers().cloned();
    Ok(Resp {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: collected.to_bytes(),
        trailers,
    })
}
