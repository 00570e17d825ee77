//! The hot paths allocate nothing, counted by a global allocator wrapper per thread (so
//! tests running side by side count only their own work):
//! - inbound: `admit`, `record_queuing`, `observe_queue`, `record_completion`, `tick`
//!   (including window rollovers), `level`, the header codecs, the audit counters and the
//!   size grade and the queue policy's dequeue check and service-order bound, under every law;
//! - egress: `should_refuse` and `level`, and `observe` of an authority that already has a
//!   slot (or of bad values).

#![allow(unsafe_code)] // implementing GlobalAlloc is unsafe by definition

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

use admission_core::audit::{AuditCounters, Outcome};
use admission_core::downstream::DownstreamLevels;
use admission_core::priority::{parse_business, parse_user};
use admission_core::queue_policy::{Conditions, QueuePolicy, Waiter};
use admission_core::size_grade::{SizeGrade, SizeGradeConfig};
use admission_core::{AdmissionEngine, AdmissionLevel, EngineConfig, Law, ManualClock, Priority};

struct Counting;

thread_local! {
    /// Allocations of this thread while counting (`None`: not counting). Only a test's own
    /// thread counts: the harness and other tests allocate on theirs.
    static COUNTED: Cell<Option<u64>> = const { Cell::new(None) };
}

fn count() {
    let _ = COUNTED.try_with(|c| c.set(c.get().map(|n| n + 1)));
}

/// Runs `f` and returns how often this thread allocated meanwhile.
fn allocations_in(f: impl FnOnce()) -> u64 {
    COUNTED.with(|c| c.set(Some(0)));
    f();
    COUNTED.with(|c| c.take()).expect("counting")
}

// SAFETY: forwards every call unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn hot_path_does_not_allocate() {
    for law in [Law::Capacity, Law::Dagor, Law::Goodput] {
        let cfg = EngineConfig { law, window_requests: 500, ..EngineConfig::default() };
        let engine = AdmissionEngine::new(&cfg, ManualClock::new());
        let audit = AuditCounters::new();
        let grade = SizeGrade::new(&SizeGradeConfig::default()).expect("valid");
        let policy = QueuePolicy::new(Duration::from_micros(1), Duration::ZERO, false);
        let mut sink = 0u64;
        let allocations = allocations_in(|| {
            for i in 0..20_000u64 {
                let p = Priority { business: (i % 3) as u8, user: (i % 128) as u8 };
                let d = engine.admit(p);
                // Overloaded half the time, so the level moves and windows roll over.
                let waited = if (i / 2_000) % 2 == 1 { 50 } else { 1 };
                engine.record_queuing(Duration::from_millis(waited));
                // The app completes half of what arrives, so the capacity law has to cut.
                if i % 2 == 0 {
                    engine.record_completion();
                }
                // Overloaded, a queue far past what the budget absorbs as a burst.
                let backlog = if waited > 1 { 2_000 } else { 0 };
                engine.observe_queue((i % 7) as usize + backlog, Duration::from_millis(waited));
                engine.clock().advance(Duration::from_micros(300));
                engine.tick();
                audit.record(p.business, Outcome::Admitted);
                let level = engine.level();
                sink += level.encode().as_bytes().len() as u64;
                sink += AdmissionLevel::parse(level.encode().as_bytes()).is_ok() as u64;
                sink +=
                    parse_business(b"17").unwrap_or(0) as u64 + parse_user(b"x").is_err() as u64;
                sink += grade.priority(i * 37).user as u64;
                let waiter = Waiter { priority: p, arrival: 0, deadline: 1_000 };
                let at = Conditions { now: i, level, level_binds: true, typical_app: 10 };
                sink += policy.at_dequeue(&waiter, &at, true) as u64 + d as u64;
                // The service order's bound and the waiter's expiry, asked at every grant.
                let open = Conditions { level_binds: i % 2 == 0, ..at };
                sink += policy.urgent_until(&open).unwrap_or(0) + policy.expiry(&waiter);
            }
        });
        assert!(engine.windows_closed() >= 30, "rollovers must be exercised");
        assert!(engine.level() < AdmissionLevel::FULLY_OPEN, "the level must have moved");
        assert_eq!(allocations, 0, "{law:?}: hot path allocated {allocations} times (sink {sink})");
    }
}

#[test]
fn the_egress_hot_path_does_not_allocate() {
    let clock = ManualClock::new();
    let levels = DownstreamLevels::new(Duration::from_secs(2), 8, clock.clone());
    levels.observe("b.svc:8080", [&b"3.64"[..]]);
    let probes: Vec<Priority> =
        (0..=255u8).flat_map(|b| [0u8, 64, 127].map(|u| Priority::new(b, u).unwrap())).collect();

    let mut refused = 0;
    let allocations = allocations_in(|| {
        for round in 0..100u64 {
            for &p in &probes {
                refused += levels.should_refuse("b.svc:8080", p) as u32;
                refused += levels.should_refuse("unknown:80", p) as u32;
            }
            levels.observe("b.svc:8080", [&b"3.64"[..]]);
            levels.observe("b.svc:8080", [&b"garbage"[..]]);
            levels.observe("b.svc:8080", [&b"1.1"[..], &b"1.1"[..]]);
            let _ = levels.level("b.svc:8080");
            clock.advance(Duration::from_millis(round % 3));
        }
    });
    assert!(refused > 0);
    assert_eq!(allocations, 0, "the egress hot path allocated");
}
