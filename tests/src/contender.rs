//! What sits between the load and the backend: nothing (direct), HAProxy as a priority
//! queue, nginx, or the `weir` binary. Proxies run as child processes on 127.0.0.1 with
//! a generated config in a temporary directory, and are killed when dropped.
//!
//! weir binds port 0 and reports its ports through `--ready-file`
//! ([`crate::weir_process`]). nginx and HAProxy cannot report a port they chose, so they get
//! a port that was free a moment ago ([`free_port`]); should another process take it first,
//! the proxy fails to bind and exits, and the start is retried on a fresh port (at most
//! [`PORT_ATTEMPTS`] times). The other picks left are in benchmark graphs whose apps must
//! know a sidecar's port before it starts (the egress an app calls through: the no-harm
//! middle hop, the multi-hop graph); their weir still reports readiness through the file.
//! No test picks a port.

use serde::Serialize;
use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::load::Protocol;
use crate::weir_process::{Listeners, WeirProcess};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    Direct,
    Haproxy,
    Nginx,
    /// weir with the paper's law (`law: dagor`).
    WeirDagor,
    /// weir with the faster law (`law: goodput`).
    WeirGoodput,
    /// weir with its shipped default configuration (the default law).
    Weir,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Direct => "direct",
            Kind::Haproxy => "haproxy",
            Kind::Nginx => "nginx",
            Kind::WeirDagor => "weir-dagor",
            Kind::WeirGoodput => "weir-goodput",
            Kind::Weir => "weir",
        }
    }

    pub fn is_weir(self) -> bool {
        matches!(self, Kind::Weir | Kind::WeirDagor | Kind::WeirGoodput)
    }
}

#[derive(Clone, Debug)]
pub struct Options {
    pub weir_bin: PathBuf,
    /// Requests HAProxy forwards at once (`maxconn`); set to the app's worker count so
    /// the queue forms in the proxy (HAProxy cannot find it itself).
    pub max_inflight: usize,
    /// weir's `max_inflight`; None (the benchmark's default) leaves weir's shipped
    /// default, so weir has to find the app's concurrency itself.
    pub weir_max_inflight: Option<usize>,
    /// `taskset -c CPU` for the child.
    pub pin_cpu: Option<usize>,
    /// Listen for h2c instead of HTTP/1.1 (HAProxy, nginx; weir serves both).
    pub protocol: Protocol,
    /// HAProxy's `timeout queue`.
    pub queue_timeout: Duration,
}

/// A running contender. `addr` is where the load goes.
pub struct Contender {
    pub kind: Kind,
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
    /// weir's listeners, as its ready file names them.
    pub listeners: Option<Listeners>,
    process: Process,
    _dir: Option<tempfile::TempDir>,
}

/// The contender's process: none (direct), nginx or HAProxy, or weir.
enum Process {
    None,
    Child(Child),
    Weir(WeirProcess),
}

/// Starts of nginx or HAProxy tried, each on a fresh port, before giving up.
pub const PORT_ATTEMPTS: usize = 3;

// === impl Contender ===

impl Contender {
    pub async fn start(kind: Kind, backend: SocketAddr, opts: &Options) -> anyhow::Result<Self> {
        match kind {
            Kind::Direct => Ok(Contender {
                kind,
                addr: backend,
                admin: None,
                listeners: None,
                process: Process::None,
                _dir: None,
            }),
            Kind::Haproxy | Kind::Nginx => {
                let mut attempt = 1;
                loop {
                    match Self::start_fixed_port(kind, backend, opts).await {
                        Err(StartError::Exited(e)) if attempt < PORT_ATTEMPTS => {
                            eprintln!(
                                "{} exited at start ({e}); again on a fresh port",
                                kind.label()
                            );
                            attempt += 1;
                        }
                        Err(StartError::Exited(e) | StartError::Other(e)) => return Err(e),
                        Ok(contender) => return Ok(contender),
                    }
                }
            }
            Kind::Weir | Kind::WeirDagor | Kind::WeirGoodput => {
                let yaml = weir_config(kind, backend, opts);
                let mut extra = Vec::new();
                if let Some(n) = opts.weir_max_inflight {
                    extra = vec!["--max-inflight".to_string(), n.to_string()];
                }
                Self::weir(kind, &opts.weir_bin, &yaml, &extra, opts.pin_cpu).await
            }
        }
    }

    /// nginx or HAProxy on a port that was free a moment ago.
    async fn start_fixed_port(
        kind: Kind,
        backend: SocketAddr,
        opts: &Options,
    ) -> Result<Self, StartError> {
        let dir = tempfile::tempdir().map_err(StartError::other)?;
        let addr = free_port().map_err(StartError::other)?;
        let (program, args): (PathBuf, Vec<String>) = match kind {
            Kind::Haproxy => {
                let cfg = dir.path().join("haproxy.cfg");
                std::fs::write(&cfg, haproxy_config(addr, backend, opts))
                    .map_err(StartError::other)?;
                let program = require("haproxy").map_err(StartError::Other)?;
                (program, vec!["-db".into(), "-f".into(), path_arg(&cfg)])
            }
            Kind::Nginx => {
                let cfg = dir.path().join("nginx.conf");
                std::fs::write(&cfg, nginx_config(addr, backend, dir.path(), opts))
                    .map_err(StartError::other)?;
                let args = vec!["-c".into(), path_arg(&cfg), "-p".into(), path_arg(dir.path())];
                (require("nginx").map_err(StartError::Other)?, args)
            }
            _ => unreachable!("fixed-port contenders are nginx and HAProxy"),
        };
        let mut command = pinned(&program, opts.pin_cpu).map_err(StartError::Other)?;
        command.args(&args).stdin(Stdio::null()).stdout(Stdio::null());
        let stderr =
            std::fs::File::create(dir.path().join("stderr.log")).map_err(StartError::other)?;
        command.stderr(stderr);
        let child = command.spawn().map_err(|e| {
            StartError::Other(anyhow::anyhow!("starting {}: {e}", program.display()))
        })?;
        let mut contender = Contender {
            kind,
            addr,
            admin: None,
            listeners: None,
            process: Process::Child(child),
            _dir: Some(dir),
        };
        contender.wait_listening(addr).await?;
        Ok(contender)
    }

    /// The `weir` binary serving `yaml`, a configuration the caller wrote (several roles,
    /// an entry table, an egress listener...), with `extra` arguments after `run --config`.
    /// Its listeners should be on port 0: the ready file says where they are
    /// ([`Contender::listeners`]); the load goes to the inbound one.
    pub async fn weir_with_config(weir_bin: &Path, yaml: &str) -> anyhow::Result<Self> {
        Self::weir(Kind::Weir, weir_bin, yaml, &[], None).await
    }

    async fn weir(
        kind: Kind,
        weir_bin: &Path,
        yaml: &str,
        extra: &[String],
        pin_cpu: Option<usize>,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            weir_bin.is_file(),
            "{} not found: build it with `cargo build --release -p proxy`",
            weir_bin.display()
        );
        let dir = tempfile::tempdir()?;
        let cfg = dir.path().join("weir.yaml");
        std::fs::write(&cfg, yaml)?;
        let mut command = pinned(weir_bin, pin_cpu)?;
        command.args(["run", "--config", &path_arg(&cfg)]).args(extra);
        command.stdin(Stdio::null()).stdout(Stdio::null());
        let weir = WeirProcess::start(command, Duration::from_secs(10))
            .await
            .map_err(|e| anyhow::anyhow!("{}: {e}", kind.label()))?;
        let listeners = weir.listeners.clone();
        Ok(Contender {
            kind,
            addr: listeners.inbound,
            admin: Some(listeners.admin),
            listeners: Some(listeners),
            process: Process::Weir(weir),
            _dir: Some(dir),
        })
    }

    pub fn pid(&self) -> Option<u32> {
        match &self.process {
            Process::None => None,
            Process::Child(child) => Some(child.id()),
            Process::Weir(weir) => Some(weir.pid()),
        }
    }

    /// Bounded poll until the listener accepts; an early exit is [`StartError::Exited`].
    async fn wait_listening(&mut self, target: SocketAddr) -> Result<(), StartError> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Process::Child(child) = &mut self.process {
                if let Some(status) = child.try_wait().map_err(StartError::other)? {
                    return Err(StartError::Exited(anyhow::anyhow!(
                        "{} exited early ({status}): {}",
                        self.kind.label(),
                        self.stderr()
                    )));
                }
            }
            if tokio::net::TcpStream::connect(target).await.is_ok() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(StartError::Other(anyhow::anyhow!(
                    "{} did not listen on {target} within 10 s: {}",
                    self.kind.label(),
                    self.stderr()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn stderr(&self) -> String {
        let text = match (&self.process, &self._dir) {
            (Process::Weir(weir), _) => weir.stderr(),
            (_, Some(dir)) => {
                std::fs::read_to_string(dir.path().join("stderr.log")).unwrap_or_default()
            }
            _ => String::new(),
        };
        text.lines()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join(" | ")
    }
}

impl Drop for Contender {
    fn drop(&mut self) {
        if let Process::Child(child) = &mut self.process {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Why nginx or HAProxy did not start: it exited (perhaps its port was taken: worth
/// another try), or anything else.
enum StartError {
    Exited(anyhow::Error),
    Other(anyhow::Error),
}

impl StartError {
    fn other(e: impl Into<anyhow::Error>) -> Self {
        StartError::Other(e.into())
    }
}

/// `program`, or `taskset -c CPU program` when pinned.
fn pinned(program: &Path, pin_cpu: Option<usize>) -> anyhow::Result<Command> {
    Ok(match pin_cpu {
        Some(cpu) => {
            let mut c = Command::new(require("taskset")?);
            c.arg("-c").arg(cpu.to_string()).arg(program);
            c
        }
        None => Command::new(program),
    })
}

/// An ephemeral port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> std::io::Result<SocketAddr> {
    TcpListener::bind("127.0.0.1:0")?.local_addr()
}

/// The path of `program` on `PATH`, or an error that says how to install it.
pub fn require(program: &str) -> anyhow::Result<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .chain(["/usr/sbin".into(), "/sbin".into()])
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    });
    let package = match program {
        "nginx" => "nginx-light",
        "taskset" => "util-linux",
        other => other,
    };
    found.ok_or_else(|| {
        anyhow::anyhow!("`{program}` not found: install it with `apt-get install -y {package}`")
    })
}

fn path_arg(p: &Path) -> String {
    p.display().to_string()
}

pub fn haproxy_config(listen: SocketAddr, backend: SocketAddr, o: &Options) -> String {
    let proto = if o.protocol == Protocol::H2c { " proto h2" } else { "" };
    let mut s = String::new();
    let _ = write!(
        s,
        "global\n  nbthread 1\n  maxconn 8000\n\
         defaults\n  mode http\n  timeout connect 1s\n  timeout client 10s\n  timeout server 10s\n\
         \x20 timeout queue {queue}ms\n  option http-keep-alive\n  option abortonclose\n\
         frontend fe\n  bind {listen}{proto}\n  http-request set-priority-class req.hdr_val(x-business-priority)\n\
         \x20 default_backend app\n\
         backend app\n  http-reuse always\n  server app {backend} maxconn {maxconn}\n",
        queue = o.queue_timeout.as_millis(),
        maxconn = o.max_inflight,
    );
    s
}

pub fn nginx_config(listen: SocketAddr, backend: SocketAddr, dir: &Path, o: &Options) -> String {
    let http2 = if o.protocol == Protocol::H2c { " http2" } else { "" };
    format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\nerror_log {dir}/error.log warn;\npid {dir}/nginx.pid;\n\
         events {{ worker_connections 20000; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {dir}/body;\n  proxy_temp_path {dir}/proxy;\n\
         \x20 fastcgi_temp_path {dir}/fastcgi;\n  uwsgi_temp_path {dir}/uwsgi;\n  scgi_temp_path {dir}/scgi;\n\
         \x20 upstream app {{ server {backend}; keepalive 256; }}\n\
         \x20 server {{\n    listen {listen}{http2};\n    keepalive_requests 1000000;\n\
         \x20   location / {{ proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection \"\"; }}\n  }}\n}}\n",
        dir = dir.display(),
    )
}

/// weir's configuration for `kind` in front of `backend`: every listener on port 0.
pub fn weir_config(kind: Kind, backend: SocketAddr, o: &Options) -> String {
    // The default law is whatever weir ships with: leave the section out.
    let law = match kind {
        Kind::WeirDagor => "admission:\n  law: dagor\n",
        Kind::WeirGoodput => "admission:\n  law: goodput\n",
        _ => "",
    };
    let inflight = o.weir_max_inflight.map_or(String::new(), |n| format!("  max_inflight: {n}\n"));
    format!(
        "inbound:\n  listen: 127.0.0.1:0\n  app: {backend}\n{inflight}  threads: 1\n\
         {law}\
         admin:\n  listen: 127.0.0.1:0\n\
         log:\n  filter: warn\n",
    )
}
