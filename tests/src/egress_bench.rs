//! The egress benchmark (issue 11; BENCHMARKS.md, "Egress: chain, fan-out, expiry"): real
//! `weir` processes on 127.0.0.1, a call graph of two services, B the bottleneck.
//!
//! ```text
//! load --> weir A (entry + egress) --> app A --(A's egress)--> weir B --> app B
//!          stamps the priority         hashes ~1 ms,           inbound    capacity
//!          from the table by path      then calls B            only       backend
//! ```
//!
//! - `chain`: app A calls B once per request; B offered 3x its capacity. Where the refusals
//!   happen (A's inbound, A's egress, B), how many requests crossed the network only to be
//!   refused by B, how fast app A gets an egress refusal, per-class success; propagation on
//!   (A's egress caches B's level) and off (`egress.max_authorities: 0`).
//! - `fanout`: app A calls B twice in sequence and succeeds only if both do (the paper's
//!   subsequent overload). Wasted work: A's requests whose first call succeeded and whose
//!   second was refused; with the entry's stamp on both calls, and with the user priority
//!   drawn at random per call.
//! - `expiry`: B's service time triples, then recovers: how long after the recovery the
//!   classes refused meanwhile flow again (target: the egress level expiry plus one window).
//!
//! Everything is measured in one process: the load generator, app A and app B are tasks of
//! this program, the two sidecars child processes. Counts come from app A (what each call
//! to B became), from both sidecars' `/metrics` (sampled every 250 ms: refusals per place,
//! B's level, A's cached level of B) and from the load generator (end-to-end success).

use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use rand::Rng;
use serde::Serialize;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use crate::backend::{BackendConfig, BackendSnapshot, CapacityBackend, ServiceChange};
use crate::contender::Contender;
use crate::load::{self, ClassReport, LoadSpec, Phase};
use crate::prom::Metrics;
use crate::status::{StatusPoller, StatusSample};

/// Which parts of the benchmark to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Suite {
    Chain,
    Fanout,
    Expiry,
}

#[derive(Clone, Debug, Serialize)]
pub struct EgressBenchConfig {
    pub suites: Vec<Suite>,
    /// App B, the bottleneck.
    pub app_b: BackendConfig,
    /// CPU app A burns per request before calling B.
    #[serde(serialize_with = "crate::report::ser_millis")]
    pub app_a_work: Duration,
    /// Offered load at B as a multiple of its capacity (chain and fan-out).
    pub multiple: f64,
    /// Each chain / fan-out run, and the part of it not counted (the level settling).
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub run: Duration,
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub warmup: Duration,
    /// Expiry: normal, degraded (service time x `slowdown`), recovered.
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub expiry_phase: Duration,
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub expiry_degraded: Duration,
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub expiry_after: Duration,
    pub expiry_load: f64,
    pub slowdown: u32,
    /// critical / normal / background shares.
    pub mix: [f64; 3],
    pub seed: u64,
    #[serde(skip)]
    pub weir_bin: PathBuf,
}

/// Refusals by where they happened, over the counted part of a run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Places {
    /// weir A's inbound (entry) refused the client's request.
    pub a_inbound: f64,
    /// weir A's egress refused a call locally (`x-weir-shed: downstream-level`).
    pub a_egress: f64,
    /// weir B's inbound refused a call that crossed the network.
    pub b: f64,
    pub b_overload: f64,
    pub b_deadline: f64,
}

impl Places {
    pub fn total(&self) -> f64 {
        self.a_inbound + self.a_egress + self.b
    }
    /// Share of all refusals made at A's egress.
    pub fn egress_share(&self) -> f64 {
        self.a_egress / self.total().max(1.0)
    }
}

/// One chain or fan-out run.
#[derive(Clone, Debug, Serialize)]
pub struct ChainResult {
    pub suite: Suite,
    pub label: String,
    pub propagation: bool,
    pub calls_per_request: usize,
    pub random_user_per_call: bool,
    pub offered_rps: f64,
    pub goodput_rps: f64,
    pub refusals: Places,
    /// What reached B's sidecar (admitted + refused) and what it refused.
    pub b_received: f64,
    pub b_refused_share: f64,
    /// Time for app A to get an egress refusal back (send to answer), microseconds.
    pub egress_refusal_p50_us: Option<f64>,
    pub egress_refusal_p99_us: Option<f64>,
    pub egress_refusals_timed: u64,
    /// App A's requests, and those whose first call succeeded and second was refused.
    pub app_requests: u64,
    pub wasted: u64,
    pub wasted_share: f64,
    pub classes: Vec<ClassReport>,
    pub app_b: BackendSnapshot,
    pub samples: Vec<Sample>,
    /// B's `/v1/status` every 100 ms (level, window, capacity estimate, in-flight limit).
    pub b_status: Vec<StatusSample>,
}

impl ChainResult {
    pub fn success(&self, class: usize) -> f64 {
        self.classes.get(class).map_or(1.0, ClassReport::success_ratio)
    }
}

/// One expiry run.
#[derive(Clone, Debug, Serialize)]
pub struct ExpiryResult {
    pub label: String,
    pub propagation: bool,
    pub degraded_from_secs: f64,
    pub recovered_at_secs: f64,
    /// Classes with refusals while B was slow.
    pub refused_classes: Vec<String>,
    /// From B's recovery until every class refused meanwhile keeps >= 99% success.
    pub flow_again_secs: Option<f64>,
    /// From B's recovery until A's cached level of B admits every class (or has expired)
    /// and stays so; and the same for B's own level.
    pub a_cached_open_secs: Option<f64>,
    pub b_level_open_secs: Option<f64>,
    pub degraded_success: Vec<f64>,
    pub samples: Vec<Sample>,
    pub b_status: Vec<StatusSample>,
}

#[derive(Clone, Debug, Serialize)]
pub struct EgressBenchResult {
    pub config: EgressBenchConfig,
    pub chains: Vec<ChainResult>,
    pub expiries: Vec<ExpiryResult>,
    /// The level expiry and window the expiry target is made of, seconds.
    pub target_secs: f64,
}

/// Level drawn for "every class in use admitted" (business 3.0).
const LEVEL_ALL_OPEN: f64 = 3.0 * 128.0;
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
const CLASS_PATHS: [&str; 3] = ["/critical", "/normal", "/background"];
const TABLE: &str = "default_business: 2
rules:
  - name: critical
    match: { path_prefix: /critical }
    business: 0
  - name: normal
    match: { path_prefix: /normal }
    business: 1
  - name: background
    match: { path_prefix: /background }
    business: 2
";
/// weir's shipped defaults the expiry target is made of.
const LEVEL_EXPIRY_SECS: f64 = 2.0;
const WINDOW_SECS: f64 = 1.0;

/// Runs the selected suites; `progress` gets one line per finished run.
pub async fn run(
    config: EgressBenchConfig,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<EgressBenchResult> {
    let mut result = EgressBenchResult {
        config: config.clone(),
        chains: Vec::new(),
        expiries: Vec::new(),
        target_secs: LEVEL_EXPIRY_SECS + WINDOW_SECS,
    };
    let work_iters = calibrate(config.app_a_work);
    progress(&format!(
        "app A burns {work_iters} hash rounds per request (~{:.1} ms); app B {} x {:.0} ms = {:.0} rps",
        config.app_a_work.as_secs_f64() * 1e3,
        config.app_b.workers,
        config.app_b.service_time.as_secs_f64() * 1e3,
        config.app_b.nominal_capacity()
    ));
    let capacity = config.app_b.nominal_capacity();
    let phases = |calls: usize| {
        let rate = capacity * config.multiple / calls as f64;
        vec![Phase { rate_per_sec: rate, duration: config.run }]
    };
    let mut runs: Vec<(Suite, &str, bool, usize, bool)> = Vec::new();
    if config.suites.contains(&Suite::Chain) {
        runs.push((Suite::Chain, "chain, propagation on", true, 1, false));
        runs.push((Suite::Chain, "chain, propagation off", false, 1, false));
    }
    if config.suites.contains(&Suite::Fanout) {
        runs.push((Suite::Fanout, "fan-out, entry stamp", true, 2, false));
        runs.push((Suite::Fanout, "fan-out, random user per call", true, 2, true));
    }
    for (suite, label, propagation, calls, random_user) in runs {
        let graph = Graph { propagation, calls, random_user, work_iters };
        let run = graph.run(&config, config.app_b.clone(), phases(calls), config.warmup).await?;
        let r = chain_result(suite, label, &graph, run, &config);
        progress(&format!(
            "{label:<32} refusals: A in {:.0}, A egress {:.0}, B {:.0} ({:.1}% at A's egress); B refused {:.1}% of {:.0}; egress refusal p50 {} p99 {} us; wasted {:.1}%; success {:.1}/{:.1}/{:.1}%",
            r.refusals.a_inbound,
            r.refusals.a_egress,
            r.refusals.b,
            r.refusals.egress_share() * 100.0,
            r.b_refused_share * 100.0,
            r.b_received,
            opt0(r.egress_refusal_p50_us),
            opt0(r.egress_refusal_p99_us),
            r.wasted_share * 100.0,
            r.success(0) * 100.0,
            r.success(1) * 100.0,
            r.success(2) * 100.0,
        ));
        result.chains.push(r);
    }
    if config.suites.contains(&Suite::Expiry) {
        for propagation in [true, false] {
            let r = expiry_run(&config, propagation, work_iters).await?;
            progress(&format!(
                "{:<32} refused meanwhile: {:?}; flow again {} after B recovered; A's cached level open after {}, B's level after {}",
                r.label,
                r.refused_classes,
                secs(r.flow_again_secs),
                secs(r.a_cached_open_secs),
                secs(r.b_level_open_secs),
            ));
            result.expiries.push(r);
        }
    }
    Ok(result)
}

fn opt0(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.0}"))
}

fn secs(x: Option<f64>) -> String {
    x.map_or("never".into(), |v| format!("{v:.1} s"))
}

// === the call graph ===

/// How one run wires the graph.
struct Graph {
    propagation: bool,
    calls: usize,
    random_user: bool,
    work_iters: u64,
}

/// What one run of the graph gives back.
struct GraphRun {
    report: load::LoadReport,
    samples: Vec<Sample>,
    b_status: Vec<StatusSample>,
    app_a: Arc<AppA>,
    app_b: BackendSnapshot,
}

impl Graph {
    async fn run(
        &self,
        config: &EgressBenchConfig,
        app_b: BackendConfig,
        phases: Vec<Phase>,
        warmup: Duration,
    ) -> anyhow::Result<GraphRun> {
        let dir = tempfile::tempdir()?;
        let table = dir.path().join("table.yaml");
        let secret = dir.path().join("secret");
        std::fs::write(&table, TABLE)?;
        std::fs::write(&secret, "egress-bench-secret\n")?;

        let backend = CapacityBackend::start(app_b).await?;
        let b_yaml = format!(
            "inbound:\n  listen: 127.0.0.1:0\n  app: {}\n  threads: 1\nadmin:\n  listen: 127.0.0.1:0\nlog:\n  filter: warn\n",
            backend.addr()
        );
        let weir_b = Contender::weir_with_config(&config.weir_bin, &b_yaml).await?;
        let (b_in, b_admin) = (weir_b.addr, weir_b.admin.expect("weir's admin"));

        // App A needs its egress's address, weir A its app's: A's egress port is known once
        // weir A is up, and given to app A before any load.
        let app_a =
            Arc::new(AppA::new(b_in.to_string(), self.calls, self.random_user, self.work_iters));
        // Serves until the end of this run.
        let app_a_server = app_a.clone().serve().await?;
        let app_a_addr = app_a_server.addr();
        let max_authorities = if self.propagation { 64 } else { 0 };
        let a_yaml = format!(
            "inbound:\n  listen: 127.0.0.1:0\n  app: {app_a_addr}\n  entry: true\n  threads: 1\n\
             admin:\n  listen: 127.0.0.1:0\n  table_file: {}\n  user_secret_file: {}\n\
             egress:\n  enabled: true\n  listen: 127.0.0.1:0\n  max_authorities: {max_authorities}\n  threads: 1\n\
             log:\n  filter: warn\n",
            table.display(),
            secret.display()
        );
        let weir_a = Contender::weir_with_config(&config.weir_bin, &a_yaml).await?;
        let (a_in, a_admin) = (weir_a.addr, weir_a.admin.expect("weir's admin"));
        let a_egress = weir_a.listeners.as_ref().and_then(|l| l.egress).expect("A's egress");
        app_a.egress.set(a_egress).expect("set once");

        let mut spec = LoadSpec::new(a_in, phases);
        spec.classes = load::classes_with_shares(config.mix);
        spec.class_paths = CLASS_PATHS.iter().map(|p| p.to_string()).collect();
        spec.warmup = warmup;
        spec.seed = config.seed;
        // Service changes are timed from here, as are the load and the samples.
        backend.reset();
        let sampler = Sampler::start(a_admin, b_admin, app_a.clone());
        let b_poller = StatusPoller::start(b_admin, Duration::from_millis(100));
        let report = load::run(spec).await?;
        let samples = sampler.stop();
        let b_status = b_poller.stop();
        let app_b = backend.snapshot();
        drop(weir_a);
        drop(weir_b);
        drop(backend);
        Ok(GraphRun { report, samples, b_status, app_a, app_b })
    }
}

fn chain_result(
    suite: Suite,
    label: &str,
    graph: &Graph,
    run: GraphRun,
    config: &EgressBenchConfig,
) -> ChainResult {
    let warm = config.warmup.as_secs_f64();
    let (first, last) = counted(&run.samples, warm);
    let d = |f: fn(&Sample) -> f64| f(last) - f(first);
    let refusals = Places {
        a_inbound: d(|s| s.a_inbound_refused),
        a_egress: d(|s| s.a_egress_refused),
        b: d(|s| s.b_overload + s.b_deadline),
        b_overload: d(|s| s.b_overload),
        b_deadline: d(|s| s.b_deadline),
    };
    let b_received = d(|s| s.b_admitted + s.b_overload + s.b_deadline);
    let app_requests = (last.app_requests - first.app_requests) as u64;
    let wasted = (last.app_wasted - first.app_wasted) as u64;
    let latency = run.app_a.stats.egress_refusal_us.lock().unwrap_or_else(|e| e.into_inner());
    let q = |q: f64| (!latency.is_empty()).then(|| latency.value_at_quantile(q) as f64);
    ChainResult {
        suite,
        label: label.into(),
        propagation: graph.propagation,
        calls_per_request: graph.calls,
        random_user_per_call: graph.random_user,
        offered_rps: run.report.offered(),
        goodput_rps: run.report.goodput(),
        b_refused_share: refusals.b / b_received.max(1.0),
        refusals,
        b_received,
        egress_refusal_p50_us: q(0.5),
        egress_refusal_p99_us: q(0.99),
        egress_refusals_timed: latency.len(),
        app_requests,
        wasted,
        wasted_share: wasted as f64 / app_requests.max(1) as f64,
        classes: run.report.classes.clone(),
        app_b: run.app_b,
        samples: run.samples.clone(),
        b_status: run.b_status.clone(),
    }
}

/// The first sample at or after `warm` seconds and the last one.
fn counted(samples: &[Sample], warm: f64) -> (&Sample, &Sample) {
    static EMPTY: std::sync::OnceLock<Sample> = std::sync::OnceLock::new();
    let empty = EMPTY.get_or_init(Sample::default);
    let first = samples.iter().find(|s| s.at_secs >= warm).or(samples.first()).unwrap_or(empty);
    (first, samples.last().unwrap_or(empty))
}

async fn expiry_run(
    config: &EgressBenchConfig,
    propagation: bool,
    work_iters: u64,
) -> anyhow::Result<ExpiryResult> {
    let from = config.expiry_phase;
    let to = from + config.expiry_degraded;
    let end = to + config.expiry_after;
    let mut app_b = config.app_b.clone();
    app_b.service_changes = vec![
        ServiceChange { at: from, service_time: app_b.service_time * config.slowdown },
        ServiceChange { at: to, service_time: app_b.service_time },
    ];
    let rate = app_b.nominal_capacity() * config.expiry_load;
    let phases = vec![Phase { rate_per_sec: rate, duration: end }];
    let graph = Graph { propagation, calls: 1, random_user: false, work_iters };
    let run = graph.run(config, app_b, phases, Duration::ZERO).await?;
    let (f, t, e) = (from.as_secs_f64(), to.as_secs_f64(), end.as_secs_f64());
    let events = &run.report.events;
    let classes = run.report.classes.len();
    let degraded_success = weir_workload::analysis::success_by_class(events, f, t, classes);
    let refused: Vec<u16> = (0..classes as u16)
        .filter(|&k| weir_workload::analysis::counts(events, f, t, Some(k)).success() < 0.99)
        .collect();
    let flow_again_secs = refused
        .iter()
        .map(|&k| weir_workload::analysis::recovery_secs(events, t, e, classes, Some(k), 0.99, 2.0))
        .try_fold(0.0f64, |m, r| r.map(|r| m.max(r)));
    let open_after = |level: fn(&Sample) -> Option<f64>| {
        let points: Vec<(f64, f64)> = run
            .samples
            .iter()
            .map(|s| (s.at_secs, level(s).unwrap_or(f64::from(u16::MAX)).min(LEVEL_ALL_OPEN)))
            .collect();
        weir_workload::analysis::follow_secs(&points, t, e, LEVEL_ALL_OPEN, 0.0)
    };
    Ok(ExpiryResult {
        label: format!("expiry, propagation {}", if propagation { "on" } else { "off" }),
        propagation,
        degraded_from_secs: f,
        recovered_at_secs: t,
        refused_classes: refused
            .iter()
            .map(|&k| run.report.classes[k as usize].name.clone())
            .collect(),
        flow_again_secs,
        a_cached_open_secs: if propagation { open_after(|s| s.a_cached_level) } else { None },
        b_level_open_secs: open_after(|s| s.b_level),
        degraded_success,
        samples: run.samples,
        b_status: run.b_status,
    })
}

// === app A ===

/// App A: burns CPU for each request, then calls B through A's egress (routed by `Host`)
/// once or twice in sequence, passing the priority the entry stamped (or, to show what
/// it prevents, a random user priority per call) and the remaining budget.
struct AppA {
    /// Weir A's egress listener, known once weir A is up (it binds port 0).
    egress: std::sync::OnceLock<SocketAddr>,
    downstream: String,
    calls: usize,
    random_user: bool,
    work_iters: u64,
    client: Client<HttpConnector, Empty<Bytes>>,
    stats: AppStats,
}

struct AppStats {
    requests: AtomicU64,
    calls: AtomicU64,
    calls_ok: AtomicU64,
    refused_at_egress: AtomicU64,
    refused_downstream: AtomicU64,
    failed: AtomicU64,
    /// First call succeeded, a later one was refused: B's work on the first one wasted.
    wasted: AtomicU64,
    egress_refusal_us: Mutex<Histogram<u64>>,
}

/// What app A answers when a call to B failed, in `x-weir-shed` so the load generator
/// counts it by place (`a-egress`, `b-overload`, ...).
const SHED: &str = "x-weir-shed";

impl AppA {
    fn new(downstream: String, calls: usize, random_user: bool, work_iters: u64) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(usize::MAX)
            .build(connector);
        let stats = AppStats {
            requests: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            calls_ok: AtomicU64::new(0),
            refused_at_egress: AtomicU64::new(0),
            refused_downstream: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            wasted: AtomicU64::new(0),
            egress_refusal_us: Mutex::new(
                Histogram::new_with_bounds(1, 60_000_000, 3).expect("static bounds"),
            ),
        };
        let egress = std::sync::OnceLock::new();
        AppA { egress, downstream, calls, random_user, work_iters, client, stats }
    }

    /// Binds an ephemeral port and serves until the runtime ends.
    async fn serve(self: Arc<Self>) -> anyhow::Result<weir_workload::backend::HttpServer> {
        let handler = move |req| {
            let app = self.clone();
            async move { app.handle(req).await }
        };
        Ok(weir_workload::backend::HttpServer::bind(([127, 0, 0, 1], 0).into(), handler).await?)
    }

    async fn handle(&self, req: hyper::Request<Incoming>) -> hyper::Response<Full<Bytes>> {
        let arrived = Instant::now();
        let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
        let budget = header("x-request-timeout-ms").and_then(|v| v.parse::<u64>().ok());
        let deadline = arrived + Duration::from_millis(budget.unwrap_or(500));
        let business = header("x-business-priority").unwrap_or("255").to_string();
        let user = header("x-user-priority").unwrap_or("127").to_string();
        let harness_deadline = header(crate::DEADLINE_HEADER).map(str::to_string);
        let iters = self.work_iters;
        let _ = tokio::task::spawn_blocking(move || burn(iters)).await;
        self.stats.requests.fetch_add(1, Relaxed);
        // `succeeded`: calls before this one, all of which succeeded.
        for succeeded in 0..self.calls {
            let user = if self.random_user {
                rand::rng().random_range(0..128u8).to_string()
            } else {
                user.clone()
            };
            let ended = self.call(deadline, &business, &user, harness_deadline.as_deref()).await;
            if let Some(answer) = ended {
                if succeeded > 0 && answer.status() == hyper::StatusCode::SERVICE_UNAVAILABLE {
                    self.stats.wasted.fetch_add(1, Relaxed);
                }
                return answer;
            }
        }
        hyper::Response::new(Full::new(Bytes::from_static(b"ok\n")))
    }

    /// One call to B; `None` when it succeeded, else app A's answer to its caller.
    async fn call(
        &self,
        deadline: Instant,
        business: &str,
        user: &str,
        harness_deadline: Option<&str>,
    ) -> Option<hyper::Response<Full<Bytes>>> {
        let stats = &self.stats;
        stats.calls.fetch_add(1, Relaxed);
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            stats.failed.fetch_add(1, Relaxed);
            return Some(answer(504, "a-budget"));
        }
        let egress = self.egress.get().expect("the egress address is set before any load");
        let mut builder = http::Request::get(format!("http://{egress}/work"))
            .header(http::header::HOST, &self.downstream)
            .header("x-business-priority", business)
            .header("x-user-priority", user)
            .header("x-request-timeout-ms", remaining.as_millis().max(1) as u64);
        if let Some(d) = harness_deadline {
            builder = builder.header(crate::DEADLINE_HEADER, d);
        }
        let Ok(request) = builder.body(Empty::new()) else {
            stats.failed.fetch_add(1, Relaxed);
            return Some(answer(502, "a-bad-request"));
        };
        let sent = Instant::now();
        let exchange = async {
            let response = self.client.request(request).await?;
            let (parts, body) = response.into_parts();
            body.collect().await?;
            anyhow::Ok(parts)
        };
        let parts = match tokio::time::timeout_at(deadline, exchange).await {
            Ok(Ok(parts)) => parts,
            Ok(Err(_)) => {
                stats.failed.fetch_add(1, Relaxed);
                return Some(answer(502, "b-error"));
            }
            Err(_) => {
                stats.failed.fetch_add(1, Relaxed);
                return Some(answer(504, "b-timeout"));
            }
        };
        let shed = parts.headers.get(SHED).and_then(|v| v.to_str().ok());
        match (parts.status.as_u16(), shed) {
            (200, _) => {
                stats.calls_ok.fetch_add(1, Relaxed);
                None
            }
            (503, Some("downstream-level")) => {
                let us = sent.elapsed().as_micros() as u64;
                let mut h = stats.egress_refusal_us.lock().unwrap_or_else(|e| e.into_inner());
                let _ = h.record(us.max(1));
                stats.refused_at_egress.fetch_add(1, Relaxed);
                Some(answer(503, "a-egress"))
            }
            (503, reason) => {
                stats.refused_downstream.fetch_add(1, Relaxed);
                let label = match reason {
                    Some("overload") => "b-overload",
                    Some("deadline") => "b-deadline",
                    _ => "b-unlabelled",
                };
                Some(answer(503, label))
            }
            _ => {
                stats.failed.fetch_add(1, Relaxed);
                Some(answer(502, "b-error"))
            }
        }
    }
}

fn answer(status: u16, place: &'static str) -> hyper::Response<Full<Bytes>> {
    let mut resp = hyper::Response::new(Full::new(Bytes::new()));
    *resp.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
    resp.headers_mut().insert(SHED, http::HeaderValue::from_static(place));
    resp
}

/// `iters` rounds of SipHash: app A's real work.
fn burn(iters: u64) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for i in 0..iters {
        std::hint::black_box(i).hash(&mut h);
    }
    h.finish()
}

/// Hash rounds that take about `work` on this machine (the fastest of a few trials, so a
/// busy moment does not inflate it).
fn calibrate(work: Duration) -> u64 {
    if work.is_zero() {
        return 0;
    }
    let trial = 200_000u64;
    let best = (0..5)
        .map(|_| {
            let t = std::time::Instant::now();
            std::hint::black_box(burn(trial));
            t.elapsed()
        })
        .min()
        .unwrap_or(Duration::from_millis(1));
    ((trial as f64) * work.as_secs_f64() / best.as_secs_f64().max(1e-9)) as u64
}

// === sampling both sidecars ===

/// Cumulative counters of both sidecars and app A at one moment.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Sample {
    pub at_secs: f64,
    pub a_inbound_refused: f64,
    pub a_egress_refused: f64,
    pub a_egress_sent: f64,
    /// A's cached level of B (compound), `None` when nothing is cached.
    pub a_cached_level: Option<f64>,
    pub a_level: Option<f64>,
    pub b_admitted: f64,
    pub b_overload: f64,
    pub b_deadline: f64,
    pub b_level: Option<f64>,
    pub app_requests: f64,
    pub app_wasted: f64,
}

struct Sampler {
    samples: Arc<Mutex<Vec<Sample>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    fn start(a_admin: SocketAddr, b_admin: SocketAddr, app: Arc<AppA>) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let sink = samples.clone();
        let task = tokio::spawn(async move {
            let client = crate::status::admin_client();
            let start = Instant::now();
            let mut ticks = tokio::time::interval(SAMPLE_EVERY);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                ticks.tick().await;
                let at_secs = start.elapsed().as_secs_f64();
                let (a, b) =
                    tokio::join!(fetch_metrics(&client, a_admin), fetch_metrics(&client, b_admin));
                let (Some(a), Some(b)) = (a, b) else { continue };
                let sample = Sample {
                    at_secs,
                    a_inbound_refused: a.sum("weir_requests_total", "inbound", "shed_overload")
                        + a.sum("weir_requests_total", "inbound", "shed_deadline"),
                    a_egress_refused: a.sum("weir_requests_total", "egress", "shed_downstream"),
                    a_egress_sent: a.sum("weir_requests_total", "egress", "admitted"),
                    a_cached_level: a.first("weir_downstream_level"),
                    a_level: a.first("weir_admission_level"),
                    b_admitted: b.sum("weir_requests_total", "inbound", "admitted"),
                    b_overload: b.sum("weir_requests_total", "inbound", "shed_overload"),
                    b_deadline: b.sum("weir_requests_total", "inbound", "shed_deadline"),
                    b_level: b.first("weir_admission_level"),
                    app_requests: app.stats.requests.load(Relaxed) as f64,
                    app_wasted: app.stats.wasted.load(Relaxed) as f64,
                };
                sink.lock().unwrap_or_else(|e| e.into_inner()).push(sample);
            }
        });
        Sampler { samples, task }
    }

    fn stop(self) -> Vec<Sample> {
        self.task.abort();
        std::mem::take(&mut *self.samples.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One scrape of a sidecar's `/metrics`, bounded by 1 s; `None` when it failed.
pub(crate) async fn fetch_metrics(
    client: &Client<HttpConnector, Empty<Bytes>>,
    admin: SocketAddr,
) -> Option<Metrics> {
    let uri = format!("http://{admin}/metrics").parse::<http::Uri>().ok()?;
    let exchange = async {
        let response = client.get(uri).await.ok()?;
        response.status().is_success().then_some(())?;
        response.into_body().collect().await.ok().map(|b| b.to_bytes())
    };
    let body = tokio::time::timeout(Duration::from_secs(1), exchange).await.ok()??;
    Some(Metrics::parse(&String::from_utf8_lossy(&body)))
}

// === report ===

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// The markdown tables of a run.
pub fn markdown(r: &EgressBenchResult) -> String {
    let mut s = String::new();
    let c = &r.config;
    let _ = writeln!(
        s,
        "App B {} x {:.0} ms ({:.0} rps, the bottleneck), app A {:.1} ms of hashing per request, \
         mix {:.0}/{:.0}/{:.0} (critical/normal/background, stamped by weir A's entry table), \
         offered {:.1}x B's capacity at B, {} s runs of which the first {} s are not counted.\n",
        c.app_b.workers,
        c.app_b.service_time.as_secs_f64() * 1e3,
        c.app_b.nominal_capacity(),
        c.app_a_work.as_secs_f64() * 1e3,
        c.mix[0] * 100.0,
        c.mix[1] * 100.0,
        c.mix[2] * 100.0,
        c.multiple,
        c.run.as_secs(),
        c.warmup.as_secs(),
    );
    let chains: Vec<_> = r.chains.iter().filter(|x| x.suite == Suite::Chain).collect();
    if !chains.is_empty() {
        s.push_str("**Chain** (targets with propagation: >= 95% of refusals at A's egress, B refuses <= 2% of what it receives, egress refusal < 1 ms)\n\n");
        s.push_str("| run | refused at A's inbound / A's egress / B | at A's egress | B received | B refused (overload / deadline) | egress refusal p50 / p99 (app A) | success critical / normal / background | goodput |\n|---|---|---|---|---|---|---|---|\n");
        for x in chains {
            let _ = writeln!(
                s,
                "| {} | {:.0} / {:.0} / {:.0} | {} | {:.0} | {} ({:.0} / {:.0}) | {} / {} us | {} / {} / {} | {:.0} rps |",
                x.label,
                x.refusals.a_inbound,
                x.refusals.a_egress,
                x.refusals.b,
                pct(x.refusals.egress_share()),
                x.b_received,
                pct(x.b_refused_share),
                x.refusals.b_overload,
                x.refusals.b_deadline,
                opt0(x.egress_refusal_p50_us),
                opt0(x.egress_refusal_p99_us),
                pct(x.success(0)),
                pct(x.success(1)),
                pct(x.success(2)),
                x.goodput_rps,
            );
        }
        s.push('\n');
    }
    let fans: Vec<_> = r.chains.iter().filter(|x| x.suite == Suite::Fanout).collect();
    if !fans.is_empty() {
        s.push_str(
            "**Fan-out** (app A calls B twice; target: wasted <= 2% with the entry stamp)\n\n",
        );
        s.push_str("| run | app A requests | first call ok, second refused (wasted) | refused at A's egress / B | B refused | success critical / normal / background | goodput |\n|---|---|---|---|---|---|---|\n");
        for x in fans {
            let _ = writeln!(
                s,
                "| {} | {} | {} ({}) | {:.0} / {:.0} | {} | {} / {} / {} | {:.0} rps |",
                x.label,
                x.app_requests,
                x.wasted,
                pct(x.wasted_share),
                x.refusals.a_egress,
                x.refusals.b,
                pct(x.b_refused_share),
                pct(x.success(0)),
                pct(x.success(1)),
                pct(x.success(2)),
                x.goodput_rps,
            );
        }
        s.push('\n');
    }
    if !r.expiries.is_empty() {
        let c = &r.config;
        let _ = writeln!(
            s,
            "**Expiry** (B's service time x{} from {:.0} s to {:.0} s at {:.1}x its normal capacity; target: refused classes flow again within {:.0} s = level expiry + one window)\n",
            c.slowdown,
            c.expiry_phase.as_secs_f64(),
            (c.expiry_phase + c.expiry_degraded).as_secs_f64(),
            c.expiry_load,
            r.target_secs,
        );
        s.push_str("| run | refused while slow | success while slow (c / n / b) | flow again after recovery | A's cached level open after | B's level open after |\n|---|---|---|---|---|---|\n");
        for x in &r.expiries {
            let success: Vec<String> = x.degraded_success.iter().map(|v| pct(*v)).collect();
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} |",
                x.label,
                x.refused_classes.join(", "),
                success.join(" / "),
                secs(x.flow_again_secs),
                if x.propagation { secs(x.a_cached_open_secs) } else { "-".into() },
                secs(x.b_level_open_secs),
            );
        }
        s.push('\n');
    }
    s
}

// === plots ===

/// One SVG per run: B's level and A's cached level of B, and refusals per place per
/// second. Returns the file names.
pub fn write_plots(r: &EgressBenchResult, dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut written = Vec::new();
    for x in &r.chains {
        let name = format!("{}.svg", slug(&x.label));
        timeline_plot(&x.label, &x.samples, &dir.join(&name))?;
        written.push(name);
    }
    for x in &r.expiries {
        let name = format!("{}.svg", slug(&x.label));
        timeline_plot(&x.label, &x.samples, &dir.join(&name))?;
        written.push(name);
    }
    Ok(written)
}

fn slug(label: &str) -> String {
    let s: String =
        label.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    s.split('-').filter(|p| !p.is_empty()).collect::<Vec<_>>().join("-")
}

fn timeline_plot(title: &str, samples: &[Sample], path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1000, 700)).into_drawing_area();
    root.fill(&WHITE).map_err(crate::plot::err)?;
    let panels = root.split_evenly((2, 1));
    let t_max = samples.last().map_or(1.0, |s| s.at_secs + 0.25);
    let level = |f: fn(&Sample) -> Option<f64>| -> Vec<(f64, f64)> {
        samples
            .iter()
            .map(|s| (s.at_secs, f(s).unwrap_or(LEVEL_ALL_OPEN).min(LEVEL_ALL_OPEN) / 128.0))
            .collect()
    };
    crate::plot::time_panel(
        &panels[0],
        &format!("{title}: levels as B + U/128 (3 = every class admitted)"),
        "level",
        t_max,
        3.1,
        vec![
            ("B's level".into(), level(|s| s.b_level)),
            ("A's cached level of B".into(), level(|s| s.a_cached_level)),
        ],
    )?;
    let rate = |f: fn(&Sample) -> f64| -> Vec<(f64, f64)> {
        samples
            .windows(2)
            .map(|w| {
                let dt = (w[1].at_secs - w[0].at_secs).max(1e-3);
                (w[1].at_secs, (f(&w[1]) - f(&w[0])).max(0.0) / dt)
            })
            .collect()
    };
    let lines = vec![
        ("refused at A's inbound".to_string(), rate(|s| s.a_inbound_refused)),
        ("refused at A's egress".to_string(), rate(|s| s.a_egress_refused)),
        ("refused at B".to_string(), rate(|s| s.b_overload + s.b_deadline)),
        ("sent by A's egress".to_string(), rate(|s| s.a_egress_sent)),
    ];
    let y = lines.iter().flat_map(|(_, v)| v.iter().map(|p| p.1)).fold(10.0, f64::max) * 1.1;
    crate::plot::time_panel(&panels[1], "per second, by place", "requests / s", t_max, y, lines)?;
    root.present().map_err(crate::plot::err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_become_file_names() {
        assert_eq!(slug("fan-out, random user per call"), "fan-out-random-user-per-call");
        assert_eq!(slug("chain, propagation on"), "chain-propagation-on");
    }
}
