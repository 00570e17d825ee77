//! What the end-to-end tests (`proxy/tests/e2e`) put around a sidecar: a real hyper app that
//! records what reaches it ([`backend`]), real clients ([`client`]), misbehaving peers and
//! apps ([`misbehaving`]), a raw tonic codec ([`grpc_codec`]), bounded polling and the
//! metrics reader. The e2e binary adds the parts that need the proxy crate itself (the
//! in-process sidecar, the `weir` binary) in its own `support` module.

pub mod backend;
pub mod client;
pub mod grpc_codec;
pub mod misbehaving;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

pub use crate::prom::Metrics;
pub use crate::weir_process::{Listeners, WeirProcess};

/// 60 rules of 1,000 header matches each, every rule reachable (~480 KiB): a valid table
/// that is heavy to check (the table-check floods of the e2e tests and the hardening bench).
pub fn big_valid_table() -> String {
    let mut yaml = String::from("rules:\n");
    for r in 0..60 {
        let headers: Vec<String> =
            (0..1000).map(|h| format!("h{h}: {}", if h == 999 { r } else { 0 })).collect();
        yaml.push_str(&format!(
            "  - {{ name: r{r}, business: 1, match: {{ header: {{ {} }} }} }}\n",
            headers.join(", ")
        ));
    }
    yaml
}

/// An entry's table for the edge tests: probes (`/bytes/...`) most important, the hosts of
/// the ambiguous-authority requests classed apart (`shop.example` 30, `admin.example` 1),
/// everything else the least.
pub const EDGE_ENTRY_TABLE: &str = "default_business: 200
rules:
  - name: probes
    match: { path_prefix: /bytes/ }
    business: 0
  - name: shop
    match: { host: shop.example }
    business: 30
  - name: admin
    match: { host: admin.example }
    business: 1
";

/// Polls `cond` every millisecond until it holds or `within` passes.
pub async fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    cond()
}

/// `GET http://admin/metrics`.
pub async fn metrics_text(admin: SocketAddr) -> String {
    let resp = client::Http1::new().get(&format!("http://{admin}/metrics"), &[]).await;
    assert_eq!(resp.status, 200, "metrics endpoint");
    String::from_utf8_lossy(&resp.body).into_owned()
}

/// `GET http://admin/metrics`, parsed.
pub async fn metrics(admin: SocketAddr) -> Metrics {
    Metrics::parse(&metrics_text(admin).await)
}

/// The value of one series (`name{labels}`, every label, in any order), 0 if absent.
pub fn sample(text: &str, series: &str) -> f64 {
    Metrics::parse(text).value(series)
}
