//! `weir run --egress ADDR` as a real process: the egress listener comes up on ADDR and
//! carries an outbound call to its downstream (named by `Host`), which answers through it.

use crate::support;

use std::time::Duration;

use support::backend::Backend;
use support::client::Http1;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weir_run_with_egress_serves_outbound_calls() {
    let downstream = Backend::start().await;
    let app = Backend::start().await;
    let app_addr = app.addr.to_string();
    let weir = support::weir_run(&[
        "--inbound",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--app",
        &app_addr,
        "--egress",
        "127.0.0.1:0",
    ])
    .await;
    let egress = weir.listeners.egress.expect("the ready file names the egress listener");
    let host = downstream.addr.to_string();
    let r = Http1::new()
        .get(
            &format!("http://{egress}/via-egress"),
            &[("host", &host), ("x-business-priority", "2")],
        )
        .await;
    assert_eq!(r.status, 200);
    let seen = downstream.seen_path("/via-egress");
    assert_eq!(seen.len(), 1, "the downstream got the call");
    assert!(app.seen_path("/via-egress").is_empty(), "not the sidecar's own app");
}

/// Each hop takes `deadline_margin` off the budget it passes on: that is what ends a loop the
/// egress cannot see. Zero is refused at start, naming the field.
#[test]
fn a_zero_deadline_margin_exits_64_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "egress:\n  enabled: true\n  deadline_margin: 0ms\n").unwrap();
    let (code, stderr) = support::run_weir(
        &["run", "--config", config.to_str().unwrap(), "--inbound", "127.0.0.1:0"],
        Duration::from_secs(20),
    );
    assert_eq!(code, Some(64), "stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(lines[0].starts_with("weir: egress.deadline_margin: "), "{}", lines[0]);
}
