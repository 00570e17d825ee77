//! The request-path use of the table allocates nothing: `TableStore::load()` +
//! `classify` (scan and path index) and the user hash. Counted by a global allocator
//! wrapper in its own test binary, on this test's thread only.

#![allow(unsafe_code)] // implementing GlobalAlloc is unsafe by definition

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use admission_core::table::{PriorityTable, RequestView};
use control_api::TableStore;

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
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

struct Req {
    method: &'static str,
    path: String,
}

impl RequestView for Req {
    fn method(&self) -> &str {
        self.method
    }
    fn path(&self) -> &str {
        &self.path
    }
    fn host(&self) -> Option<&str> {
        Some("API.example.com:443")
    }
    fn header(&self, name: &str) -> Option<&[u8]> {
        (name == "x-client-kind").then_some(b"background".as_slice())
    }
}

#[test]
fn load_and_classify_do_not_allocate() {
    let mut indexed = String::from("rules:\n");
    for i in 0..50 {
        indexed
            .push_str(&format!("  - {{ name: e{i}, match: {{ path: /e/{i} }}, business: {i} }}\n"));
    }
    indexed
        .push_str("  - { name: h, match: { host: api.example.com, method: PUT }, business: 60 }\n");
    let stores = [
        TableStore::new(PriorityTable::embedded_default().compile_with_secret(b"k").unwrap()),
        TableStore::new(PriorityTable::from_yaml(&indexed).unwrap().compile().unwrap()),
    ];
    let requests: Vec<Req> =
        ["/api/login", "/api/pay/1", "/api/feed/x", "/e/7", "/e/49?x=1", "/none"]
            .iter()
            .flat_map(|p| ["GET", "POST", "PUT"].map(|method| Req { method, path: p.to_string() }))
            .collect();
    // Warm up: arc-swap registers this thread on its first load.
    let mut sink = stores.iter().map(|s| s.load().version()).sum::<u64>();
    let before = ALLOCATIONS.load(SeqCst);
    COUNTING.with(|c| c.set(true));
    for i in 0..10_000u64 {
        for store in &stores {
            let table = store.load();
            let req = &requests[i as usize % requests.len()];
            let c = table.classify(req);
            sink += c.business as u64 + c.rule.unwrap_or(0) as u64;
            sink += table.user_hasher().user_priority(b"user-42", Duration::from_secs(i)) as u64;
            sink += table.produces(c.business) as u64 + table.least_important_business() as u64;
        }
    }
    COUNTING.with(|c| c.set(false));
    let allocations = ALLOCATIONS.load(SeqCst) - before;
    assert_eq!(allocations, 0, "request path allocated {allocations} times (sink {sink})");
}
