//! HTTP/2 (h2c) protocol edges through the real sidecar: a caller that never opens its flow
//! control window, one connection opening 2,000 streams, and HEAD / 1xx / 204 / 304. Each
//! misbehaving caller runs next to a well-behaved one that must be served normally. See
//! `support/misbehaving.rs` for `WEIR_EDGE_DISARM`.

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::backend::Backend;
use support::client::{bytes_body, H2};
use support::eventually;
use support::misbehaving::{
    edge_sidecar, guard, guard_count, h2_connect, h2_get, served_within, MARGIN, SHORT,
};

const WAIT: Duration = Duration::from_secs(10);

/// How an h2 stream of a misbehaving caller ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// Response complete.
    Complete(u16),
    /// Reset or failed (by weir, or the connection went away).
    Reset,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_window_h2_caller_does_not_hold_in_flight_slots() {
    const STREAMS: usize = 64;
    let app = Backend::start().await;
    let weir = edge_sidecar(app.addr, |c| {
        c.inbound.max_inflight = STREAMS;
        c.inbound.timeouts.write = guard(SHORT);
    });
    let addr = weir.inbound_addr();
    // INITIAL_WINDOW_SIZE=0: weir may send response headers but not one byte of body.
    let h2 = h2_connect(addr, |b| {
        b.initial_window_size(0);
    })
    .await;
    let started = Instant::now();
    let mut streams = Vec::new();
    for i in 0..STREAMS {
        let mut send = h2.clone().ready().await.expect("stream capacity");
        let (response, _) =
            send.send_request(h2_get(addr, &format!("/bytes/16384?i={i}")), true).unwrap();
        streams.push(tokio::spawn(async move {
            let Ok(response) = response.await else { return Ended::Reset };
            let status = response.status().as_u16();
            let mut body = response.into_body();
            loop {
                match body.data().await {
                    Some(Ok(_)) => {}
                    Some(Err(_)) => return Ended::Reset,
                    None => return Ended::Complete(status),
                }
            }
        }));
    }
    assert!(
        eventually(WAIT, || app.arrivals() == STREAMS as u64).await,
        "all {STREAMS} reached the app"
    );
    // Another caller gets an answer although every slot was taken by a stalled stream.
    let probe = served_within(addr, SHORT + MARGIN).await;
    // The stalled streams are ended within the write timeout, and their slots are free.
    for (i, stream) in streams.into_iter().enumerate() {
        let left = (SHORT + MARGIN * 2).saturating_sub(started.elapsed());
        let ended = tokio::time::timeout(left, stream)
            .await
            .unwrap_or_else(|_| {
                panic!("zero-window stream {i} still open after {:?}", started.elapsed())
            })
            .unwrap();
        assert_eq!(ended, Ended::Reset, "stream {i} cannot complete with a zero window");
    }
    assert!(
        eventually(MARGIN, || weir.status().inflight == 0 && weir.shared().active() == 0).await,
        "slots freed: inflight {} active {}",
        weir.status().inflight,
        weir.shared().active()
    );
    eprintln!(
        "probe answered in {probe:?}; stalled streams ended {:?} after start",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_opening_2000_streams_is_capped_and_others_are_served() {
    const STREAMS: usize = 2000;
    const MAX_STREAMS: u32 = 100;
    const PER_CONNECTION: usize = 16;
    let app = Backend::start().await;
    app.set_service_time(Duration::from_millis(100));
    let weir = edge_sidecar(app.addr, |c| {
        c.inbound.max_inflight = 4;
        c.inbound.max_queued = 1024;
        c.inbound.h2.max_concurrent_streams = guard_count(MAX_STREAMS as usize) as u32;
        c.inbound.max_queued_per_connection = guard_count(PER_CONNECTION);
    });
    let addr = weir.inbound_addr();
    let h2 = h2_connect(addr, |_| {}).await;
    let h2 = h2.ready().await.expect("connection ready");

    // Watch how much of weir the hostile connection gets while it runs.
    let peak_queue = Arc::new(AtomicUsize::new(0));
    let peak_active = Arc::new(AtomicUsize::new(0));
    let shared = weir.shared().clone();
    let watcher = tokio::spawn({
        let (peak_queue, peak_active) = (peak_queue.clone(), peak_active.clone());
        async move {
            loop {
                peak_queue.fetch_max(shared.limit.queued(), Relaxed);
                peak_active.fetch_max(shared.active(), Relaxed);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    });

    let started = Instant::now();
    let mut streams = Vec::with_capacity(STREAMS);
    let opener = tokio::spawn({
        let h2 = h2.clone();
        async move {
            for i in 0..STREAMS {
                let Ok(mut send) = h2.clone().ready().await else { break };
                let Ok((response, _)) =
                    send.send_request(h2_get(addr, &format!("/slow?i={i}")), true)
                else {
                    break;
                };
                streams.push(tokio::spawn(async move {
                    match response.await {
                        Ok(r) => {
                            let status = r.status().as_u16();
                            let mut body = r.into_body();
                            while let Some(chunk) = body.data().await {
                                if chunk.is_err() {
                                    return Ended::Reset;
                                }
                            }
                            Ended::Complete(status)
                        }
                        Err(_) => Ended::Reset,
                    }
                }));
            }
            streams
        }
    });
    // Once the hostile connection has filled its share of the queue, another caller comes.
    assert!(
        eventually(WAIT, || weir.status().queue_depth as usize >= PER_CONNECTION).await,
        "the hostile connection queued requests"
    );
    served_within(addr, MARGIN).await;

    let streams = tokio::time::timeout(Duration::from_secs(60), opener)
        .await
        .expect("all 2,000 streams opened within 60 s")
        .unwrap();
    assert_eq!(streams.len(), STREAMS, "every stream was opened");
    let (mut ok, mut refused, mut reset) = (0, 0, 0);
    for s in streams {
        match tokio::time::timeout(Duration::from_secs(60), s).await.expect("stream ended").unwrap()
        {
            Ended::Complete(200) => ok += 1,
            Ended::Complete(503) => refused += 1,
            Ended::Complete(other) => panic!("unexpected status {other}"),
            Ended::Reset => reset += 1,
        }
    }
    // Read once every stream has ended: the client has certainly processed weir's SETTINGS
    // by then (before that, h2 reports an unlimited stream count).
    let advertised = h2.current_max_send_streams();
    watcher.abort();
    let (peak_queue, peak_active) = (peak_queue.load(Relaxed), peak_active.load(Relaxed));
    eprintln!(
        "{STREAMS} streams in {:?}: {ok} served, {refused} refused, {reset} reset; \
         advertised max streams {advertised}, peak queue {peak_queue}, peak active {peak_active}",
        started.elapsed()
    );
    assert!(advertised <= MAX_STREAMS as usize, "max_concurrent_streams advertised: {advertised}");
    // One connection's share of the queue, plus the well-behaved caller.
    assert!(peak_queue <= PER_CONNECTION + 1, "peak queue {peak_queue}");
    assert!(peak_active <= MAX_STREAMS as usize + 1, "peak active {peak_active}");
    assert!(ok >= 1 && refused + reset >= 1, "some served, the excess refused: {ok} / {refused}");
    assert!(eventually(WAIT, || weir.shared().active() == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_100_continue_204_304_through_h2c() {
    let app = Backend::start().await;
    let weir = edge_sidecar(app.addr, |_| {});
    let base = format!("http://{}", weir.inbound_addr());
    let h2 = H2::new();

    let head = h2
        .send(http::Method::HEAD, &format!("{base}/bytes/1000"), &[], support::client::empty())
        .await
        .expect("HEAD over h2c answered");
    assert_eq!(head.status, 200, "{head:?}");
    assert!(head.body.is_empty());
    head.level();

    for code in [204, 304] {
        let resp = h2.get(&format!("{base}/status/{code}"), &[]).await;
        assert_eq!(resp.status, code, "{resp:?}");
        assert!(resp.body.is_empty());
        resp.level();
    }

    let resp = h2
        .send(
            http::Method::POST,
            &format!("{base}/echo"),
            &[("expect", "100-continue")],
            bytes_body("hello"),
        )
        .await
        .expect("100-continue over h2c answered");
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(&resp.body[..], b"hello");
    resp.level();

    // The app saw each request once, with its method.
    let seen = app.seen();
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert_eq!(seen[0].method, http::Method::HEAD);
}
