//! The priority table swapped through the control API while requests flow through the entry
//! sidecar: no request fails, and every request is stamped entirely by one table version.
//!
//! Each table version `v` stamps two things that must agree: the business level of the
//! matched rule (`v`, so its parity is `v`'s) and the user level, hashed from the header the
//! table names (`x-uid-even` for even versions, `x-uid-odd` for odd ones). The client sends
//! both user-id headers with values whose user levels differ, so a request stamped half by
//! one version and half by another shows up as a parity/user-level mismatch at the app.

use crate::support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::Method;
use support::backend::Backend;
use support::client::{bytes_body, empty, Http1, TestClient};

const SWAPS: u64 = 100;

fn table_yaml(version: u64) -> String {
    let header = if version % 2 == 0 { "x-uid-even" } else { "x-uid-odd" };
    format!(
        "version: {version}\n\
         default_business: 250\n\
         rules:\n  \
           - name: api\n    \
             match: {{ path_prefix: /api/ }}\n    \
             business: {version}\n\
         user:\n  header: {header}\n  rekey_every: 1h\n"
    )
}

/// PUTs the table for `next` (expecting the current version `next - 1`); returns the status.
async fn put_table(client: &TestClient, admin: std::net::SocketAddr, next: u64) -> u16 {
    let if_match = format!("\"{}\"", next - 1);
    client
        .send(
            Method::PUT,
            &format!("http://{admin}/v1/priority-table"),
            &[
                ("authorization", "Bearer swap-test-token"),
                ("content-type", "application/yaml"),
                ("if-match", &if_match),
            ],
            bytes_body(table_yaml(next)),
        )
        .await
        .expect("control API answers")
        .status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_swaps_under_load_fail_nothing_and_never_mix_versions() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "swap-test-token\n").unwrap();
    let app = Backend::start().await;
    let weir = support::sidecar(app.addr, |c| {
        c.inbound.entry = true;
        c.admin.allow_empty_user_secret = true;
        c.admin.token_file = Some(token.clone());
    });
    let (base, admin) = (format!("http://{}", weir.inbound_addr()), weir.admin_addr());
    let client = Http1::new();

    // Start from version 2 (even) so the parity rule holds from the first request on.
    let initial: u64 = client
        .get(&format!("http://{admin}/v1/priority-table"), &[])
        .await
        .header("etag")
        .and_then(|e| e.trim_matches('"').parse().ok())
        .expect("ETag with the version");
    let mut version = initial;
    while version < 2 || version % 2 == 1 {
        version += 1;
        assert_eq!(put_table(&client, admin, version).await, 200);
    }

    // Two user ids whose user levels differ under the current secret and period.
    let level_of = |seen: &support::backend::Seen| -> u8 {
        seen.headers["x-user-priority"].to_str().unwrap().parse().unwrap()
    };
    let mut ids = Vec::new();
    for i in 0..16 {
        let id = format!("user-{i}");
        let resp = client.get(&format!("{base}/api/probe"), &[("x-uid-even", &id)]).await;
        assert_eq!(resp.status, 200);
        ids.push((id, level_of(&app.seen().pop().unwrap())));
    }
    let (even_id, even_level) = ids[0].clone();
    let (odd_id, odd_level) =
        ids.iter().find(|(_, l)| *l != even_level).cloned().expect("16 ids share one level");

    // Load: 4 clients loop until the swapper is done (bounded by a time limit too).
    let done = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let limit = Instant::now() + Duration::from_secs(60);
    let mut load = Vec::new();
    for _ in 0..4 {
        let (client, base, done, sent, failed) =
            (client.clone(), base.clone(), done.clone(), sent.clone(), failed.clone());
        let headers = [("x-uid-even", even_id.clone()), ("x-uid-odd", odd_id.clone())];
        load.push(tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) && Instant::now() < limit {
                let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
                let resp = client.send(Method::GET, &format!("{base}/api/x"), &h, empty()).await;
                sent.fetch_add(1, Ordering::Relaxed);
                if !matches!(resp, Ok(ref r) if r.status == 200) {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let first_swap = version;
    for _ in 0..SWAPS {
        version += 1;
        assert_eq!(put_table(&client, admin, version).await, 200, "swap to {version}");
        // Let some requests through between swaps without timing on wall-clock sleeps.
        let before = sent.load(Ordering::Relaxed);
        support::eventually(Duration::from_secs(5), || sent.load(Ordering::Relaxed) >= before + 3)
            .await;
    }
    done.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }

    let sent = sent.load(Ordering::Relaxed);
    assert_eq!(failed.load(Ordering::Relaxed), 0, "no request failed during {SWAPS} swaps");
    assert!(sent >= SWAPS * 3, "load flowed during the swaps: {sent} requests");
    let mut versions_seen = std::collections::BTreeSet::new();
    for seen in app.seen_path("/api/x") {
        let business: u64 = seen.headers["x-business-priority"].to_str().unwrap().parse().unwrap();
        assert!(
            (first_swap..=version).contains(&business),
            "stamped by a version in the test range: {business}"
        );
        let expected_user = if business % 2 == 0 { even_level } else { odd_level };
        assert_eq!(
            level_of(&seen),
            expected_user,
            "business {business} with the other version's user"
        );
        versions_seen.insert(business);
    }
    assert!(versions_seen.len() > 10, "requests saw many versions: {}", versions_seen.len());
}
