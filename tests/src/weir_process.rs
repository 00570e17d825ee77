//! `weir run` as a child process that binds its listeners where its configuration says
//! (port 0: wherever the kernel chooses) and reports the bound addresses in the file named
//! by `--ready-file`, written once every listener is bound and `/ready` answers 200. Nothing
//! here picks a "free" port and hopes it is still free when weir binds it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use serde::Deserialize;

/// What `weir run --ready-file FILE` writes (`weir_proxy::cli::ReadyFile`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Listeners {
    pub pid: u32,
    pub inbound: SocketAddr,
    pub admin: SocketAddr,
    pub public: Option<SocketAddr>,
    pub egress: Option<SocketAddr>,
    #[serde(default)]
    pub egress_routes: Vec<SocketAddr>,
}

/// How long [`WeirProcess::start`] waits for the ready file by default: a debug build on a
/// busy 2-core machine starts in well under a second; the bound is for a hung start.
pub const START_WITHIN: Duration = Duration::from_secs(30);

/// A running `weir run`, killed (SIGKILL) when dropped unless it exited. Its stderr goes
/// to a file next to the ready file ([`WeirProcess::stderr`]).
#[derive(Debug)]
pub struct WeirProcess {
    child: Child,
    pub listeners: Listeners,
    dir: tempfile::TempDir,
}

/// Why a `weir run` did not become ready.
#[derive(Debug)]
pub enum StartFailure {
    /// It exited first: its status and what it wrote to stderr.
    Exited {
        status: ExitStatus,
        stderr: String,
    },
    /// Neither ready nor exited within the bound (it was killed).
    TimedOut(Duration),
    Io(std::io::Error),
}

impl std::fmt::Display for StartFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartFailure::Exited { status, stderr } => {
                write!(f, "weir exited before it was ready ({status}): {}", stderr.trim_end())
            }
            StartFailure::TimedOut(within) => write!(f, "weir was not ready within {within:?}"),
            StartFailure::Io(e) => write!(f, "starting weir: {e}"),
        }
    }
}

impl std::error::Error for StartFailure {}

impl WeirProcess {
    /// Spawns `command` (`weir run ...`, with whatever arguments, environment, stdin and
    /// stdout the caller set; stderr goes to a file) with `--ready-file` appended, and waits
    /// up to `within` for the file.
    pub async fn start(command: Command, within: Duration) -> Result<WeirProcess, StartFailure> {
        let mut starting = Starting::spawn(command)?;
        let deadline = Instant::now() + within;
        loop {
            if let Some(ready) = starting.poll(deadline, within)? {
                return Ok(ready);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// [`WeirProcess::start`] for callers outside an async runtime.
    pub fn start_blocking(command: Command, within: Duration) -> Result<WeirProcess, StartFailure> {
        let mut starting = Starting::spawn(command)?;
        let deadline = Instant::now() + within;
        loop {
            if let Some(ready) = starting.poll(deadline, within)? {
                return Ok(ready);
            }
            std::thread::sleep(POLL);
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join(STDERR)).unwrap_or_default()
    }

    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Sends SIGTERM (the graceful stop); returns when it was sent.
    pub fn sigterm(&self) -> Instant {
        let kill = Command::new("kill").args(["-TERM", &self.pid().to_string()]).status();
        assert!(kill.is_ok_and(|s| s.success()), "kill -TERM {}", self.pid());
        Instant::now()
    }

    /// Waits at most `within` for the exit: its status and when it was seen; `None` (and the
    /// process is killed) if it is still running then.
    pub fn exit_within(&mut self, within: Duration) -> Option<(ExitStatus, Instant)> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some((status, Instant::now()));
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for WeirProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const POLL: Duration = Duration::from_millis(10);
const STDERR: &str = "stderr.log";

/// A spawned child whose ready file has not appeared yet.
struct Starting {
    child: Option<Child>,
    dir: Option<tempfile::TempDir>,
    file: PathBuf,
}

impl Starting {
    fn spawn(mut command: Command) -> Result<Starting, StartFailure> {
        let dir = tempfile::tempdir().map_err(StartFailure::Io)?;
        let file = dir.path().join("ready.json");
        command.arg("--ready-file").arg(&file);
        let stderr = std::fs::File::create(dir.path().join(STDERR)).map_err(StartFailure::Io)?;
        command.stderr(stderr);
        let child = command.spawn().map_err(StartFailure::Io)?;
        Ok(Starting { child: Some(child), dir: Some(dir), file })
    }

    /// `Some` once ready; an error once it exited or `deadline` passed.
    fn poll(
        &mut self,
        deadline: Instant,
        within: Duration,
    ) -> Result<Option<WeirProcess>, StartFailure> {
        let child = self.child.as_mut().expect("polled after the end");
        if let Some(listeners) = read_ready(&self.file) {
            let child = self.child.take().expect("still here");
            let dir = self.dir.take().expect("still here");
            return Ok(Some(WeirProcess { child, listeners, dir }));
        }
        if let Some(status) = child.try_wait().map_err(StartFailure::Io)? {
            let dir = self.dir.as_ref().expect("still here").path();
            let stderr = std::fs::read_to_string(dir.join(STDERR)).unwrap_or_default();
            return Err(StartFailure::Exited { status, stderr });
        }
        if Instant::now() > deadline {
            return Err(StartFailure::TimedOut(within));
        }
        Ok(None)
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The ready file, once it is there (it is renamed into place whole).
fn read_ready(file: &Path) -> Option<Listeners> {
    let text = std::fs::read(file).ok()?;
    Some(serde_json::from_slice(&text).expect("weir's ready file is JSON"))
}
