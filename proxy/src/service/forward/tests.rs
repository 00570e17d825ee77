use super::*;
use http::header::{CONNECTION, CONTENT_LENGTH, EXPECT, TE};

fn parts(req: http::request::Builder) -> http::request::Parts {
    req.body(()).unwrap().into_parts().0
}

fn app() -> SocketAddr {
    "127.0.0.1:8080".parse().unwrap()
}

fn forwarded(req: http::request::Builder, protocol: Protocol) -> http::request::Parts {
    let remaining = Duration::from_millis(480);
    let name = HeaderName::from_static("x-request-timeout-ms");
    let body = RequestBody::empty();
    app_request(parts(req), body, protocol, app(), remaining, &name, None).into_parts().0
}

#[test]
fn http1_gets_origin_form_and_a_host() {
    let p =
        forwarded(Request::get("http://svc.local/a?b=1").version(Version::HTTP_2), Protocol::Http1);
    assert_eq!(p.uri, "/a?b=1");
    assert_eq!(p.headers[HOST], "svc.local");
    assert_eq!(p.version, Version::HTTP_11);

    let p = forwarded(Request::get("/").version(Version::HTTP_10), Protocol::Http1);
    assert_eq!(p.headers[HOST], "127.0.0.1:8080", "HTTP/1.0 without Host gets the app's");
}

#[test]
fn h2c_gets_an_absolute_uri_from_the_host() {
    let p = forwarded(Request::get("/x").header(HOST, "svc.local:81"), Protocol::H2c);
    assert_eq!(p.uri, "http://svc.local:81/x");
    assert!(p.headers.get(HOST).is_none());
    assert_eq!(p.version, Version::HTTP_2);
}

#[test]
fn hop_by_hop_headers_go_and_the_budget_is_rewritten() {
    let p = forwarded(
        Request::post("/")
            .header(CONNECTION, "keep-alive, x-private")
            .header("x-private", "1")
            .header("keep-alive", "timeout=5")
            .header(TE, "trailers")
            .header(EXPECT, "100-continue")
            .header("x-request-timeout-ms", "900")
            .header("grpc-timeout", "2S")
            .header(CONTENT_LENGTH, "5,5"),
        Protocol::Http1,
    );
    for gone in ["connection", "x-private", "keep-alive", "expect"] {
        assert!(p.headers.get(gone).is_none(), "{gone}");
    }
    assert_eq!(p.headers[TE], "trailers");
    assert_eq!(p.headers["x-request-timeout-ms"], "480");
    assert_eq!(p.headers["grpc-timeout"], "480m");
    // The (empty) body's exact length replaces whatever the caller wrote.
    assert_eq!(p.headers.get_all(CONTENT_LENGTH).iter().collect::<Vec<_>>(), ["0"]);
}

#[test]
fn replace_path_keeps_the_authority() {
    let mut uri: Uri = "http://a.b/x/../y".parse().unwrap();
    replace_path(&mut uri, PathAndQuery::from_static("/y"));
    assert_eq!(uri, "http://a.b/y");
}
