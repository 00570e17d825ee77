//! The egress's target authority (`proxy/src/egress/forward.rs`): where an outbound request
//! goes, from its absolute-form URI or HTTP/2 `:authority`, else its `Host`, and the request
//! the downstream then receives.
//!
//! Properties: a target always has a port, no user info, and re-parses to itself; its host
//! is the one the caller named and its port the one the caller named (80 when none); a port
//! the caller named but that is no port, or anything else after the host, is refused rather
//! than replaced or dropped; a route target is such an authority too; the downstream
//! request carries exactly that authority (HTTP/1.1 `Host`, or the h2 `:authority`).
#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use http::uri::Authority;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Uri};
use libfuzzer_sys::fuzz_target;
use weir_proxy::app_client::Protocol;
use weir_proxy::body::RequestBody;
use weir_proxy::egress::forward::{downstream_request, parse_target, target_authority};

#[derive(Debug, Arbitrary)]
struct Input<'a> {
    uri: &'a [u8],
    host: Option<&'a [u8]>,
    route: Option<&'a str>,
    h2: bool,
}

fuzz_target!(|input: Input<'_>| {
    let Ok(uri) = Uri::try_from(input.uri) else { return };
    let mut headers = HeaderMap::new();
    if let Some(host) = input.host.and_then(|h| HeaderValue::from_bytes(h).ok()) {
        headers.insert(http::header::HOST, host);
    }
    let route = input.route.and_then(|r| parse_target(r).ok());
    if let Some(route) = &route {
        assert_eq!(port_text(route).and_then(port_number), route.port_u16(), "{route:?}");
        assert!(!route.as_str().contains('@') && !route.host().is_empty(), "{route:?}");
    }
    let target = target_authority(route.as_ref(), &uri, &headers);
    let named = match (&route, uri.authority()) {
        (Some(route), _) => Some(route.clone()),
        (None, Some(a)) => Some(a.clone()),
        (None, None) => {
            headers.get(http::header::HOST).and_then(|h| Authority::try_from(h.as_bytes()).ok())
        }
    };
    let Some(target) = target else {
        // Refused: nothing named, user info, no host, or not `:port` after the host.
        if let Some(named) = named {
            let user_info = named.as_str().contains('@');
            let port = port_text(&named).filter(|p| p.is_empty() || port_number(p).is_some());
            assert!(user_info || named.host().is_empty() || port.is_none(), "refused {named:?}");
        }
        return;
    };
    let named = named.expect("a target from nothing");
    let port = target.port_u16().expect("a target without a port");
    assert!(!target.as_str().contains('@'), "user info in {target}");
    assert!(!target.host().is_empty(), "empty host in {target}");
    assert_eq!(Authority::try_from(target.as_str()).ok().as_ref(), Some(&target), "re-parses");
    assert_eq!(target.host(), named.host(), "the host the caller named");
    match port_text(&named) {
        Some("") => assert_eq!(port, 80),
        Some(text) => assert_eq!(port_number(text), Some(port), "the port named"),
        None => panic!("accepted {named:?}, which has more than a port after its host"),
    }

    let (parts, ()) = Request::builder().uri(uri).body(()).unwrap().into_parts();
    let mut parts = parts;
    parts.headers = headers;
    parts.headers.insert("proxy-authorization", HeaderValue::from_static("secret"));
    let protocol = if input.h2 { Protocol::H2c } else { Protocol::Http1 };
    let timeout = HeaderName::from_static("x-request-timeout-ms");
    let out = downstream_request(
        parts,
        RequestBody::empty(),
        protocol,
        &target,
        Duration::from_millis(480),
        &timeout,
    );
    assert!(!out.headers().contains_key("proxy-authorization"));
    if input.h2 {
        assert_eq!(out.uri().authority(), Some(&target), "the :authority");
        assert!(!out.headers().contains_key(http::header::HOST));
    } else {
        assert_eq!(out.uri().authority(), None, "origin form");
        let host = out.headers().get(http::header::HOST).expect("a Host");
        assert_eq!(host.as_bytes(), target.as_str().as_bytes());
    }
});

/// A port: digits only, at most 65535.
fn port_number(text: &str) -> Option<u16> {
    text.bytes().all(|b| b.is_ascii_digit()).then(|| text.parse().ok())?
}

/// The port text after the host (empty without one), or `None` when what follows the host
/// is not `:` and a port text.
fn port_text(authority: &Authority) -> Option<&str> {
    let s = authority.as_str();
    let host_at = s.rfind('@').map_or(0, |i| i + 1);
    match &s[host_at + authority.host().len()..] {
        "" => Some(""),
        rest => rest.strip_prefix(':'),
    }
}
