//! The admin API over real HTTP: auth, limits, content types, validation, If-Match.

mod common;

use admission_core::table::RequestView;
use std::sync::Arc;

use bytes::Bytes;
use common::{send, start, table_yaml, TOKEN};
use http::{Method, StatusCode};

struct Req(&'static str);

impl RequestView for Req {
    fn method(&self) -> &str {
        "GET"
    }
    fn path(&self) -> &str {
        self.0
    }
    fn host(&self) -> Option<&str> {
        None
    }
    fn header(&self, _: &str) -> Option<&[u8]> {
        None
    }
}

#[tokio::test]
async fn get_table_in_yaml_and_json_with_etag() {
    let s = start().await;
    let yaml = s.get("/v1/priority-table").await;
    assert_eq!(yaml.status, StatusCode::OK);
    assert_eq!(yaml.headers["etag"], "\"1\"");
    assert_eq!(yaml.headers["content-type"], "application/yaml");
    assert!(yaml.body.contains("rekey_every: 1h"), "{}", yaml.body);

    let json =
        s.send(Method::GET, "/v1/priority-table", &[("accept", "application/json")], "").await;
    assert_eq!(json.headers["content-type"], "application/json");
    assert_eq!(json.json()["version"], 1);
    assert_eq!(json.json()["rules"][0]["name"], "login");

    let same = s.send(Method::GET, "/v1/priority-table", &[("if-none-match", "\"1\"")], "").await;
    assert_eq!(same.status, StatusCode::NOT_MODIFIED);
    s.stop().await;
}

#[tokio::test]
async fn put_replaces_bumps_version_and_serves_new_table() {
    let s = start().await;
    let r = s.put_table(&table_yaml(7), "\"1\"").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.headers["etag"], "\"2\"");
    assert_eq!(r.json()["version"], 2);
    let (version, table) = s.current_table().await;
    assert_eq!((version, table.default_business), (2, 7));
    assert_eq!(s.store.load().classify(&Req("/a")).business, 7);

    // JSON body too; the `version` in the body is ignored, the server assigns it.
    let json = r#"{"version": 99, "default_business": 9, "rules": []}"#;
    let auth = format!("Bearer {TOKEN}");
    let headers = [
        ("authorization", auth.as_str()),
        ("content-type", "application/json; charset=utf-8"),
        ("if-match", "\"2\""),
    ];
    let r = s.send(Method::PUT, "/v1/priority-table", &headers, json).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(s.current_table().await.0, 3);
    s.stop().await;
}

#[tokio::test]
async fn auth_limits_and_content_types_get_the_right_status_and_message() {
    let s = start().await;
    let body = table_yaml(5);
    let put = |headers: Vec<(&'static str, String)>, body: String| {
        let url = s.url("/v1/priority-table");
        async move {
            let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            send(&url, Method::PUT, &h, Bytes::from(body)).await
        }
    };
    let good = format!("Bearer {TOKEN}");
    let yaml = ("content-type", "application/yaml".to_string());
    let etag = ("if-match", "\"1\"".to_string());

    let r = put(vec![yaml.clone(), etag.clone()], body.clone()).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.headers["www-authenticate"], "Bearer");
    assert!(r.json()["error"].as_str().unwrap().contains("Authorization"), "{}", r.body);

    let r =
        put(vec![("authorization", "Basic abc".into()), yaml.clone(), etag.clone()], body.clone())
            .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);

    let r = put(
        vec![("authorization", "Bearer nope".into()), yaml.clone(), etag.clone()],
        body.clone(),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.json()["error"], "wrong token");

    let r = put(
        vec![("authorization", good.clone()), ("content-type", "text/plain".into()), etag.clone()],
        body.clone(),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(r.body.contains("text/plain"), "{}", r.body);

    let r = put(vec![("authorization", good.clone()), etag.clone()], body.clone()).await;
    assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);

    let r = put(vec![("authorization", good.clone()), yaml.clone()], body.clone()).await;
    assert_eq!(r.status, StatusCode::PRECONDITION_REQUIRED);
    assert!(r.body.contains("If-Match"), "{}", r.body);

    let r = put(
        vec![("authorization", good.clone()), yaml.clone(), ("if-match", "yesterday".into())],
        body.clone(),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);

    // Over the 1 MiB limit: refused from Content-Length before reading...
    let huge = format!("# {}\n{body}", "x".repeat(2 << 20));
    let r =
        put(vec![("authorization", good.clone()), yaml.clone(), etag.clone()], huge.clone()).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(r.body.contains("1048576"), "{}", r.body);
    // ...and while reading a chunked body that declares no length.
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Chunked>();
    let req = http::Request::put(s.url("/v1/priority-table"))
        .header("authorization", &good)
        .header("content-type", "application/yaml")
        .header("if-match", "\"1\"")
        .body(Chunked(huge.as_bytes().chunks(64 * 1024).map(Bytes::copy_from_slice).collect()))
        .unwrap();
    let status = client.request(req).await.map(|r| r.status());
    // The server may answer 413 and close before the client finishes sending.
    assert!(matches!(status, Ok(StatusCode::PAYLOAD_TOO_LARGE) | Err(_)), "{status:?}");

    let r = put(
        vec![("authorization", good.clone()), yaml.clone(), etag.clone()],
        "rules: [ { name: x".into(),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["error"], "malformed request body");
    assert!(
        r.json()["fields"][0]["message"].as_str().unwrap().starts_with("malformed YAML"),
        "{}",
        r.body
    );

    let r = put(
        vec![
            ("authorization", good.clone()),
            ("content-type", "application/json".into()),
            etag.clone(),
        ],
        "{\"rules\": [}".into(),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(
        r.json()["fields"][0]["message"].as_str().unwrap().starts_with("malformed JSON"),
        "{}",
        r.body
    );

    // After all that, the process still serves and the table is untouched.
    assert_eq!(s.get("/live").await.status, StatusCode::OK);
    assert_eq!(s.current_table().await.0, 1);
    s.stop().await;
}

/// A body without a declared length: sent chunked.
struct Chunked(std::collections::VecDeque<Bytes>);

impl hyper::body::Body for Chunked {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.0.pop_front().map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

#[tokio::test]
async fn invalid_tables_of_each_kind_get_400_with_the_field_and_the_old_table_keeps_serving() {
    let s = start().await;
    assert_eq!(s.put_table(&table_yaml(7), "\"1\"").await.status, StatusCode::OK);
    let cases: &[(&str, &str)] = &[
        ("default_business: 256\n", "default_business"),
        ("rules:\n  - { name: a, match: { path: /a }, business: -3 }\n", "rules[0].business"),
        ("rules:\n  - { name: a, match: { path: /a }, business: 1 }\n  - { name: a, match: { path: /b }, business: 2 }\n", "rules[1].name"),
        ("rules:\n  - { name: '', match: { path: /a }, business: 1 }\n", "rules[0].name"),
        ("rules:\n  - { name: a, match: {}, business: 1 }\n", "rules[0].match"),
        ("rules:\n  - { name: a, business: 1 }\n", "rules[0].match"),
        ("rules:\n  - { name: a, match: { path_prefix: /api }, business: 1 }\n  - { name: b, match: { path: /api/x }, business: 2 }\n", "rules[1].match"),
        ("rules:\n  - { name: a, match: { path: api }, business: 1 }\n", "rules[0].match.path"),
        ("rules:\n  - { name: a, match: { path: /a, path_prefix: /a }, business: 1 }\n", "rules[0].match.path_prefix"),
        ("rules:\n  - { name: a, match: { method: 'GE T' }, business: 1 }\n", "rules[0].match.method"),
        ("rules:\n  - { name: a, match: { header: { 'x y': z } }, business: 1 }\n", "rules[0].match.header.x y"),
        ("rules:\n  - { name: a, match: { host: 'a b' }, business: 1 }\n", "rules[0].match.host"),
        ("rules:\n  - { name: a, match: { pth: /a }, business: 1 }\n", "rules[0].match.pth"),
        ("user: { header: '' }\n", "user.header"),
        ("user: { rekey_every: 0s }\n", "user.rekey_every"),
        ("user: { rekey_every: forever }\n", "user.rekey_every"),
        ("user: { cycle_periods: 0 }\n", "user.cycle_periods"),
        ("user: { cycle_periods: 1025 }\n", "user.cycle_periods"),
        ("user: { schedule: sometimes }\n", "user.schedule"),
        ("size_grade: { min_bytes: 3 }\n", "size_grade.min_bytes"),
        ("bogus: 1\n", "bogus"),
    ];
    for (yaml, path) in cases {
        let r = s.put_table(yaml, "\"2\"").await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{yaml}: {}", r.body);
        let fields = r.json()["fields"].as_array().unwrap().clone();
        assert!(
            fields.iter().any(|f| f["path"] == *path),
            "{yaml}: expected an error at `{path}`, got {}",
            r.body
        );
        // The old table keeps serving, over the API and on the request path.
        let (version, table) = s.current_table().await;
        assert_eq!((version, table.default_business), (2, 7), "after {yaml}");
        assert_eq!(s.store.load().classify(&Req("/a")).business, 7);
    }
    // Several problems at once: all of them in one answer.
    let r = s.put_table("default_business: 300\nuser: { header: '' }\nrules:\n  - { name: a, match: {}, business: 1 }\n", "\"2\"").await;
    assert_eq!(r.json()["fields"].as_array().unwrap().len(), 3, "{}", r.body);
    assert_eq!(r.json()["error"], "invalid priority table (3 errors)");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_puts_with_the_same_if_match_have_exactly_one_winner() {
    let s = Arc::new(start().await);
    for round in 0..20u64 {
        let version = 1 + round;
        let tag = format!("\"{version}\"");
        let (ten, twenty) = (table_yaml(10), table_yaml(20));
        let (a, b) = tokio::join!(s.put_table(&ten, &tag), s.put_table(&twenty, &tag));
        let mut statuses = [a.status, b.status];
        statuses.sort();
        assert_eq!(statuses, [StatusCode::OK, StatusCode::PRECONDITION_FAILED], "round {round}");
        let loser = if a.status == StatusCode::OK { &b } else { &a };
        let winner_business = if a.status == StatusCode::OK { 10 } else { 20 };
        assert_eq!(loser.headers["etag"], format!("\"{}\"", version + 1));
        // Nothing lost: the winner's table is what serves, at the next version.
        let (current, table) = s.current_table().await;
        assert_eq!((current, table.default_business), (version + 1, winner_business));
    }
    Arc::into_inner(s).unwrap().stop().await;
}

#[tokio::test]
async fn validate_is_a_dry_run() {
    let s = start().await;
    let yaml = [("content-type", "application/yaml")];
    let r = s.send(Method::POST, "/v1/priority-table/validate", &yaml, &table_yaml(9)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.json()["least_important_business"], 9);
    let r =
        s.send(Method::POST, "/v1/priority-table/validate", &yaml, "default_business: 999\n").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["fields"][0]["path"], "default_business");
    assert_eq!(s.current_table().await.0, 1, "validate changes nothing");
    s.stop().await;
}

#[tokio::test]
async fn status_probes_and_unknown_routes() {
    let s = start().await;
    let r = s.get("/v1/status").await;
    assert_eq!(r.status, StatusCode::OK);
    let status = r.json();
    assert_eq!(status["level"], "255.127");
    assert_eq!(status["level_compound"], 32767);
    assert_eq!(status["mode"], "enforce");
    assert_eq!(status["inflight"], 3);
    assert_eq!(status["table_version"], 1);

    assert_eq!(s.get("/live").await.status, StatusCode::OK);
    assert_eq!(s.get("/ready").await.status, StatusCode::OK);
    s.view.status.lock().unwrap().draining = true;
    assert_eq!(s.get("/ready").await.status, StatusCode::SERVICE_UNAVAILABLE);

    assert_eq!(s.get("/nope").await.status, StatusCode::NOT_FOUND);
    let r = s.send(Method::DELETE, "/v1/priority-table", &[], "").await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.headers["allow"], "GET, PUT");
    s.stop().await;
}

#[tokio::test]
async fn public_listener_serves_only_metrics_and_probes() {
    let s = start().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(s.plane.clone().serve_public(listener, async move {
        let _ = stopped.await;
    }));
    let get = |path: &'static str| async move {
        send(&format!("http://{addr}{path}"), Method::GET, &[], Bytes::new()).await
    };
    assert_eq!(get("/metrics").await.status, StatusCode::OK);
    assert_eq!(get("/live").await.status, StatusCode::OK);
    assert_eq!(get("/ready").await.status, StatusCode::OK);
    assert_eq!(get("/v1/status").await.status, StatusCode::NOT_FOUND);
    assert_eq!(get("/v1/priority-table").await.status, StatusCode::NOT_FOUND);
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
    s.stop().await;
}

#[tokio::test]
async fn without_a_token_file_mutations_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = common::start_with(control_api::AdminConfig::default(), dir).await;
    let r = s.put_table(&table_yaml(1), "\"1\"").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(r.body.contains("token_file"), "{}", r.body);
    s.stop().await;
}
