//! Measurement (ignored by default; run it by name): the priority table's `size_grade`
//! behind the real entry sidecar, with request sizes clustered tightly around 3 kB and
//! twice the app's capacity offered. With one grade per doubling (`sub_bits: 0`) most of
//! the traffic sits behind one notch of the dial; with `sub_bits: 7` the level can cut
//! close to the share the capacity requires.
//!
//! `cargo test -p proxy --test e2e size_grade_dial -- --ignored --nocapture`

use crate::support;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::{rngs::StdRng, SeedableRng};
use rand_distr::{Distribution, LogNormal};
use support::backend::Backend;

const SERVICE: Duration = Duration::from_millis(10);
const MAX_INFLIGHT: usize = 4;
const OFFERED_PER_SEC: u64 = 800; // capacity 4 / 10 ms = 400/s: 2x
const RUN: Duration = Duration::from_secs(24);
const SETTLED_AFTER: Duration = Duration::from_secs(12);

struct Counts {
    sent: AtomicU64,
    ok: AtomicU64,
    shed: AtomicU64,
    other: AtomicU64,
}

async fn run(sub_bits: u8) -> Vec<(u64, u64, u64)> {
    let app = Backend::start().await;
    app.set_service_time(SERVICE);
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("table.yaml");
    std::fs::write(
        &table,
        format!(
            "default_business: 200\nrules:\n  - {{ name: login, match: {{ path: /login }}, business: 0 }}\n\
             size_grade: {{ business: 100, min_bytes: 64, max_bytes: 1048576, sub_bits: {sub_bits} }}\n"
        ),
    )
    .unwrap();
    let weir = support::sidecar(app.addr, |c| {
        c.inbound.entry = true;
        c.admin.allow_empty_user_secret = true;
        c.admin.table_file = Some(table);
        c.inbound.max_inflight = MAX_INFLIGHT;
        // A fixed limit, so the capacity is exactly MAX_INFLIGHT / SERVICE.
        c.inbound.adaptive_inflight = false;
        c.inbound.threads = 2;
        c.admission.window = Duration::from_millis(250);
    });
    let url = format!("http://{}/slow", weir.inbound_addr());
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let sizes = LogNormal::new((3000f64).ln(), 0.2).unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    let bins = (RUN.as_secs()) as usize;
    let per_sec: Arc<Vec<Counts>> = Arc::new(
        (0..bins)
            .map(|_| Counts {
                sent: AtomicU64::new(0),
                ok: AtomicU64::new(0),
                shed: AtomicU64::new(0),
                other: AtomicU64::new(0),
            })
            .collect(),
    );
    let started = Instant::now();
    let gap = Duration::from_secs(1) / OFFERED_PER_SEC as u32;
    let mut next = Instant::now();
    let mut tasks = Vec::new();
    while started.elapsed() < RUN {
        next += gap;
        tokio::time::sleep_until(next.into()).await;
        let bin = (started.elapsed().as_secs() as usize).min(bins - 1);
        let len = (sizes.sample(&mut rng) as usize).max(1);
        let req = http::Request::post(&url)
            .header("x-request-timeout-ms", "500")
            .body(Full::new(Bytes::from(vec![b'x'; len])))
            .unwrap();
        let (client, counts) = (client.clone(), per_sec.clone());
        counts[bin].sent.fetch_add(1, Relaxed);
        tasks.push(tokio::spawn(async move {
            let outcome = tokio::time::timeout(Duration::from_secs(2), async {
                let resp = client.request(req).await.ok()?;
                let status = resp.status();
                resp.into_body().collect().await.ok()?;
                Some(status)
            })
            .await
            .ok()
            .flatten();
            let c = &counts[bin];
            match outcome.map(|s| s.as_u16()) {
                Some(200) => c.ok.fetch_add(1, Relaxed),
                Some(503) => c.shed.fetch_add(1, Relaxed),
                _ => c.other.fetch_add(1, Relaxed),
            };
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    per_sec
        .iter()
        .map(|c| {
            (
                c.ok.load(Relaxed),
                c.shed.load(Relaxed),
                c.sent.load(Relaxed) - c.ok.load(Relaxed) - c.shed.load(Relaxed),
            )
        })
        .collect()
}

fn summary(label: &str, bins: &[(u64, u64, u64)]) {
    let settled = &bins[SETTLED_AFTER.as_secs() as usize..];
    let shed: Vec<f64> = settled
        .iter()
        .map(|&(ok, shed, other)| shed as f64 / (ok + shed + other).max(1) as f64)
        .collect();
    let mean = shed.iter().sum::<f64>() / shed.len() as f64;
    let sd = (shed.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / shed.len() as f64).sqrt();
    let goodput = settled.iter().map(|b| b.0).sum::<u64>() as f64 / settled.len() as f64;
    let other: u64 = settled.iter().map(|b| b.2).sum();
    let (lo, hi) = shed.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &s| (lo.min(s), hi.max(s)));
    println!(
        "{label}: settled shed mean {:.1}% (ideal 50%), sd {:.1} pp, per-second range {:.1}..{:.1}%, \
         goodput {goodput:.0}/s (capacity {}/s), timeouts/errors {other}",
        mean * 100.0,
        sd * 100.0,
        lo * 100.0,
        hi * 100.0,
        MAX_INFLIGHT as u64 * 1000 / SERVICE.as_millis() as u64
    );
    for (i, (ok, shed, other)) in bins.iter().enumerate() {
        println!("  {label} t={i:>2}s ok {ok:>4} shed {shed:>4} other {other:>3}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement; run by name"]
async fn size_grade_dial_with_clustered_sizes() {
    let coarse = run(0).await;
    let fine = run(7).await;
    summary("sub_bits 0", &coarse);
    summary("sub_bits 7", &fine);
}
