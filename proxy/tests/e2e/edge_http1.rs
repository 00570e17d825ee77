//! HTTP/1.x protocol edges through the real sidecar: each case is a misbehaving (or merely
//! unusual) caller, and where it could hold something, a well-behaved caller that must be
//! served normally at the same time. Timeouts are configured short (`SHORT`) and asserted
//! with a generous `MARGIN`. See `support/misbehaving.rs` for `WEIR_EDGE_DISARM` (every guard
//! huge: the guard tests must then fail).

use crate::support;

use std::time::{Duration, Instant};

use support::backend::Backend;
use support::client::Http1;
use support::eventually;
use support::misbehaving::{
    edge_sidecar, guard, served_within, RawConn, RawResponse, MARGIN, SHORT,
};

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_18_byte_http10_request_without_host_is_answered_promptly() {
    // HAProxy's default health check: shorter than the h2c preface (24 bytes), no Host.
    let app = Backend::start().await;
    // A long header-read timeout: the answer must not wait for it. Answered within half of
    // it, whatever the machine's load; one that waited for the timeout (the bytes are too
    // few for protocol detection) would take all of it.
    const HEADER_READ: Duration = Duration::from_secs(30);
    let weir = edge_sidecar(app.addr, |c| c.inbound.timeouts.header_read = HEADER_READ);
    let mut raw = RawConn::connect(weir.inbound_addr()).await;
    let request = b"GET / HTTP/1.0\r\n\r\n";
    assert_eq!(request.len(), 18);
    let started = Instant::now();
    raw.send(request).await;
    let resp = raw.response(HEADER_READ / 2).await.expect("answered before the header timeout");
    eprintln!("an 18-byte HTTP/1.0 request answered in {:?}", started.elapsed());
    resp.level();
    match resp.status {
        // Forwarded: the app got a Host header.
        200 => {
            let seen = app.seen_path("/");
            assert_eq!(seen.len(), 1);
            assert!(seen[0].headers.get("host").is_some(), "host added: {:?}", seen[0].headers);
        }
        400 => assert_eq!(app.arrivals(), 0, "refused, not forwarded"),
        other => panic!("expected 200 or 400, got {other}: {resp:?}"),
    }
    // HTTP/1.0 without keep-alive: the connection ends after the response.
    raw.closed_within(MARGIN).await.expect("closed after an HTTP/1.0 response");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_length_5_comma_5_collapses_to_one_value() {
    let app = Backend::start().await;
    let weir = edge_sidecar(app.addr, |_| {});
    let mut raw = RawConn::connect(weir.inbound_addr()).await;
    raw.send(b"POST /cl HTTP/1.1\r\nHost: edge\r\nContent-Length: 5,5\r\n\r\nhello").await;
    let resp = raw.response(MARGIN).await.expect("answered");
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.body, b"hello");
    resp.level();
    let seen = app.seen_path("/cl");
    assert_eq!(seen.len(), 1);
    let values: Vec<_> = seen[0].headers.get_all("content-length").iter().collect();
    assert_eq!(values, ["5"], "one content-length value reached the app");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weirs_own_400_and_405_carry_the_admission_level() {
    let app = Backend::start().await;
    let weir = edge_sidecar(app.addr, |_| {});
    // A header line without a colon.
    let mut raw = RawConn::connect(weir.inbound_addr()).await;
    raw.send(b"GET /bad HTTP/1.1\r\nHost: edge\r\nno colon here\r\n\r\n").await;
    let resp = raw.response(MARGIN).await.expect("answered");
    assert_eq!(resp.status, 400, "{resp:?}");
    resp.level();

    // CONNECT is not proxied to the app.
    let mut raw = RawConn::connect(weir.inbound_addr()).await;
    raw.send(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n").await;
    let resp = raw.response(MARGIN).await.expect("answered");
    assert!(matches!(resp.status, 400 | 405), "{resp:?}");
    resp.level();
    assert_eq!(app.arrivals(), 0, "neither reached the app");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_served_in_order_or_the_connection_is_closed() {
    let app = Backend::start().await;
    let weir = edge_sidecar(app.addr, |_| {});
    let mut raw = RawConn::connect(weir.inbound_addr()).await;
    // Three requests in one write.
    let mut batch = Vec::new();
    for code in [201, 202, 203] {
        batch.extend_from_slice(
            format!("GET /status/{code} HTTP/1.1\r\nHost: edge\r\n\r\n").as_bytes(),
        );
    }
    raw.send(&batch).await;
    let mut answered: Vec<RawResponse> = Vec::new();
    for expected in [201, 202, 203] {
        let resp = raw.response(MARGIN).await.unwrap_or_else(|e| {
            panic!("response {expected} neither came nor was refused by a close: {e}; before: {answered:?}")
        });
        assert_eq!(resp.status, expected, "in order");
        resp.level();
        let closes = resp.closes();
        answered.push(resp);
        if closes {
            break;
        }
    }
    if answered.len() < 3 {
        raw.closed_within(MARGIN).await.expect("`Connection: close` and then closed");
    }
    assert!(!answered.is_empty());
    assert_eq!(app.arrivals(), answered.len() as u64, "nothing forwarded without an answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_1xx_204_304_keep_http1_framing() {
    let app = Backend::start().await;
    let weir = edge_sidecar(app.addr, |_| {});
    // One keep-alive connection: a body where none belongs would break the next response.
    let mut raw = RawConn::connect(weir.inbound_addr()).await;
    raw.send(b"HEAD /bytes/1000 HTTP/1.1\r\nHost: edge\r\n\r\n").await;
    let head = raw.head_response(MARGIN).await.expect("HEAD answered");
    assert_eq!(head.status, 200, "{head:?}");
    head.level();

    for code in [204, 304] {
        raw.send(format!("GET /status/{code} HTTP/1.1\r\nHost: edge\r\n\r\n").as_bytes()).await;
        let resp = raw.response(MARGIN).await.expect("answered");
        assert_eq!(resp.status, code, "{resp:?}");
        resp.level();
    }

    // 100-continue: the interim response comes before the body is sent.
    raw.send(
        b"POST /echo HTTP/1.1\r\nHost: edge\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n",
    )
    .await;
    let interim = raw.response(MARGIN).await.expect("100 Continue before the body");
    assert_eq!(interim.status, 100, "{interim:?}");
    raw.send(b"hello").await;
    let resp = raw.response(MARGIN).await.expect("final response");
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.body, b"hello");
    resp.level();

    // Framing intact after all of them.
    raw.send(b"GET /status/200 HTTP/1.1\r\nHost: edge\r\n\r\n").await;
    let last = raw.response(MARGIN).await.expect("answered");
    assert_eq!((last.status, last.body.as_slice()), (200, &b"status"[..]), "{last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_never_read_lose_their_slots_within_the_write_timeout() {
    const BODY: usize = 32 << 20;
    const NEVER_READERS: usize = 8;
    let app = Backend::start().await;
    let weir = edge_sidecar(app.addr, |c| {
        c.inbound.max_inflight = NEVER_READERS;
        c.inbound.timeouts.write = guard(SHORT);
    });
    // Each asks for 32 MiB (more than any socket buffers hold) and never reads a byte.
    let mut never_readers = Vec::new();
    for i in 0..NEVER_READERS {
        let mut raw = RawConn::connect_small_receive_buffer(weir.inbound_addr(), 4096).await;
        raw.send(format!("GET /bytes/{BODY}?i={i} HTTP/1.1\r\nHost: edge\r\n\r\n").as_bytes())
            .await;
        never_readers.push(raw);
    }
    assert!(
        eventually(WAIT, || app.seen().len() == NEVER_READERS).await,
        "all reached the app, holding every slot"
    );
    let stalled_at = Instant::now();
    // Another caller is served once the stalled writes give their slots up.
    served_within(weir.inbound_addr(), SHORT + MARGIN).await;
    assert!(
        eventually(SHORT + MARGIN, || weir.status().inflight == 0 && weir.shared().active() == 0)
            .await,
        "slots freed: inflight {} active {}",
        weir.status().inflight,
        weir.shared().active()
    );
    // The stalled responses were cut: each connection ends well short of the full body.
    // (The slots came back sooner, once each caller kept the app waiting for the app's
    // typical time; the responses end at the write timeout, which must pass before the
    // reads below, or they would be progress.)
    // On a busy machine the writes may stall a while after the app saw the requests.
    tokio::time::sleep((SHORT + MARGIN).saturating_sub(stalled_at.elapsed())).await;
    for (i, raw) in never_readers.iter_mut().enumerate() {
        let left =
            raw.closed_within(MARGIN).await.unwrap_or_else(|e| panic!("never-reader {i}: {e}"));
        assert!(left < BODY, "never-reader {i} got the whole body ({left} bytes)");
    }
    eprintln!("stalled writes cut and slots freed {:?} after the stall", stalled_at.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_that_never_ends_is_bounded_by_body_read() {
    // Whatever ends the stuck request must be `body_read`, not the request's budget: that
    // is a minute here, and the request must end within a third of it (the body-read
    // timeout is 400 ms; the margin is for a busy machine).
    const BUDGET: Duration = Duration::from_secs(60);
    let app = Backend::start().await;
    let weir = edge_sidecar(app.addr, |c| {
        c.inbound.max_inflight = 1;
        c.inbound.timeouts.body_read = guard(SHORT);
        c.inbound.task_timeout = BUDGET;
    });
    let mut raw = RawConn::connect(weir.inbound_addr()).await;
    let started = Instant::now();
    raw.send(
        b"POST /never-ends HTTP/1.1\r\nHost: edge\r\nContent-Length: 1000000\r\n\r\n0123456789",
    )
    .await;
    // A body of declared length takes no slot until it has arrived (all of it, or its
    // first 64 KiB): the only slot serves others while this body is awaited.
    served_within(weir.inbound_addr(), BUDGET / 3).await;
    // The stuck caller's request ends: whatever it was answered, its connection closes.
    let left = (BUDGET / 3).saturating_sub(started.elapsed());
    raw.closed_within(left).await.expect("the never-ending request was ended by body_read");
    eprintln!("the never-ending request ended {:?} after it started", started.elapsed());
    assert!(
        eventually(MARGIN, || weir.status().inflight == 0 && weir.shared().active() == 0).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_idle_connections_are_closed_while_others_are_served() {
    const IDLE: usize = 1000;
    let app = Backend::start().await;
    let weir = edge_sidecar(app.addr, |c| {
        c.inbound.timeouts.header_read = guard(Duration::from_millis(500));
        c.inbound.timeouts.idle = guard(Duration::from_millis(500));
    });
    let started = Instant::now();
    let mut idle = Vec::with_capacity(IDLE);
    for _ in 0..IDLE {
        idle.push(RawConn::connect(weir.inbound_addr()).await);
    }
    let connected = started.elapsed();
    // A keep-alive caller that goes quiet after one request is idle too.
    let mut quiet = RawConn::connect(weir.inbound_addr()).await;
    quiet.send(b"GET /status/200 HTTP/1.1\r\nHost: edge\r\n\r\n").await;
    assert_eq!(quiet.response(MARGIN).await.expect("answered").status, 200);

    served_within(weir.inbound_addr(), MARGIN).await;

    // All of them are closed by weir, none sent a byte.
    let waits: Vec<_> = idle
        .into_iter()
        .map(|mut raw| tokio::spawn(async move { raw.closed_within(connected + MARGIN * 3).await }))
        .collect();
    let mut open = 0;
    for w in waits {
        if w.await.unwrap().is_err() {
            open += 1;
        }
    }
    assert_eq!(open, 0, "{open} of {IDLE} idle connections still open");
    quiet.closed_within(MARGIN).await.expect("the quiet keep-alive connection was closed");
    // And the sidecar still serves.
    served_within(weir.inbound_addr(), MARGIN).await;
    assert_eq!(app.arrivals(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_leaving_while_queued_with_an_unread_body_never_reaches_the_app() {
    let app = Backend::start().await;
    let weir = edge_sidecar(app.addr, |c| c.inbound.max_inflight = 1);
    let base = format!("http://{}", weir.inbound_addr());
    let holder = tokio::spawn({
        let url = format!("{base}/hold");
        async move { Http1::new().get(&url, &[]).await }
    });
    assert!(eventually(WAIT, || app.seen_path("/hold").len() == 1).await);

    // A complete request with a 64 KiB body weir has not read yet: it waits in the queue.
    let mut raw = RawConn::connect(weir.inbound_addr()).await;
    let mut request =
        b"POST /gone-body HTTP/1.1\r\nHost: edge\r\nContent-Length: 65536\r\n\r\n".to_vec();
    request.extend(std::iter::repeat_n(b'x', 65536));
    raw.send(&request).await;
    assert!(eventually(WAIT, || weir.status().queue_depth == 1).await, "queued");
    drop(raw);
    assert!(
        eventually(MARGIN, || weir.status().queue_depth == 0).await,
        "the caller was seen leaving although its body was unread"
    );

    app.release(1);
    assert_eq!(holder.await.unwrap().status, 200);
    served_within(weir.inbound_addr(), MARGIN).await;
    assert!(app.seen_path("/gone-body").is_empty(), "the departed request never reached the app");
    assert!(eventually(WAIT, || weir.status().inflight == 0).await);
}
