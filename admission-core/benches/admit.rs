//! `admit` + `record_queuing`, the per-request cost of admission, single-threaded and
//! with two threads contending on one engine, against a naive `Mutex` engine.
//!
//! `cargo bench -p admission-core --bench admit`

use std::hint::black_box;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use admission_core::priority::COMPOUND_LEVELS;
use admission_core::{AdmissionEngine, AdmissionLevel, EngineConfig, ManualClock, Priority};
use criterion::{criterion_group, criterion_main, Criterion};

/// The obvious implementation: one lock around the window state.
struct NaiveEngine {
    state: Mutex<NaiveState>,
}

struct NaiveState {
    level: AdmissionLevel,
    histogram: Vec<u32>,
    admitted: u64,
    queuing_sum_ns: u64,
    queuing_count: u32,
}

impl NaiveEngine {
    fn new() -> Self {
        NaiveEngine {
            state: Mutex::new(NaiveState {
                level: AdmissionLevel::FULLY_OPEN,
                histogram: vec![0; COMPOUND_LEVELS],
                admitted: 0,
                queuing_sum_ns: 0,
                queuing_count: 0,
            }),
        }
    }

    fn admit(&self, p: Priority) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.histogram[p.compound() as usize] += 1;
        let ok = s.level.admits(p);
        if ok {
            s.admitted += 1;
        }
        ok
    }

    fn record_queuing(&self, waited: Duration) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.queuing_sum_ns += waited.as_nanos() as u64;
        s.queuing_count += 1;
        if s.queuing_count >= 2000 {
            s.histogram.iter_mut().for_each(|n| *n = 0);
            s.queuing_count = 0;
            s.queuing_sum_ns = 0;
            s.admitted = 0;
        }
    }
}

fn priority(i: u64) -> Priority {
    Priority { business: (i % 3) as u8, user: (i % 128) as u8 }
}

/// Runs `op` `iters` times on each of `threads` threads started together; returns the
/// wall time, so the figure is the per-call latency each thread sees.
fn contended(threads: usize, iters: u64, op: impl Fn(u64) + Send + Sync + 'static) -> Duration {
    let op = Arc::new(op);
    let barrier = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (op, barrier) = (op.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                for i in 0..iters {
                    op(i * threads as u64 + t as u64);
                }
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for h in handles {
        h.join().expect("bench thread");
    }
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    let waited = Duration::from_micros(300);
    let mut g = c.benchmark_group("admit+record_queuing");

    let engine = AdmissionEngine::with_config(&EngineConfig::default());
    let mut i = 0u64;
    g.bench_function("engine/1 thread", |b| {
        b.iter(|| {
            i += 1;
            black_box(engine.admit(black_box(priority(i))));
            engine.record_queuing(black_box(waited));
        })
    });
    let engine2 = AdmissionEngine::with_config(&EngineConfig {
        window_requests: u32::MAX,
        ..EngineConfig::default()
    });
    g.bench_function("engine/1 thread/no rollover", |b| {
        b.iter(|| {
            i += 1;
            black_box(engine2.admit(black_box(priority(i))));
            engine2.record_queuing(black_box(waited));
        })
    });
    g.bench_function("engine/admit only", |b| {
        b.iter(|| {
            i += 1;
            black_box(engine2.admit(black_box(priority(i))));
        })
    });
    let naive = NaiveEngine::new();
    g.bench_function("naive mutex/1 thread", |b| {
        b.iter(|| {
            i += 1;
            black_box(naive.admit(black_box(priority(i))));
            naive.record_queuing(black_box(waited));
        })
    });

    let engine = Arc::new(AdmissionEngine::with_config(&EngineConfig::default()));
    g.bench_function("engine/2 threads", |b| {
        b.iter_custom(|iters| {
            let engine = engine.clone();
            contended(2, iters, move |i| {
                black_box(engine.admit(priority(i)));
                engine.record_queuing(waited);
            })
        })
    });
    let naive = Arc::new(NaiveEngine::new());
    g.bench_function("naive mutex/2 threads", |b| {
        b.iter_custom(|iters| {
            let naive = naive.clone();
            contended(2, iters, move |i| {
                black_box(naive.admit(priority(i)));
                naive.record_queuing(waited);
            })
        })
    });
    g.finish();

    // One window rollover (drain + controller) with three busy classes, for scale: the
    // hot-path figures above include it amortised over 2000 calls.
    let clock = ManualClock::new();
    let engine = AdmissionEngine::new(&EngineConfig::default(), clock.clone());
    c.bench_function("rollover/3 classes", |b| {
        b.iter(|| {
            for i in 0..384 {
                engine.admit(priority(i));
            }
            clock.advance(Duration::from_secs(1));
            engine.tick();
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
