//! What a request's head and body may claim, and what the sidecar forwards: the budget an
//! outside client declares is capped at the entry and a body must arrive within it; the
//! request names one authority, the one the entry classified and the app receives; framing
//! weir cannot pass on is refused with the right status (and the level); the entry's
//! priority stamp survives a caller's `Connection` header. Each misbehaving caller runs
//! next to a well-behaved one, whose latency is printed beside its unattacked latency.

use crate::support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::backend::Backend;
use support::misbehaving::{
    edge_sidecar, h2_connect, probe_series, unattacked_series, BodyFirstApp, Latencies, RawConn,
    MARGIN,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weir_proxy::Sidecar;

const PROBES: usize = 40;
const PROBE_BOUND: Duration = Duration::from_millis(1500);

fn entry(
    app: SocketAddr,
    dir: &tempfile::TempDir,
    tweak: impl FnOnce(&mut weir_proxy::SidecarConfig),
) -> Sidecar {
    let table = dir.path().join("table.yaml");
    let secret = dir.path().join("secret");
    std::fs::write(&table, support::EDGE_ENTRY_TABLE).unwrap();
    std::fs::write(&secret, "edge-request-head-secret\n").unwrap();
    support::sidecar(app, |c| {
        c.inbound.entry = true;
        c.admin.table_file = Some(table);
        c.admin.user_secret_file = Some(secret);
        tweak(c);
    })
}

/// Runs `attack` in a loop until the returned flag is set.
fn keep_attacking<F, Fut>(attack: F) -> (Arc<AtomicBool>, tokio::task::JoinHandle<usize>)
where
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let task = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut n = 0;
            while !stop.load(Relaxed) {
                attack().await;
                n += 1;
            }
            n
        }
    });
    (stop, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_entry_caps_a_declared_budget_and_forwards_it_capped() {
    let app = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    // The shipped defaults: the entry's cap is the task timeout, 500 ms.
    let weir = entry(app.addr, &dir, |_| {});
    let base = format!("http://{}", weir.inbound_addr());
    let client = support::client::Http1::new();
    for (name, value) in [("x-request-timeout-ms", "3600000"), ("grpc-timeout", "99999999H")] {
        let resp = client.get(&format!("{base}/echo?{name}"), &[(name, value)]).await;
        assert_eq!(resp.status, 200, "{resp:?}");
        let seen = app.seen().pop().unwrap();
        let forwarded: u64 =
            seen.headers["x-request-timeout-ms"].to_str().unwrap().parse().unwrap();
        assert!(forwarded <= 500, "{name}: {value} reached the app as {forwarded} ms");
        if name == "grpc-timeout" {
            let grpc = seen.headers["grpc-timeout"].to_str().unwrap();
            assert!(grpc.ends_with('m') && grpc[..grpc.len() - 1].parse::<u64>().unwrap() <= 500);
        }
    }
}

/// A client that declares a 1 h budget and sends its body one byte every 100 ms to the
/// echo route (which answers at once and streams the body back, so the response head never
/// times out): the exchange ends when weir ends it, or the client gives up at `give_up`.
/// Returns how long it lasted.
async fn trickle(addr: SocketAddr, give_up: Duration) -> Duration {
    let started = Instant::now();
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let head = "POST /echo HTTP/1.1\r\nHost: edge\r\nContent-Length: 100000\r\n\
                x-request-timeout-ms: 3600000\r\n\r\n";
    write.write_all(head.as_bytes()).await.unwrap();
    let writer = tokio::spawn(async move {
        loop {
            if write.write_all(b"x").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut buf = [0u8; 4096];
    // Bounded so that a test against a sidecar without the bound ends.
    let _ = tokio::time::timeout(give_up, async {
        while let Ok(n) = read.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
    writer.abort();
    started.elapsed()
}

/// How many clients trickle bodies, how many times each starts again after being cut off, and
/// the cap each exchange is given (plus a margin) before the client gives up.
struct Trickle {
    clients: usize,
    rounds: usize,
    cap: Duration,
}

/// Measures the well-behaved caller alone, then runs the trickling clients while it probes
/// again; reports both and asserts that every trickled exchange ended by the cap (plus the
/// margin), whatever ended it.
async fn trickles_end_by_the_cap(addr: SocketAddr, attack: Trickle, label: &str) {
    let unattacked = unattacked_series(addr, PROBES, PROBE_BOUND).await;
    let mut tricklers = Vec::new();
    for _ in 0..attack.clients {
        tricklers.push(tokio::spawn(async move {
            let mut lasted = Vec::new();
            for _ in 0..attack.rounds {
                lasted.push(trickle(addr, attack.cap + MARGIN).await);
            }
            lasted
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let attacked = probe_series(addr, PROBES, PROBE_BOUND).await;
    Latencies::report(label, &unattacked, &attacked);
    let mut longest = Duration::ZERO;
    for t in tricklers {
        for lasted in t.await.unwrap() {
            longest = longest.max(lasted);
        }
    }
    eprintln!("[{label}] longest trickled exchange: {longest:?} (cap {:?})", attack.cap);
    assert!(longest < attack.cap + MARGIN, "[{label}] a trickled exchange lasted {longest:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_trickled_under_a_declared_hour_hold_no_slot_past_the_cap() {
    // Half the slots: with all of them taken, the queue the tricklers build would (rightly)
    // make admission control shed the probes' class too; the property under test is that no
    // trickler keeps a slot past the cap (without it they keep theirs for the whole body).
    const SLOTS: usize = 8;
    const TRICKLERS: usize = 4;
    const CAP: Duration = Duration::from_millis(300);
    let app = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let weir = entry(app.addr, &dir, |c| {
        c.inbound.max_inflight = SLOTS;
        c.inbound.task_timeout = Duration::from_secs(2);
        c.inbound.max_budget = Some(CAP);
    });
    let attack = Trickle { clients: TRICKLERS, rounds: 6, cap: CAP };
    trickles_end_by_the_cap(weir.inbound_addr(), attack, "4 clients, 1 h budgets").await;
}

/// The budget trickle of the hardening benchmark, with the shipped defaults (the adaptive
/// limit, the entry's 500 ms cap): 64 clients declaring Content-Length 100000 and a 1 h
/// budget, sending a byte every 100 ms, each starting again when cut off. A body of
/// declared length takes no slot until it is here, so none of them reaches the app (before:
/// every admitted one did, and held its slot for the cap); each is answered 504 by the cap
/// (plus a margin), and every probe of the well-behaved caller is answered meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_trickled_under_a_declared_length_never_reach_the_app() {
    const TRICKLERS: usize = 64;
    const CAP: Duration = Duration::from_millis(500);
    let app = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let weir = entry(app.addr, &dir, |_| {});
    let attack = Trickle { clients: TRICKLERS, rounds: 3, cap: CAP };
    trickles_end_by_the_cap(weir.inbound_addr(), attack, "64 clients, declared length").await;
    let reached = app.seen_path("/echo").len();
    assert_eq!(reached, 0, "{reached} trickled requests reached the app before their bodies");
}

/// Requests whose authority is ambiguous, each of which must be refused with 400 and the
/// level; returns the cases that were not.
async fn ambiguous_authorities(addr: SocketAddr) -> Vec<String> {
    let mut failed = Vec::new();
    for (case, head) in [
        (
            "two Hosts",
            &b"GET /buy HTTP/1.1\r\nHost: shop.example\r\nHost: admin.example\r\n\r\n"[..],
        ),
        ("HTTP/1.1 without Host", b"GET /buy HTTP/1.1\r\n\r\n"),
    ] {
        let mut raw = RawConn::connect(addr).await;
        raw.send(head).await;
        match raw.response(MARGIN).await {
            Ok(resp) if resp.status == 400 && resp.header("x-admission-level").is_some() => {}
            Ok(resp) => failed.push(format!("{case}: {}", resp.status)),
            Err(e) => failed.push(format!("{case}: {e}")),
        }
    }
    let h2 = h2_connect(addr, |_| {}).await;
    let mut send = h2.ready().await.unwrap();
    let req = http::Request::get("http://shop.example/buy")
        .header("host", "admin.example")
        .body(())
        .unwrap();
    let (response, _) = send.send_request(req, true).unwrap();
    let response = tokio::time::timeout(MARGIN, response).await.expect("h2 answered").unwrap();
    if response.status() != 400 || !response.headers().contains_key("x-admission-level") {
        failed.push(format!("h2 host differing from :authority: {}", response.status()));
    }
    failed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_names_one_authority_the_one_classified_and_forwarded() {
    let app = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let weir = entry(app.addr, &dir, |_| {});
    let addr = weir.inbound_addr();
    let unattacked = unattacked_series(addr, PROBES, PROBE_BOUND).await;

    // Every case is tried; the panic lists each one that failed.
    let mut failed = Vec::new();
    // HTTP/1.1, absolute form: the target's authority wins and replaces Host (RFC 9112
    // 3.2.2), so the app gets the host that was classified.
    let mut raw = RawConn::connect(addr).await;
    raw.send(b"GET http://shop.example/buy HTTP/1.1\r\nHost: admin.example\r\n\r\n").await;
    let resp = raw.response(MARGIN).await.unwrap();
    assert_eq!(resp.status, 200, "{resp:?}");
    let seen = app.seen().pop().unwrap();
    let hosts: Vec<_> = seen.headers.get_all("host").iter().collect();
    let business = &seen.headers["x-business-priority"];
    if hosts != ["shop.example"] || business != "30" {
        failed.push(format!(
            "absolute form for shop.example, Host admin.example: the app got Host {hosts:?} \
             with business {business:?} (expected shop.example, classified 30)"
        ));
    }

    // Refused before the app, with the level: two Hosts, none on HTTP/1.1, and an h2
    // `host` that differs from `:authority` (RFC 9112 3.2, RFC 9113 8.3.1).
    failed.extend(ambiguous_authorities(addr).await);
    assert!(failed.is_empty(), "{failed:#?}");
    let arrivals = app.arrivals();
    let attack = move || async move {
        let failed = ambiguous_authorities(addr).await;
        assert!(failed.is_empty(), "{failed:#?}");
    };
    let (stop, attacker) = keep_attacking(attack);
    let attacked = probe_series(addr, PROBES, PROBE_BOUND).await;
    stop.store(true, Relaxed);
    let rounds = attacker.await.expect("every ambiguous request was refused");
    Latencies::report("ambiguous authorities, refused", &unattacked, &attacked);
    assert!(rounds > 0);
    assert_eq!(
        app.arrivals(),
        arrivals + PROBES as u64,
        "only the probes reached the app after the refusals began"
    );
}

/// The misbehaving framings, each checked: a transfer coding other than chunked (501,
/// before the app), a malformed chunk (400, not 502), a URI too long (hyper's 414, with the
/// level). Every case is tried; the panic lists each one that failed.
async fn bad_framings(addr: SocketAddr) {
    let long = "a".repeat(70_000);
    let cases: [(&str, Vec<u8>, u16); 3] = [
        (
            "Transfer-Encoding: gzip, chunked",
            b"POST /upload HTTP/1.1\r\nHost: edge\r\nTransfer-Encoding: gzip, chunked\r\n\r\n\
              5\r\nhello\r\n0\r\n\r\n"
                .to_vec(),
            501,
        ),
        (
            "malformed chunk size",
            b"POST /upload HTTP/1.1\r\nHost: edge\r\nTransfer-Encoding: chunked\r\n\r\n\
              5\r\nhello\r\nzz\r\n"
                .to_vec(),
            400,
        ),
        ("URI too long", format!("GET /{long} HTTP/1.1\r\nHost: edge\r\n\r\n").into_bytes(), 414),
    ];
    let mut failed = Vec::new();
    for (case, request, status) in cases {
        let mut raw = RawConn::connect(addr).await;
        raw.send(&request).await;
        match raw.response(MARGIN).await {
            Ok(resp) if resp.status == status && resp.header("x-admission-level").is_some() => {}
            Ok(resp) => failed.push(format!(
                "{case}: {} (level {:?}), expected {status} with the level",
                resp.status,
                resp.header("x-admission-level")
            )),
            Err(e) => failed.push(format!("{case}: {e}")),
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framing_weir_cannot_pass_on_is_refused_with_the_right_status() {
    let app = BodyFirstApp::start().await;
    let weir = edge_sidecar(app.addr, |_| {});
    let addr = weir.inbound_addr();
    let unattacked = unattacked_series(addr, PROBES, PROBE_BOUND).await;
    let arrivals = app.arrivals.load(Relaxed);
    bad_framings(addr).await;
    // The gzip-coded body never reached the app (only the malformed one's head did).
    assert!(app.arrivals.load(Relaxed) <= arrivals + 1, "never forwarded without its coding");

    let (stop, attacker) = keep_attacking(move || bad_framings(addr));
    let attacked = probe_series(addr, PROBES, PROBE_BOUND).await;
    stop.store(true, Relaxed);
    let rounds = attacker.await.expect("every bad framing got its status");
    Latencies::report("bad framings (501, 400, 414)", &unattacked, &attacked);
    assert!(rounds > 0);

    // A well-formed chunked upload still works.
    let mut raw = RawConn::connect(addr).await;
    raw.send(b"POST /upload HTTP/1.1\r\nHost: edge\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
        .await;
    let resp = raw.response(MARGIN).await.unwrap();
    assert_eq!((resp.status, &resp.body[..]), (200, &b"5"[..]), "{resp:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_connection_header_cannot_remove_the_entrys_stamp() {
    let app = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let weir = entry(app.addr, &dir, |_| {});
    let addr = weir.inbound_addr();
    let unattacked = unattacked_series(addr, PROBES, PROBE_BOUND).await;
    let attack = {
        let state = app.state.clone();
        move || {
            let state = state.clone();
            async move {
                let resp = support::client::Http1::new()
                    .get(
                        &format!("http://{addr}/echo?unstamp"),
                        &[
                            ("connection", "x-business-priority, x-user-priority"),
                            ("x-business-priority", "0"),
                        ],
                    )
                    .await;
                assert_eq!(resp.status, 200, "{resp:?}");
                let seen = state.seen.lock().unwrap();
                let seen = seen.iter().rev().find(|s| s.path == "/echo").expect("forwarded");
                let business = seen.headers.get("x-business-priority").map(|v| v.as_bytes());
                assert_eq!(business, Some(&b"200"[..]), "the stamp survives: {:?}", seen.headers);
                assert!(seen.headers.contains_key("x-user-priority"), "{:?}", seen.headers);
            }
        }
    };
    attack().await;
    let (stop, attacker) = keep_attacking(attack);
    let attacked = probe_series(addr, PROBES, PROBE_BOUND).await;
    stop.store(true, Relaxed);
    let rounds = attacker.await.expect("every stamp survived");
    Latencies::report("Connection: x-business-priority at the entry", &unattacked, &attacked);
    assert!(rounds > 0);
}
