//! A first chain measurement (not yet the full issue-11 runner): load -> weir A's egress ->
//! weir B's inbound -> app B, B's capacity the bottleneck at 3x, one important class
//! (business 1, 40/s) and one unimportant (business 5, 260/s, users spread), run with
//! propagation on (egress caches B's level) and off (`egress.max_authorities: 0`: nothing
//! cached, B refuses everything itself). Prints where refusals happen, what B received and
//! refused, and each class's success. Missing from the runner: the entry sidecar in
//! front and app A doing real work between the hops.
//!
//! `cargo run -p weir-tests --example chain_propagation -- [SECONDS]`

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::backend::Backend;
use support::client::Http1;

const SERVICE: Duration = Duration::from_millis(20);
const B_INFLIGHT: usize = 2;
const CLASSES: [(u8, Duration); 2] =
    [(1, Duration::from_millis(25)), (5, Duration::from_micros(3846))];

#[derive(Default, Debug)]
struct Counts {
    ok: AtomicU64,
    at_egress: AtomicU64,
    at_b: AtomicU64,
    other: AtomicU64,
}

async fn run(propagation: bool, length: Duration) {
    let app_b = Backend::start().await;
    app_b.set_service_time(SERVICE);
    let b = support::sidecar(app_b.addr, |c| {
        c.inbound.max_inflight = B_INFLIGHT;
        c.admission.window = Duration::from_millis(200);
    });
    let b_addr = b.inbound_addr();
    let unused = Backend::start().await;
    let a = support::sidecar(unused.addr, |c| {
        c.egress.enabled = true;
        c.egress.listen = "127.0.0.1:0".parse().unwrap();
        if !propagation {
            c.egress.max_authorities = 0;
        }
    });
    let egress = a.egress().unwrap().addr();
    let client = Http1::new();
    let counts: Vec<Arc<Counts>> = CLASSES.iter().map(|_| Arc::default()).collect();
    let mut tasks = Vec::new();
    for (i, &(business, interval)) in CLASSES.iter().enumerate() {
        let (client, counts) = (client.clone(), counts[i].clone());
        tasks.push(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let end = Instant::now() + length;
            let mut inflight = Vec::new();
            let mut n = 0u64;
            while Instant::now() < end {
                ticks.tick().await;
                n += 1;
                let (client, counts) = (client.clone(), counts.clone());
                let user = ((n * 37) % 128).to_string();
                inflight.push(tokio::spawn(async move {
                    let (business, host) = (business.to_string(), b_addr.to_string());
                    let headers = [
                        ("host", host.as_str()),
                        ("x-business-priority", business.as_str()),
                        ("x-user-priority", user.as_str()),
                    ];
                    let url = format!("http://{egress}/slow");
                    let r =
                        client.send(http::Method::GET, &url, &headers, support::client::empty());
                    let c = match r.await {
                        Ok(r) => match (r.status, r.header("x-weir-shed")) {
                            (200, None) => &counts.ok,
                            (503, Some("downstream-level")) => &counts.at_egress,
                            (503, Some(_)) => &counts.at_b,
                            _ => &counts.other,
                        },
                        Err(_) => &counts.other,
                    };
                    c.fetch_add(1, Relaxed);
                }));
            }
            for t in inflight {
                let _ = t.await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let b_text = support::metrics_text(b.admin_addr()).await;
    let b_series = |outcome: &str| -> f64 {
        b_text
            .lines()
            .filter(|l| l.starts_with("weir_requests_total{role=\"inbound\""))
            .filter(|l| l.contains(&format!("outcome=\"{outcome}\"")))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    };
    let b_received: f64 =
        ["admitted", "shed_overload", "shed_deadline"].iter().map(|o| b_series(o)).sum();
    let b_refused = b_series("shed_overload") + b_series("shed_deadline");
    let get = |c: &Counts| [&c.ok, &c.at_egress, &c.at_b, &c.other].map(|n| n.load(Relaxed));
    let (c1, c5) = (get(&counts[0]), get(&counts[1]));
    let refusals_egress = (c1[1] + c5[1]) as f64;
    let refusals_b = (c1[2] + c5[2]) as f64;
    let succ = |c: [u64; 4]| c[0] as f64 / c.iter().sum::<u64>().max(1) as f64;
    println!(
        "propagation {}: refusals at A's egress {:.1}% of all refusals; B received {b_received:.0}, \
         refused {b_refused:.0} ({:.1}% of what it received; overload {:.0}, deadline {:.0}); \
         success business 1 {:.1}%, business 5 {:.1}%; other answers {}",
        if propagation { "on " } else { "off" },
        100.0 * refusals_egress / (refusals_egress + refusals_b).max(1.0),
        100.0 * b_refused / b_received.max(1.0),
        b_series("shed_overload"),
        b_series("shed_deadline"),
        100.0 * succ(c1),
        100.0 * succ(c5),
        c1[3] + c5[3],
    );
    a.stop();
    b.stop();
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let secs: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(10);
    for propagation in [true, false] {
        run(propagation, Duration::from_secs(secs)).await;
    }
}
