//! The hot path allocates nothing: `admit`, `record_queuing`, `tick` (including window
//! rollovers), `level`, the header codecs, the audit counters and the size grade, counted
//! by a global allocator wrapper. Its own test binary, so no other test allocates
//! concurrently; one test function for the same reason.

#![allow(unsafe_code)] // implementing GlobalAlloc is unsafe by definition

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use admission_core::audit::{AuditCounters, Outcome};
use admission_core::priority::{parse_business, parse_user};
use admission_core::size_grade::{SizeGrade, SizeGradeConfig};
use admission_core::{
    residence_gate, AdmissionEngine, AdmissionLevel, EngineConfig, Law, ManualClock, Priority,
};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Only this test's thread is counted: the harness allocates on its own threads.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        ALLOCATIONS.fetch_add(1, SeqCst);
    }
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
    for law in [Law::Dagor, Law::Goodput] {
        let cfg = EngineConfig { law, window_requests: 500, ..EngineConfig::default() };
        let engine = AdmissionEngine::new(&cfg, ManualClock::new());
        let audit = AuditCounters::new();
        let grade = SizeGrade::new(&SizeGradeConfig::default()).expect("valid");
        let before = ALLOCATIONS.load(SeqCst);
        COUNTING.with(|c| c.set(true));
        let mut sink = 0u64;
        for i in 0..20_000u64 {
            let p = Priority { business: (i % 3) as u8, user: (i % 128) as u8 };
            let d = engine.admit(p);
            // Overloaded half the time, so the level moves and windows roll over.
            let waited = if (i / 2_000) % 2 == 1 { 50 } else { 1 };
            engine.record_queuing(Duration::from_millis(waited));
            engine.clock().advance(Duration::from_micros(300));
            engine.tick();
            audit.record(p.business, Outcome::Admitted);
            let level = engine.level();
            sink += level.encode().as_bytes().len() as u64;
            sink += AdmissionLevel::parse(level.encode().as_bytes()).is_ok() as u64;
            sink += parse_business(b"17").unwrap_or(0) as u64 + parse_user(b"x").is_err() as u64;
            sink += grade.priority(i * 37).user as u64;
            sink += residence_gate(0, i, 1_000, 500) as u64 + d as u64;
        }
        COUNTING.with(|c| c.set(false));
        let allocations = ALLOCATIONS.load(SeqCst) - before;
        assert!(engine.windows_closed() >= 30, "rollovers must be exercised");
        assert!(engine.level() < AdmissionLevel::FULLY_OPEN, "the level must have moved");
        assert_eq!(allocations, 0, "{law:?}: hot path allocated {allocations} times (sink {sink})");
    }
}
