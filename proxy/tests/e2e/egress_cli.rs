//! `weir run --egress ADDR` as a real process: the egress listener comes up on ADDR and
//! carries an outbound call to its downstream (named by `Host`), which answers through it.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::backend::Backend;
use support::client::Http1;

/// Kills the child on every exit path (a failed assertion included).
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weir_run_with_egress_serves_outbound_calls() {
    let downstream = Backend::start().await;
    let app = Backend::start().await;
    let egress = free_port();
    let child = Command::new(support::weir_binary())
        .args(["run", "--inbound", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(["--app", &app.addr.to_string(), "--egress", &egress.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("weir starts");
    let mut child = Child(child);

    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect_timeout(&egress, Duration::from_millis(100)).is_err() {
        assert!(child.0.try_wait().unwrap().is_none(), "weir exited early");
        assert!(Instant::now() < deadline, "egress listener {egress} never came up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
