//! `weir run` as the kubelet sees it: the public listener (`admin.public_listen`) answers the
//! probes and the scrape and nothing else, `/ready` fails from SIGTERM on, and with
//! `--drain-delay` the sidecar keeps accepting and serving for that long before it drains.

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::backend::Backend;
use support::WeirProcess;
use weir_harness::weir_process::START_WITHIN;

/// One request on a new connection (`connection: close`): the status code.
fn status(addr: SocketAddr, method: &str, path: &str) -> std::io::Result<u16> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        conn,
        "{method} {path} HTTP/1.1\r\nhost: weir\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    )?;
    let mut response = Vec::new();
    conn.read_to_end(&mut response)?;
    let head = String::from_utf8_lossy(&response);
    head.split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {head:?}")))
}

fn body(addr: SocketAddr, path: &str) -> String {
    let mut conn = TcpStream::connect(addr).unwrap();
    write!(conn, "GET {path} HTTP/1.1\r\nhost: weir\r\nconnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).unwrap();
    response
}

struct Weir {
    process: WeirProcess,
    inbound: SocketAddr,
    public: SocketAddr,
}

impl Weir {
    fn start(dir: &Path, app: SocketAddr, extra: &[&str]) -> Weir {
        let config = dir.join("weir.yaml");
        std::fs::write(
            &config,
            format!(
                "inbound:\n  listen: 127.0.0.1:0\n  app: {app}\n  threads: 1\n  shutdown_grace: 5s\n\
                 admin:\n  listen: 127.0.0.1:0\n  public_listen: 127.0.0.1:0\nlog:\n  filter: warn\n"
            ),
        )
        .unwrap();
        let mut command = Command::new(support::weir_binary());
        command.args(["run", "--config"]).arg(&config).args(extra).stdout(Stdio::null());
        let process = WeirProcess::start_blocking(command, START_WITHIN).expect("weir is ready");
        let (inbound, public) = (process.listeners.inbound, process.listeners.public.unwrap());
        Weir { process, inbound, public }
    }

    fn sigterm(&self) -> Instant {
        self.process.sigterm()
    }

    /// Waits (at most `within`) for the exit; its status and when.
    fn exit_within(&mut self, within: Duration) -> (std::process::ExitStatus, Instant) {
        self.process
            .exit_within(within)
            .unwrap_or_else(|| panic!("weir still running {within:?} after SIGTERM"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_public_listener_answers_probes_and_scrapes_only() {
    let app = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut weir = tokio::task::spawn_blocking({
        let dir = dir.path().to_owned();
        move || Weir::start(&dir, app.addr, &[])
    })
    .await
    .unwrap();
    let public = weir.public;
    assert_eq!(status(public, "GET", "/live").unwrap(), 200);
    assert_eq!(status(public, "GET", "/ready").unwrap(), 200);
    let metrics = body(public, "/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics:.200}");
    assert!(metrics.contains("weir_admission_level"), "the scrape carries weir's metrics");
    // The control API stays on the loopback admin listener: nothing else is routed here.
    for (method, path) in
        [("GET", "/v1/status"), ("GET", "/v1/audit"), ("PUT", "/v1/priority-table")]
    {
        assert_eq!(status(public, method, path).unwrap(), 404, "{method} {path}");
    }
    assert_eq!(status(weir.inbound, "GET", "/through").unwrap(), 200, "serves the app");

    // No drain delay: the exit follows SIGTERM as soon as nothing is in flight.
    let termed = weir.sigterm();
    let (exit, at) = weir.exit_within(Duration::from_secs(10));
    assert!(exit.success(), "{exit:?}");
    assert!(at - termed < Duration::from_secs(2), "exit {:?} after SIGTERM", at - termed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_delay_keeps_serving_while_ready_fails() {
    const DELAY: Duration = Duration::from_millis(1500);
    let app = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (weir, served, ready) = tokio::task::spawn_blocking({
        let dir = dir.path().to_owned();
        move || {
            let mut weir = Weir::start(&dir, app.addr, &["--drain-delay", "1500ms"]);
            let termed = weir.sigterm();
            // Through the delay: /ready fails (after the signal lands), new connections
            // are still accepted and served.
            let (mut served, mut ready) = (Vec::new(), Vec::new());
            while termed.elapsed() < DELAY - Duration::from_millis(400) {
                std::thread::sleep(Duration::from_millis(100));
                served
                    .push(status(weir.inbound, "GET", "/during-delay").map_err(|e| e.to_string()));
                ready.push(status(weir.public, "GET", "/ready").map_err(|e| e.to_string()));
            }
            let (exit, at) = weir.exit_within(Duration::from_secs(15));
            assert!(exit.success(), "{exit:?}");
            let took = at - termed;
            assert!(took >= DELAY - Duration::from_millis(50), "exited {took:?} after SIGTERM");
            assert!(took < DELAY + Duration::from_secs(4), "exited {took:?} after SIGTERM");
            // Once drained, nothing accepts on the inbound port.
            assert!(TcpStream::connect(weir.inbound).is_err(), "inbound closed after the drain");
            (weir, served, ready)
        }
    })
    .await
    .unwrap();
    assert!(served.len() >= 5, "{served:?}");
    assert!(served.iter().all(|s| *s == Ok(200)), "served through the delay: {served:?}");
    // The first check may race the signal's delivery; every later one fails.
    assert!(ready[1..].iter().all(|s| *s == Ok(503)), "/ready during the delay: {ready:?}");
    assert_eq!(app.seen_path("/during-delay").len(), served.len());
    drop(weir);
}

#[test]
fn a_taken_public_port_fails_the_start_naming_the_setting() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("weir.yaml");
    std::fs::write(
        &config,
        format!(
            "inbound:\n  listen: 127.0.0.1:0\n  threads: 1\nadmin:\n  listen: 127.0.0.1:0\n  \
             public_listen: {port}\n"
        ),
    )
    .unwrap();
    let (code, stderr) =
        support::run_weir(&["run", "--config", config.to_str().unwrap()], Duration::from_secs(20));
    assert_eq!(code, Some(1), "{stderr}");
    let last = stderr.trim_end().lines().last().unwrap_or_default();
    assert!(last.starts_with("weir: admin.public_listen"), "{stderr}");
}

/// `--ready-file`: with every listener on port 0, the file names where each one is bound,
/// and it appears only once they all accept and `/ready` answers 200 (it is renamed into
/// place whole). Tests and supervisors learn weir's ports from it instead of picking free
/// ports and hoping they stay free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ready_file_names_every_listener_bound_on_port_0() {
    let app = Backend::start().await;
    let downstream = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("weir.yaml");
    std::fs::write(
        &config,
        format!(
            "inbound:\n  listen: 127.0.0.1:0\n  app: {}\n  threads: 2\n\
             admin:\n  listen: 127.0.0.1:0\n  public_listen: 127.0.0.1:0\n\
             egress:\n  enabled: true\n  listen: 127.0.0.1:0\n  routes:\n    - listen: 127.0.0.1:0\n      target: {}\n\
             log:\n  filter: warn\n",
            app.addr, downstream.addr
        ),
    )
    .unwrap();
    let weir = support::weir_run(&["--config", config.to_str().unwrap()]).await;
    let l = weir.listeners.clone();
    assert_eq!(l.pid, weir.pid());
    let public = l.public.expect("public listener");
    let egress = l.egress.expect("egress listener");
    assert_eq!(l.egress_routes.len(), 1, "{l:?}");
    let route = l.egress_routes[0];
    let mut ports: Vec<u16> =
        [l.inbound, l.admin, public, egress, route].iter().map(|a| a.port()).collect();
    assert!(ports.iter().all(|p| *p != 0), "{l:?}");
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 5, "five listeners, five ports: {l:?}");
    let (admin, inbound) = (l.admin, l.inbound);
    let answers = tokio::task::spawn_blocking(move || {
        [
            status(admin, "GET", "/ready"),
            status(public, "GET", "/ready"),
            status(inbound, "GET", "/through-inbound"),
            status(route, "GET", "/through-route"),
        ]
        .map(|s| s.map_err(|e| e.to_string()))
    })
    .await
    .unwrap();
    assert_eq!(answers, [Ok(200), Ok(200), Ok(200), Ok(200)], "{}", weir.stderr());
    assert_eq!(app.seen_path("/through-inbound").len(), 1);
    assert_eq!(downstream.seen_path("/through-route").len(), 1);
}
