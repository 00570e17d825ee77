//! The egress hot path allocates nothing: `should_refuse` and `level`, and `observe` of
//! an authority that already has a slot (or of bad values), counted by a global allocator
//! wrapper. Its own test binary, so no other test allocates concurrently.

#![allow(unsafe_code)] // implementing GlobalAlloc is unsafe by definition

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use admission_core::downstream::DownstreamLevels;
use admission_core::{ManualClock, Priority};

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
fn the_egress_hot_path_does_not_allocate() {
    let clock = ManualClock::new();
    let levels = DownstreamLevels::new(Duration::from_secs(2), 8, clock.clone());
    levels.observe("b.svc:8080", [&b"3.64"[..]]);
    let probes: Vec<Priority> =
        (0..=255u8).flat_map(|b| [0u8, 64, 127].map(|u| Priority::new(b, u).unwrap())).collect();

    COUNTING.with(|c| c.set(true));
    let mut refused = 0;
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
    COUNTING.with(|c| c.set(false));

    assert!(refused > 0);
    assert_eq!(ALLOCATIONS.load(SeqCst), 0, "the egress hot path allocated");
}
