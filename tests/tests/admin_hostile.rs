//! Nothing sent to the admin API can stall the sidecar: while hostile and huge table bodies
//! hit `/v1/priority-table/validate`, `/live` and proxied traffic keep answering promptly,
//! admission windows keep closing on time, and every body is answered within a bound.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use control_api::StatusDoc;
use support::backend::Backend;
use support::client::{bytes_body, Http1};

/// 60 rules of 1,000 header matches each, every rule reachable (~480 KiB).
fn big_valid_table() -> String {
    let mut yaml = String::from("rules:\n");
    for r in 0..60 {
        let headers: Vec<String> =
            (0..1000).map(|h| format!("h{h}: {}", if h == 999 { r } else { 0 })).collect();
        yaml.push_str(&format!(
            "  - {{ name: r{r}, business: 1, match: {{ header: {{ {} }} }} }}\n",
            headers.join(", ")
        ));
    }
    yaml
}

async fn status(admin: std::net::SocketAddr) -> StatusDoc {
    let resp = Http1::new().get(&format!("http://{admin}/v1/status"), &[]).await;
    serde_json::from_slice(&resp.body).expect("StatusDoc")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_table_bodies_stall_nothing() {
    let app = Backend::start().await;
    let weir = support::sidecar(app.addr, |c| {
        c.admission.window = Duration::from_millis(200);
        c.admission.early_close_after = Duration::ZERO;
    });
    let (admin, inbound) = (weir.admin_addr(), weir.inbound_addr());
    let validate = format!("http://{admin}/v1/priority-table/validate");
    let yaml = [("content-type", "application/yaml")];
    let big = big_valid_table();
    assert!(big.len() < 1 << 20, "within the default body limit");

    // Each body alone: answered, and in bounded time (debug build; the release figures
    // are in the closing note of the change).
    let started = Instant::now();
    let r = Http1::new()
        .send(http::Method::POST, &validate, &yaml, bytes_body("[".repeat(200_000)))
        .await
        .unwrap();
    let hostile_took = started.elapsed();
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert!(hostile_took < Duration::from_secs(2), "nested body refused in {hostile_took:?}");
    let started = Instant::now();
    let r = Http1::new()
        .send(http::Method::POST, &validate, &yaml, bytes_body(big.clone()))
        .await
        .unwrap();
    let big_took = started.elapsed();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(big_took < Duration::from_secs(10), "big table validated in {big_took:?}");

    // Now both, over and over from several clients, while probes and traffic are timed.
    let before = status(admin).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut attackers = Vec::new();
    for k in 0..4 {
        let (stop, validate, big) = (stop.clone(), validate.clone(), big.clone());
        attackers.push(tokio::spawn(async move {
            let client = Http1::new();
            let mut answered = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let body = if k % 2 == 0 { "[".repeat(200_000) } else { big.clone() };
                let r = client
                    .send(http::Method::POST, &validate, &yaml, bytes_body(body))
                    .await
                    .unwrap();
                // 503 = all table-check permits busy: refused at once, which is the point.
                assert!([200, 400, 503].contains(&r.status), "{}", r.status);
                answered += 1;
            }
            answered
        }));
    }
    let probe = Http1::new();
    let (mut live_max, mut proxied_max) = (Duration::ZERO, Duration::ZERO);
    let run_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < run_until {
        let t = Instant::now();
        let r = probe.get(&format!("http://{admin}/live"), &[]).await;
        assert_eq!(r.status, 200);
        live_max = live_max.max(t.elapsed());
        let t = Instant::now();
        let r = probe.get(&format!("http://{inbound}/echo"), &[]).await;
        assert_eq!(r.status, 200);
        proxied_max = proxied_max.max(t.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut bodies = 0;
    for a in attackers {
        bodies += a.await.unwrap();
    }
    let after = status(admin).await;
    let closed = after.windows_closed - before.windows_closed;
    eprintln!(
        "{bodies} hostile/huge bodies answered; /live max {live_max:?}, proxied max \
         {proxied_max:?}, {closed} windows of 200 ms closed in ~3 s, last took {:?} ms",
        after.window.as_ref().map(|w| w.duration_ms)
    );
    assert!(bodies >= 4, "the bodies were answered, not left hanging");
    // Margins for a busy 2-core machine running a debug build; the target is 100 ms.
    assert!(live_max < Duration::from_millis(500), "/live took {live_max:?}");
    assert!(proxied_max < Duration::from_millis(500), "proxied request took {proxied_max:?}");
    // 15 windows fit in 3 s; a frozen timer would close none (no window closes by traffic
    // alone here: 2000-request windows at ~25 req/s).
    assert!(closed >= 8, "only {closed} windows closed");
    let last = after.window.expect("a window closed").duration_ms;
    assert!(last < 450.0, "the last 200 ms window took {last} ms");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_table_body_is_refused() {
    let app = Backend::start().await;
    let weir = support::sidecar(app.addr, |_| {});
    let admin = weir.admin_addr();
    let yaml = [("content-type", "application/yaml")];
    let r = Http1::new()
        .send(
            http::Method::POST,
            &format!("http://{admin}/v1/priority-table/validate"),
            &yaml,
            bytes_body(""),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    assert!(String::from_utf8_lossy(&r.body).contains("empty"));
}
