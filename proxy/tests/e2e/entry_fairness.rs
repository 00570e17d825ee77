//! Fairness between users at the entry (docs/design.md, "Priorities"): with the balanced
//! re-key schedule every user visits every part of the level range once per cycle, so over
//! a cycle no user is refused much more often than another, and the set of refused users
//! changes at every re-key.
//!
//! The first test reads the levels the entry stamps (exact properties of the schedule,
//! through the real header path); the second (soak group) overloads a real app 3x and checks
//! the refusals users actually get.

use crate::support;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use support::backend::{unix_micros, Backend};
use support::client::Http1;
use weir_harness::backend::{BackendConfig, CapacityBackend};
use weir_harness::fairness::analyse;
use weir_harness::load::{ClassSpec, LoadRun, LoadSpec, Phase};

const SECOND_US: u64 = 1_000_000;

fn table(rekey_secs: u64, cycle_periods: u32) -> String {
    format!(
        "default_business: 10\nrules: []\nuser:\n  header: x-user-id\n  rekey_every: {rekey_secs}s\n  \
         schedule: balanced\n  cycle_periods: {cycle_periods}\n"
    )
}

fn entry(
    app: std::net::SocketAddr,
    dir: &tempfile::TempDir,
    table_text: &str,
    tweak: impl FnOnce(&mut weir_proxy::SidecarConfig),
) -> weir_proxy::Sidecar {
    let table = dir.path().join("table.yaml");
    let secret = dir.path().join("secret");
    std::fs::write(&table, table_text).unwrap();
    std::fs::write(&secret, "entry-fairness-secret\n").unwrap();
    support::sidecar(app, |c| {
        c.inbound.entry = true;
        c.inbound.forward_user_id = true;
        c.admin.table_file = Some(table);
        c.admin.user_secret_file = Some(secret);
        tweak(c);
    })
}

/// Waits (a bounded poll on the clock) until `at_us` Unix microseconds.
async fn until_unix(at_us: u64) {
    let limit = tokio::time::Instant::now()
        + Duration::from_micros(at_us.saturating_sub(unix_micros()))
        + Duration::from_secs(1);
    while unix_micros() < at_us {
        assert!(tokio::time::Instant::now() < limit, "the clock did not reach {at_us}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_user_visits_every_slot_once_per_cycle_and_the_refused_set_moves() {
    const USERS: usize = 64;
    const N: u64 = 4;
    let app = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let weir = entry(app.addr, &dir, &table(1, N as u32), |_| {});
    let url = format!("http://{}/stamp", weir.inbound_addr());
    let client = Http1::new();
    // Start at a cycle boundary (cycles are N one-second periods from the Unix epoch), and
    // cover one whole cycle plus the first period of the next.
    let cycle_us = N * SECOND_US;
    let first = (unix_micros() + 200_000).div_ceil(cycle_us) * (cycle_us / SECOND_US);
    let mut levels: BTreeMap<(usize, u64), u8> = BTreeMap::new();
    for period in first..first + N + 1 {
        // Send inside the period, well away from its edges; a request whose answer comes
        // back in another period is not attributed to either.
        until_unix(period * SECOND_US + 100_000).await;
        let mut pending: Vec<usize> = (0..USERS).collect();
        let mut good: HashSet<(usize, String)> = HashSet::new();
        let mut attempt = 0;
        while !pending.is_empty() && unix_micros() < (period + 1) * SECOND_US - 150_000 {
            attempt += 1;
            let tag = format!("{period}.{attempt}");
            let sends = pending.iter().map(|u| {
                let user = format!("user-{u}");
                let tag = tag.clone();
                let (client, url) = (&client, &url);
                async move {
                    let headers = [("x-user-id", user.as_str()), ("x-test-period", tag.as_str())];
                    let resp = client.get(url, &headers).await;
                    (resp.status, unix_micros() / SECOND_US == period)
                }
            });
            let answers = futures_util::future::join_all(sends).await;
            let mut retry = Vec::new();
            for (u, (status, in_period)) in pending.iter().zip(answers) {
                assert_eq!(status, 200);
                if in_period {
                    good.insert((*u, tag.clone()));
                } else {
                    retry.push(*u);
                }
            }
            pending = retry;
        }
        let seen = app.seen();
        for s in seen.iter().filter(|s| s.path == "/stamp") {
            let user: usize = s.headers["x-user-id"].to_str().unwrap()[5..].parse().unwrap();
            let tag = s.headers["x-test-period"].to_str().unwrap().to_owned();
            if !good.contains(&(user, tag)) {
                continue; // another period's, or answered after the period ended
            }
            let level: u8 = s.headers["x-user-priority"].to_str().unwrap().parse().unwrap();
            assert_eq!(s.headers["x-business-priority"], "10", "one business class");
            let previous = levels.insert((user, period), level);
            assert!(previous.is_none_or(|p| p == level), "one level per user and period");
        }
    }
    let complete: Vec<usize> = (0..USERS)
        .filter(|u| (first..first + N + 1).all(|p| levels.contains_key(&(*u, p))))
        .collect();
    assert!(
        complete.len() >= USERS * 3 / 4,
        "only {} users stamped in every period",
        complete.len()
    );
    let cut = 43u8; // about a third of the levels admitted, as at 3x overload
    for &u in &complete {
        let mut cycle: Vec<u8> = (first..first + N).map(|p| levels[&(u, p)]).collect();
        // Every slot once: the levels are the base plus 0, 32, 64 and 96 (mod 128).
        assert!(cycle.iter().all(|l| l % 32 == cycle[0] % 32), "user {u}: {cycle:?}");
        cycle.sort_unstable();
        cycle.dedup();
        assert_eq!(cycle.len(), N as usize, "user {u} visits every slot once");
        // Under any cut, one or two admitted periods of four (43 * 4 / 128 = 1.3).
        let admitted = (first..first + N).filter(|p| levels[&(u, *p)] < cut).count();
        assert!((1..=2).contains(&admitted), "user {u}: admitted in {admitted} of {N} periods");
    }
    let refused = |p: u64| -> HashSet<usize> {
        complete.iter().copied().filter(|u| levels[&(*u, p)] >= cut).collect()
    };
    for p in first..first + N {
        let (before, after) = (refused(p), refused(p + 1));
        let jaccard =
            before.intersection(&after).count() as f64 / before.union(&after).count() as f64;
        assert!(
            jaccard < 0.9,
            "re-key {p} -> {}: the refused set barely moved (Jaccard {jaccard:.2})",
            p + 1
        );
    }
}

/// Soak: a 14 s load whose bounds (a spread under 10 points where independent keys would give
/// ~14) are figures a busy machine can move. The schedule's own properties, exact, are the
/// default run's (`each_user_visits_every_slot_once_per_cycle_and_the_refused_set_moves`,
/// through the same header path).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "soak"]
async fn under_3x_overload_users_are_refused_evenly_and_in_turn_soak() {
    // An app of 2 workers x 20 ms (100/s) behind the entry, 300/s offered by 60 users taking
    // turns, re-keyed every second in cycles of 12; one whole cycle is measured after a
    // lead-in of at least 2 s.
    const USERS: u32 = 60;
    const N: u64 = 12;
    let backend =
        CapacityBackend::start(BackendConfig::new(2, Duration::from_millis(20))).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let weir = entry(backend.addr(), &dir, &table(1, N as u32), |c| {
        c.inbound.max_inflight = 2;
    });
    let cycle_us = N * SECOND_US;
    let from_us = (unix_micros() + 2 * SECOND_US).div_ceil(cycle_us) * cycle_us;
    until_unix(from_us - 2 * SECOND_US).await;
    let duration =
        Duration::from_micros(from_us + cycle_us - unix_micros()) + Duration::from_millis(100);
    let mut spec =
        LoadSpec::new(weir.inbound_addr(), vec![Phase { rate_per_sec: 300.0, duration }]);
    spec.classes = vec![ClassSpec { name: "all".into(), business: 10, weight: 1.0 }];
    spec.users = USERS;
    spec.users_round_robin = true;
    spec.send_priority_headers = false;
    let run = LoadRun::start(spec).unwrap();
    let recorder = run.recorder().clone();
    tokio::time::timeout(duration + Duration::from_secs(10), run.finish())
        .await
        .expect("the load ends")
        .unwrap();
    let a = analyse(
        &recorder.user_events(),
        USERS,
        Duration::from_micros(from_us),
        Duration::from_secs(1),
        N as u32,
    );
    let success = a.ok as f64 / a.sent.max(1) as f64;
    eprintln!(
        "sent {}, success {success:.2}, spread {:?}, Jaccard {:?}",
        a.sent, a.spread, a.jaccard_quantiles
    );
    assert!(a.sent > 2000, "sent {}", a.sent);
    assert!((0.1..0.8).contains(&success), "the entry must shed part of 3x: success {success:.2}");
    // The refused set moves at (nearly) every re-key: the controller can open fully for a
    // moment on a busy machine, so allow two boundaries of eleven without a change.
    let moved = a.boundaries.iter().filter(|b| b.jaccard < 0.95).count();
    assert!(
        moved + 2 >= a.boundaries.len(),
        "refused set moved at {moved} of {} re-keys: {:#?}",
        a.boundaries.len(),
        a.boundaries
    );
    // Over one cycle of 12 the ideal spread is one period (8 points); independent keys
    // would give a standard deviation of ~14 points over 12 periods. Generous bounds.
    assert!(a.spread.stddev_pp < 10.0, "per-user spread {:#?}", a.spread);
    assert!(a.spread.max_abs_dev_pp < 30.0, "per-user spread {:#?}", a.spread);
}
