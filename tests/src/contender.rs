//! What sits between the load and the backend: nothing (direct), HAProxy as a priority
//! queue, nginx, or the `weir` binary. Proxies run as child processes on 127.0.0.1 with
//! a generated config in a temporary directory, and are killed when dropped.

use serde::Serialize;
use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::load::Protocol;

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
    child: Option<Child>,
    _dir: Option<tempfile::TempDir>,
}

// === impl Contender ===

impl Contender {
    pub async fn start(kind: Kind, backend: SocketAddr, opts: &Options) -> anyhow::Result<Self> {
        if kind == Kind::Direct {
            return Ok(Contender { kind, addr: backend, admin: None, child: None, _dir: None });
        }
        let dir = tempfile::tempdir()?;
        let addr = free_port()?;
        let mut admin = None;
        let (program, args): (PathBuf, Vec<String>) = match kind {
            Kind::Haproxy => {
                let cfg = dir.path().join("haproxy.cfg");
                std::fs::write(&cfg, haproxy_config(addr, backend, opts))?;
                (require("haproxy")?, vec!["-db".into(), "-f".into(), path_arg(&cfg)])
            }
            Kind::Nginx => {
                let cfg = dir.path().join("nginx.conf");
                std::fs::write(&cfg, nginx_config(addr, backend, dir.path(), opts))?;
                let args = vec!["-c".into(), path_arg(&cfg), "-p".into(), path_arg(dir.path())];
                (require("nginx")?, args)
            }
            Kind::Weir | Kind::WeirDagor | Kind::WeirGoodput => {
                anyhow::ensure!(
                    opts.weir_bin.is_file(),
                    "{} not found: build it with `cargo build --release -p proxy`",
                    opts.weir_bin.display()
                );
                let admin_addr = free_port()?;
                admin = Some(admin_addr);
                let cfg = dir.path().join("weir.yaml");
                std::fs::write(&cfg, weir_config(kind, addr, backend, admin_addr, opts))?;
                let args = ["run", "--config", &path_arg(&cfg)]
                    .into_iter()
                    .map(String::from)
                    .chain([
                        "--inbound".into(),
                        addr.to_string(),
                        "--app".into(),
                        backend.to_string(),
                    ])
                    .chain(["--admin".into(), admin_addr.to_string()])
                    .chain(
                        opts.weir_max_inflight
                            .iter()
                            .flat_map(|n| ["--max-inflight".to_string(), n.to_string()]),
                    )
                    .collect();
                (opts.weir_bin.clone(), args)
            }
            Kind::Direct => unreachable!("handled above"),
        };
        let mut command = match opts.pin_cpu {
            Some(cpu) => {
                let mut c = Command::new(require("taskset")?);
                c.arg("-c").arg(cpu.to_string()).arg(&program);
                c
            }
            None => Command::new(&program),
        };
        command.args(&args).stdin(Stdio::null()).stdout(Stdio::null());
        command.stderr(std::fs::File::create(dir.path().join("stderr.log"))?);
        let child =
            command.spawn().map_err(|e| anyhow::anyhow!("starting {}: {e}", program.display()))?;
        let mut contender = Contender { kind, addr, admin, child: Some(child), _dir: Some(dir) };
        contender.wait_ready().await?;
        Ok(contender)
    }

    /// The `weir` binary serving `yaml`, a configuration the caller wrote (several roles,
    /// an entry table, an egress listener...). It must listen on `addr` and serve its admin
    /// on `admin`; the process is ready once those and every address in `also` accept.
    pub async fn weir_with_config(
        weir_bin: &Path,
        yaml: &str,
        addr: SocketAddr,
        admin: SocketAddr,
        also: &[SocketAddr],
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            weir_bin.is_file(),
            "{} not found: build it with `cargo build --release -p proxy`",
            weir_bin.display()
        );
        let dir = tempfile::tempdir()?;
        let cfg = dir.path().join("weir.yaml");
        std::fs::write(&cfg, yaml)?;
        let mut command = Command::new(weir_bin);
        command
            .args(["run", "--config", &path_arg(&cfg)])
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        command.stderr(std::fs::File::create(dir.path().join("stderr.log"))?);
        let child =
            command.spawn().map_err(|e| anyhow::anyhow!("starting {}: {e}", weir_bin.display()))?;
        let mut contender = Contender {
            kind: Kind::Weir,
            addr,
            admin: Some(admin),
            child: Some(child),
            _dir: Some(dir),
        };
        let mut targets = vec![addr, admin];
        targets.extend_from_slice(also);
        contender.wait_listening(targets).await?;
        Ok(contender)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Bounded poll until the listener accepts (and weir's admin answers).
    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let mut targets = vec![self.addr];
        targets.extend(self.admin);
        self.wait_listening(targets).await
    }

    async fn wait_listening(&mut self, targets: Vec<SocketAddr>) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        for target in targets {
            loop {
                if let Some(child) = self.child.as_mut() {
                    if let Some(status) = child.try_wait()? {
                        anyhow::bail!(
                            "{} exited early ({status}): {}",
                            self.kind.label(),
                            self.stderr()
                        );
                    }
                }
                if tokio::net::TcpStream::connect(target).await.is_ok() {
                    break;
                }
                anyhow::ensure!(
                    tokio::time::Instant::now() < deadline,
                    "{} did not listen on {target} within 10 s: {}",
                    self.kind.label(),
                    self.stderr()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok(())
    }

    fn stderr(&self) -> String {
        let Some(dir) = &self._dir else { return String::new() };
        let text = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap_or_default();
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
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
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

pub fn weir_config(
    kind: Kind,
    listen: SocketAddr,
    backend: SocketAddr,
    admin: SocketAddr,
    o: &Options,
) -> String {
    // The default law is whatever weir ships with: leave the section out.
    let law = match kind {
        Kind::WeirDagor => "admission:\n  law: dagor\n",
        Kind::WeirGoodput => "admission:\n  law: goodput\n",
        _ => "",
    };
    let inflight = o.weir_max_inflight.map_or(String::new(), |n| format!("  max_inflight: {n}\n"));
    format!(
        "inbound:\n  listen: {listen}\n  app: {backend}\n{inflight}  threads: 1\n\
         {law}\
         admin:\n  listen: {admin}\n\
         log:\n  filter: warn\n",
    )
}
