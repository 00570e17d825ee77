//! What the egress hot path costs: `DownstreamLevels::should_refuse` against a naive
//! baseline (a `Mutex<HashMap<String, (level, Instant)>>`, the obvious first version), on 1
//! and 2 threads, with 64 cached authorities.
//!
//! `cargo run --release -p admission-core --example downstream_cost`

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use admission_core::downstream::DownstreamLevels;
use admission_core::{AdmissionLevel, MonotonicClock, Priority};

const AUTHORITIES: usize = 64;
const CALLS: u64 = 5_000_000;

struct Naive {
    map: Mutex<HashMap<String, (AdmissionLevel, Instant)>>,
    expiry: Duration,
}

impl Naive {
    fn should_refuse(&self, authority: &str, p: Priority) -> bool {
        let map = self.map.lock().unwrap();
        map.get(authority)
            .filter(|(_, at)| at.elapsed() < self.expiry)
            .is_some_and(|(level, _)| !level.admits(p))
    }
}

/// A `should_refuse` under test.
type Probe = Arc<dyn Fn(&str, Priority) -> bool + Send + Sync>;

fn run(threads: usize, f: Probe) -> f64 {
    let names: Arc<Vec<String>> =
        Arc::new((0..AUTHORITIES).map(|i| format!("svc-{i}.ns.svc.cluster.local:8080")).collect());
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (f, names) = (f.clone(), names.clone());
            std::thread::spawn(move || {
                let mut refused = 0u64;
                for i in 0..CALLS {
                    let name = &names[(i as usize + t) % AUTHORITIES];
                    let p = Priority::new((i % 256) as u8, (i % 128) as u8).unwrap();
                    refused += f(black_box(name), black_box(p)) as u64;
                }
                refused
            })
        })
        .collect();
    let refused: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    black_box(refused);
    start.elapsed().as_nanos() as f64 / (CALLS as f64)
}

fn main() {
    let level = AdmissionLevel::parse(b"100.64").unwrap();
    let cache = Arc::new(DownstreamLevels::new(
        Duration::from_secs(3600),
        AUTHORITIES,
        MonotonicClock::new(),
    ));
    let naive =
        Arc::new(Naive { map: Mutex::new(HashMap::new()), expiry: Duration::from_secs(3600) });
    for i in 0..AUTHORITIES {
        let name = format!("svc-{i}.ns.svc.cluster.local:8080");
        cache.observe(&name, [level.encode().as_bytes()]);
        naive.map.lock().unwrap().insert(name, (level, Instant::now()));
    }
    println!("ns per should_refuse call ({AUTHORITIES} authorities, {CALLS} calls per thread)");
    for threads in [1, 2] {
        let c = cache.clone();
        let n = naive.clone();
        let ours = run(threads, Arc::new(move |a, p| c.should_refuse(a, p)));
        let base = run(threads, Arc::new(move |a, p| n.should_refuse(a, p)));
        println!(
            "threads {threads}: DownstreamLevels {ours:.1} ns, naive Mutex<HashMap> {base:.1} ns ({:.2}x)",
            base / ours
        );
    }
}
