//! Header rules shared by every forwarded exchange, inbound (caller -> app) and egress
//! (app -> downstream): one authority per request, no hop-by-hop headers either way, one
//! `content-length` (the length weir will send), `Expect` answered by weir itself, and the
//! remaining budget in both deadline forms the request used.

use std::time::Duration;

use http::header::{
    CONNECTION, CONTENT_LENGTH, EXPECT, HOST, PROXY_AUTHENTICATE, TE, TRANSFER_ENCODING, UPGRADE,
};
use http::uri::Authority;
use http::{HeaderMap, HeaderName, HeaderValue, Version};
use hyper::body::Body;

use crate::body::RequestBody;
use crate::deadline::{self, GRPC_TIMEOUT};
use crate::refusal::WeirError;

const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
/// A header named like the `close` connection option (removed with it, as any listed name).
const CLOSE: HeaderName = HeaderName::from_static("close");

/// Prepares a request's headers for the next hop. `remaining` is what is left of the
/// caller's budget: the next hop gets that, not the budget the request arrived with
/// (`timeout_header` always, `grpc-timeout` when the caller sent one).
pub(crate) fn prepare_request(
    headers: &mut HeaderMap,
    body: &RequestBody,
    remaining: Duration,
    timeout_header: &HeaderName,
) {
    let present = strip(headers, 0);
    prepare_stripped_request(headers, body, remaining, timeout_header, present);
}

/// [`prepare_request`] for a head [`check_scanned_request_head`] passed as `checked`, with
/// nothing since added of the names it strips or rewrites: no second pass over its names.
pub(crate) fn prepare_checked_request(
    headers: &mut HeaderMap,
    body: &RequestBody,
    remaining: Duration,
    timeout_header: &HeaderName,
    checked: Carried,
) {
    debug_assert_eq!(Head::of(headers) & !checked.known, 0, "a name the check did not see");
    let present = strip_known(headers, checked.known, 0);
    prepare_stripped_request(headers, body, remaining, timeout_header, present);
}

fn prepare_stripped_request(
    headers: &mut HeaderMap,
    body: &RequestBody,
    remaining: Duration,
    timeout_header: &HeaderName,
    present: u16,
) {
    // weir answers `Expect: 100-continue` itself (when it starts reading the body).
    if present & Head::EXPECT != 0 {
        headers.remove(EXPECT);
    }
    // One value (`Content-Length: 5,5` was accepted as 5): the length weir will send.
    if present & Head::CONTENT_LENGTH != 0 && headers.contains_key(CONTENT_LENGTH) {
        match body.size_hint().exact() {
            Some(n) => {
                headers.insert(CONTENT_LENGTH, HeaderValue::from(n));
            }
            None => {
                headers.remove(CONTENT_LENGTH);
            }
        }
    }
    headers.insert(timeout_header.clone(), deadline::ms_value(remaining));
    if present & Head::GRPC_TIMEOUT != 0 && headers.contains_key(GRPC_TIMEOUT) {
        let mut buf = [0u8; 20];
        if let Ok(v) = HeaderValue::from_bytes(deadline::format_grpc_ms(remaining, &mut buf)) {
            headers.insert(GRPC_TIMEOUT, v);
        }
    }
}

/// What every role checks first, before the head is read for anything (priority, budget,
/// the downstream): the request names one authority ([`one_authority`]), carries no
/// transfer coding weir cannot pass on, and loses its hop-by-hop headers now, so that
/// nothing weir adds later (the entry's priority stamp) can be removed by a caller's
/// `Connection: x-business-priority`. `Err` is the status to answer with; the request is
/// not forwarded.
pub(crate) fn check_request_head(parts: &mut http::request::Parts) -> Result<(), WeirError> {
    let carried = Carried::scan(&parts.headers, &[]);
    check_scanned_request_head(parts, carried).map(drop)
}

/// [`check_request_head`] of a head [`Carried::scan`] has looked at; what it may carry after
/// the check.
pub(crate) fn check_scanned_request_head(
    parts: &mut http::request::Parts,
    carried: Carried,
) -> Result<Carried, WeirError> {
    let present = carried.known;
    if present & Head::TRANSFER_ENCODING != 0 && has_unsupported_transfer_coding(&parts.headers) {
        return Err(WeirError::UnsupportedTransferCoding);
    }
    one_authority(parts).map_err(|why| {
        tracing::debug!(why, "request refused: its authority is ambiguous");
        WeirError::AmbiguousAuthority
    })?;
    // (`one_authority` touches `Host` alone, none of the names the bits stand for.)
    let left = strip_known(&mut parts.headers, present, 0);
    // The check only removes names: one the scan found absent still is; one it found may
    // have gone (`Connection` listed it), and is looked up, finding nothing, as before.
    Ok(Carried { known: left, asked: carried.asked })
}

/// Which names a request head carries, from one pass over its names: the ones these rules
/// act on, `content-type`, and up to eight more the caller asks about (the request path's
/// configured names). A name found absent costs the path no hashed lookup; one found
/// present is looked up as before, so nothing reads differently.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Carried {
    known: u16,
    asked: u8,
}

impl Carried {
    /// One pass over `headers`' names; `asked[i]` is [`Carried::may_carry`]`(i)`.
    pub(crate) fn scan(headers: &HeaderMap, asked: &[HeaderName]) -> Self {
        debug_assert!(asked.len() <= 8);
        let (mut known, mut found) = (0, 0u8);
        for name in headers.keys() {
            known |= Head::bit(name);
            for (i, wanted) in asked.iter().enumerate() {
                if name == wanted {
                    found |= 1 << i;
                }
            }
        }
        Carried { known, asked: found }
    }

    /// The head may carry the `i`-th asked name (`false`: it certainly does not).
    pub(crate) fn may_carry(&self, i: usize) -> bool {
        self.asked & (1 << i) != 0
    }

    /// The head may carry `content-type`.
    pub(crate) fn may_carry_content_type(&self) -> bool {
        self.known & Head::CONTENT_TYPE != 0
    }

    /// The head may carry `grpc-timeout`.
    pub(crate) fn may_carry_grpc_timeout(&self) -> bool {
        self.known & Head::GRPC_TIMEOUT != 0
    }
}

/// Makes the request name exactly one authority, the one every later step reads (the
/// entry's classification, the app's `Host` or `:authority`, the egress's downstream):
///
/// - HTTP/1.x: more than one `Host`, an HTTP/1.1 request without one, or an invalid one is
///   refused (RFC 9112 3.2). An absolute-form target's authority wins over `Host`, which is
///   replaced by it (RFC 9112 3.2.2).
/// - HTTP/2: `:authority` wins; a `host` that names another authority, or several `host`s,
///   make the request malformed (RFC 9113 8.3.1). Without `:authority`, one valid `host`.
/// - Userinfo (`user@host`) is refused in either (RFC 9110 4.2.4).
///
/// Afterwards `Host`, when present, equals the URI's authority when that is present.
pub(crate) fn one_authority(parts: &mut http::request::Parts) -> Result<(), &'static str> {
    let mut hosts = parts.headers.get_all(HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err("more than one Host");
    }
    let host = match host {
        Some(value) => Some(parse_authority(value.as_bytes()).ok_or("an invalid Host")?),
        None => None,
    };
    let target = match parts.uri.authority() {
        Some(a) if a.as_str().contains('@') => return Err("userinfo in the target"),
        Some(a) => Some(a.clone()),
        None => None,
    };
    let http2 = parts.version >= Version::HTTP_2;
    if !http2 && parts.version == Version::HTTP_11 && host.is_none() {
        return Err("an HTTP/1.1 request without Host");
    }
    let Some(target) = target else { return Ok(()) };
    if http2 {
        if let Some(host) = &host {
            if !same_authority(host, &target, parts.uri.scheme_str()) {
                return Err("a host that differs from :authority");
            }
        }
    }
    let value = HeaderValue::from_str(target.as_str()).map_err(|_| "an invalid target")?;
    if http2 && host.is_none() {
        return Ok(());
    }
    parts.headers.insert(HOST, value);
    Ok(())
}

fn parse_authority(value: &[u8]) -> Option<Authority> {
    let authority = Authority::try_from(value).ok()?;
    (!authority.as_str().contains('@')).then_some(authority)
}

/// Host compared case-insensitively, ports with the scheme's default filled in.
fn same_authority(a: &Authority, b: &Authority, scheme: Option<&str>) -> bool {
    let default = match scheme {
        Some(s) if s.eq_ignore_ascii_case("https") => 443,
        _ => 80,
    };
    a.host().eq_ignore_ascii_case(b.host())
        && a.port_u16().unwrap_or(default) == b.port_u16().unwrap_or(default)
}

/// A transfer coding other than `chunked` (`Transfer-Encoding: gzip, chunked`): weir takes
/// the chunked framing off and cannot pass the rest on (HTTP/2 has no transfer codings, and
/// few apps implement them); dropping it would hand the app a compressed body it takes for
/// plain. Refused with 501, as nginx does.
fn has_unsupported_transfer_coding(headers: &HeaderMap) -> bool {
    headers.get_all(TRANSFER_ENCODING).iter().any(|value| {
        value
            .as_bytes()
            .split(|&b| b == b',')
            .map(<[u8]>::trim_ascii)
            .any(|coding| !coding.is_empty() && !coding.eq_ignore_ascii_case(b"chunked"))
    })
}

/// A response's headers for the previous hop: framing is that connection's business.
pub(crate) fn clean_response(headers: &mut HeaderMap) {
    strip(headers, Head::PROXY_AUTHENTICATE);
}

/// Which of the names these rules look at a head carries, as bits: the fixed hop-by-hop
/// names, and the few that [`prepare_request`] rewrites.
struct Head;

impl Head {
    const CONNECTION: u16 = 1;
    const KEEP_ALIVE: u16 = 1 << 1;
    const PROXY_CONNECTION: u16 = 1 << 2;
    const TRANSFER_ENCODING: u16 = 1 << 3;
    const UPGRADE: u16 = 1 << 4;
    const TE: u16 = 1 << 5;
    const PROXY_AUTHENTICATE: u16 = 1 << 6;
    const EXPECT: u16 = 1 << 7;
    const CONTENT_LENGTH: u16 = 1 << 8;
    const GRPC_TIMEOUT: u16 = 1 << 9;
    const CONTENT_TYPE: u16 = 1 << 10;
    /// The hop-by-hop names (`proxy-authenticate` only for a response).
    const HOP_BY_HOP: u16 = Self::CONNECTION
        | Self::KEEP_ALIVE
        | Self::PROXY_CONNECTION
        | Self::TRANSFER_ENCODING
        | Self::UPGRADE
        | Self::TE;

    /// The bits of the names `headers` carries.
    fn of(headers: &HeaderMap) -> u16 {
        headers.keys().fold(0, |bits, name| bits | Self::bit(name))
    }

    /// The bit of `name` (0: none of them). By length first: most names are none of them
    /// and cost one comparison.
    fn bit(name: &HeaderName) -> u16 {
        let name = name.as_str();
        match name.len() {
            2 if name == "te" => Self::TE,
            6 if name == "expect" => Self::EXPECT,
            7 if name == "upgrade" => Self::UPGRADE,
            10 if name == "connection" => Self::CONNECTION,
            10 if name == "keep-alive" => Self::KEEP_ALIVE,
            12 if name == "grpc-timeout" => Self::GRPC_TIMEOUT,
            12 if name == "content-type" => Self::CONTENT_TYPE,
            14 if name == "content-length" => Self::CONTENT_LENGTH,
            16 if name == "proxy-connection" => Self::PROXY_CONNECTION,
            17 if name == "transfer-encoding" => Self::TRANSFER_ENCODING,
            18 if name == "proxy-authenticate" => Self::PROXY_AUTHENTICATE,
            _ => 0,
        }
    }
}

/// Removes the headers that describe one connection, not the message (RFC 9110 7.6.1),
/// and the names in `also` (bits of [`Head`]). `te: trailers` stays: gRPC needs it end to
/// end; so does `Host`, whatever `Connection` lists (it names the request's authority,
/// never a connection option). Returns the bits of the names the head may still carry (all
/// of them when `Connection` listed names of its own: what those removed is not known).
///
/// Most heads carry none of them, and most of the rest only `Connection: keep-alive` (or
/// `close`): one pass over the names (a comparison each) says which are there, and only
/// those are removed; a `Connection` that lists nothing but options removed anyway, or
/// `close`, needs no copy of its values and no lookup by a name parsed from them.
fn strip(headers: &mut HeaderMap, also: u16) -> u16 {
    let present = Head::of(headers);
    strip_known(headers, present, also)
}

/// [`strip`], with the head's bits already known.
fn strip_known(headers: &mut HeaderMap, mut present: u16, also: u16) -> u16 {
    if present & (Head::HOP_BY_HOP | also) == 0 {
        return present;
    }
    if present & Head::CONNECTION != 0 {
        let mut close = false;
        let plain = headers.get_all(CONNECTION).iter().all(|value| {
            value.as_bytes().split(|&b| b == b',').map(<[u8]>::trim_ascii).all(|option| {
                let is_close = option.eq_ignore_ascii_case(b"close");
                close |= is_close;
                option.is_empty() || is_close || removed_anyway(option)
            })
        });
        if plain {
            headers.remove(CONNECTION);
            if close {
                headers.remove(CLOSE);
            }
        } else {
            let listed: Vec<HeaderValue> = headers.get_all(CONNECTION).iter().cloned().collect();
            headers.remove(CONNECTION);
            for value in &listed {
                let Ok(names) = value.to_str() else { continue };
                for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                    if !name.eq_ignore_ascii_case("te") && !name.eq_ignore_ascii_case("host") {
                        headers.remove(name);
                    }
                }
            }
            // What the listed names took is not known: anything may be left.
            present = !0;
        }
        present &= !Head::CONNECTION;
    }
    let fixed = [
        (Head::KEEP_ALIVE, KEEP_ALIVE),
        (Head::PROXY_CONNECTION, PROXY_CONNECTION),
        (Head::TRANSFER_ENCODING, TRANSFER_ENCODING),
        (Head::UPGRADE, UPGRADE),
    ];
    for (bit, name) in fixed {
        if present & bit != 0 {
            headers.remove(name);
            present &= !bit;
        }
    }
    if present & Head::TE != 0 && headers.get(TE).is_some_and(|te| te.as_bytes() != b"trailers") {
        headers.remove(TE);
    }
    if present & also & Head::PROXY_AUTHENTICATE != 0 {
        headers.remove(PROXY_AUTHENTICATE);
        present &= !Head::PROXY_AUTHENTICATE;
    }
    present
}

/// A connection option whose header the fixed list removes or keeps on its own rules
/// (`te`: kept when it says `trailers`; `host`: never removed).
fn removed_anyway(option: &[u8]) -> bool {
    [&b"keep-alive"[..], b"te", b"host", b"upgrade", b"transfer-encoding", b"proxy-connection"]
        .iter()
        .any(|fixed| option.eq_ignore_ascii_case(fixed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, StatusCode};

    fn head(req: http::request::Builder) -> http::request::Parts {
        req.body(()).unwrap().into_parts().0
    }

    fn checked(req: http::request::Builder) -> Result<http::request::Parts, StatusCode> {
        let mut parts = head(req);
        check_request_head(&mut parts).map(|()| parts).map_err(WeirError::status)
    }

    #[test]
    fn the_absolute_form_authority_replaces_host() {
        let p =
            checked(Request::get("http://shop.example/buy").header(HOST, "admin.example")).unwrap();
        assert_eq!(p.headers.get_all(HOST).iter().collect::<Vec<_>>(), ["shop.example"]);
        assert_eq!(p.uri.host(), Some("shop.example"));
    }

    #[test]
    fn http1_needs_exactly_one_valid_host() {
        let two = Request::get("/").header(HOST, "a.example").header(HOST, "b.example");
        assert_eq!(checked(two).unwrap_err(), StatusCode::BAD_REQUEST);
        assert_eq!(checked(Request::get("/")).unwrap_err(), StatusCode::BAD_REQUEST);
        let bad = Request::get("/").header(HOST, "a b");
        assert_eq!(checked(bad).unwrap_err(), StatusCode::BAD_REQUEST);
        let userinfo = Request::get("/").header(HOST, "u@a.example");
        assert_eq!(checked(userinfo).unwrap_err(), StatusCode::BAD_REQUEST);
        // Two Hosts are refused even when an absolute-form target would win.
        let both = Request::get("http://a.example/").header(HOST, "a").header(HOST, "b");
        assert_eq!(checked(both).unwrap_err(), StatusCode::BAD_REQUEST);
        // HTTP/1.0 may omit it.
        assert!(checked(Request::get("/").version(Version::HTTP_10)).is_ok());
    }

    #[test]
    fn h2_authority_wins_and_a_different_host_is_malformed() {
        let h2 = |host: Option<&str>| {
            let mut req = Request::get("http://shop.example/buy").version(Version::HTTP_2);
            if let Some(host) = host {
                req = req.header(HOST, host);
            }
            checked(req)
        };
        assert_eq!(h2(Some("admin.example")).unwrap_err(), StatusCode::BAD_REQUEST);
        let same = h2(Some("SHOP.example:80")).unwrap();
        assert_eq!(same.headers[HOST], "shop.example");
        assert!(h2(None).unwrap().headers.get(HOST).is_none());
        // Without :authority, a single host is the authority.
        let p = checked(Request::get("/x").version(Version::HTTP_2).header(HOST, "a.example"));
        assert_eq!(p.unwrap().headers[HOST], "a.example");
    }

    #[test]
    fn a_transfer_coding_other_than_chunked_is_refused() {
        let gzip = Request::post("/").header(HOST, "a").header(TRANSFER_ENCODING, "gzip, chunked");
        assert_eq!(checked(gzip).unwrap_err(), StatusCode::NOT_IMPLEMENTED);
        let chunked = Request::post("/").header(HOST, "a").header(TRANSFER_ENCODING, "chunked");
        assert!(checked(chunked).unwrap().headers.get(TRANSFER_ENCODING).is_none());
    }

    #[test]
    fn connection_options_go_before_anything_is_stamped_and_host_stays() {
        let p = checked(
            Request::get("/")
                .header(HOST, "a.example")
                .header(CONNECTION, "x-business-priority, host")
                .header("x-business-priority", "0"),
        )
        .unwrap();
        assert!(p.headers.get("x-business-priority").is_none());
        assert!(p.headers.get(CONNECTION).is_none());
        assert_eq!(p.headers[HOST], "a.example");
    }

    #[test]
    fn a_response_loses_its_hop_by_hop_headers_whatever_connection_lists() {
        let response = |connection: &str| {
            let mut h = HeaderMap::new();
            for (name, value) in [
                ("content-type", "text/plain"),
                ("connection", connection),
                ("keep-alive", "timeout=5"),
                ("close", "1"),
                ("x-listed", "1"),
                ("te", "trailers"),
                ("proxy-authenticate", "Basic"),
            ] {
                h.append(HeaderName::from_static(name), HeaderValue::from_str(value).unwrap());
            }
            clean_response(&mut h);
            let mut names: Vec<_> = h.keys().map(|n| n.as_str().to_owned()).collect();
            names.sort();
            names
        };
        // Only options removed anyway (the cheap path), `close` among them.
        assert_eq!(response("keep-alive"), ["close", "content-type", "te", "x-listed"]);
        assert_eq!(response("Close, TE"), ["content-type", "te", "x-listed"]);
        // A listed name of its own.
        assert_eq!(response("keep-alive, x-listed"), ["close", "content-type", "te"]);
        // Nothing hop-by-hop at all: untouched.
        let mut plain = HeaderMap::new();
        plain.insert(HOST, HeaderValue::from_static("a"));
        clean_response(&mut plain);
        assert_eq!(plain.len(), 1);
    }

    /// The scan says absent only for what the head certainly lacks: present names, in any
    /// case, are found; a name the caller's `Connection` listed (and the check removed)
    /// reads as maybe present (its lookup finds nothing, as before); one never sent, absent.
    #[test]
    fn the_scan_never_calls_a_name_absent_that_may_be_there() {
        let asked = [
            HeaderName::from_static("x-request-timeout-ms"),
            HeaderName::from_static("x-business-priority"),
        ];
        let scanned = |req: http::request::Builder| {
            let mut parts = head(req.header(HOST, "a.example"));
            let carried = Carried::scan(&parts.headers, &asked);
            check_scanned_request_head(&mut parts, carried).unwrap()
        };
        let none = scanned(Request::get("/"));
        assert!(!none.may_carry(0) && !none.may_carry(1));
        assert!(!none.may_carry_content_type() && !none.may_carry_grpc_timeout());
        let all = scanned(
            Request::get("/")
                .header("X-Request-Timeout-Ms", "900")
                .header("x-business-priority", "1")
                .header("Content-Type", "application/grpc")
                .header("grpc-timeout", "1S"),
        );
        assert!(all.may_carry(0) && all.may_carry(1));
        assert!(all.may_carry_content_type() && all.may_carry_grpc_timeout());
        let listed = scanned(
            Request::get("/")
                .header(CONNECTION, "x-request-timeout-ms")
                .header("x-request-timeout-ms", "900"),
        );
        assert!(listed.may_carry(0) && !listed.may_carry(1));
    }
}
