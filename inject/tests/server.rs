//! The webhook server end to end: real TLS (a CA and certificate generated here with rcgen;
//! `scripts/test-chart` repeats the round trip with the certificate the chart generates),
//! a verifying HTTPS client over HTTP/1.1 and HTTP/2, certificate rotation without restart,
//! hostile and broken reviews, and 1000 reviews from 32 concurrent clients.

mod support;

use std::time::{Duration, Instant};

use base64::Engine as _;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weir_inject::metrics::Refused;
use weir_inject::patch::Outcome;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reviews_over_verified_tls_with_http1_and_http2() {
    let pki = Pki::new("weir test ca");
    let secret = SecretDir::new(&pki);
    let server = start(&secret, test_limits(), Duration::from_secs(60)).await;
    for h2 in [false, true] {
        let mut client = Client::connect(server.addr, &pki.ca_pem, h2).await.expect("verified TLS");
        // The API server appends its timeout to the webhook's path.
        let path = "/inject/namespace?timeout=5s";
        let reply = client.request("POST", path, fixture("namespace__deployment-pod")).await;
        assert_eq!(reply.status, 200, "h2={h2}: {}", reply.text);
        let response = &reply.body["response"];
        assert_eq!(response["uid"], "2f1c8e0a-5b7d-4c39-8e61-0a9d4b3c7f12");
        assert_eq!(response["allowed"], true);
        assert_eq!(response["patchType"], "JSONPatch");
        let patch = base64::engine::general_purpose::STANDARD
            .decode(response["patch"].as_str().unwrap())
            .unwrap();
        let ops: serde_json::Value = serde_json::from_slice(&patch).unwrap();
        assert_eq!(ops[0]["path"], "/spec/initContainers");
        assert_eq!(ops[0]["value"][0]["name"], "weir-proxy");
        // The same pod through the other webhook (namespace not labelled): not opted in.
        let reply =
            client.request("POST", "/inject/pod", fixture("namespace__deployment-pod")).await;
        assert_eq!(reply.status, 200);
        assert!(reply.body["response"].get("patch").is_none());
        assert_eq!(client.request("GET", "/live", vec![]).await.status, 200);
        assert_eq!(client.request("GET", "/ready", vec![]).await.status, 200);
    }
    let mut client = Client::connect(server.addr, &pki.ca_pem, false).await.unwrap();
    // Draining (SIGTERM): not ready any more, but reviews are still answered.
    server.begin_drain();
    assert_eq!(client.request("GET", "/ready", vec![]).await.status, 503);
    assert_eq!(client.request("GET", "/live", vec![]).await.status, 200);
    let reply = client.request("POST", "/inject/pod", fixture("pod__bare-pod")).await;
    assert_eq!(reply.body["response"]["patchType"], "JSONPatch");
    let metrics = client.request("GET", "/metrics", vec![]).await.text;
    assert!(metrics.contains("weir_inject_reviews_total{outcome=\"injected\"} 3"), "{metrics}");
    assert!(metrics.contains("weir_inject_reviews_total{outcome=\"not_opted_in\"} 2"), "{metrics}");
    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_trust_the_ca_is_refused() {
    let pki = Pki::new("weir test ca");
    let other = Pki::new("someone else's ca");
    let secret = SecretDir::new(&pki);
    let server = start(&secret, test_limits(), Duration::from_secs(60)).await;
    let Err(err) = tls_connect(server.addr, &other.ca_pem, &[b"http/1.1"]).await else {
        panic!("a certificate from an untrusted CA was accepted");
    };
    assert!(err.to_string().to_lowercase().contains("certificate"), "{err}");
    // And the server still serves a client that does.
    let mut client = Client::connect(server.addr, &pki.ca_pem, false).await.unwrap();
    assert_eq!(client.request("GET", "/live", vec![]).await.status, 200);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_rotation_without_restart() {
    let first = Pki::new("first ca");
    let second = Pki::new("second ca");
    let mut secret = SecretDir::new(&first);
    let server = start(&secret, test_limits(), Duration::from_millis(100)).await;
    let mut before = Client::connect(server.addr, &first.ca_pem, false).await.expect("first cert");
    assert_eq!(before.request("GET", "/live", vec![]).await.status, 200);

    // The kubelet swaps the Secret's ..data symlink.
    secret.rotate(&second.cert_pem, &second.key_pem);
    let addr = server.addr;
    let rotated = eventually(Duration::from_secs(10), || {
        let ca = second.ca_pem.clone();
        async move { tls_connect(addr, &ca, &[b"http/1.1"]).await.is_ok() }
    })
    .await;
    assert!(rotated, "the new certificate was not served within 10 s");
    assert!(
        tls_connect(addr, &first.ca_pem, &[b"http/1.1"]).await.is_err(),
        "old certificate still served"
    );
    // A connection made before the rotation keeps working.
    assert_eq!(before.request("GET", "/live", vec![]).await.status, 200);
    assert_eq!(server.metrics.tls_reloads().0, 1, "one new pair served");
    let errors_before = server.metrics.tls_reloads().1;

    // A broken pair (key of another certificate) is refused; the current one keeps serving.
    let third = Pki::new("third ca");
    secret.rotate(&third.cert_pem, &second.key_pem);
    let metrics = server.metrics.clone();
    let refused = eventually(Duration::from_secs(10), || {
        let m = metrics.clone();
        async move { m.tls_reloads().1 > errors_before }
    })
    .await;
    assert!(refused, "the mismatched pair was not noticed");
    let mut client =
        Client::connect(addr, &second.ca_pem, true).await.expect("second cert still serves");
    let reply =
        client.request("POST", "/inject/namespace", fixture("namespace__deployment-pod")).await;
    assert_eq!(reply.status, 200);
    server.shutdown().await.unwrap();
}

/// Sends raw bytes over verified TLS; returns the status line's code (0 when the server
/// closed without an answer) and the rest of the answer.
async fn raw(
    addr: std::net::SocketAddr,
    ca: &str,
    bytes: &[u8],
    close_write: bool,
) -> (u16, String) {
    let mut tls = tls_connect(addr, ca, &[b"http/1.1"]).await.expect("tls");
    tls.write_all(bytes).await.expect("write");
    tls.flush().await.expect("flush");
    if close_write {
        let _ = tls.shutdown().await;
    }
    // Read until the answer is complete (head + content-length) or the server closes.
    let mut out = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match tls.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
            let text = String::from_utf8_lossy(&out);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().to_string())
                    })
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0);
                if body.len() >= len {
                    return;
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read).await.expect("answer or close within 5 s");
    let text = String::from_utf8_lossy(&out).to_string();
    let code = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, text)
}

type BadCase<'a> = (&'a str, &'a str, &'a str, Vec<u8>, u16, &'a str);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_and_hostile_reviews_get_clear_errors() {
    let pki = Pki::new("weir test ca");
    let secret = SecretDir::new(&pki);
    let limits = test_limits();
    let max = limits.max_body_bytes;
    let server = start(&secret, limits, Duration::from_secs(60)).await;
    let addr = server.addr;
    let valid = fixture("namespace__deployment-pod");

    // (name, method, path, body, expected status, text the error must contain)
    let cases: Vec<BadCase<'_>> = vec![
        ("malformed", "POST", "/inject/namespace", b"{\"apiVersion\": admission".to_vec(), 400, "not a JSON AdmissionReview"),
        ("truncated", "POST", "/inject/namespace", valid[..valid.len() / 2].to_vec(), 400, "EOF while parsing"),
        ("empty", "POST", "/inject/namespace", Vec::new(), 400, "not a JSON AdmissionReview"),
        ("not an object", "POST", "/inject/namespace", b"[1,2,3]".to_vec(), 400, "not a JSON AdmissionReview"),
        (
            "v1beta1",
            "POST",
            "/inject/namespace",
            String::from_utf8(valid.clone()).unwrap().replace("admission.k8s.io/v1", "admission.k8s.io/v1beta1").into_bytes(),
            422,
            "admission.k8s.io/v1",
        ),
        ("no request", "POST", "/inject/pod", br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(), 400, "no request"),
        (
            "no uid",
            "POST",
            "/inject/pod",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":""}}"#.to_vec(),
            400,
            "empty uid",
        ),
        ("wrong method", "GET", "/inject/pod", Vec::new(), 405, "POST"),
        ("unknown path", "POST", "/mutate", valid.clone(), 404, "no such endpoint"),
    ];
    for (name, method, path, body, status, needle) in cases {
        // A fresh connection each: the server may close one whose body it did not read.
        let mut client = Client::connect(addr, &pki.ca_pem, false).await.unwrap();
        let reply = client.request(method, path, body).await;
        assert_eq!(reply.status, status, "{name}: {}", reply.text);
        let error = reply.body["error"].as_str().unwrap_or_default();
        assert!(error.contains(needle), "{name}: error {error:?} lacks {needle:?}");
    }

    // A usable review of something else than a pod CREATE is allowed, with a warning.
    let update = String::from_utf8(valid.clone()).unwrap().replace("\"CREATE\"", "\"UPDATE\"");
    let mut client = Client::connect(addr, &pki.ca_pem, false).await.unwrap();
    let reply = client.request("POST", "/inject/namespace", update.into_bytes()).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body["response"]["allowed"], true);
    assert!(reply.body["response"]["warnings"][0].as_str().unwrap().contains("not CREATE"));

    // Raw edges: a chunked body over the limit, a wrong content type, a body that stops
    // (the client half-closes), a body that never ends, a request head that never comes.
    let mut chunked = format!(
        "POST /inject/pod HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n",
        max + 10
    )
    .into_bytes();
    chunked.extend(vec![b' '; max + 10]);
    chunked.extend(b"\r\n0\r\n\r\n");
    let (code, text) = raw(addr, &pki.ca_pem, &chunked, false).await;
    assert_eq!(code, 413, "{text}");

    // Oversized by its declared length: refused from the head, before a body byte is read.
    // (Sent raw: a client still writing the body would see its write fail when the server
    // answers early and closes, and report that instead of the 413.)
    let oversized = format!(
        "POST /inject/pod HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        max + 1
    );
    let (code, text) = raw(addr, &pki.ca_pem, oversized.as_bytes(), false).await;
    assert_eq!(code, 413, "{text}");
    assert!(text.contains("exceeds the limit"), "{text}");

    let (code, text) = raw(
        addr,
        &pki.ca_pem,
        b"POST /inject/pod HTTP/1.1\r\nhost: x\r\ncontent-type: text/yaml\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
        false,
    )
    .await;
    assert_eq!(code, 415, "{text}");

    let head = format!("POST /inject/pod HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", valid.len());
    let mut cut = head.clone().into_bytes();
    cut.extend(&valid[..100]);
    let (code, text) = raw(addr, &pki.ca_pem, &cut, true).await;
    assert!(code == 400 || code == 0, "a body cut short: {code} {text}");

    let started = Instant::now();
    let mut stalled = head.into_bytes();
    stalled.extend(&valid[..100]);
    let (code, text) = raw(addr, &pki.ca_pem, &stalled, false).await;
    assert_eq!(code, 408, "{text}");
    assert!(text.contains("not received within"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "body timeout took {:?}",
        started.elapsed()
    );

    let started = Instant::now();
    let (code, _) = raw(addr, &pki.ca_pem, b"", false).await;
    assert_eq!(code, 0, "a silent connection is closed");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "header timeout took {:?}",
        started.elapsed()
    );

    // A TCP connection that never starts TLS is closed too (handshake timeout 2 s).
    let started = Instant::now();
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(6), tcp.read(&mut buf))
        .await
        .expect("closed in time");
    assert!(matches!(read, Ok(0) | Err(_)));
    assert!(started.elapsed() < Duration::from_secs(5));

    // Nothing above hurt the server.
    let mut client = Client::connect(addr, &pki.ca_pem, true).await.unwrap();
    let reply = client.request("POST", "/inject/namespace", valid).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body["response"]["patchType"], "JSONPatch");
    assert!(server.metrics.reviews(Outcome::BadReview) >= 12, "{}", server.metrics.render());
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_reviews_from_32_clients() {
    const CLIENTS: usize = 32;
    const REVIEWS: usize = 1000;
    let pki = Pki::new("weir test ca");
    let secret = SecretDir::new(&pki);
    let server = start(&secret, test_limits(), Duration::from_secs(60)).await;
    let body = fixture("namespace__init-and-several-containers");
    let mut tasks = Vec::new();
    let cpu_before = process_cpu();
    let started = Instant::now();
    for c in 0..CLIENTS {
        let (addr, ca, body) = (server.addr, pki.ca_pem.clone(), body.clone());
        let share = REVIEWS / CLIENTS + usize::from(c < REVIEWS % CLIENTS);
        tasks.push(tokio::spawn(async move {
            // Half the clients speak HTTP/2, as the API server does by default.
            let mut client = Client::connect(addr, &ca, c % 2 == 0).await.expect("connect");
            let mut latencies = Vec::with_capacity(share);
            for _ in 0..share {
                let t = Instant::now();
                let reply = client.request("POST", "/inject/namespace", body.clone()).await;
                latencies.push(t.elapsed());
                assert_eq!(reply.status, 200);
                assert_eq!(reply.body["response"]["patchType"], "JSONPatch");
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("client task"));
    }
    let wall = started.elapsed();
    let cpu = process_cpu().saturating_sub(cpu_before);
    // The handler alone (decode, plan, encode), without HTTP and TLS.
    let template = template();
    let exclusions = weir_inject::patch::Exclusions::defaults(Some("weir-system"));
    let t = Instant::now();
    for _ in 0..REVIEWS {
        let reply = weir_inject::review::review(
            &body,
            weir_inject::patch::Scope::Namespace,
            &template,
            &exclusions,
        );
        assert!(reply.is_ok());
    }
    let handler = t.elapsed() / REVIEWS as u32;
    all.sort();
    assert_eq!(all.len(), REVIEWS);
    let q = |p: f64| all[((all.len() as f64 * p).ceil() as usize).saturating_sub(1)];
    let (p50, p99, max) = (q(0.50), q(0.99), all[all.len() - 1]);
    eprintln!(
        "inject load: {REVIEWS} reviews, {CLIENTS} clients, {:.0} reviews/s, p50 {p50:?} p99 {p99:?} max {max:?}; \
         process CPU (server + clients) {:?}/review, handler alone {handler:?}/review ({} build)",
        REVIEWS as f64 / wall.as_secs_f64(),
        cpu / REVIEWS as u32,
        if cfg!(debug_assertions) { "debug" } else { "release" }
    );
    assert_eq!(server.metrics.reviews(Outcome::Injected), REVIEWS as u64);
    // The target is p99 < 10 ms, measured in release (inject/README.md has the figures and
    // the command). On a shared 2-core machine a closed loop of 32 clients measures the
    // scheduler as much as the injector, so the test asserts only what a regression would
    // break by a wide margin: the latency and the CPU spent per review.
    let (latency_bound, cpu_bound) = if cfg!(debug_assertions) {
        (Duration::from_secs(1), Duration::from_millis(3))
    } else {
        (Duration::from_millis(200), Duration::from_micros(500))
    };
    assert!(p99 < latency_bound, "p99 {p99:?} >= {latency_bound:?}");
    let per_review = cpu / REVIEWS as u32;
    assert!(per_review < cpu_bound, "CPU per review {per_review:?} >= {cpu_bound:?}");
    server.shutdown().await.unwrap();
}

/// User + system CPU time of this process (Linux /proc; zero elsewhere).
fn process_cpu() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return Duration::ZERO };
    // Fields after the command name (which may hold spaces): utime is the 12th, stime the 13th.
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12].iter().filter_map(|i| fields.get(*i)?.parse::<u64>().ok()).sum();
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_limit_are_closed_at_once() {
    let pki = Pki::new("weir test ca");
    let secret = SecretDir::new(&pki);
    let limits = weir_inject::server::Limits {
        max_connections: 2,
        header_read_timeout: Duration::from_secs(5),
        ..test_limits()
    };
    let server = start(&secret, limits, Duration::from_secs(60)).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut c =
            Client::connect(server.addr, &pki.ca_pem, true).await.expect("within the limit");
        assert_eq!(c.request("GET", "/live", vec![]).await.status, 200);
        held.push(c);
    }
    // The third is accepted by the kernel and closed by the server before any TLS.
    let refused = tls_connect(server.addr, &pki.ca_pem, &[b"h2"]).await;
    assert!(refused.is_err(), "a third connection got through");
    let metrics = server.metrics.render();
    assert!(
        metrics.contains("weir_inject_connections_refused_total{reason=\"max_connections\"} 1"),
        "{metrics}"
    );
    // Once one is gone, a new one is served.
    drop(held.pop());
    let addr = server.addr;
    let ca = pki.ca_pem.clone();
    let served = eventually(Duration::from_secs(10), || {
        let ca = ca.clone();
        async move {
            match Client::connect(addr, &ca, true).await {
                Ok(mut c) => c.request("GET", "/live", vec![]).await.status == 200,
                Err(_) => false,
            }
        }
    })
    .await;
    assert!(served, "no connection served after one closed");
    server.shutdown().await.unwrap();
}

/// Sorted latencies' `q`-quantile, in ms.
fn quantile_ms(sorted: &[Duration], q: f64) -> f64 {
    sorted[((sorted.len() as f64 * q).ceil() as usize).saturating_sub(1)].as_secs_f64() * 1e3
}

/// The well-behaved API server: `n` reviews, each on a fresh verified TLS connection (the
/// case a full server breaks), alternating HTTP/1.1 and HTTP/2. Returns the sorted latencies
/// (connect + handshake + review), or the first failure.
async fn fresh_reviews(
    addr: std::net::SocketAddr,
    ca: &str,
    n: usize,
) -> Result<Vec<Duration>, String> {
    let mut took = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        let mut client = Client::connect(addr, ca, i % 2 == 0)
            .await
            .map_err(|e| format!("review {i}: connection refused or closed: {e}"))?;
        let reply =
            client.request("POST", "/inject/namespace", fixture("namespace__deployment-pod")).await;
        if reply.status != 200 || reply.body["response"]["patchType"] != "JSONPatch" {
            return Err(format!("review {i}: {} {}", reply.status, reply.text));
        }
        took.push(t.elapsed());
    }
    took.sort();
    Ok(took)
}

/// `n` TCP connections to `addr` that never send a byte, spread over the loopback source
/// addresses `127.0.0.<first>..`, `per_host` from each.
async fn idle_connections(
    addr: std::net::SocketAddr,
    n: usize,
    first: u8,
    per_host: usize,
) -> Vec<tokio::net::TcpStream> {
    let mut held = Vec::with_capacity(n);
    for i in 0..n {
        let source = std::net::Ipv4Addr::new(127, 0, 0, first + (i / per_host) as u8);
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind((source, 0).into()).unwrap();
        // The kernel completes the connection; the server may close it at once.
        if let Ok(stream) = socket.connect(addr).await {
            held.push(stream);
        }
    }
    held
}

/// Of `held`, how many the server has closed (end of stream or reset) by now.
async fn closed_by_server(held: &mut [tokio::net::TcpStream]) -> usize {
    let mut closed = 0;
    for s in held.iter_mut() {
        let mut b = [0u8; 1];
        match tokio::time::timeout(Duration::from_millis(1), s.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => closed += 1,
            _ => {}
        }
    }
    closed
}

/// 1,100 idle TCP connections from one host, with the shipped limits (1,024 connections, 64
/// per peer, 2 s handshake): the host gets 64 of them, the rest are closed on accept, and
/// every review from the API server (another address) on a fresh connection is served
/// meanwhile. Before: the host took all 1,024 slots and every review failed for the 10 s
/// handshake timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_from_one_host_never_block_reviews() {
    let pki = Pki::new("weir test ca");
    let secret = SecretDir::new(&pki);
    let limits = weir_inject::server::Limits::default();
    let server = start(&secret, limits.clone(), Duration::from_secs(60)).await;
    let unattacked = fresh_reviews(server.addr, &pki.ca_pem, 40).await.expect("unattacked");

    let started = Instant::now();
    let mut held = idle_connections(server.addr, 1_100, 2, 1_100).await;
    let attacked = fresh_reviews(server.addr, &pki.ca_pem, 40).await;
    let during = started.elapsed();
    let refused = server.metrics.connections_refused(Refused::PerPeer);
    // The 64 it kept are closed by the handshake timeout.
    let give_up = Instant::now() + limits.handshake_timeout + Duration::from_secs(3);
    let mut all_closed = false;
    while !all_closed && Instant::now() < give_up {
        all_closed = closed_by_server(&mut held).await == held.len();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let closed_after = started.elapsed();
    let attacked =
        attacked.expect("the API server is served while one host holds idle connections");
    eprintln!(
        "idle connections, one host: fresh-connection reviews unattacked p50 {:.1} p99 {:.1} ms, \
         attacked p50 {:.1} p99 {:.1} ms (40 reviews in {during:?}); {refused} of 1100 closed \
         on accept; all closed after {closed_after:?}; load {}",
        quantile_ms(&unattacked, 0.5),
        quantile_ms(&unattacked, 0.99),
        quantile_ms(&attacked, 0.5),
        quantile_ms(&attacked, 0.99),
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
    );
    let cap = limits.max_connections_per_peer as u64;
    assert!(refused >= 1_100 - cap - 10, "only {refused} closed on accept");
    assert!(all_closed, "idle connections still open after {closed_after:?}");
    // A wide margin for a busy 2-core machine (the target is unattacked p99 + 10 ms).
    let (before, after) = (quantile_ms(&unattacked, 0.99), quantile_ms(&attacked, 0.99));
    assert!(after < before + 250.0, "fresh-connection p99 {before:.1} -> {after:.1} ms");
    server.shutdown().await.unwrap();
}

/// 1,100 idle connections from 20 hosts (55 each, under the per-peer limit) do fill every
/// slot: then it is the handshake timeout (2 s, was 10 s) that bounds how long the API
/// server is locked out, under its own 5 s wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_from_many_hosts_lock_reviews_out_for_the_handshake_timeout_only() {
    let pki = Pki::new("weir test ca");
    let secret = SecretDir::new(&pki);
    let limits = weir_inject::server::Limits::default();
    let server = start(&secret, limits.clone(), Duration::from_secs(60)).await;
    let started = Instant::now();
    let _held = idle_connections(server.addr, 1_100, 10, 55).await;
    let (addr, ca) = (server.addr, pki.ca_pem.clone());
    let served = eventually(Duration::from_secs(15), || {
        let ca = ca.clone();
        async move { fresh_reviews(addr, &ca, 1).await.is_ok() }
    })
    .await;
    let locked_out = started.elapsed();
    eprintln!(
        "idle connections, 20 hosts: reviews served again after {locked_out:?} (handshake \
         timeout {:?}); {} closed on accept; load {}",
        limits.handshake_timeout,
        server.metrics.connections_refused(Refused::MaxConnections),
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
    );
    assert!(served, "never served");
    // Within the API server's own wait for a review (timeoutSeconds, 5 s in the chart): a
    // review sent as the flood starts could still succeed on its retry.
    assert!(locked_out < Duration::from_secs(5), "locked out for {locked_out:?}");
    server.shutdown().await.unwrap();
}

/// A pod in a labelled namespace that opts out with anything but the documented values is
/// not injected, and the review says why; the API server's other reviews are injected at the
/// same time. Before: `False`, `0`, `no`, `off` were ignored and the pod injected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_opt_out_in_any_spelling_is_honoured_with_a_warning() {
    let pki = Pki::new("weir test ca");
    let secret = SecretDir::new(&pki);
    let server = start(&secret, test_limits(), Duration::from_secs(60)).await;
    let mut pod: serde_json::Value =
        serde_json::from_slice(&fixture("namespace__deployment-pod")).unwrap();
    let well_behaved = {
        let (addr, ca) = (server.addr, pki.ca_pem.clone());
        tokio::spawn(async move { fresh_reviews(addr, &ca, 20).await })
    };
    let mut client = Client::connect(server.addr, &pki.ca_pem, true).await.unwrap();
    for value in ["False", "FALSE", "0", "no", "off", "No", "nope", " false "] {
        pod["request"]["object"]["metadata"]["annotations"] =
            serde_json::json!({ "weir.dev/inject": value });
        let body = serde_json::to_vec(&pod).unwrap();
        let reply = client.request("POST", "/inject/namespace", body).await;
        assert_eq!(reply.status, 200, "{value:?}: {}", reply.text);
        let response = &reply.body["response"];
        assert_eq!(response["allowed"], true);
        assert!(response.get("patch").is_none(), "{value:?} injected: {}", reply.text);
        let warned = value.trim() != "false";
        assert_eq!(response.get("warnings").is_some(), warned, "{value:?}: {}", reply.text);
    }
    let served = well_behaved.await.unwrap().expect("the well-behaved reviews");
    eprintln!(
        "opt-out spellings: well-behaved fresh-connection reviews p50 {:.1} p99 {:.1} ms meanwhile",
        quantile_ms(&served, 0.5),
        quantile_ms(&served, 0.99)
    );
    assert_eq!(server.metrics.reviews(Outcome::OptedOut), 8);
    server.shutdown().await.unwrap();
}
