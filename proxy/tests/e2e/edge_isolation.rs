//! One misbehaving peer must not cost anyone else: callers that never read a large response
//! from an h2c app (whose connections to the app are shared), h2 peers that never answer
//! the shutdown PING, and an app that closes pooled keep-alive connections as requests go
//! out. Each runs next to a well-behaved caller, whose latency is compared with its
//! unattacked latency (the figures are printed; the assertions keep generous margins for a
//! busy 2-core machine). See `support/misbehaving.rs` for `WEIR_EDGE_DISARM`.

use crate::support;

use std::time::{Duration, Instant};

use support::backend::Backend;
use support::misbehaving::{
    edge_sidecar, fds_and_rss, guard, h2_connect, h2_get, probe_series, unattacked_series,
    ClosingKeepAliveApp, Latencies, RawConn, SilentH2Peer, MARGIN,
};
use weir_proxy::config::AppProtocol;

/// Probes per series.
const PROBES: usize = 60;
/// A probe slower than this failed: far above any unattacked probe, far below the 4 s a
/// stalled shared connection costs.
const PROBE_BOUND: Duration = Duration::from_millis(1500);

/// The response the stalled callers ask for and never read.
const LARGE: usize = 20_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_never_read_do_not_stall_the_shared_h2c_connections() {
    // A write timeout long enough that, were the shared connections stalled, every probe
    // would wait it out; short enough to watch the stalled callers end.
    const WRITE: Duration = Duration::from_secs(4);
    let app = Backend::start().await;
    let weir = edge_sidecar(app.addr, |c| {
        c.inbound.app_protocol = AppProtocol::H2c;
        c.inbound.timeouts.write = WRITE;
        // The shipped default: the in-flight limit follows the app, a handful of slots for
        // this one, which stalled callers held until `timeouts.write` (isolating the h2c
        // windows alone did not help then).
        c.inbound.adaptive_inflight = true;
    });
    let addr = weir.inbound_addr();
    let unattacked = unattacked_series(addr, PROBES, PROBE_BOUND).await;

    // Four HTTP/1.1 callers that never read a 20 MB response, and one h2 caller whose
    // four streams have a zero window (INITIAL_WINDOW_SIZE=0).
    let before = app.arrivals();
    let started = Instant::now();
    let mut readers = RawConn::never_reading(addr, 4, &format!("/bytes/{LARGE}"), "edge").await;
    let h2 = h2_connect(addr, |b| {
        b.initial_window_size(0);
    })
    .await;
    let mut zero_window = Vec::new();
    for i in 0..4 {
        let mut send = h2.clone().ready().await.expect("stream capacity");
        let path = format!("/bytes/{LARGE}?zero-window={i}");
        let (response, _) = send.send_request(h2_get(addr, &path), true).unwrap();
        zero_window.push(tokio::spawn(async move {
            let Ok(response) = response.await else { return Err("no head") };
            let mut body = response.into_body();
            let mut got = 0usize;
            while let Some(chunk) = body.data().await {
                got += chunk.map_err(|_| "reset")?.len();
            }
            Ok(got)
        }));
    }
    assert!(
        support::eventually(MARGIN, || app.arrivals() >= before + 8).await,
        "the eight large requests reached the app"
    );
    // Long enough for the unread responses to fill whatever window they can.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let attacked = probe_series(addr, PROBES, PROBE_BOUND).await;
    Latencies::report("h2c app, 8 unread 20 MB responses", &unattacked, &attacked);
    let probed_in = started.elapsed();
    assert!(
        probed_in < WRITE,
        "the probes ran while the callers were stalled ({probed_in:?} >= {WRITE:?})"
    );

    // The stalled callers end within timeouts.write of their last progress.
    for (i, stream) in zero_window.into_iter().enumerate() {
        let left = (WRITE + MARGIN).saturating_sub(started.elapsed());
        let ended = tokio::time::timeout(left, stream)
            .await
            .unwrap_or_else(|_| {
                panic!("zero-window stream {i} still open at {:?}", started.elapsed())
            })
            .unwrap();
        assert!(ended.is_err(), "zero-window stream {i} cannot complete: {ended:?}");
    }
    tokio::time::sleep((WRITE + Duration::from_millis(1500)).saturating_sub(started.elapsed()))
        .await;
    for (i, raw) in readers.iter_mut().enumerate() {
        let read = raw.closed_within(MARGIN).await.unwrap_or_else(|e| panic!("reader {i}: {e}"));
        assert!(read < LARGE, "reader {i}: the unread response was abandoned ({read} bytes)");
    }
    eprintln!("stalled callers ended {:?} after they started", started.elapsed());
    assert!(
        support::eventually(MARGIN, || weir.status().inflight == 0).await,
        "slots freed: inflight {}",
        weir.status().inflight
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_peers_that_never_acknowledge_the_shutdown_ping_are_closed() {
    const PEERS: usize = 20;
    const IDLE: Duration = Duration::from_millis(300);
    let graceful_close = guard(Duration::from_secs(1));
    let app = Backend::start().await;
    let weir = edge_sidecar(app.addr, |c| {
        // The silent peers, and room for the well-behaved caller's connections (weir may
        // still be closing the previous probe's as the next one connects).
        c.inbound.max_connections = PEERS + 4;
        c.inbound.timeouts.idle = IDLE;
        c.inbound.timeouts.graceful_close = graceful_close;
    });
    let addr = weir.inbound_addr();
    let unattacked = unattacked_series(addr, PROBES, PROBE_BOUND).await;
    let (fds_before, rss_before) = fds_and_rss();

    let started = Instant::now();
    let mut peers = Vec::with_capacity(PEERS);
    for _ in 0..PEERS {
        peers.push(SilentH2Peer::connect(addr).await);
    }
    let (fds_during, rss_during) = fds_and_rss();
    let attacked = probe_series(addr, PROBES, PROBE_BOUND).await;
    Latencies::report("20 h2 peers that never ack the shutdown PING", &unattacked, &attacked);

    // Each is asked to close when idle (GOAWAY + PING) and dropped `graceful_close` later.
    let by = started + IDLE + graceful_close + MARGIN;
    for (i, peer) in peers.iter_mut().enumerate() {
        let frames = peer.closed_by(by).await.unwrap_or_else(|e| {
            panic!("silent peer {i} still open {:?} after it connected: {e}", started.elapsed())
        });
        assert!(frames.contains(&7), "peer {i} was sent a GOAWAY first: {frames:?}");
    }
    let closed_after = started.elapsed();
    drop(peers);
    // With every silent peer gone, all of max_connections is free again.
    let mut again = Vec::new();
    for _ in 0..PEERS {
        again.push(SilentH2Peer::connect(addr).await);
    }
    let (fds_after, rss_after) = fds_and_rss();
    eprintln!(
        "silent h2 peers closed {closed_after:?} after they connected (idle {IDLE:?} + \
         graceful_close {graceful_close:?}); this process: fds {fds_before} -> {fds_during} \
         during -> {fds_after} after a second wave, RSS {:.1} -> {:.1} -> {:.1} MB",
        rss_before as f64 / 1e6,
        rss_during as f64 / 1e6,
        rss_after as f64 / 1e6
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_request_lost_on_a_reused_app_connection_is_sent_again() {
    let app = ClosingKeepAliveApp::start().await;
    let weir = edge_sidecar(app.addr, |_| {});
    let base = format!("http://{}", weir.inbound_addr());
    let client = support::client::Http1::new();
    let get = || async {
        let started = Instant::now();
        let resp = tokio::time::timeout(MARGIN, client.get(&format!("{base}/x"), &[]))
            .await
            .expect("answered in time");
        (resp, started.elapsed())
    };
    // Every request after the first goes out on the connection the previous one left in the
    // pool, which the app closes as the request arrives.
    let (first, _) = get().await;
    assert_eq!(first.status, 200);
    let mut latencies = Latencies::default();
    for i in 0..20 {
        let (resp, took) = get().await;
        assert_eq!(resp.status, 200, "GET {i} on a connection the app closed: {resp:?}");
        assert_eq!(resp.header("x-app"), Some("closing"));
        resp.level();
        latencies.0.push(took);
    }
    let dropped = app.dropped.load(std::sync::atomic::Ordering::Relaxed);
    assert!(dropped >= 20, "the app closed the reused connections under 20 requests: {dropped}");
    eprintln!(
        "[app closing reused connections] 20 GETs, each lost once and sent again on a fresh \
         connection: p50 {:.2} ms p99 {:.2} ms",
        latencies.quantile(0.5).as_secs_f64() * 1e3,
        latencies.quantile(0.99).as_secs_f64() * 1e3
    );

    // A POST is not repeated: the app may have acted on it.
    let resp = client
        .send(
            http::Method::POST,
            &format!("{base}/x"),
            &[],
            support::client::bytes_body("not idempotent"),
        )
        .await
        .expect("answered");
    assert_eq!(resp.status, 502, "a lost POST is the app's failure, not retried: {resp:?}");
}
