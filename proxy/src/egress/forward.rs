//! The outbound request as the downstream receives it and the downstream's response as the
//! app receives it: origin-form (HTTP/1.1) or scheme + authority (h2c), a `Host`, no
//! hop-by-hop or proxy headers, priority headers untouched, and the remaining budget in
//! both deadline forms the request used (`x-request-timeout-ms` always, `grpc-timeout`
//! when the caller sent one).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::header::{HOST, PROXY_AUTHORIZATION};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Uri, Version};

use crate::app_client::Protocol;
use crate::body::RequestBody;
pub use crate::config::egress::parse_target;
use crate::config::egress::with_port;

/// The authority a request is for: a fixed route's, the absolute-form URI's (HTTP proxy
/// style, and HTTP/2's `:authority`), or the `Host` header's. Port 80 when none is given
/// (or the port is empty, `host:`, as RFC 3986 allows).
pub fn target_authority(
    route: Option<&Authority>,
    uri: &Uri,
    headers: &HeaderMap,
) -> Option<Authority> {
    if let Some(route) = route {
        return Some(route.clone());
    }
    let authority = match uri.authority() {
        Some(a) => a.clone(),
        None => Authority::try_from(headers.get(HOST)?.as_bytes()).ok()?,
    };
    with_port(authority)
}

/// The request for the downstream.
pub fn downstream_request(
    mut parts: http::request::Parts,
    body: RequestBody,
    protocol: Protocol,
    authority: &Authority,
    remaining: Duration,
    timeout_header: &HeaderName,
) -> Request<RequestBody> {
    parts.headers.remove(PROXY_AUTHORIZATION);
    crate::forward_headers::prepare_request(&mut parts.headers, &body, remaining, timeout_header);
    let headers = &mut parts.headers;
    let path = parts.uri.path_and_query().cloned().unwrap_or(PathAndQuery::from_static("/"));
    match protocol {
        Protocol::Http1 => {
            parts.version = Version::HTTP_11;
            if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
                headers.insert(HOST, host);
            }
            parts.uri = Uri::from(path);
        }
        Protocol::H2c => {
            parts.version = Version::HTTP_2;
            let mut uri = http::uri::Parts::default();
            uri.scheme = Some(Scheme::HTTP);
            uri.authority = Some(authority.clone());
            uri.path_and_query = Some(path);
            parts.uri = Uri::from_parts(uri).unwrap_or_else(|_| Uri::from_static("/"));
            headers.remove(HOST);
        }
    }
    Request::from_parts(parts, body)
}

/// Authority -> address, resolved with a bound (`timeouts.resolve`) and reused for
/// `timeouts.resolve_ttl`. At most `max` names are remembered; beyond that a name is
/// resolved on every request (still bounded).
#[derive(Debug)]
pub struct Resolver {
    timeout: Duration,
    ttl: Duration,
    max: usize,
    known: Mutex<HashMap<Box<str>, (SocketAddr, Instant)>>,
}

/// Why a downstream has no address.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("resolving {0}: no answer within egress.timeouts.resolve")]
    Timeout(String),
    #[error("resolving {0}: {1}")]
    Failed(String, String),
}

impl Resolver {
    pub fn new(timeout: Duration, ttl: Duration, max: usize) -> Self {
        Resolver { timeout, ttl, max, known: Mutex::new(HashMap::new()) }
    }

    pub async fn resolve(&self, authority: &Authority) -> Result<SocketAddr, ResolveError> {
        let port = authority.port_u16().unwrap_or(80);
        let host = authority.host();
        // IP literals need no lookup (`[::1]` keeps its brackets in `host()`).
        let literal = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = literal.parse::<std::net::IpAddr>() {
            return Ok(SocketAddr::new(ip, port));
        }
        let now = Instant::now();
        {
            let known = self.known.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(&(addr, at)) = known.get(authority.as_str()) {
                if now.duration_since(at) < self.ttl {
                    return Ok(addr);
                }
            }
        }
        let name = authority.as_str().to_string();
        let lookup = tokio::net::lookup_host((host.to_string(), port));
        let addr = match tokio::time::timeout(self.timeout, lookup).await {
            Err(_) => return Err(ResolveError::Timeout(name)),
            Ok(Err(e)) => return Err(ResolveError::Failed(name, e.to_string())),
            Ok(Ok(mut addrs)) => addrs
                .next()
                .ok_or_else(|| ResolveError::Failed(name.clone(), "no address".into()))?,
        };
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if known.len() < self.max || known.contains_key(authority.as_str()) {
            known.insert(name.into(), (addr, now));
        }
        Ok(addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_comes_from_the_route_the_uri_or_the_host() {
        let h = |host: &str| {
            let mut m = HeaderMap::new();
            m.insert(HOST, HeaderValue::from_str(host).unwrap());
            m
        };
        let abs: Uri = "http://b.svc:8080/x".parse().unwrap();
        let origin: Uri = "/x".parse().unwrap();
        let route = parse_target("r.svc:9000").unwrap();
        assert_eq!(target_authority(Some(&route), &abs, &h("h:1")).unwrap(), "r.svc:9000");
        assert_eq!(target_authority(None, &abs, &h("h:1")).unwrap(), "b.svc:8080");
        assert_eq!(target_authority(None, &origin, &h("h.svc:81")).unwrap(), "h.svc:81");
        assert_eq!(target_authority(None, &origin, &h("h.svc")).unwrap(), "h.svc:80");
        assert!(target_authority(None, &origin, &HeaderMap::new()).is_none());
        assert_eq!(target_authority(None, &origin, &h("[::1]")).unwrap(), "[::1]:80");
        assert_eq!(target_authority(None, &origin, &h("h.svc:")).unwrap(), "h.svc:80");
        assert!(parse_target("b.svc").is_err());
        assert!(parse_target("u@b.svc:80").is_err());
    }

    /// Fuzz findings (fuzz/fuzz_targets/target_authority.rs): an authority with no host
    /// (`:2`) was a target (resolving the empty name), as a route's too; a port that is no port
    /// (`h.svc:99999`) was silently replaced by 80; and what http accepts after a bracketed
    /// host (`[::1]x:80`, `[]C`) was kept or dropped.
    #[test]
    fn no_host_or_a_bad_port_is_no_target() {
        let origin: Uri = "/x".parse().unwrap();
        let mut headers = HeaderMap::new();
        for host in
            [":2", "h.svc:99999", "h.svc:8o", "h.svc:+80", "[::1]:65536", "[::1]x:80", "[]C"]
        {
            headers.insert(HOST, HeaderValue::from_str(host).unwrap());
            assert_eq!(target_authority(None, &origin, &headers), None, "{host}");
        }
        let authority_form: Uri = ":2".parse().unwrap();
        assert_eq!(target_authority(None, &authority_form, &HeaderMap::new()), None);
        for target in [":2", "[::1]x:80", "b.svc:+80"] {
            assert!(parse_target(target).is_err(), "a route target is host:port too: {target}");
        }
        assert_eq!(parse_target("[::1]:80").unwrap(), "[::1]:80");
    }

    #[test]
    fn the_downstream_gets_the_remaining_budget_in_both_forms_and_origin_form() {
        let req = Request::builder()
            .uri("http://b.svc:8080/p?q=1")
            .header("x-business-priority", "3")
            .header("x-user-priority", "77")
            .header("grpc-timeout", "5S")
            .header("x-request-timeout-ms", "5000")
            .header("proxy-authorization", "secret")
            .header("proxy-connection", "keep-alive")
            .body(())
            .unwrap();
        let (parts, ()) = req.into_parts();
        let authority = parse_target("b.svc:8080").unwrap();
        let timeout = HeaderName::from_static("x-request-timeout-ms");
        let out = downstream_request(
            parts,
            RequestBody::empty(),
            Protocol::Http1,
            &authority,
            Duration::from_millis(480),
            &timeout,
        );
        assert_eq!(out.uri(), "/p?q=1");
        let h = out.headers();
        assert_eq!(h["host"], "b.svc:8080");
        assert_eq!(h["x-request-timeout-ms"], "480");
        assert_eq!(h["grpc-timeout"], "480m");
        assert_eq!(h["x-business-priority"], "3");
        assert_eq!(h["x-user-priority"], "77");
        assert!(!h.contains_key("proxy-authorization") && !h.contains_key("proxy-connection"));
    }
}
