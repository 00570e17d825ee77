//! nginx as the app (not as a proxy): one worker process answering every request with
//! `200 ok` (2 bytes), on a cleartext listener that speaks HTTP/1.1 only, or h2c only
//! (nginx 1.22's `listen ... http2` without TLS: prior knowledge, no HTTP/1.1). The
//! fastest real app there is, and the HTTP/1.1-only server most apps sit behind.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::contender::{free_port, require};

/// What the app's listener speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Listener {
    Http1,
    H2c,
}

/// A running nginx app, killed when dropped.
pub struct NginxApp {
    pub addr: SocketAddr,
    pub listener: Listener,
    child: Child,
    _dir: tempfile::TempDir,
}

impl NginxApp {
    /// Starts nginx on an ephemeral port of 127.0.0.1 and waits (at most 10 s) until it
    /// accepts connections. `cpu`: pin it (`taskset -c`).
    pub fn start(listener: Listener, cpu: Option<usize>) -> anyhow::Result<Self> {
        let nginx = require("nginx")?;
        let dir = tempfile::tempdir()?;
        let addr = free_port()?;
        let conf = dir.path().join("nginx.conf");
        std::fs::write(&conf, config(addr, listener, dir.path()))?;
        let mut command = match cpu {
            Some(cpu) => {
                let mut c = Command::new(require("taskset")?);
                c.arg("-c").arg(cpu.to_string()).arg(&nginx);
                c
            }
            None => Command::new(&nginx),
        };
        command
            .arg("-c")
            .arg(&conf)
            .arg("-p")
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = command.spawn().map_err(|e| anyhow::anyhow!("starting nginx: {e}"))?;
        let mut app = NginxApp { addr, listener, child, _dir: dir };
        app.wait_listening()?;
        Ok(app)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn wait_listening(&mut self) -> anyhow::Result<()> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait()? {
                let log =
                    std::fs::read_to_string(self._dir.path().join("error.log")).unwrap_or_default();
                anyhow::bail!("nginx app exited early ({status}): {log}");
            }
            if std::net::TcpStream::connect_timeout(&self.addr, Duration::from_millis(100)).is_ok()
            {
                return Ok(());
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "nginx app did not listen on {} within 10 s",
                self.addr
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for NginxApp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The app's configuration: `return 200 "ok"` for everything, no access log.
pub fn config(addr: SocketAddr, listener: Listener, dir: &std::path::Path) -> String {
    let http2 = if listener == Listener::H2c { " http2" } else { "" };
    format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\nerror_log {dir}/error.log warn;\n\
         pid {dir}/nginx.pid;\nevents {{ worker_connections 20000; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {dir}/body;\n  proxy_temp_path {dir}/proxy;\n\
         \x20 fastcgi_temp_path {dir}/fastcgi;\n  uwsgi_temp_path {dir}/uwsgi;\n  scgi_temp_path {dir}/scgi;\n\
         \x20 keepalive_requests 1000000;\n\
         \x20 server {{\n    listen {addr}{http2};\n\
         \x20   location / {{ default_type text/plain; return 200 \"ok\"; }}\n  }}\n}}\n",
        dir = dir.display(),
    )
}
