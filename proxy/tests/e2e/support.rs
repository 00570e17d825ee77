//! Shared pieces of the end-to-end tests. The apps, clients and misbehaving peers are the
//! harness library's (`weir_harness::support`, re-exported here under the names the tests
//! use); what needs this crate is here: an in-process weir sidecar, and the `weir` binary
//! this package builds, run as a child that reports the ports it bound.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub use weir_harness::support::{
    backend, big_valid_table, client, eventually, grpc_codec, metrics_text, sample, WeirProcess,
    EDGE_ENTRY_TABLE,
};
use weir_proxy::{Sidecar, SidecarConfig};

/// The tests that load the CPU, or measure time or CPU under a load they make, take turns:
/// they share this process (and, in CI, two cores), and one test's load would otherwise show
/// up in another's figures (a middle hop's queue built by a neighbour's overload, a parse
/// another test times).
pub static CPU_HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The harness's misbehaving peers, and the sidecar the protocol-edge tests put them before.
pub mod misbehaving {
    pub use weir_harness::support::misbehaving::*;

    use std::net::SocketAddr;
    use std::time::Duration;

    use weir_proxy::{Sidecar, SidecarConfig};

    /// A sidecar in front of `app`. Requests without a deadline get
    /// 10 s (not the default 500 ms), and a long wait under overload is not cut
    /// (`overload_max_wait: 0`), so a well-behaved caller stuck behind a misbehaving one shows
    /// up as "not answered in time" rather than as one of weir's own refusals: these tests are
    /// about the data plane's bounds, not about admission control.
    pub fn edge_sidecar(app: SocketAddr, tweak: impl FnOnce(&mut SidecarConfig)) -> Sidecar {
        super::sidecar(app, |c| {
            c.inbound.task_timeout = Duration::from_secs(10);
            c.inbound.overload_max_wait = Duration::ZERO;
            tweak(c);
        })
    }
}

/// A sidecar in front of `app` on ephemeral ports, with `tweak` applied to the embedded
/// default configuration.
pub fn sidecar(app: SocketAddr, tweak: impl FnOnce(&mut SidecarConfig)) -> Sidecar {
    sidecar_with_defaults(app, |config| {
        // These tests pin exact in-flight counts; the adaptive limit (the default) would move
        // them. It has its own tests (admission-core, and inbound_adaptive.rs, which runs
        // with the shipped default through `sidecar_with_defaults`).
        config.inbound.adaptive_inflight = false;
        tweak(config);
    })
}

/// A sidecar in front of `app` on ephemeral ports with the embedded default configuration
/// (the adaptive in-flight limit on), only what several sidecars in one test process need
/// changed, then `tweak`.
pub fn sidecar_with_defaults(app: SocketAddr, tweak: impl FnOnce(&mut SidecarConfig)) -> Sidecar {
    let mut config = SidecarConfig::load(None).expect("embedded default");
    config.inbound.listen = "127.0.0.1:0".parse().unwrap();
    config.admin.listen = "127.0.0.1:0".parse().unwrap();
    config.inbound.app = app;
    config.inbound.threads = 1;
    // See `InboundConfig::work_stealing`: several sidecars per process need it.
    config.inbound.work_stealing = true;
    config.inbound.shutdown_grace = Duration::from_secs(2);
    config.log.filter = "warn".into();
    tweak(&mut config);
    weir_proxy::telemetry::init_logging(&config.log);
    Sidecar::start(config).expect("sidecar starts")
}

/// The `weir` binary of this package, built by cargo for this test (never by the test).
pub fn weir_binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_weir"))
}

/// `weir run ARGS... --ready-file FILE`, ready: every listener bound (wherever the
/// configuration and `args` say; port 0 for any free one) and `/ready` answering 200.
/// stdin and stdout are closed; stderr (warnings only, `RUST_LOG=warn`) is kept in a file,
/// [`WeirProcess::stderr`].
pub async fn weir_run(args: &[&str]) -> WeirProcess {
    let mut command = Command::new(weir_binary());
    command.arg("run").args(args).env("RUST_LOG", "warn");
    command.stdin(Stdio::null()).stdout(Stdio::null());
    WeirProcess::start(command, weir_harness::weir_process::START_WITHIN)
        .await
        .unwrap_or_else(|e| panic!("weir run {args:?}: {e}"))
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
