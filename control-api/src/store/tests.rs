use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;

use admission_core::table::{RequestView, Rule, RuleMatch};

use super::*;

struct Req(&'static str);

impl RequestView for Req {
    fn method(&self) -> &str {
        "GET"
    }
    fn path(&self) -> &str {
        self.0
    }
    fn host(&self) -> Option<&str> {
        None
    }
    fn header(&self, _: &str) -> Option<&[u8]> {
        None
    }
}

/// Every rule and the default map to `version % 200`, so a classification carries the
/// version of the table that produced it.
fn table_for(version: u64) -> PriorityTable {
    let business = (version % 200) as u8;
    let mut table = PriorityTable::empty();
    table.default_business = business;
    table.rules = ["/a", "/b", "/c"]
        .iter()
        .map(|p| Rule {
            name: p.to_string(),
            matches: RuleMatch { path: Some(p.to_string()), ..RuleMatch::default() },
            business,
        })
        .collect();
    table
}

#[test]
fn if_match_mismatch_and_invalid_tables_leave_the_table_alone() {
    let store = TableStore::new(table_for(1).compile().unwrap());
    assert_eq!(store.version(), 0);
    let r = store.swap(table_for(1), Some(7), |_| Ok::<_, ()>(()));
    assert!(matches!(r, Err(SwapError::VersionMismatch { expected: 7, current: 0 })));
    let mut bad = table_for(1);
    bad.rules[1].name = "/a".into();
    assert!(matches!(store.swap(bad, Some(0), |_| Ok::<_, ()>(())), Err(SwapError::Invalid(_))));
    let r = store.swap(table_for(1), Some(0), |_| Err("disk full"));
    assert!(matches!(r, Err(SwapError::Persist("disk full"))));
    assert_eq!(store.version(), 0);
    let swapped = store.swap(table_for(1), Some(0), |_| Ok::<_, ()>(())).unwrap();
    assert_eq!((swapped.version(), store.version()), (1, 1));
}

#[test]
fn racing_swaps_with_the_same_if_match_have_exactly_one_winner() {
    for _ in 0..50 {
        let store = TableStore::new(table_for(0).compile().unwrap());
        let barrier = Barrier::new(2);
        let wins: Vec<bool> = std::thread::scope(|s| {
            let racers: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        store.swap(table_for(1), Some(0), |_| Ok::<_, ()>(())).is_ok()
                    })
                })
                .collect();
            racers.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(wins.iter().filter(|w| **w).count(), 1, "{wins:?}");
        assert_eq!(store.version(), 1);
    }
}

#[test]
fn readers_see_whole_tables_during_100_swaps() {
    let store = TableStore::new(table_for(0).compile().unwrap());
    let done = AtomicBool::new(false);
    let checked = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                let paths = ["/a", "/b", "/c", "/other"];
                while !done.load(Ordering::Relaxed) {
                    let table = store.load();
                    let want = (table.version() % 200) as u8;
                    for p in paths {
                        let got = table.classify(&Req(p)).business;
                        assert_eq!(got, want, "path {p} in version {}", table.version());
                    }
                    checked.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        for v in 1..=100 {
            store.swap(table_for(v), Some(v - 1), |_| Ok::<_, ()>(())).unwrap();
            std::thread::yield_now();
        }
        // On a busy machine the swaps may all be done before a reader ran: let them read
        // (the last table) before they stop, so the test checks something.
        while checked.load(Ordering::Relaxed) < 3 {
            std::thread::yield_now();
        }
        done.store(true, Ordering::Relaxed);
    });
    assert_eq!(store.version(), 100);
    assert!(checked.load(Ordering::Relaxed) > 0);
}
