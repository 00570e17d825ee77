//! Cost of classifying a request on the request path: `TableStore::load()` + `classify`.
//!
//! `cargo bench -p control-api --bench classify`

use std::hint::black_box;

use admission_core::table::{PriorityTable, RequestView};
use control_api::TableStore;
use criterion::{criterion_group, criterion_main, Criterion};

struct Req {
    method: &'static str,
    path: &'static str,
}

impl RequestView for Req {
    fn method(&self) -> &str {
        self.method
    }
    fn path(&self) -> &str {
        self.path
    }
    fn host(&self) -> Option<&str> {
        Some("api.example.com")
    }
    fn header(&self, name: &str) -> Option<&[u8]> {
        (name == "x-client-kind").then_some(b"background".as_slice())
    }
}

/// `n` endpoint rules (exact paths, indexed) plus a few prefix and header rules.
fn large_table(n: usize) -> PriorityTable {
    let mut yaml = String::from("rules:\n");
    for i in 0..n {
        yaml.push_str(&format!(
            "  - {{ name: e{i}, match: {{ method: GET, path: /api/v1/endpoint/{i} }}, business: {} }}\n",
            i % 200
        ));
    }
    for i in 0..8 {
        yaml.push_str(&format!(
            "  - {{ name: p{i}, match: {{ path_prefix: /static/{i}/ }}, business: 150 }}\n"
        ));
    }
    yaml.push_str("  - { name: bg, match: { path_prefix: /api/feed, header: { x-client-kind: background } }, business: 40 }\n");
    PriorityTable::from_yaml(&yaml).unwrap()
}

fn bench(c: &mut Criterion) {
    let small = TableStore::new(PriorityTable::embedded_default().compile().unwrap());
    let large = TableStore::new(large_table(1000).compile().unwrap());
    let requests = [
        ("login", Req { method: "POST", path: "/api/login" }),
        ("prefix", Req { method: "GET", path: "/api/pay/123" }),
        ("no_match", Req { method: "GET", path: "/unknown/path?q=1" }),
    ];
    for (name, req) in &requests {
        c.bench_function(&format!("embedded_table/{name}"), |b| {
            b.iter(|| black_box(small.load().classify(black_box(req))))
        });
    }
    let hits = [
        ("exact_hit", Req { method: "GET", path: "/api/v1/endpoint/777" }),
        ("header_rule", Req { method: "GET", path: "/api/feed/x" }),
        ("no_match", Req { method: "GET", path: "/unknown/path" }),
    ];
    for (name, req) in &hits {
        c.bench_function(&format!("1000_rules/{name}"), |b| {
            b.iter(|| black_box(large.load().classify(black_box(req))))
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
