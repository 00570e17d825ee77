//! Shared pieces of the inbound end-to-end tests: a real hyper app (HTTP/1.1 and h2c on one
//! port) that records what reaches it, clients, and an in-process weir sidecar.
#![allow(dead_code)]

pub mod backend;
pub mod client;
pub mod grpc_codec;
pub mod misbehaving;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use weir_proxy::{Sidecar, SidecarConfig};

/// A sidecar in front of `app` on ephemeral ports, with `tweak` applied to the embedded
/// default configuration.
pub fn sidecar(app: SocketAddr, tweak: impl FnOnce(&mut SidecarConfig)) -> Sidecar {
    let mut config = SidecarConfig::load(None).expect("embedded default");
    config.inbound.listen = "127.0.0.1:0".parse().unwrap();
    config.admin.listen = "127.0.0.1:0".parse().unwrap();
    config.inbound.app = app;
    config.inbound.threads = 1;
    // See `InboundConfig::work_stealing`: several sidecars per process need it.
    config.inbound.work_stealing = true;
    config.inbound.shutdown_grace = Duration::from_secs(2);
    config.log.filter = "warn".into();
    // These tests pin exact in-flight counts; the adaptive limit (the default) would move
    // them. It has its own tests (admission-core, and inbound_adaptive.rs opts back in).
    config.inbound.adaptive_inflight = false;
    tweak(&mut config);
    weir_proxy::telemetry::init_logging(&config.log);
    Sidecar::start(config).expect("sidecar starts")
}

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

/// The value of one Prometheus sample line (`name{labels} value`), 0 if absent.
pub fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok()).flatten()
        })
        .unwrap_or(0.0)
}

/// The `weir` binary next to this test's target directory, built if needed.
pub fn weir_binary() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(build_weir).clone()
}

fn build_weir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).unwrap().to_path_buf();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "-q", "-p", "proxy", "--bin", "weir"])
        .stdout(Stdio::null())
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building weir");
    let bin = profile_dir.join("weir");
    assert!(bin.exists(), "{} exists", bin.display());
    bin
}

/// Runs the `weir` binary with `args`, returning its exit code and stderr; a process still running after `wait` is killed (`None`).
pub fn run_weir(args: &[&str], wait: Duration) -> (Option<i32>, String) {
    let mut child = Command::new(weir_binary())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("weir starts");
    let deadline = Instant::now() + wait;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stderr = String::new();
    use std::io::Read as _;
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    (status.and_then(|s| s.code()), stderr)
}
