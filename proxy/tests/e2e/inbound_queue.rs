//! The pending queue in front of the app: bounded, FIFO, left by callers who hang up, and
//! guarded at dequeue by the queue policy's deadline check. Also the entry role's header stamping.
//! The deadline rules themselves (a burst past its deadlines, a spent budget) are tested
//! in-process on a paused clock: proxy/src/service/tests.rs.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use support::backend::Backend;
use support::client::{Http1, H2};
use support::eventually;

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_refuses_at_once_and_queued_requests_are_served() {
    let app = Backend::start().await;
    let weir = support::sidecar(app.addr, |c| {
        c.inbound.max_inflight = 1;
        c.inbound.max_queued = 2;
        c.inbound.task_timeout = Duration::from_secs(10);
    });
    let base = format!("http://{}", weir.inbound_addr());
    let client = Http1::new();
    let holder = tokio::spawn({
        let (c, url) = (client.clone(), format!("{base}/hold"));
        async move { c.get(&url, &[]).await }
    });
    assert!(eventually(WAIT, || app.seen_path("/hold").len() == 1).await);
    let queued: Vec<_> = (0..2)
        .map(|i| {
            let (c, url) = (client.clone(), format!("{base}/echo?q={i}"));
            tokio::spawn(async move { c.get(&url, &[]).await })
        })
        .collect();
    assert!(eventually(WAIT, || weir.status().queue_depth == 2).await, "two wait");

    let refused = client.get(&format!("{base}/echo?q=overflow"), &[]).await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.header("x-weir-shed"), Some("overload"));
    assert_eq!(refused.header("retry-after"), Some("1"));
    refused.level();

    app.release(1);
    assert_eq!(holder.await.unwrap().status, 200);
    for q in queued {
        let resp = q.await.unwrap();
        assert_eq!(resp.status, 200);
        resp.level();
    }
    assert_eq!(weir.status().queue_depth, 0);
    // Outcomes are recorded in the logging phase, just after the response went out.
    let counted = || {
        let audit = weir.shared().audit.snapshot();
        audit.classes[200].shed_overload == 1 && audit.classes[200].admitted == 3
    };
    assert!(eventually(WAIT, counted).await, "1 refused, 3 admitted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_who_hang_up_while_queued_never_reach_the_app() {
    let app = Backend::start().await;
    let weir = support::sidecar(app.addr, |c| {
        c.inbound.max_inflight = 1;
        c.inbound.task_timeout = Duration::from_secs(10);
    });
    let base = format!("http://{}", weir.inbound_addr());
    let holder = tokio::spawn({
        let url = format!("{base}/hold");
        async move { Http1::new().get(&url, &[]).await }
    });
    assert!(eventually(WAIT, || app.seen_path("/hold").len() == 1).await);

    // HTTP/1.1: a raw connection sends a complete request, waits in the queue, hangs up.
    let mut raw = TcpStream::connect(weir.inbound_addr()).unwrap();
    raw.write_all(b"GET /gone-h1 HTTP/1.1\r\nhost: weir\r\n\r\n").unwrap();
    assert!(eventually(WAIT, || weir.status().queue_depth == 1).await);
    drop(raw);
    assert!(eventually(WAIT, || weir.status().queue_depth == 0).await, "h1 caller left the queue");

    // h2: the client drops the request (RST_STREAM) while it is queued.
    let h2 = H2::new();
    let pending = tokio::spawn({
        let (c, url) = (h2.clone(), format!("{base}/gone-h2"));
        async move { c.get(&url, &[]).await }
    });
    assert!(eventually(WAIT, || weir.status().queue_depth == 1).await);
    pending.abort();
    assert!(eventually(WAIT, || weir.status().queue_depth == 0).await, "h2 caller left the queue");

    app.release(1);
    assert_eq!(holder.await.unwrap().status, 200);
    // The slot is free again and the next request is served...
    let after = Http1::new().get(&format!("{base}/after"), &[]).await;
    assert_eq!(after.status, 200);
    // ...and neither departed request ever reached the app.
    assert!(app.seen_path("/gone-h1").is_empty());
    assert!(app.seen_path("/gone-h2").is_empty());
    assert!(eventually(WAIT, || weir.status().inflight == 0).await, "slots released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entry_role_replaces_client_priority_headers() {
    let app = Backend::start().await;
    let weir = support::sidecar(app.addr, |c| {
        c.inbound.entry = true;
        c.admin.allow_empty_user_secret = true;
    });
    let base = format!("http://{}", weir.inbound_addr());
    let client = Http1::new();
    let claims = [("x-business-priority", "0"), ("x-user-priority", "0"), ("x-user-id", "alice")];

    let resp = client.get(&format!("{base}/api/anything"), &claims).await;
    assert_eq!(resp.status, 200);
    let seen = app.seen().pop().unwrap();
    assert_eq!(seen.headers.get_all("x-business-priority").iter().count(), 1);
    assert_eq!(seen.headers["x-business-priority"], "200", "the table's default, not the claim");
    let user: u8 = seen.headers["x-user-priority"].to_str().unwrap().parse().unwrap();
    assert!(user <= 127);
    assert!(seen.headers.get("x-user-id").is_none(), "user id stays at the entry");

    // Same user, same period: same user level; a rule match sets the business level.
    let resp = client
        .send(http::Method::POST, &format!("{base}/api/login"), &claims, support::client::empty())
        .await
        .unwrap();
    assert_eq!(resp.status, 200);
    let seen = app.seen().pop().unwrap();
    assert_eq!(seen.headers["x-business-priority"], "0", "login rule");
    assert_eq!(seen.headers["x-user-priority"].to_str().unwrap(), user.to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_stop_finishes_queued_and_in_flight_requests() {
    let app = Backend::start().await;
    let weir = support::sidecar(app.addr, |c| {
        c.inbound.max_inflight = 1;
        c.inbound.shutdown_grace = Duration::from_secs(5);
    });
    let base = format!("http://{}", weir.inbound_addr());
    let in_flight = tokio::spawn({
        let url = format!("{base}/hold");
        async move { Http1::new().get(&url, &[]).await }
    });
    assert!(eventually(WAIT, || app.seen_path("/hold").len() == 1).await);
    let queued = tokio::spawn({
        let url = format!("{base}/echo");
        async move { Http1::new().get(&url, &[]).await }
    });
    assert!(eventually(WAIT, || weir.status().queue_depth == 1).await);

    let shared = weir.shared().clone();
    let stopping = tokio::task::spawn_blocking(move || weir.stop());
    assert!(eventually(WAIT, || shared.draining()).await, "draining");
    app.release(1);
    assert_eq!(in_flight.await.unwrap().status, 200);
    assert_eq!(queued.await.unwrap().status, 200);
    assert!(stopping.await.unwrap(), "everything finished within the grace");
    assert_eq!(shared.active(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_flight_limit_changes_at_run_time() {
    let app = Backend::start().await;
    let weir = support::sidecar(app.addr, |c| c.inbound.max_inflight = 1);
    let base = format!("http://{}", weir.inbound_addr());
    let hold = |n: usize| {
        let url = format!("{base}/hold?n={n}");
        tokio::spawn(async move { Http1::new().get(&url, &[]).await })
    };
    let first = hold(1);
    assert!(eventually(WAIT, || app.seen_path("/hold").len() == 1).await);
    let second = hold(2);
    assert!(eventually(WAIT, || weir.status().queue_depth == 1).await);
    weir.set_max_inflight(2);
    assert!(
        eventually(WAIT, || app.seen_path("/hold").len() == 2).await,
        "raised limit dispatches"
    );
    assert_eq!(weir.status().max_inflight, 2);
    app.release(2);
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(second.await.unwrap().status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_leaving_mid_request_does_not_free_the_apps_slot_early() {
    let app = Backend::start().await;
    app.set_service_time(Duration::from_millis(150));
    let weir = support::sidecar(app.addr, |c| c.inbound.max_inflight = 1);
    let url = format!("http://{}/slow", weir.inbound_addr());
    // Teach weir how long the app takes.
    for _ in 0..3 {
        assert_eq!(Http1::new().get(&url, &[]).await.status, 200);
    }
    let before = app.arrivals();
    let leaver = tokio::spawn({
        let url = url.clone();
        async move { Http1::new().get(&url, &[]).await }
    });
    assert!(eventually(WAIT, || app.arrivals() == before + 1).await, "reached the app");
    leaver.abort();
    let _ = leaver.await;
    // The next request must wait for the app to finish the abandoned one.
    let next = Http1::new().get(&url, &[]).await;
    assert_eq!(next.status, 200);
    assert_eq!(
        app.state.peak_inside.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "never two at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_h2_connection_can_queue_more_than_a_hundred_requests() {
    // gRPC clients use one connection: it must be able to hold all it has queued (up to its
    // configured share of the queue and its stream limit), or the client queues the rest
    // itself where weir cannot refuse them quickly.
    let app = Backend::start().await;
    let weir = support::sidecar(app.addr, |c| {
        c.inbound.max_inflight = 1;
        c.inbound.task_timeout = Duration::from_secs(10);
        c.inbound.max_queued_per_connection = 200;
        // About holding streams, not shedding: 150 waiters behind one slot are an overload the
        // control loop would rightly start refusing (at the door or by their wait).
        c.admission.mode = admission_core::Mode::Shadow;
    });
    let h2 = H2::new();
    let base = format!("http://{}", weir.inbound_addr());
    let held = tokio::spawn({
        let (c, url) = (h2.clone(), format!("{base}/hold"));
        async move { c.get(&url, &[]).await }
    });
    assert!(eventually(WAIT, || app.seen_path("/hold").len() == 1).await);
    let queued: Vec<_> = (0..150)
        .map(|i| {
            let (c, url) = (h2.clone(), format!("{base}/echo?i={i}"));
            tokio::spawn(async move { c.get(&url, &[]).await })
        })
        .collect();
    assert!(eventually(WAIT, || weir.status().queue_depth == 150).await, "all 150 queued in weir");
    app.release(1);
    assert_eq!(held.await.unwrap().status, 200);
    for q in queued {
        assert_eq!(q.await.unwrap().status, 200);
    }
}

/// How long the slots of callers who hung up may stay held: the default run allows half
/// the task timeout (10 s; a slot held for it fails), the soak run 700 ms (the app's 100 ms
/// plus a margin).
const HELD_AT_MOST: Duration = Duration::from_secs(5);
const HELD_AT_MOST_SOAK: Duration = Duration::from_millis(700);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_who_hang_up_hold_slots_for_the_apps_time_not_their_own() {
    slots_held_for_the_apps_time(HELD_AT_MOST).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "soak"]
async fn callers_who_hang_up_hold_slots_for_the_apps_time_not_their_own_soak() {
    slots_held_for_the_apps_time(HELD_AT_MOST_SOAK).await;
}

async fn slots_held_for_the_apps_time(at_most: Duration) {
    // The app answers /slow in 100 ms whatever its caller does. Four callers make slow
    // uploads (a byte every 100 ms) of a declared length; weir forwards each once its body is
    // here, so the estimate must read the app's 100 ms, not the callers' pace. Then four callers hang up while the app works on their
    // requests: the slots they leave are held for the rest of the app's time (~100 ms),
    // not longer (a slot held for the task timeout, 10 s, fails the last assertion).
    const SERVICE: Duration = Duration::from_millis(100);
    const UPLOAD: Duration = Duration::from_millis(1_500);
    let app = Backend::start().await;
    app.set_service_time(SERVICE);
    let weir = support::sidecar(app.addr, |c| {
        c.inbound.max_inflight = 4;
        c.inbound.adaptive_inflight = false;
        c.inbound.task_timeout = Duration::from_secs(10);
    });
    let addr = weir.inbound_addr();
    let uploads: Vec<_> = (0..4)
        .map(|_| {
            tokio::task::spawn_blocking(move || {
                let mut raw = TcpStream::connect(addr).unwrap();
                let body = b"0123456789abcde";
                let head = format!(
                    "POST /slow HTTP/1.1\r\nhost: weir\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                );
                raw.write_all(head.as_bytes()).unwrap();
                let gap = UPLOAD / body.len() as u32;
                for byte in body {
                    std::thread::sleep(gap);
                    // The app may answer (and weir pass the answer on) before the upload
                    // ends; a write that fails then is fine.
                    if raw.write_all(&[*byte]).is_err() {
                        break;
                    }
                }
                // Wait for the answer: a caller that hangs up here would abandon the request.
                raw.set_read_timeout(Some(WAIT)).unwrap();
                let _ = raw.read(&mut [0u8; 512]);
            })
        })
        .collect();
    for u in uploads {
        u.await.unwrap();
    }
    let typical = weir.shared().app_time.typical();
    assert!(!typical.is_zero(), "the slow uploads were answered");
    assert!(typical < UPLOAD / 2, "the app's time excludes the callers' upload: {typical:?}");

    let before = app.arrivals();
    let leavers: Vec<_> = (0..4)
        .map(|_| {
            let url = format!("http://{addr}/slow");
            tokio::spawn(async move { Http1::new().get(&url, &[]).await })
        })
        .collect();
    assert!(eventually(WAIT, || app.arrivals() == before + 4).await, "all four reached the app");
    for l in &leavers {
        l.abort();
    }
    let left = std::time::Instant::now();
    for l in leavers {
        let _ = l.await;
    }
    assert!(eventually(WAIT, || weir.status().inflight == 0).await, "slots released");
    let held = left.elapsed();
    println!("typical app time {typical:?}; slots held {held:?} after the callers left");
    // At most the app's time (100 ms) after the hang-up, with the run's margin.
    assert!(held < at_most, "slots held {held:?} after the callers left");
}
