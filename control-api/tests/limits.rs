//! Every wait on the admin listener is bounded by a named setting, and table checks beyond
//! `max_concurrent_table_checks` wait in a bounded line, each within
//! `timeouts.write_wait`; past the line they are refused at once.

mod common;

use std::time::{Duration, Instant};

use control_api::{AdminConfig, AdminTimeouts};
use http::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn tight(cfg: AdminConfig) -> AdminConfig {
    AdminConfig {
        timeouts: AdminTimeouts {
            header_read: Duration::from_millis(300),
            body_read: Duration::from_millis(300),
            ..AdminTimeouts::default()
        },
        ..cfg
    }
}

/// Reads until the peer closes (or 10 s pass); returns what arrived and when it closed.
async fn read_until_closed(stream: &mut TcpStream) -> (String, Duration) {
    let started = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while started.elapsed() < Duration::from_secs(10) {
        match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
    (String::from_utf8_lossy(&got).into_owned(), started.elapsed())
}

#[tokio::test]
async fn a_silent_connection_is_closed_after_header_read() {
    let (cfg, dir) = common::config();
    let s = common::start_with(tight(cfg), dir).await;
    let mut silent = TcpStream::connect(s.addr).await.unwrap();
    let (_, took) = read_until_closed(&mut silent).await;
    assert!(took < Duration::from_secs(3), "closed after {took:?}");

    // A head that never completes.
    let mut slow = TcpStream::connect(s.addr).await.unwrap();
    slow.write_all(b"GET /live HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let (_, took) = read_until_closed(&mut slow).await;
    assert!(took < Duration::from_secs(3), "closed after {took:?}");
    s.stop().await;
}

#[tokio::test]
async fn a_body_that_never_ends_is_answered_408() {
    let (cfg, dir) = common::config();
    let s = common::start_with(tight(cfg), dir).await;
    let mut stream = TcpStream::connect(s.addr).await.unwrap();
    stream
        .write_all(
            b"POST /v1/priority-table/validate HTTP/1.1\r\nHost: x\r\n\
              content-type: application/yaml\r\ncontent-length: 1000\r\n\r\nrules: [",
        )
        .await
        .unwrap();
    let (answer, took) = read_until_closed(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("admin.timeouts.body_read"), "{answer}");
    assert!(took < Duration::from_secs(3), "answered after {took:?}");
    // The API still answers.
    assert_eq!(s.get("/live").await.status, StatusCode::OK);
    s.stop().await;
}

/// With the one permit taken, the next eight checks (eight per permit) wait in line, each at
/// most `timeouts.write_wait` (then 503); those beyond the line are refused 503 at once,
/// with `retry-after` and the connection closed (their bodies were never read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_checks_beyond_the_limit_wait_in_a_bounded_line_and_past_it_are_refused_at_once() {
    const WAIT: Duration = Duration::from_secs(3);
    let (cfg, dir) = common::config();
    let cfg = AdminConfig {
        max_concurrent_table_checks: 1,
        timeouts: AdminTimeouts { write_wait: WAIT, ..AdminTimeouts::default() },
        ..cfg
    };
    let s = common::start_with(cfg, dir).await;
    // Heavy enough to hold the one permit for a while (the check, then 9x its time: one permit, a tenth of a core).
    let big = bytes::Bytes::from(heavy_table());
    let url = s.url("/v1/priority-table/validate");
    let validate = |body: bytes::Bytes| {
        let url = url.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let yaml = [("content-type", "application/yaml")];
            let r = common::try_send(&url, Method::POST, &yaml, body).await;
            (r, started.elapsed())
        })
    };
    let first = validate(big.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let line: Vec<_> = (0..8).map(|_| validate(big.clone())).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Small bodies: what they cost is their head alone.
    let beyond: Vec<_> = (0..4).map(|_| validate(common::table_yaml(1).into())).collect();
    for refused in beyond {
        let (r, took) = refused.await.unwrap();
        let r = r.expect("answered");
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
        assert_eq!(r.headers["retry-after"], "1");
        assert_eq!(r.headers["connection"], "close");
        assert!(took < WAIT, "refused after {took:?}: it waited in line");
    }
    let (r, _) = first.await.unwrap();
    assert_eq!(r.unwrap().status, StatusCode::OK);
    for waiter in line {
        let (r, took) = waiter.await.unwrap();
        match r.map(|r| r.status) {
            Ok(StatusCode::OK) => {}
            // Busy when its wait ran out (the connection may close under the rest of its
            // body).
            Ok(StatusCode::SERVICE_UNAVAILABLE) | Err(_) => {
                assert!(took >= WAIT, "a waiter refused after {took:?}, before its wait ran out");
            }
            Ok(other) => panic!("a waiter got {other}"),
        }
    }
    s.stop().await;
}

/// ~480 KiB, 60 rules of 1,000 header matches each: holds a table-check permit a while.
fn heavy_table() -> String {
    let mut big = String::from("rules:\n");
    for r in 0..60 {
        let headers: Vec<String> =
            (0..1000).map(|h| format!("h{h}: {}", if h == 999 { r } else { 0 })).collect();
        big.push_str(&format!(
            "  - {{ name: r{r}, business: 1, match: {{ header: {{ {} }} }} }}\n",
            headers.join(", ")
        ));
    }
    big
}

/// Unauthenticated validations take every table-check permit, over and over; authenticated
/// writes have a permit of their own and are all applied. (Before: one pool, and a flood
/// made 31 of 32 writes 503.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_validate_flood_never_takes_the_write_permit() {
    let (cfg, dir) = common::config();
    let s = common::start_with(AdminConfig { max_concurrent_table_checks: 1, ..cfg }, dir).await;
    let (big, url) = (bytes::Bytes::from(heavy_table()), s.url("/v1/priority-table/validate"));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // More than the permit and its line (eight) hold: some are refused busy all along.
    let flood: Vec<_> = (0..12)
        .map(|_| {
            let (stop, url, big) = (stop.clone(), url.clone(), big.clone());
            tokio::spawn(async move {
                let yaml = [("content-type", "application/yaml")];
                let mut busy = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // Busy is answered before the body is read; the connection may then
                    // close under the rest of the body (counted busy too).
                    let status =
                        match common::try_send(&url, Method::POST, &yaml, big.clone()).await {
                            Ok(r) => r.status,
                            Err(_) => StatusCode::SERVICE_UNAVAILABLE,
                        };
                    assert!([200, 503].contains(&status.as_u16()), "{status}");
                    busy += u32::from(status == StatusCode::SERVICE_UNAVAILABLE);
                }
                busy
            })
        })
        .collect();
    // Let the flood take the permit first.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for business in 0..8u8 {
        let (version, _) = s.current_table().await;
        let r = s.put_table(&common::table_yaml(business % 4), &format!("\"{version}\"")).await;
        assert_eq!(r.status, StatusCode::OK, "write {business}: {}", r.body);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut refused = 0;
    for f in flood {
        refused += f.await.unwrap();
    }
    assert!(refused > 0, "the flood never found the validation permit busy");
    s.stop().await;
}

#[tokio::test]
async fn a_write_waits_for_the_one_before_it_within_write_wait() {
    let (cfg, dir) = common::config();
    let cfg = AdminConfig {
        timeouts: AdminTimeouts {
            write_wait: Duration::from_millis(50),
            ..AdminTimeouts::default()
        },
        ..cfg
    };
    let s = common::start_with(cfg, dir).await;
    // Four at once: each waits for the write before it; with a 50 ms wait and cheap tables
    // most get through, and any that does not is a clean 503 naming the setting.
    let (version, _) = s.current_table().await;
    let puts: Vec<_> = (0..4)
        .map(|b| {
            let url = s.url("/v1/priority-table");
            let auth = format!("Bearer {}", common::TOKEN);
            let body = bytes::Bytes::from(common::table_yaml(b));
            let if_match = format!("\"{version}\"");
            tokio::spawn(async move {
                let headers = [
                    ("authorization", auth.as_str()),
                    ("content-type", "application/yaml"),
                    ("if-match", if_match.as_str()),
                ];
                common::send(&url, Method::PUT, &headers, body).await
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for p in puts {
        let r = p.await.unwrap();
        if r.status == StatusCode::SERVICE_UNAVAILABLE {
            assert!(r.body.contains("admin.timeouts.write_wait"), "{}", r.body);
            assert_eq!(r.headers["retry-after"], "1");
        }
        statuses.push(r.status.as_u16());
    }
    // Same If-Match for all four: exactly one applies, the others see the new version.
    assert_eq!(statuses.iter().filter(|&&s| s == 200).count(), 1, "{statuses:?}");
    assert!(statuses.iter().all(|s| [200, 412, 503].contains(s)), "{statuses:?}");
    s.stop().await;
}

#[tokio::test]
async fn an_empty_put_body_is_refused_and_changes_nothing() {
    let s = common::start().await;
    let (version, _) = s.current_table().await;
    let r = s.put_table("", &format!("\"{version}\"")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert!(r.body.contains("empty"), "{}", r.body);
    assert_eq!(s.current_table().await.0, version);
    s.stop().await;
}
