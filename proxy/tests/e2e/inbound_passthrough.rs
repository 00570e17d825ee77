//! The inbound path passes traffic through faithfully (HTTP/1.1 and h2c, real hyper app and
//! clients) and stamps `x-admission-level` on every response, including its own errors.

use crate::support;

use bytes::Bytes;
use http::Method;
use support::backend::{pattern, Backend};
use support::client::{bytes_body, chunked_body, empty, Http1, H2};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_statuses_and_headers_pass_through_http1_and_h2() {
    let app = Backend::start().await;
    let weir = support::sidecar(app.addr, |_| {});
    let base = format!("http://{}", weir.inbound_addr());
    for (name, h1) in [("http1", true), ("h2", false)] {
        let send = |m: Method, path: &str, headers: &[(&str, &str)], body| {
            let url = format!("{base}{path}");
            let headers: Vec<(String, String)> =
                headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            async move {
                let h: Vec<(&str, &str)> =
                    headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                if h1 {
                    Http1::new().send(m, &url, &h, body).await.unwrap()
                } else {
                    H2::new().send(m, &url, &h, body).await.unwrap()
                }
            }
        };
        for method in
            [Method::GET, Method::POST, Method::PUT, Method::DELETE, Method::PATCH, Method::OPTIONS]
        {
            let body = if method == Method::GET { empty() } else { bytes_body("payload") };
            let resp = send(
                method.clone(),
                "/echo",
                &[("x-custom", "v1"), ("x-business-priority", "5")],
                body,
            )
            .await;
            assert_eq!(resp.status, 200, "{name} {method}");
            assert_eq!(resp.header("x-echo-method"), Some(method.as_str()), "{name}");
            assert_eq!(resp.header("x-backend"), Some("yes"));
            assert_eq!(resp.level(), "255.127");
            if method != Method::GET {
                assert_eq!(resp.body, "payload", "{name} {method}");
            }
            let seen = app.seen().pop().unwrap();
            assert_eq!(seen.method, method);
            assert_eq!(seen.headers["x-custom"], "v1");
            assert_eq!(seen.headers["x-business-priority"], "5", "inner hops pass priority on");
            let budget: u64 =
                seen.headers["x-request-timeout-ms"].to_str().unwrap().parse().unwrap();
            assert!((1..=500).contains(&budget), "reduced default budget forwarded: {budget}");
        }
        // HEAD through both protocols (over h2c to the app for h2 callers).
        let head = send(Method::HEAD, "/status/200", &[], empty()).await;
        assert_eq!(head.status, 200, "{name}");
        assert!(head.body.is_empty());
        for code in [201u16, 204, 301, 400, 404, 418, 500, 503] {
            let resp = send(Method::GET, &format!("/status/{code}"), &[], empty()).await;
            assert_eq!(resp.status, code, "{name}");
            assert!(resp.header("x-weir-shed").is_none(), "the app's own 503 is not a refusal");
            resp.level();
        }
        let versions: Vec<_> = app.seen().iter().map(|s| s.version).collect();
        let expected = if h1 { http::Version::HTTP_11 } else { http::Version::HTTP_2 };
        assert_eq!(versions.last(), Some(&expected), "{name}: h2 callers reach the app over h2c");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_megabyte_bodies_stream_both_ways() {
    let app = Backend::start().await;
    let weir = support::sidecar(app.addr, |_| {});
    let base = format!("http://{}", weir.inbound_addr());
    const MB: usize = 1024 * 1024;
    for h1 in [true, false] {
        // Upload 8 MiB in 128 chunks (chunked on HTTP/1.1), echoed back.
        let resp = if h1 {
            Http1::new()
                .send(Method::POST, &format!("{base}/echo"), &[], chunked_body(128, 64 * 1024))
                .await
        } else {
            H2::new()
                .send(Method::POST, &format!("{base}/echo"), &[], chunked_body(128, 64 * 1024))
                .await
        }
        .unwrap();
        assert_eq!(resp.status, 200);
        assert_eq!(resp.body.len(), 8 * MB);
        assert!(resp
            .body
            .chunks(64 * 1024)
            .enumerate()
            .all(|(i, c)| c.iter().all(|&b| b == (i % 13) as u8)));
        resp.level();

        // Download 6 MiB + a tail, streamed without content-length.
        let n = 6 * MB + 123;
        let url = format!("{base}/bytes/{n}");
        let resp =
            if h1 { Http1::new().get(&url, &[]).await } else { H2::new().get(&url, &[]).await };
        assert_eq!(resp.status, 200);
        assert_eq!(resp.body.len(), n);
        assert!(resp
            .body
            .chunks(64 * 1024)
            .enumerate()
            .all(|(i, c)| c.iter().all(|&b| b == pattern(i))));
        if h1 {
            assert_eq!(resp.header("transfer-encoding"), Some("chunked"));
        }
        resp.level();
    }
    // A fixed-length upload keeps its exact bytes.
    let body = Bytes::from((0..3 * MB).map(|i| (i % 241) as u8).collect::<Vec<_>>());
    let resp = Http1::new()
        .send(Method::PUT, &format!("{base}/echo"), &[], bytes_body(body.clone()))
        .await
        .unwrap();
    assert_eq!(resp.body, body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_trailers_pass_through() {
    let app = Backend::start().await;
    let weir = support::sidecar(app.addr, |_| {});
    let resp = H2::new().get(&format!("http://{}/trailers", weir.inbound_addr()), &[]).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body, "with trailers");
    let trailers = resp.trailers.as_ref().expect("trailers arrive");
    assert_eq!(trailers["x-checksum"], "done");
    resp.level();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weirs_own_errors_carry_the_level_too() {
    // Nothing listens at the app address: weir answers 502 itself. The port stays bound (and
    // not listening) for the whole test, so no other test of this process can take it.
    let unused = tokio::net::TcpSocket::new_v4().unwrap();
    unused.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let weir = support::sidecar(unused.local_addr().unwrap(), |_| {});
    let url = format!("http://{}/", weir.inbound_addr());
    let resp = Http1::new().get(&url, &[]).await;
    assert_eq!(resp.status, 502);
    assert_eq!(resp.level(), "255.127");
    // ... and says it made it, and why (an app's own 502 carries no x-weir-error).
    assert_eq!(resp.header("x-weir-error"), Some("app-unreachable"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weirs_own_gateway_errors_say_why() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    // An app that accepts and never answers: 504 when the budget runs out.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let weir = support::sidecar(silent_addr, |_| {});
    let url = format!("http://{}/", weir.inbound_addr());
    let resp = Http1::new().get(&url, &[("x-request-timeout-ms", "200")]).await;
    assert_eq!(resp.status, 504);
    assert_eq!(resp.header("x-weir-error"), Some("app-timeout"));

    // An app that answers garbage: 502, the exchange failed (the app was reached).
    let garbage = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let garbage_addr = garbage.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = garbage.accept().await {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(b"\x16\x03\x01 this is not HTTP\r\n\r\n").await;
        }
    });
    let weir = support::sidecar(garbage_addr, |_| {});
    let resp = Http1::new().get(&format!("http://{}/", weir.inbound_addr()), &[]).await;
    assert_eq!(resp.status, 502);
    assert_eq!(resp.header("x-weir-error"), Some("app-failed"));

    // The app's own 502 passes through without the header.
    let app = Backend::start().await;
    let weir = support::sidecar(app.addr, |_| {});
    let resp = Http1::new().get(&format!("http://{}/status/502", weir.inbound_addr()), &[]).await;
    assert_eq!(resp.status, 502);
    assert_eq!(resp.header("x-weir-error"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_priority_headers_fall_back_to_the_default_and_are_served() {
    let app = Backend::start().await;
    let weir = support::sidecar(app.addr, |_| {});
    let url = format!("http://{}/echo", weir.inbound_addr());
    let before = support::metrics_text(weir.admin_addr()).await;
    let client = Http1::new();
    for (b, u) in [("abc", "1"), ("-3", "1"), ("999", "1"), ("4", "500"), ("", "")] {
        let resp = client.get(&url, &[("x-business-priority", b), ("x-user-priority", u)]).await;
        assert_eq!(resp.status, 200, "served despite {b:?}/{u:?}");
        resp.level();
    }
    let after = support::metrics_text(weir.admin_addr()).await;
    let delta = |reason: &str| {
        let series = format!("weir_priority_header_invalid_total{{reason=\"{reason}\"}}");
        support::sample(&after, &series) - support::sample(&before, &series)
    };
    // The recorder is process-wide, so other tests may add to these; at least ours counted.
    assert!(delta("not_numeric") >= 1.0);
    assert!(delta("negative") >= 1.0);
    assert!(delta("out_of_range") >= 2.0);
    assert!(delta("empty") >= 1.0);
    // Default: the table's least important business (200 in the built-in table).
    // Outcomes are recorded in the logging phase, just after each response went out.
    let counted = || {
        let audit = weir.shared().audit.snapshot();
        audit.classes[200].admitted >= 4 && audit.classes[4].admitted >= 1
    };
    let within = std::time::Duration::from_secs(10);
    assert!(support::eventually(within, counted).await, "fell back to class 200; class 4 kept");
}
