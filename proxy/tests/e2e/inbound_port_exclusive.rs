//! A second process cannot silently share a taken inbound port. weir's per-thread
//! listeners use SO_REUSEPORT, which lets any process of the same user bind a listening
//! port and then take a share of its new connections: a second weir started by mistake
//! (or an old one that never exited) would quietly serve half the pod's traffic. weir
//! probes the port without SO_REUSEPORT first and refuses to start, naming it.

use crate::support;

use std::io::Read as _;
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::WeirProcess;
use weir_harness::weir_process::START_WITHIN;

fn command(dir: &std::path::Path, name: &str, inbound: SocketAddr, threads: usize) -> Command {
    let config = dir.join(format!("{name}.yaml"));
    std::fs::write(&config, format!("inbound:\n  threads: {threads}\n")).unwrap();
    let mut command = Command::new(support::weir_binary());
    command
        .args(["run", "--config", config.to_str().unwrap()])
        .args(["--inbound", &inbound.to_string(), "--admin", "127.0.0.1:0", "--app", "127.0.0.1:9"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// Waits for `child` to exit within `within`; its exit code and stderr.
fn exited(mut child: Child, within: Duration) -> Option<(i32, String)> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            return Some((status.code().unwrap_or(-1), err));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

#[test]
fn a_second_weir_on_a_taken_inbound_port_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    // The first one: two threads, so its listeners carry SO_REUSEPORT; on a port of the
    // kernel's choosing, which its ready file names.
    let any_port = "127.0.0.1:0".parse().unwrap();
    let mut first =
        WeirProcess::start_blocking(command(dir.path(), "first", any_port, 2), START_WITHIN)
            .expect("the first weir starts");
    let port = first.listeners.inbound;
    // A second one, per-thread listeners too (the case SO_REUSEPORT would let through),
    // and one with a single listener.
    for threads in [2, 1] {
        let second = command(dir.path(), "second", port, threads).spawn().unwrap();
        let (code, err) = exited(second, Duration::from_secs(30)).unwrap_or_else(|| {
            panic!("threads {threads}: the second weir shares {port} and serves")
        });
        assert_eq!(code, 1, "threads {threads}: {err}");
        let last = err.trim_end().lines().last().unwrap_or("");
        assert!(last.starts_with(&format!("weir: inbound.listen {port}: ")), "{err}");
        if threads > 1 {
            assert!(last.contains("in use by another process"), "{err}");
        }
    }
    // The first one still holds the port alone.
    assert!(first.child().try_wait().unwrap().is_none(), "the first weir exited");
    TcpStream::connect(port).expect("the first weir still accepts");
}
