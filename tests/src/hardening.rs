//! The hardening benchmark (issue 17; BENCHMARKS.md, "Hardening"): each finding of the
//! issue's probe run as the attacker ran it, against a release `weir` with its shipped
//! defaults plus only what the attack needs, while a well-behaved caller is served by the
//! same process. Per attack: the caller alone, then the caller during the attack, back to
//! back on the same weir; the caller's p50 / p99 both times and the p99 delta against the
//! issue's target (within 10 ms of the unattacked p99); what the caller saw that was not
//! its answer (refusals, errors, timeouts); what the attacker was answered; weir's open
//! file descriptors and RSS before, at their highest during, and after the attack; the
//! load average around each phase (the machine is shared).
//!
//! The peers are the e2e tests' (`support::misbehaving`, `support::backend`); what only
//! the benchmark needs (the injector's TLS reviews) is in [`inject`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::bench_cli::loadavg;
use crate::procfs;
use crate::support::backend::Backend;
use crate::support::client::{bytes_body, Http1, TestClient};
use crate::support::misbehaving::{
    h2_connect, h2_get, ClosingKeepAliveApp, RawConn, SilentH2Peer, IMPORTANT,
};
use crate::weir_process::{WeirProcess, START_WITHIN};

pub mod inject;

/// The target: the caller's p99 during an attack within this of its unattacked p99.
pub const TARGET: Duration = Duration::from_millis(10);

/// A well-behaved request slower than this counts as an error (timeout).
const CALLER_TIMEOUT: Duration = Duration::from_secs(2);

// === what to run ===

/// The attacks, by the names the command line takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum AttackKind {
    /// 4 HTTP/1.1 callers that never read a 20 MB response and 4 zero-window h2 streams,
    /// all through the h2c app's shared connections.
    H2cStall,
    /// 64 clients declaring a 1 h budget (`x-request-timeout-ms: 3600000`) and trickling
    /// their bodies a byte every 100 ms, at the entry.
    BudgetTrickle,
    /// h2 peers that never answer the shutdown PING, up to `max_connections`.
    IdleH2,
    /// Two Hosts, no Host, h2 `host` != `:authority`, absolute form != Host, at the entry.
    HostMismatch,
    /// Requests addressed to weir's own listeners through its egress, with a 300 s budget.
    EgressLoop,
    /// An app that closes every pooled keep-alive connection as the next request arrives.
    ClosingApp,
    /// Unauthenticated validations of a big table from 8 clients vs authenticated writes.
    ValidateFlood,
    /// The watched table file pointed at a 200 MB file, a FIFO, `/dev/zero`.
    TableFile,
    /// 1,100 idle TCP connections from one host to the injector vs the API server's reviews.
    InjectorFlood,
}

impl AttackKind {
    pub const ALL: [AttackKind; 9] = [
        AttackKind::H2cStall,
        AttackKind::BudgetTrickle,
        AttackKind::IdleH2,
        AttackKind::HostMismatch,
        AttackKind::EgressLoop,
        AttackKind::ClosingApp,
        AttackKind::ValidateFlood,
        AttackKind::TableFile,
        AttackKind::InjectorFlood,
    ];
}

#[derive(Clone, Debug)]
pub struct HardeningConfig {
    pub attacks: Vec<AttackKind>,
    /// How long the caller is measured alone, and during the attack.
    pub phase: Duration,
    /// Pause between two of the caller's requests.
    pub pace: Duration,
    pub weir_bin: PathBuf,
    /// The workspace (for the injector's template and review fixtures).
    pub workspace: PathBuf,
    /// The attackers' tasks on the caller's runtime (the first runs' setup), not their own.
    pub shared_runtime: bool,
}

// === what it measured ===

/// The caller's figures in one phase.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PhaseStats {
    pub answered: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Anything but the expected answer, by kind (`503`, `timeout`, `connect: ...`).
    pub errors: BTreeMap<String, u64>,
    pub loadavg: String,
}

/// weir's (or the injector's) open fds and RSS.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Resources {
    pub fds: usize,
    pub rss_kib: u64,
    /// During the attack only: weir's CPU, and this runner's (the caller, the attackers and
    /// the apps), in % of one core over the attacked phase.
    pub cpu_pct: Option<f64>,
    pub runner_cpu_pct: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct AttackResult {
    pub attack: AttackKind,
    /// One line: what the attacker does.
    pub what: String,
    /// What weir was configured with beyond its shipped defaults (addresses aside).
    pub settings: String,
    /// What the well-behaved caller does.
    pub caller: String,
    pub unattacked: PhaseStats,
    pub attacked: PhaseStats,
    pub p99_delta_ms: f64,
    pub within_target: bool,
    /// What the attacker's requests were answered, by outcome.
    pub attack_outcomes: BTreeMap<String, u64>,
    pub before: Resources,
    /// The highest fds and RSS seen during the attack (sampled every 20 ms).
    pub during_max: Resources,
    pub after: Resources,
    pub notes: Vec<String>,
}

// === the pieces every attack uses ===

/// A release `weir run` with `yaml` as its configuration (the rest: shipped defaults).
pub struct Weir {
    pub process: WeirProcess,
    _dir: tempfile::TempDir,
}

impl Weir {
    pub async fn start(bin: &Path, yaml: &str) -> anyhow::Result<Weir> {
        let dir = tempfile::tempdir()?;
        let config = dir.path().join("weir.yaml");
        std::fs::write(&config, yaml)?;
        let mut command = Command::new(bin);
        command.arg("run").arg("--config").arg(&config).env("RUST_LOG", "warn");
        command.stdin(Stdio::null()).stdout(Stdio::null());
        let process = WeirProcess::start(command, START_WITHIN).await?;
        Ok(Weir { process, _dir: dir })
    }

    pub fn inbound(&self) -> SocketAddr {
        self.process.listeners.inbound
    }

    pub fn admin(&self) -> SocketAddr {
        self.process.listeners.admin
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}

/// The minimal configuration: the listeners on ports of the kernel's choosing, the app.
fn base_yaml(app: SocketAddr, inbound_extra: &str, admin_extra: &str) -> String {
    format!(
        "inbound:\n  listen: 127.0.0.1:0\n  app: {app}\n{inbound_extra}\
         admin:\n  listen: 127.0.0.1:0\n{admin_extra}"
    )
}

pub fn resources(pid: u32) -> Resources {
    Resources {
        fds: std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count()),
        rss_kib: procfs::rss_bytes(pid).unwrap_or(0) / 1024,
        ..Resources::default()
    }
}

/// Samples `pid`'s fds and RSS every 20 ms until stopped; keeps the highest of each.
struct Sampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Resources>,
}

impl Sampler {
    fn start(pid: u32) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let cpu = || procfs::cpu_time(pid).unwrap_or_default();
                let own = || procfs::cpu_time(std::process::id()).unwrap_or_default();
                let (cpu0, own0, started) = (cpu(), own(), Instant::now());
                let mut max = Resources::default();
                while !stop.load(Relaxed) {
                    let now = resources(pid);
                    max.fds = max.fds.max(now.fds);
                    max.rss_kib = max.rss_kib.max(now.rss_kib);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let wall = started.elapsed().as_secs_f64();
                max.cpu_pct = Some(cpu().saturating_sub(cpu0).as_secs_f64() / wall * 100.0);
                max.runner_cpu_pct = Some(own().saturating_sub(own0).as_secs_f64() / wall * 100.0);
                max
            }
        });
        Sampler { stop, task }
    }

    async fn stop(self) -> Resources {
        self.stop.store(true, Relaxed);
        self.task.await.unwrap_or_default()
    }
}

/// The attackers' own runtime (two threads): their tasks never queue in front of the
/// well-behaved caller's on the runner's runtime; they share only the machine's cores with
/// it, as an attacker elsewhere on the node would.
fn attack_runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("attacker")
            .enable_all()
            .build()
            .expect("the attackers' runtime")
    })
}

/// The attacker's tasks, each running its attack over and over until stopped; outcomes
/// counted by name.
#[derive(Default)]
struct Attackers {
    /// Spawn on the caller's runtime instead of the attackers' own (`--shared-runtime`).
    shared_runtime: bool,
    stop: Arc<AtomicBool>,
    outcomes: Arc<Mutex<BTreeMap<String, u64>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Attackers {
    /// `n` tasks, each calling `attack(k)` in a loop; each call returns its outcome.
    fn spawn<F, Fut>(&mut self, n: usize, attack: F)
    where
        F: Fn(usize) -> Fut + Send + Sync + Clone + 'static,
        Fut: Future<Output = String> + Send,
    {
        for k in 0..n {
            let (stop, outcomes, attack) =
                (self.stop.clone(), self.outcomes.clone(), attack.clone());
            let task = async move {
                while !stop.load(Relaxed) {
                    let outcome = attack(k).await;
                    *outcomes.lock().unwrap().entry(outcome).or_default() += 1;
                }
            };
            self.tasks.push(if self.shared_runtime {
                tokio::spawn(task)
            } else {
                attack_runtime().spawn(task)
            });
        }
    }

    fn stopping(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// Stops them: each finishes its current attack, or is aborted after `grace`.
    async fn stop(self, grace: Duration) -> BTreeMap<String, u64> {
        self.stop.store(true, Relaxed);
        let deadline = tokio::time::Instant::now() + grace;
        for t in self.tasks {
            let abort = t.abort_handle();
            if tokio::time::timeout_at(deadline, t).await.is_err() {
                abort.abort();
            }
        }
        std::mem::take(&mut *self.outcomes.lock().unwrap())
    }
}

/// The well-behaved caller for `span`: `call` one after another, `pace` apart, each bounded
/// by [`CALLER_TIMEOUT`]. `Ok` is an expected answer; `Err` names what came instead.
async fn measure<F, Fut>(span: Duration, pace: Duration, mut call: F) -> PhaseStats
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let mut took = Vec::new();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let until = Instant::now() + span;
    let mut i = 0;
    while Instant::now() < until {
        let t = Instant::now();
        match tokio::time::timeout(CALLER_TIMEOUT, call(i)).await {
            Ok(Ok(())) => took.push(t.elapsed()),
            Ok(Err(e)) => *errors.entry(e).or_default() += 1,
            Err(_) => *errors.entry(format!("no answer in {CALLER_TIMEOUT:?}")).or_default() += 1,
        }
        i += 1;
        tokio::time::sleep(pace).await;
    }
    took.sort_unstable();
    let q = |q: f64| -> f64 {
        if took.is_empty() {
            return f64::NAN;
        }
        took[((took.len() as f64 * q).ceil() as usize).saturating_sub(1)].as_secs_f64() * 1e3
    };
    PhaseStats {
        answered: took.len(),
        p50_ms: q(0.5),
        p99_ms: q(0.99),
        max_ms: q(1.0),
        errors,
        loadavg: loadavg(),
    }
}

/// `GET url` on a pooled keep-alive connection: 200 with `body_len` bytes and the level.
async fn proxied_get(
    client: &TestClient,
    url: &str,
    headers: &[(&str, &str)],
    body_len: Option<usize>,
) -> Result<(), String> {
    let resp = client
        .send(http::Method::GET, url, headers, crate::support::client::empty())
        .await
        .map_err(|e| format!("error: {}", e.chars().take(60).collect::<String>()))?;
    if resp.status != 200 {
        return Err(format!("{}", resp.status));
    }
    if resp.header("x-admission-level").is_none() {
        return Err("no level".into());
    }
    if body_len.is_some_and(|n| resp.body.len() != n) {
        return Err(format!("body {} bytes", resp.body.len()));
    }
    Ok(())
}

/// `GET url` through the egress with `Host: host`: 200 with 4,096 bytes.
async fn egress_get(client: &TestClient, url: &str, host: &str) -> Result<(), String> {
    let resp = client
        .send(http::Method::GET, url, &[("host", host)], crate::support::client::empty())
        .await
        .map_err(|e| format!("error: {}", e.chars().take(60).collect::<String>()))?;
    match (resp.status, resp.body.len()) {
        (200, 4096) => Ok(()),
        (200, n) => Err(format!("body {n} bytes")),
        (s, _) => Err(format!("{s}")),
    }
}

/// The usual caller: `GET /bytes/4096` (a body, so a stalled window would show) through
/// weir's inbound listener, most important class.
fn probe_caller(
    inbound: SocketAddr,
) -> impl FnMut(usize) -> std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Clone
{
    let client = Http1::new();
    let url = format!("http://{inbound}/bytes/4096?probe");
    move |_| {
        let (client, url) = (client.clone(), url.clone());
        Box::pin(async move { proxied_get(&client, &url, &IMPORTANT, Some(4096)).await })
    }
}

const PROBE_CALLER: &str = "GET /bytes/4096 (keep-alive, HTTP/1.1) through the inbound listener";

/// Everything one attack run assembles into its result.
struct Run {
    attack: AttackKind,
    what: String,
    settings: String,
    caller: String,
    phases: Phases,
    attack_outcomes: BTreeMap<String, u64>,
    notes: Vec<String>,
}

/// The well-behaved caller's two phases, and weir's resources around the attacked one.
struct Phases {
    unattacked: PhaseStats,
    attacked: PhaseStats,
    before: Resources,
    during_max: Resources,
    after: Resources,
}

/// One attack's phases in order: [`Watch::unattacked`] (a warm-up, then the caller alone;
/// the resources before, and sampling starts), [`Watch::attacked`] (the caller during the
/// attack; sampling stops), [`Attacked::after`] (the resources once the attack is over).
struct Watch {
    pid: u32,
    unattacked: PhaseStats,
    before: Resources,
    sampler: Sampler,
}

/// [`Watch`] after the attacked phase.
struct Attacked {
    pid: u32,
    unattacked: PhaseStats,
    attacked: PhaseStats,
    before: Resources,
    during_max: Resources,
}

/// The warm-up before the unattacked phase.
const WARM_UP: Duration = Duration::from_millis(500);

impl Watch {
    async fn unattacked<F, Fut>(pid: u32, span: Duration, pace: Duration, call: F) -> Watch
    where
        F: FnMut(usize) -> Fut + Clone,
        Fut: Future<Output = Result<(), String>>,
    {
        measure(WARM_UP, pace, call.clone()).await;
        let unattacked = measure(span, pace, call).await;
        Watch { pid, unattacked, before: resources(pid), sampler: Sampler::start(pid) }
    }

    async fn attacked<F, Fut>(self, span: Duration, pace: Duration, call: F) -> Attacked
    where
        F: FnMut(usize) -> Fut,
        Fut: Future<Output = Result<(), String>>,
    {
        let attacked = measure(span, pace, call).await;
        Attacked {
            pid: self.pid,
            unattacked: self.unattacked,
            attacked,
            before: self.before,
            during_max: self.sampler.stop().await,
        }
    }
}

impl Attacked {
    fn after(self) -> Phases {
        Phases {
            unattacked: self.unattacked,
            attacked: self.attacked,
            before: self.before,
            during_max: self.during_max,
            after: resources(self.pid),
        }
    }
}

impl Run {
    fn result(self) -> AttackResult {
        let Phases { unattacked, attacked, before, during_max, after } = self.phases;
        let delta = attacked.p99_ms - unattacked.p99_ms;
        AttackResult {
            attack: self.attack,
            what: self.what,
            settings: self.settings,
            caller: self.caller,
            within_target: delta <= TARGET.as_secs_f64() * 1e3
                && attacked.errors.is_empty()
                && attacked.answered > 0,
            p99_delta_ms: delta,
            unattacked,
            attacked,
            attack_outcomes: self.attack_outcomes,
            before,
            during_max: during_max.max_with(before),
            after,
            notes: self.notes,
        }
    }
}

impl Resources {
    fn max_with(self, other: Resources) -> Resources {
        Resources { fds: self.fds.max(other.fds), rss_kib: self.rss_kib.max(other.rss_kib), ..self }
    }
}

/// Runs every configured attack in turn; `log` gets a line per finished attack.
pub async fn run(
    config: HardeningConfig,
    mut log: impl FnMut(String),
) -> anyhow::Result<Vec<AttackResult>> {
    let mut results = Vec::new();
    for &attack in &config.attacks {
        log(format!("{attack:?}: starting; load {}", loadavg()));
        let runs = match attack {
            AttackKind::H2cStall => vec![h2c_stall(&config).await?],
            AttackKind::BudgetTrickle => vec![budget_trickle(&config).await?],
            AttackKind::IdleH2 => vec![idle_h2(&config).await?],
            AttackKind::HostMismatch => vec![host_mismatch(&config).await?],
            AttackKind::EgressLoop => vec![egress_loop(&config).await?],
            AttackKind::ClosingApp => vec![closing_app(&config).await?],
            AttackKind::ValidateFlood => vec![validate_flood(&config).await?],
            AttackKind::TableFile => table_file(&config).await?,
            AttackKind::InjectorFlood => vec![inject::idle_flood(&config).await?],
        };
        for r in runs {
            let r = r.result();
            log(line(&r));
            results.push(r);
        }
    }
    Ok(results)
}

/// One line per result for the log.
pub fn line(r: &AttackResult) -> String {
    format!(
        "{:?} ({}): caller p50/p99 {:.2}/{:.2} -> {:.2}/{:.2} ms (delta {:+.2} ms, {}), errors \
         {:?} -> {:?}; fds {} / {} / {}, RSS {} / {} / {} KiB; attacker {:?}; load {} -> {}",
        r.attack,
        r.what,
        r.unattacked.p50_ms,
        r.unattacked.p99_ms,
        r.attacked.p50_ms,
        r.attacked.p99_ms,
        r.p99_delta_ms,
        if r.within_target { "within target" } else { "MISSED" },
        r.unattacked.errors,
        r.attacked.errors,
        r.before.fds,
        r.during_max.fds,
        r.after.fds,
        r.before.rss_kib,
        r.during_max.rss_kib,
        r.after.rss_kib,
        r.attack_outcomes,
        r.unattacked.loadavg,
        r.attacked.loadavg,
    )
}

/// Waits `within` at most for `cond`.
async fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cond()
}

// === the attacks ===

/// The response the stalled callers ask for and never read (the 20 MB).
const LARGE: usize = 20_000_000;

async fn h2c_stall(c: &HardeningConfig) -> anyhow::Result<Run> {
    let app = Backend::start().await;
    let settings = "  app_protocol: h2c\n";
    let weir = Weir::start(&c.weir_bin, &base_yaml(app.addr, settings, "")).await?;
    let addr = weir.inbound();
    let watch = Watch::unattacked(weir.pid(), c.phase, c.pace, probe_caller(addr)).await;

    let arrivals = app.arrivals();
    let mut readers = RawConn::never_reading(addr, 4, &format!("/bytes/{LARGE}"), "app").await;
    let h2 = h2_connect(addr, |b| {
        b.initial_window_size(0);
    })
    .await;
    let mut zero_window = Vec::new();
    for i in 0..4 {
        let mut send = h2.clone().ready().await?;
        let (response, _) =
            send.send_request(h2_get(addr, &format!("/bytes/{LARGE}?zero-window={i}")), true)?;
        zero_window.push(response);
    }
    let reached = eventually(Duration::from_secs(3), || app.arrivals() >= arrivals + 8).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let attacked = watch.attacked(c.phase, c.pace, probe_caller(addr)).await;
    // How the stalled callers ended: weir's write timeout (10 s) drops them.
    let started = Instant::now();
    let mut ended = 0;
    for raw in &mut readers {
        if raw.closed_within(Duration::from_secs(15)).await.is_ok() {
            ended += 1;
        }
    }
    let ended_after = started.elapsed();
    drop((readers, zero_window, h2));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let phases = attacked.after();
    let mut outcomes = BTreeMap::new();
    let large = app.seen().iter().filter(|s| s.path == format!("/bytes/{LARGE}")).count();
    outcomes.insert("large requests reaching the app".into(), large as u64);
    outcomes.insert("HTTP/1.1 stalled callers closed by weir".into(), ended);
    Ok(Run {
        attack: AttackKind::H2cStall,
        what: "4 HTTP/1.1 callers never reading a 20 MB response + 4 zero-window h2 streams".into(),
        settings: "app_protocol: h2c".into(),
        caller: PROBE_CALLER.into(),
        phases,
        attack_outcomes: outcomes,
        notes: vec![
            format!("all 8 large requests reached the app before the attacked phase: {reached}"),
            format!(
                "the stalled HTTP/1.1 callers were closed {:.1} s after the attacked phase \
                 (timeouts.write 10 s from their last progress)",
                ended_after.as_secs_f64()
            ),
        ],
    })
}

/// An entry sidecar (the table and the user secret it needs, nothing else changed).
async fn entry_weir(
    c: &HardeningConfig,
    app: SocketAddr,
) -> anyhow::Result<(Weir, tempfile::TempDir)> {
    let dir = tempfile::tempdir()?;
    let (table, secret) = (dir.path().join("table.yaml"), dir.path().join("secret"));
    std::fs::write(&table, crate::support::EDGE_ENTRY_TABLE)?;
    std::fs::write(&secret, "hardening-bench-secret\n")?;
    let yaml = base_yaml(
        app,
        "  entry: true\n",
        &format!("  table_file: {}\n  user_secret_file: {}\n", table.display(), secret.display()),
    );
    Ok((Weir::start(&c.weir_bin, &yaml).await?, dir))
}

const ENTRY_SETTINGS: &str = "entry: true, a priority table and user secret (files)";

/// A client declaring a 1 h budget and trickling its body a byte every 100 ms to the echo
/// route; returns how long until weir ended the exchange (or `give_up`).
async fn trickle(addr: SocketAddr, give_up: Duration) -> Result<(Duration, String), String> {
    let started = Instant::now();
    let stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let (mut read, mut write) = stream.into_split();
    let head = "POST /echo HTTP/1.1\r\nHost: shop.example\r\nContent-Length: 100000\r\n\
                x-request-timeout-ms: 3600000\r\n\r\n";
    write.write_all(head.as_bytes()).await.map_err(|e| e.to_string())?;
    let writer = tokio::spawn(async move {
        while write.write_all(b"x").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut buf = [0u8; 4096];
    let mut head = Vec::new();
    let _ = tokio::time::timeout(give_up, async {
        while let Ok(n) = read.read(&mut buf).await {
            if n == 0 {
                break;
            }
            if head.len() < 12 {
                head.extend_from_slice(&buf[..n.min(12)]);
            }
        }
    })
    .await;
    writer.abort();
    let status = String::from_utf8_lossy(head.get(9..12).unwrap_or(b"---")).into_owned();
    Ok((started.elapsed(), status))
}

async fn budget_trickle(c: &HardeningConfig) -> anyhow::Result<Run> {
    const TRICKLERS: usize = 64;
    let app = Backend::start().await;
    let (weir, _dir) = entry_weir(c, app.addr).await?;
    let addr = weir.inbound();
    let watch = Watch::unattacked(weir.pid(), c.phase, c.pace, probe_caller(addr)).await;
    let mut attackers = Attackers { shared_runtime: c.shared_runtime, ..Attackers::default() };
    attackers.spawn(TRICKLERS, move |_| async move {
        match trickle(addr, Duration::from_secs(5)).await {
            Ok((lasted, status)) if lasted < Duration::from_millis(100) => {
                format!("ended by weir within 100 ms, status {status}")
            }
            Ok((lasted, status)) if lasted < Duration::from_millis(1000) => {
                format!("ended by weir within 1 s, status {status}")
            }
            Ok((lasted, status)) if lasted < Duration::from_secs(5) => {
                format!("ended by weir within 5 s, status {status}")
            }
            Ok(_) => "still open at 5 s (client gave up)".into(),
            Err(e) => format!("connect: {e}"),
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let attacked = watch.attacked(c.phase, c.pace, probe_caller(addr)).await;
    let outcomes = attackers.stop(Duration::from_secs(6)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let phases = attacked.after();
    Ok(Run {
        attack: AttackKind::BudgetTrickle,
        what: format!(
            "{TRICKLERS} clients, x-request-timeout-ms 3600000, body trickled 1 byte / 100 ms"
        ),
        settings: ENTRY_SETTINGS.into(),
        caller: PROBE_CALLER.into(),
        phases,
        attack_outcomes: outcomes,
        notes: vec![
            "the entry's cap is the shipped default (max_budget: null = task_timeout, 500 ms)"
                .into(),
        ],
    })
}

async fn idle_h2(c: &HardeningConfig) -> anyhow::Result<Run> {
    const MAX_CONNECTIONS: usize = 512;
    // The caller's pooled connection and a closing one's successor need room.
    const PEERS: usize = MAX_CONNECTIONS - 4;
    let app = Backend::start().await;
    let settings = format!("  max_connections: {MAX_CONNECTIONS}\n  timeouts:\n    idle: 2s\n");
    let weir = Weir::start(&c.weir_bin, &base_yaml(app.addr, &settings, "")).await?;
    let addr = weir.inbound();
    let watch = Watch::unattacked(weir.pid(), c.phase, c.pace, probe_caller(addr)).await;
    let mut attackers = Attackers { shared_runtime: c.shared_runtime, ..Attackers::default() };
    let lifetimes: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let stop = attackers.stopping();
    let opened = Arc::new(AtomicU64::new(0));
    {
        let (lifetimes, opened) = (lifetimes.clone(), opened.clone());
        attackers.spawn(PEERS, move |_| {
            let (lifetimes, stop, opened) = (lifetimes.clone(), stop.clone(), opened.clone());
            async move {
                let mut peer = match SilentH2Peer::try_connect(addr).await {
                    Ok(p) => p,
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        return "refused at max_connections".to_string();
                    }
                };
                opened.fetch_add(1, Relaxed);
                let connected = Instant::now();
                // Hold it until weir closes it, or the run stops.
                let mut frames = Vec::new();
                loop {
                    let by = std::time::Instant::now() + Duration::from_millis(200);
                    match peer.closed_by(by).await {
                        Ok(last) => {
                            frames.extend(last);
                            lifetimes.lock().unwrap().push(connected.elapsed());
                            return if frames.contains(&7) {
                                "closed by weir after GOAWAY (PING never answered)".into()
                            } else {
                                format!("closed by weir, frames {frames:?}")
                            };
                        }
                        Err(_) if stop.load(Relaxed) => return "still open at the end".into(),
                        Err(seen) => frames.extend(seen_kinds(&seen)),
                    }
                }
            }
        });
    }
    let filled = eventually(Duration::from_secs(10), || opened.load(Relaxed) >= PEERS as u64).await;
    let fill_resources = resources(weir.pid());
    // Long enough for every peer to go idle (2 s), be sent GOAWAY + PING and be dropped
    // after graceful_close (5 s), and be replaced.
    let span = c.phase.max(Duration::from_secs(9));
    let attacked = watch.attacked(span, c.pace, probe_caller(addr)).await;
    let outcomes = attackers.stop(Duration::from_secs(2)).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let phases = attacked.after();
    let mut lifetimes = std::mem::take(&mut *lifetimes.lock().unwrap());
    lifetimes.sort_unstable();
    let life = |q: f64| {
        lifetimes
            .get(((lifetimes.len() as f64 * q).ceil() as usize).saturating_sub(1))
            .map_or("-".into(), |d| format!("{:.1} s", d.as_secs_f64()))
    };
    Ok(Run {
        attack: AttackKind::IdleH2,
        what: format!("{PEERS} h2 peers that ack SETTINGS and then answer nothing (PING included), replaced as closed"),
        settings: format!("max_connections: {MAX_CONNECTIONS}, timeouts.idle: 2s (graceful_close: shipped 5s)"),
        caller: PROBE_CALLER.into(),
        phases,
        attack_outcomes: outcomes,
        notes: vec![
            format!("all {PEERS} peers connected: {filled}; weir with them all open: {} fds, {} KiB RSS", fill_resources.fds, fill_resources.rss_kib),
            format!(
                "peer lifetime from connect to weir's close: min {} / p50 {} / max {} ({} closed; idle 2 s + graceful_close 5 s = 7 s)",
                life(0.0), life(0.5), life(1.0), lifetimes.len()
            ),
        ],
    })
}

/// The frame types `SilentH2Peer::closed_by` saw before its deadline (its error names them).
fn seen_kinds(error: &str) -> Vec<u8> {
    let Some(list) = error.split('[').nth(1).and_then(|l| l.split(']').next()) else {
        return Vec::new();
    };
    list.split(',').filter_map(|k| k.trim().parse().ok()).collect()
}

/// One round of the ambiguous-authority requests: each outcome named.
async fn ambiguous_round(addr: SocketAddr, k: usize) -> String {
    let raw = |case: &'static str, head: &'static [u8], expect: u16| async move {
        let mut conn = RawConn::connect(addr).await;
        conn.send(head).await;
        match conn.response(Duration::from_secs(3)).await {
            Ok(r) if r.status == expect && r.header("x-admission-level").is_some() => {
                format!("{case}: {expect} with level")
            }
            Ok(r) => format!("{case}: {} (WRONG)", r.status),
            Err(e) => format!("{case}: {} (WRONG)", e.chars().take(40).collect::<String>()),
        }
    };
    match k % 4 {
        0 => {
            raw(
                "two Hosts",
                b"GET /buy HTTP/1.1\r\nHost: shop.example\r\nHost: admin.example\r\n\r\n",
                400,
            )
            .await
        }
        1 => raw("HTTP/1.1 without Host", b"GET /buy HTTP/1.1\r\n\r\n", 400).await,
        2 => {
            raw(
                "absolute form shop.example, Host admin.example",
                b"GET http://shop.example/buy?absolute HTTP/1.1\r\nHost: admin.example\r\n\r\n",
                200,
            )
            .await
        }
        _ => {
            let exchange = async {
                let mut send =
                    h2_connect(addr, |_| {}).await.ready().await.map_err(|e| e.to_string())?;
                let req = http::Request::get("http://shop.example/buy")
                    .header("host", "admin.example")
                    .body(())
                    .unwrap();
                let (resp, _) = send.send_request(req, true).map_err(|e| e.to_string())?;
                let resp = resp.await.map_err(|e| e.to_string())?;
                Ok::<_, String>((
                    resp.status().as_u16(),
                    resp.headers().contains_key("x-admission-level"),
                ))
            };
            match tokio::time::timeout(Duration::from_secs(3), exchange).await {
                Ok(Ok((400, true))) => "h2 host != :authority: 400 with level".into(),
                Ok(Ok((s, _))) => format!("h2 host != :authority: {s} (WRONG)"),
                Ok(Err(e)) => format!("h2 host != :authority: {e} (WRONG)"),
                Err(_) => "h2 host != :authority: no answer (WRONG)".into(),
            }
        }
    }
}

async fn host_mismatch(c: &HardeningConfig) -> anyhow::Result<Run> {
    let app = Backend::start().await;
    let (weir, _dir) = entry_weir(c, app.addr).await?;
    let addr = weir.inbound();
    let watch = Watch::unattacked(weir.pid(), c.phase, c.pace, probe_caller(addr)).await;
    let mut attackers = Attackers { shared_runtime: c.shared_runtime, ..Attackers::default() };
    let sent = Arc::new(AtomicU64::new(0));
    attackers.spawn(4, move |_| {
        let sent = sent.clone();
        async move {
            let outcome = ambiguous_round(addr, sent.fetch_add(1, Relaxed) as usize).await;
            tokio::time::sleep(Duration::from_millis(2)).await;
            outcome
        }
    });
    let attacked = watch.attacked(c.phase, c.pace, probe_caller(addr)).await;
    let outcomes = attackers.stop(Duration::from_secs(4)).await;
    let phases = attacked.after();
    // What the app got for the absolute-form requests: the host classified, its class.
    let absolute = app.seen_path("/buy");
    let right = absolute
        .iter()
        .filter(|s| {
            let hosts: Vec<_> = s.headers.get_all("host").iter().collect();
            hosts == ["shop.example"]
                && s.headers.get("x-business-priority").is_some_and(|b| b == "30")
        })
        .count();
    Ok(Run {
        attack: AttackKind::HostMismatch,
        what: "two Hosts / no Host / h2 host != :authority (each 400) and absolute form != Host (200, forwarded as the URI's host), 4 clients".into(),
        settings: ENTRY_SETTINGS.into(),
        caller: PROBE_CALLER.into(),
        phases,
        attack_outcomes: outcomes,
        notes: vec![format!(
            "/buy requests that reached the app: {}; with Host shop.example only and business 30 (the class of the host forwarded): {right}",
            absolute.len()
        )],
    })
}

async fn egress_loop(c: &HardeningConfig) -> anyhow::Result<Run> {
    let downstream = Backend::start().await;
    let app = Backend::start().await;
    let yaml =
        format!("{}egress:\n  enabled: true\n  listen: 127.0.0.1:0\n", base_yaml(app.addr, "", ""));
    let weir = Weir::start(&c.weir_bin, &yaml).await?;
    let listeners = weir.process.listeners.clone();
    let egress = listeners.egress.ok_or_else(|| anyhow::anyhow!("no egress listener"))?;
    let caller = {
        let client = Http1::new();
        let (url, host) = (format!("http://{egress}/bytes/4096"), downstream.addr.to_string());
        move |_| {
            let (client, url, host) = (client.clone(), url.clone(), host.clone());
            async move { egress_get(&client, &url, &host).await }
        }
    };
    let watch = Watch::unattacked(weir.pid(), c.phase, c.pace, caller.clone()).await;
    let port = egress.port();
    let targets: Arc<Vec<(String, String)>> = Arc::new(vec![
        ("egress by Host".into(), format!("GET /loop HTTP/1.1\r\nhost: {egress}\r\n")),
        (
            "egress absolute form".into(),
            format!("GET http://{egress}/loop HTTP/1.1\r\nhost: {egress}\r\n"),
        ),
        ("localhost:egress".into(), format!("GET /loop HTTP/1.1\r\nhost: localhost:{port}\r\n")),
        ("0.0.0.0:egress".into(), format!("GET /loop HTTP/1.1\r\nhost: 0.0.0.0:{port}\r\n")),
        ("inbound".into(), format!("GET /loop HTTP/1.1\r\nhost: {}\r\n", listeners.inbound)),
        ("admin".into(), format!("GET /loop HTTP/1.1\r\nhost: {}\r\n", listeners.admin)),
    ]);
    let mut attackers = Attackers { shared_runtime: c.shared_runtime, ..Attackers::default() };
    let sent = Arc::new(AtomicU64::new(0));
    attackers.spawn(4, move |_| {
        let (targets, sent) = (targets.clone(), sent.clone());
        async move {
            let i = sent.fetch_add(1, Relaxed) as usize;
            let (name, head) = &targets[i % targets.len()];
            let request =
                format!("{head}x-request-timeout-ms: 300000\r\nconnection: close\r\n\r\n");
            let mut conn = RawConn::connect(egress).await;
            conn.send(request.as_bytes()).await;
            let outcome = match conn.response(Duration::from_secs(10)).await {
                Ok(r) if r.header("x-admission-level").is_none() => {
                    format!("{name}: {} from past weir (WRONG)", r.status)
                }
                Ok(r) => format!("{name}: {}", r.status),
                Err(e) => format!("{name}: {} (WRONG)", e.chars().take(40).collect::<String>()),
            };
            tokio::time::sleep(Duration::from_millis(2)).await;
            outcome
        }
    });
    let attacked = watch.attacked(c.phase, c.pace, caller).await;
    let outcomes = attackers.stop(Duration::from_secs(11)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let phases = attacked.after();
    Ok(Run {
        attack: AttackKind::EgressLoop,
        what: "requests through the egress addressed to weir's own listeners (egress, localhost, 0.0.0.0, inbound, admin), 300 s budget, 4 clients".into(),
        settings: "egress.enabled: true".into(),
        caller: "GET /bytes/4096 through the egress to a downstream (keep-alive)".into(),
        phases,
        attack_outcomes: outcomes,
        notes: vec![],
    })
}

async fn closing_app(c: &HardeningConfig) -> anyhow::Result<Run> {
    // The same caller through two sidecars back to back: one before a well-behaved
    // keep-alive app, one before an app that drops every reused connection.
    let good = Backend::start().await;
    let weir_good = Weir::start(&c.weir_bin, &base_yaml(good.addr, "", "")).await?;
    let caller = |inbound: SocketAddr| {
        let client = Http1::new();
        let url = format!("http://{inbound}/x");
        move |_| {
            let (client, url) = (client.clone(), url.clone());
            async move { proxied_get(&client, &url, &IMPORTANT, None).await }
        }
    };
    measure(WARM_UP, c.pace, caller(weir_good.inbound())).await;
    let unattacked = measure(c.phase, c.pace, caller(weir_good.inbound())).await;
    drop(weir_good);
    let app = ClosingKeepAliveApp::start().await;
    let weir = Weir::start(&c.weir_bin, &base_yaml(app.addr, "", "")).await?;
    let pid = weir.pid();
    let watch = Watch { pid, unattacked, before: resources(pid), sampler: Sampler::start(pid) };
    let attacked = watch.attacked(c.phase, c.pace, caller(weir.inbound())).await;
    let phases = attacked.after();
    let mut outcomes = BTreeMap::new();
    outcomes.insert("answered by the app".into(), app.answered.load(Relaxed));
    outcomes.insert("dropped by the app (connection closed)".into(), app.dropped.load(Relaxed));
    Ok(Run {
        attack: AttackKind::ClosingApp,
        what: "the app closes each keep-alive connection as the next request on it arrives".into(),
        settings: "none".into(),
        caller: "GET /x (keep-alive) through the inbound listener; unattacked: a sidecar before a keep-alive app".into(),
        phases,
        attack_outcomes: outcomes,
        notes: vec!["every request after the first on a pooled connection is lost by the app: the caller's 502s are the figure (the retry on a fresh connection is the fix)".into()],
    })
}

fn small_table(business: u8) -> String {
    format!(
        "default_business: {business}\nrules:\n  - {{ name: a, business: {business}, match: {{ path: /a }} }}\n"
    )
}

/// GET the table's etag, PUT a new one with the token and If-Match.
async fn put_table(
    client: &TestClient,
    admin: SocketAddr,
    token: &str,
    yaml: String,
) -> Result<(), String> {
    let url = format!("http://{admin}/v1/priority-table");
    let current =
        client.send(http::Method::GET, &url, &[], crate::support::client::empty()).await?;
    let etag = current.header("etag").ok_or("no etag")?.to_owned();
    let auth = format!("Bearer {token}");
    let headers = [
        ("authorization", auth.as_str()),
        ("content-type", "application/yaml"),
        ("if-match", etag.as_str()),
    ];
    let r = client.send(http::Method::PUT, &url, &headers, bytes_body(yaml)).await?;
    if r.status == 200 {
        Ok(())
    } else {
        Err(format!("PUT {}", r.status))
    }
}

async fn validate_flood(c: &HardeningConfig) -> anyhow::Result<Run> {
    const FLOODERS: usize = 8;
    let dir = tempfile::tempdir()?;
    let token = dir.path().join("token");
    std::fs::write(&token, "operator-token\n")?;
    let app = Backend::start().await;
    let yaml = base_yaml(app.addr, "", &format!("  token_file: {}\n", token.display()));
    let weir = Weir::start(&c.weir_bin, &yaml).await?;
    let admin = weir.admin();
    let writer = {
        let client = Http1::new();
        move |i: usize| {
            let client = client.clone();
            async move { put_table(&client, admin, "operator-token", small_table(i as u8 % 4)).await }
        }
    };
    let pace = c.pace.max(Duration::from_millis(20));
    let watch = Watch::unattacked(weir.pid(), c.phase, pace, writer.clone()).await;
    let big = Arc::new(crate::support::big_valid_table());
    let url = Arc::new(format!("http://{admin}/v1/priority-table/validate"));
    let client = Http1::new();
    let mut attackers = Attackers { shared_runtime: c.shared_runtime, ..Attackers::default() };
    attackers.spawn(FLOODERS, move |_| {
        let (big, url, client) = (big.clone(), url.clone(), client.clone());
        async move {
            let yaml = [("content-type", "application/yaml")];
            match client.send(http::Method::POST, &url, &yaml, bytes_body(big.to_string())).await {
                Ok(r) => format!("validate {}", r.status),
                Err(e) => format!("validate error {}", e.chars().take(40).collect::<String>()),
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let attacked = watch.attacked(c.phase, pace, writer).await;
    let outcomes = attackers.stop(Duration::from_secs(10)).await;
    let phases = attacked.after();
    Ok(Run {
        attack: AttackKind::ValidateFlood,
        what: format!("{FLOODERS} clients POSTing a 480 KiB table (60 rules x 1,000 header matches) to /v1/priority-table/validate without a token, back to back"),
        settings: "admin.token_file".into(),
        caller: format!("the operator's write: GET /v1/priority-table (etag) + PUT with the token and If-Match, every {} ms", pace.as_millis()),
        phases,
        attack_outcomes: outcomes,
        notes: vec![],
    })
}

/// Points `link` at `target` atomically, as the kubelet swaps a ConfigMap's `..data`.
fn repoint(link: &Path, target: &Path) -> std::io::Result<()> {
    let tmp = link.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)?;
    std::fs::rename(&tmp, link)
}

async fn table_file(c: &HardeningConfig) -> anyhow::Result<Vec<Run>> {
    let dir = tempfile::tempdir()?;
    let good = dir.path().join("good.yaml");
    std::fs::write(&good, small_table(1))?;
    let link = dir.path().join("table.yaml");
    repoint(&link, &good)?;
    let huge = dir.path().join("huge.yaml");
    std::fs::File::create(&huge)?.set_len(200 << 20)?;
    let fifo = dir.path().join("fifo");
    anyhow::ensure!(Command::new("mkfifo").arg(&fifo).status()?.success(), "mkfifo");
    let app = Backend::start().await;
    let yaml = base_yaml(app.addr, "", &format!("  table_file: {}\n", link.display()));
    let weir = Weir::start(&c.weir_bin, &yaml).await?;
    let addr = weir.inbound();
    let mut runs = Vec::new();
    measure(WARM_UP, c.pace, probe_caller(addr)).await;
    for (name, target) in [
        ("200 MB file", huge.clone()),
        ("FIFO", fifo.clone()),
        ("/dev/zero", PathBuf::from("/dev/zero")),
    ] {
        repoint(&link, &good)?;
        tokio::time::sleep(Duration::from_millis(600)).await;
        let unattacked = measure(c.phase, c.pace, probe_caller(addr)).await;
        let (pid, before) = (weir.pid(), resources(weir.pid()));
        let cpu0 = procfs::cpu_time(pid).unwrap_or_default();
        let watch = Watch { pid, unattacked, before, sampler: Sampler::start(pid) };
        let started = Instant::now();
        repoint(&link, &target)?;
        let attacked = watch.attacked(c.phase, c.pace, probe_caller(addr)).await;
        let cpu = procfs::cpu_time(weir.pid()).unwrap_or_default().saturating_sub(cpu0);
        let wall = started.elapsed();
        let phases = attacked.after();
        let text = crate::support::metrics_text(weir.admin()).await;
        let unreadable = crate::support::sample(&text, "weir_priority_table_file_unreadable_total");
        let mut outcomes = BTreeMap::new();
        outcomes.insert("unreadable polls counted so far".into(), unreadable as u64);
        runs.push(Run {
            attack: AttackKind::TableFile,
            what: format!("the watched table file (a symlink) pointed at a {name}"),
            settings: "admin.table_file (shipped poll interval 500 ms)".into(),
            caller: PROBE_CALLER.into(),
            phases,
            attack_outcomes: outcomes,
            notes: vec![format!(
                "weir's CPU during the attacked phase (serving the caller included): {:.1}% of a core",
                cpu.as_secs_f64() / wall.as_secs_f64() * 100.0
            )],
        });
    }
    Ok(runs)
}

// === output ===

fn errors_fmt(e: &BTreeMap<String, u64>) -> String {
    if e.is_empty() {
        return "0".into();
    }
    e.iter().map(|(k, v)| format!("{v} x {k}")).collect::<Vec<_>>().join("; ")
}

/// The results as markdown: one summary table, then each attack's details.
pub fn markdown(results: &[AttackResult], config: &HardeningConfig) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Each attack: the well-behaved caller alone for {:.0} s, then during the attack for {:.0} s \
         (back to back, same weir process, a request every {} ms). Target: attacked p99 within {} ms \
         of the unattacked p99, and no refusal or error. fds / RSS: weir's, before the attack / \
         highest during it (sampled every 20 ms) / after it. CPU: weir's and this runner's (caller, \
         attackers, apps), over the attack.\n",
        config.phase.as_secs_f64(),
        config.phase.as_secs_f64(),
        config.pace.as_millis(),
        TARGET.as_millis()
    );
    let _ = writeln!(
        s,
        "| attack | caller p50 / p99 unattacked ms | p50 / p99 attacked ms | p99 delta | target | caller errors (attacked) | fds before / during / after | RSS MiB before / during / after | CPU during: weir / runner (% of a core) | load (unattacked -> attacked) |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---|---|---:|---:|---:|---|");
    let mib = |k: u64| k as f64 / 1024.0;
    for r in results {
        let _ = writeln!(
            s,
            "| {} | {:.2} / {:.2} | {:.2} / {:.2} | {:+.2} ms | {} | {} | {} / {} / {} | {:.1} / {:.1} / {:.1} | {:.0} / {:.0} | {} -> {} |",
            if r.attack == AttackKind::TableFile {
                format!("{:?}: {}", r.attack, r.what.trim_start_matches("the watched table file (a symlink) pointed at a "))
            } else {
                format!("{:?}", r.attack)
            },
            r.unattacked.p50_ms,
            r.unattacked.p99_ms,
            r.attacked.p50_ms,
            r.attacked.p99_ms,
            r.p99_delta_ms,
            if r.within_target { "met" } else { "**missed**" },
            errors_fmt(&r.attacked.errors),
            r.before.fds,
            r.during_max.fds,
            r.after.fds,
            mib(r.before.rss_kib),
            mib(r.during_max.rss_kib),
            mib(r.after.rss_kib),
            r.during_max.cpu_pct.unwrap_or(f64::NAN),
            r.during_max.runner_cpu_pct.unwrap_or(f64::NAN),
            r.unattacked.loadavg,
            r.attacked.loadavg,
        );
    }
    for r in results {
        let _ = writeln!(s, "\n#### {:?}: {}\n", r.attack, r.what);
        let _ = writeln!(s, "- weir settings beyond the shipped defaults: {}", r.settings);
        let _ = writeln!(s, "- caller: {}", r.caller);
        let _ = writeln!(
            s,
            "- caller unattacked: {} answered, p50 {:.2} / p99 {:.2} / max {:.2} ms, errors {}",
            r.unattacked.answered,
            r.unattacked.p50_ms,
            r.unattacked.p99_ms,
            r.unattacked.max_ms,
            errors_fmt(&r.unattacked.errors)
        );
        let _ = writeln!(
            s,
            "- caller attacked: {} answered, p50 {:.2} / p99 {:.2} / max {:.2} ms, errors {}",
            r.attacked.answered,
            r.attacked.p50_ms,
            r.attacked.p99_ms,
            r.attacked.max_ms,
            errors_fmt(&r.attacked.errors)
        );
        let _ = writeln!(s, "- attacker's outcomes: {}", errors_fmt(&r.attack_outcomes));
        for n in &r.notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    s
}
