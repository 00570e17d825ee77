//! The overload benchmark, in suites run one after another (each run gets a fresh proxy
//! process and a reset app, so no run inherits a backlog or a learned level):
//!
//! - `step`: 0.5x -> 3x -> 0.5x per app and class mix, through every contender: settle
//!   and recovery times, refusals that reached clients as timeouts, admitted latency,
//!   goodput and per-class success.
//! - `steady`: constant multiples of capacity through every contender.
//! - `adaptive`: weir's in-flight limit against apps of different concurrency.
//! - `shift`: an app whose service time doubles mid-run and then recovers.
//! - `stall`: an app that stops answering for a while.
//!
//! weir runs with its shipped defaults (no `max_inflight`): it has to find the app's
//! concurrency itself. HAProxy gets `maxconn` = the app's workers, which an operator of
//! HAProxy has to know.

use serde::Serialize;
use std::time::Duration;

use crate::backend::{BackendConfig, BackendSnapshot, CapacityBackend, ServiceChange, Stall};
use crate::contender::{self, Contender, Kind};
use crate::load::{self, ClassReport, Event, LoadSpec, Phase, Protocol};
use crate::status::{StatusPoller, StatusSample};

mod analysis;
#[cfg(test)]
mod tests;

pub use analysis::{
    fmt_secs, step_metrics, timeline, ClassLine, StepMetrics, TimelineBucket, LEVEL_ALL_OPEN,
};

/// Which parts of the benchmark to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Suite {
    Step,
    Steady,
    Adaptive,
    Shift,
    Stall,
}

/// Shares of critical / normal / background.
#[derive(Clone, Debug, Serialize)]
pub struct Mix {
    pub name: String,
    pub shares: [f64; 3],
}

impl Mix {
    pub fn new(shares: [f64; 3]) -> Self {
        let pct = |x: f64| (x * 100.0).round() as u32;
        Mix { name: format!("{}/{}/{}", pct(shares[0]), pct(shares[1]), pct(shares[2])), shares }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ScenarioConfig {
    pub suites: Vec<Suite>,
    /// Apps of the step suite; the first is also the steady, shift and stall suites' app.
    pub apps: Vec<BackendConfig>,
    /// Class mixes of the step suite; the first is also every other suite's mix.
    pub mixes: Vec<Mix>,
    pub step: Vec<f64>,
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub step_phase: Duration,
    /// Steady multiples of capacity.
    pub loads: Vec<f64>,
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub load_duration: Duration,
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub warmup: Duration,
    /// Worker counts of the adaptive suite's apps; each app's service time is chosen so
    /// its capacity is `adaptive_capacity`.
    pub adaptive_workers: Vec<usize>,
    pub adaptive_capacity: f64,
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub adaptive_duration: Duration,
    /// Each of the shift suite's three phases (S, 2S, S).
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub shift_phase: Duration,
    /// Offered load of the shift suite, as a multiple of the app's normal capacity.
    pub shift_load: f64,
    /// How long the stall suite's app stops answering.
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub stall_for: Duration,
    pub stall_load: f64,
    pub contenders: Vec<Kind>,
    pub protocol: Protocol,
    #[serde(serialize_with = "crate::report::ser_millis")]
    pub deadline: Duration,
    pub seed: u64,
    #[serde(skip)]
    pub options: contender::Options,
}

#[derive(Clone, Debug, Serialize)]
pub struct Capacity {
    pub nominal_rps: f64,
    pub measured_rps: f64,
}

/// One app, measured.
#[derive(Clone, Debug, Serialize)]
pub struct App {
    pub label: String,
    pub config: BackendConfig,
    pub capacity: Capacity,
}

impl App {
    pub fn service_ms(&self) -> f64 {
        self.config.service_time.as_secs_f64() * 1000.0
    }
}

/// One contender at one steady offered load (numbers over the steady part).
#[derive(Clone, Debug, Serialize)]
pub struct LoadResult {
    pub app: String,
    pub contender: String,
    pub multiple: f64,
    pub offered_rps: f64,
    pub goodput_rps: f64,
    pub goodput_ratio: f64,
    pub classes: Vec<ClassReport>,
    pub ok_p50_ms: f64,
    pub ok_p99_ms: f64,
    pub refused_p50_ms: f64,
    pub refused: u64,
    pub timed_out: u64,
    /// Share of requests not served: refused, timed out or failed.
    pub unserved_fraction: f64,
    /// What capacity requires: `1 - 1/multiple` above 1x, else 0.
    pub ideal_unserved_fraction: f64,
    /// Share of the backend's busy time spent on requests whose deadline had passed.
    pub wasted_work_fraction: f64,
    /// weir's in-flight limit over the second half of the run (median).
    pub inflight_limit: Option<f64>,
    pub backend: BackendSnapshot,
    #[serde(skip)]
    pub status: Vec<StatusSample>,
}

impl LoadResult {
    /// Unserved minus ideal, percentage points.
    pub fn shed_excess_pp(&self) -> f64 {
        (self.unserved_fraction - self.ideal_unserved_fraction) * 100.0
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct StepResult {
    pub app: String,
    pub mix: String,
    pub contender: String,
    pub phases: Vec<Phase>,
    pub metrics: StepMetrics,
    /// 250 ms buckets of admitted / refused / timed out per class.
    pub timeline: Vec<TimelineBucket>,
    pub status: Vec<StatusSample>,
    pub backend: BackendSnapshot,
}

/// weir's adaptive limit against one app.
#[derive(Clone, Debug, Serialize)]
pub struct AdaptiveResult {
    pub app: String,
    pub workers: usize,
    pub service_ms: f64,
    pub capacity_rps: f64,
    /// Median limit over the second half of the 0.8x and the 3x run.
    pub limit_at_low: Option<f64>,
    pub limit_at_high: Option<f64>,
    pub p99_at_high_ms: f64,
    pub goodput_at_high_ratio: f64,
    pub throughput_at_low_rps: f64,
    pub p99_at_low_ms: f64,
    pub direct_throughput_at_low_rps: Option<f64>,
    pub direct_p99_at_low_ms: Option<f64>,
    pub refused_at_low: u64,
    /// Most requests inside the app at once during the 3x run.
    pub app_peak_inside_at_high: u64,
}

/// The limit and the level following one change of the app's service time.
#[derive(Clone, Debug, Serialize)]
pub struct Follow {
    pub at_secs: f64,
    pub service_ms: f64,
    pub limit_before: Option<f64>,
    pub limit_after: Option<f64>,
    pub limit_follow_secs: Option<f64>,
    /// Levels clamped to [`LEVEL_ALL_OPEN`] (anything above admits every class in use).
    /// Follow times are None both when the value never settled and when it did not move
    /// beyond its band (`after` within the band of `before`); the report tells them apart.
    pub level_before: Option<f64>,
    pub level_after: Option<f64>,
    pub level_follow_secs: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ShiftResult {
    pub app: String,
    pub contender: String,
    pub multiple: f64,
    pub follows: Vec<Follow>,
    /// Per phase (S, 2S, S): success of each class.
    pub phase_success: Vec<Vec<f64>>,
    pub timeline: Vec<TimelineBucket>,
    pub status: Vec<StatusSample>,
}

#[derive(Clone, Debug, Serialize)]
pub struct StallResult {
    pub app: String,
    pub contender: String,
    pub multiple: f64,
    pub stall_from_secs: f64,
    pub stall_to_secs: f64,
    /// Requests scheduled while the app stalled, and how they ended.
    pub during: analysis::CountsDoc,
    /// Their latency (any ending but a client timeout): p99 and max, ms.
    pub answered_p99_ms: Option<f64>,
    pub answered_max_ms: Option<f64>,
    /// Share of them answered (by anything) within 600 ms.
    pub answered_within_600ms: f64,
    /// First status sample saying overloaded, seconds after the stall began.
    pub overloaded_after_secs: Option<f64>,
    /// From the app's return until the level admits every class again (and stays).
    pub level_open_after_secs: Option<f64>,
    /// From the app's return until every class keeps >= 99% success.
    pub recovery_secs: Option<f64>,
    /// Critical-class success before the stall (an idle window must not refuse it).
    pub critical_success_before: f64,
    pub timeline: Vec<TimelineBucket>,
    pub status: Vec<StatusSample>,
}

#[derive(Clone, Debug, Serialize)]
pub struct BenchResult {
    pub config: ScenarioConfig,
    pub apps: Vec<App>,
    pub steps: Vec<StepResult>,
    pub loads: Vec<LoadResult>,
    pub adaptive: Vec<AdaptiveResult>,
    pub shifts: Vec<ShiftResult>,
    pub stalls: Vec<StallResult>,
    pub skipped: Vec<String>,
}

/// What one run gives back.
struct Run {
    report: load::LoadReport,
    backend: BackendSnapshot,
    status: Vec<StatusSample>,
}

/// How often weir's `/v1/status` is sampled during a run.
const STATUS_EVERY: Duration = Duration::from_millis(100);

pub fn app_label(c: &BackendConfig) -> String {
    format!("{} x {} ms", c.workers, c.service_time.as_secs_f64() * 1000.0)
}

// === impl ScenarioConfig ===

impl ScenarioConfig {
    fn spec(&self, target: std::net::SocketAddr, phases: Vec<Phase>, mix: &Mix) -> LoadSpec {
        let mut spec = LoadSpec::new(target, phases);
        spec.protocol = self.protocol;
        spec.deadline = self.deadline;
        spec.classes = load::classes_with_shares(mix.shares);
        spec.seed = self.seed;
        spec
    }

    fn runs(&self, suite: Suite) -> bool {
        self.suites.contains(&suite)
    }
}

/// Runs every selected suite; `progress` gets one line per finished run.
pub async fn run(
    config: ScenarioConfig,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<BenchResult> {
    let mut result = BenchResult {
        config: config.clone(),
        apps: Vec::new(),
        steps: Vec::new(),
        loads: Vec::new(),
        adaptive: Vec::new(),
        shifts: Vec::new(),
        stalls: Vec::new(),
        skipped: Vec::new(),
    };
    anyhow::ensure!(!config.apps.is_empty() && !config.mixes.is_empty(), "no app or no mix");
    let mut apps = Vec::new();
    for app in &config.apps {
        let measured = measure(app.clone(), &config).await?;
        progress(&format!(
            "app {}: nominal {:.0} rps, measured {:.0} rps",
            measured.label, measured.capacity.nominal_rps, measured.capacity.measured_rps
        ));
        apps.push(measured);
    }
    result.apps = apps.clone();
    if config.runs(Suite::Step) {
        for app in &apps {
            for mix in &config.mixes {
                for &kind in &config.contenders {
                    match step_run(app, mix, kind, &config).await {
                        Ok(step) => {
                            let m = &step.metrics;
                            progress(&format!(
                                "step {} {} {:<13} settle {} recover {} timeouts {} p90 {} goodput {:.1}% top {:.2}%",
                                app.label,
                                mix.name,
                                kind.label(),
                                fmt_secs(m.settle_secs),
                                fmt_secs(m.recovery_secs),
                                m.timeout_share.map_or("-".into(), |s| format!("{:.1}%", s * 100.0)),
                                m.admitted_p90_ms.map_or("-".into(), |p| format!("{p:.0} ms")),
                                m.high_goodput_ratio * 100.0,
                                m.top_class_success_high * 100.0,
                            ));
                            result.steps.push(step);
                        }
                        Err(e) => skip(kind, e, &mut result, &mut progress),
                    }
                }
            }
        }
    }

    if config.runs(Suite::Steady) {
        let app = &apps[0];
        for &kind in &config.contenders {
            for &multiple in &config.loads {
                match steady_run(app, &config.mixes[0], kind, multiple, &config).await {
                    Ok(r) => {
                        progress(&format!(
                            "steady {:<13} {:>4.1}x goodput {:>5.1}% p99 {:>6.1} ms shed {:+.1} pp top {:.2}%",
                            kind.label(),
                            multiple,
                            r.goodput_ratio * 100.0,
                            r.ok_p99_ms,
                            r.shed_excess_pp(),
                            r.classes.first().map_or(1.0, |c| c.success_ratio()) * 100.0,
                        ));
                        result.loads.push(r);
                    }
                    Err(e) => {
                        skip(kind, e, &mut result, &mut progress);
                        break;
                    }
                }
            }
        }
    }

    if config.runs(Suite::Adaptive) {
        for &workers in &config.adaptive_workers {
            match adaptive_run(workers, &config).await {
                Ok(r) => {
                    progress(&format!(
                        "adaptive {:<12} limit {}/{} p99@3x {:.0} ms thr@0.8x {:.0} rps (direct {})",
                        r.app,
                        r.limit_at_low.map_or("-".into(), |l| format!("{l:.0}")),
                        r.limit_at_high.map_or("-".into(), |l| format!("{l:.0}")),
                        r.p99_at_high_ms,
                        r.throughput_at_low_rps,
                        r.direct_throughput_at_low_rps.map_or("-".into(), |t| format!("{t:.0}")),
                    ));
                    result.adaptive.push(r);
                }
                Err(e) => skip(Kind::Weir, e, &mut result, &mut progress),
            }
        }
    }

    if config.runs(Suite::Shift) {
        match shift_run(&apps[0], &config).await {
            Ok(r) => {
                for f in &r.follows {
                    progress(&format!(
                        "shift at {:.0} s to {:.0} ms: limit {} -> {} in {}, level {} -> {} in {}",
                        f.at_secs,
                        f.service_ms,
                        opt(f.limit_before),
                        opt(f.limit_after),
                        fmt_secs(f.limit_follow_secs),
                        opt(f.level_before),
                        opt(f.level_after),
                        fmt_secs(f.level_follow_secs)
                    ));
                }
                result.shifts.push(r);
            }
            Err(e) => skip(Kind::Weir, e, &mut result, &mut progress),
        }
    }

    if config.runs(Suite::Stall) {
        match stall_run(&apps[0], &config).await {
            Ok(r) => {
                progress(&format!(
                    "stall: answered p99 {} max {} (within 600 ms {:.1}%), overloaded after {}, level open {} after the app returned, recovery {}",
                    r.answered_p99_ms.map_or("-".into(), |p| format!("{p:.0} ms")),
                    r.answered_max_ms.map_or("-".into(), |p| format!("{p:.0} ms")),
                    r.answered_within_600ms * 100.0,
                    fmt_secs(r.overloaded_after_secs),
                    fmt_secs(r.level_open_after_secs),
                    fmt_secs(r.recovery_secs),
                ));
                result.stalls.push(r);
            }
            Err(e) => skip(Kind::Weir, e, &mut result, &mut progress),
        }
    }
    Ok(result)
}

fn skip(kind: Kind, e: anyhow::Error, result: &mut BenchResult, progress: &mut dyn FnMut(&str)) {
    progress(&format!("{:<13} skipped: {e:#}", kind.label()));
    result.skipped.push(format!("{}: {e:#}", kind.label()));
}

fn opt(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.0}"))
}

/// Starts the app and offers 1.2x its nominal capacity directly for 4 s, counting
/// completions per second once it is saturated.
async fn measure(config: BackendConfig, scenario: &ScenarioConfig) -> anyhow::Result<App> {
    let mut plain = config.clone();
    plain.service_changes.clear();
    plain.stall = None;
    let backend = CapacityBackend::start(plain).await?;
    let nominal = backend.config().nominal_capacity();
    anyhow::ensure!(nominal.is_finite(), "the overload benchmark needs a non-zero service time");
    // 1.2x: enough to keep every worker busy, without a backlog (and a connection per
    // waiting request) that would load the shared CPU and understate the app.
    let phases = vec![Phase { rate_per_sec: nominal * 1.2, duration: Duration::from_secs(4) }];
    let mut spec = scenario.spec(backend.addr(), phases, &scenario.mixes[0]);
    // Nobody gives up during the measurement, so an app that cancels abandoned work
    // (`cancel_on_disconnect`) is measured at full speed too.
    spec.deadline = Duration::from_secs(10);
    let run = load::LoadRun::start(spec)?;
    // Sample the completion counter at fixed offsets: the first second fills the queue.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let first = backend.snapshot().completed;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let second = backend.snapshot().completed;
    run.finish().await?;
    let measured = (second - first) as f64 / 3.0;
    anyhow::ensure!(measured > 0.0, "the backend completed nothing while saturated");
    Ok(App {
        label: app_label(&config),
        config,
        capacity: Capacity { nominal_rps: nominal, measured_rps: measured },
    })
}

/// One run: a fresh app (counters and clock at zero when the load starts), a fresh
/// contender, the load, and weir's status sampled alongside.
async fn run_once(
    app: &BackendConfig,
    kind: Kind,
    config: &ScenarioConfig,
    spec: impl FnOnce(std::net::SocketAddr) -> LoadSpec,
) -> anyhow::Result<Run> {
    let backend = CapacityBackend::start(app.clone()).await?;
    // HAProxy's maxconn is the app's worker count (weir finds it itself).
    let options = contender::Options { max_inflight: app.workers, ..config.options.clone() };
    let contender = Contender::start(kind, backend.addr(), &options).await?;
    // Service changes and stalls are timed from here, as is the load.
    backend.reset();
    let poller = contender.admin.map(|admin| StatusPoller::start(admin, STATUS_EVERY));
    let report = load::run(spec(contender.addr)).await?;
    let snapshot = backend.snapshot();
    let status = poller.map(StatusPoller::stop).unwrap_or_default();
    drop(contender);
    drop(backend);
    Ok(Run { report, backend: snapshot, status })
}

async fn step_run(
    app: &App,
    mix: &Mix,
    kind: Kind,
    config: &ScenarioConfig,
) -> anyhow::Result<StepResult> {
    let rps = app.capacity.measured_rps;
    let phases: Vec<Phase> = config
        .step
        .iter()
        .map(|m| Phase { rate_per_sec: rps * m, duration: config.step_phase })
        .collect();
    let run =
        run_once(&app.config, kind, config, |target| config.spec(target, phases.clone(), mix))
            .await?;
    let metrics = step_metrics(&run.report.events, &phases, rps, app.service_ms(), 3);
    if std::env::var_os(STEP_TRACE_ENV).is_some() {
        let label = format!("{} {} {}", app.label, mix.name, kind.label());
        for line in analysis::settle_trace(&run.report.events, &phases, rps, app.service_ms()) {
            eprintln!("settle-trace {label} {line}");
        }
        for s in &run.status {
            eprintln!("status-trace {label} {}", analysis::status_line(s));
        }
    }
    Ok(StepResult {
        app: app.label.clone(),
        mix: mix.name.clone(),
        contender: kind.label().into(),
        timeline: timeline(&run.report.events, 3, 0.25),
        phases,
        metrics,
        status: run.status,
        backend: run.backend,
    })
}

/// Set (to anything) to print each 500 ms settle window of a step run (served, admitted
/// p90, pass or fail) and every status sample to stderr; the report is unchanged.
const STEP_TRACE_ENV: &str = "OVERLOAD_STEP_TRACE";

/// Median of the status samples' in-flight limit over the second half of a run.
fn settled_limit(status: &[StatusSample]) -> Option<f64> {
    let end = status.last()?.at_secs;
    let samples: Vec<(f64, f64)> =
        status.iter().map(|s| (s.at_secs, s.inflight_limit() as f64)).collect();
    workload_analysis::median_in(&samples, end / 2.0, end + 1.0)
}

use weir_workload::analysis as workload_analysis;

async fn steady_run(
    app: &App,
    mix: &Mix,
    kind: Kind,
    multiple: f64,
    config: &ScenarioConfig,
) -> anyhow::Result<LoadResult> {
    let rps = app.capacity.measured_rps;
    let phases = vec![Phase { rate_per_sec: rps * multiple, duration: config.load_duration }];
    let run = run_once(&app.config, kind, config, |target| {
        let mut spec = config.spec(target, phases, mix);
        spec.warmup = config.warmup;
        spec
    })
    .await?;
    Ok(load_result(&app.label, kind, multiple, rps, run))
}

fn load_result(app: &str, kind: Kind, multiple: f64, capacity: f64, run: Run) -> LoadResult {
    let report = run.report;
    let backend = run.backend;
    let sent = report.sent().max(1) as f64;
    LoadResult {
        app: app.into(),
        contender: kind.label().into(),
        multiple,
        offered_rps: report.offered(),
        goodput_rps: report.goodput(),
        goodput_ratio: report.goodput() / capacity,
        ok_p50_ms: report.all_ok_p50_ms,
        ok_p99_ms: report.all_ok_p99_ms,
        refused_p50_ms: report.all_refused_p50_ms,
        refused: report.classes.iter().map(|c| c.refused).sum(),
        timed_out: report.classes.iter().map(|c| c.timed_out).sum(),
        unserved_fraction: 1.0 - report.ok() as f64 / sent,
        ideal_unserved_fraction: if multiple > 1.0 { 1.0 - 1.0 / multiple } else { 0.0 },
        wasted_work_fraction: if backend.busy_seconds > 0.0 {
            backend.wasted_busy_seconds / backend.busy_seconds
        } else {
            0.0
        },
        inflight_limit: settled_limit(&run.status),
        classes: report.classes,
        backend,
        status: run.status,
    }
}

async fn adaptive_run(workers: usize, config: &ScenarioConfig) -> anyhow::Result<AdaptiveResult> {
    let service = Duration::from_secs_f64(workers as f64 / config.adaptive_capacity);
    let app = measure(BackendConfig::new(workers, service), config).await?;
    let rps = app.capacity.measured_rps;
    let mix = &config.mixes[0];
    let steady = |kind: Kind, multiple: f64| {
        let phases =
            vec![Phase { rate_per_sec: rps * multiple, duration: config.adaptive_duration }];
        let app = app.clone();
        async move {
            let run = run_once(&app.config, kind, config, |target| {
                let mut spec = config.spec(target, phases, mix);
                spec.warmup = config.warmup;
                spec
            })
            .await?;
            anyhow::Ok(load_result(&app.label, kind, multiple, rps, run))
        }
    };
    let low = steady(Kind::Weir, 0.8).await?;
    let high = steady(Kind::Weir, 3.0).await?;
    let direct = if config.contenders.contains(&Kind::Direct) {
        Some(steady(Kind::Direct, 0.8).await?)
    } else {
        None
    };
    Ok(AdaptiveResult {
        app: app.label.clone(),
        workers,
        service_ms: app.service_ms(),
        capacity_rps: rps,
        limit_at_low: low.inflight_limit,
        limit_at_high: high.inflight_limit,
        p99_at_high_ms: high.ok_p99_ms,
        goodput_at_high_ratio: high.goodput_ratio,
        throughput_at_low_rps: low.goodput_rps,
        p99_at_low_ms: low.ok_p99_ms,
        direct_throughput_at_low_rps: direct.as_ref().map(|d| d.goodput_rps),
        direct_p99_at_low_ms: direct.as_ref().map(|d| d.ok_p99_ms),
        refused_at_low: low.refused + low.timed_out,
        app_peak_inside_at_high: high.backend.peak_outstanding,
    })
}

async fn shift_run(app: &App, config: &ScenarioConfig) -> anyhow::Result<ShiftResult> {
    let phase = config.shift_phase;
    let base = app.config.service_time;
    let mut backend = app.config.clone();
    backend.service_changes = vec![
        ServiceChange { at: phase, service_time: base * 2 },
        ServiceChange { at: phase * 2, service_time: base },
    ];
    let rps = app.capacity.measured_rps;
    let phases = vec![Phase { rate_per_sec: rps * config.shift_load, duration: phase * 3 }];
    let mix = &config.mixes[0];
    let run =
        run_once(&backend, Kind::Weir, config, |target| config.spec(target, phases, mix)).await?;
    let limits: Vec<(f64, f64)> =
        run.status.iter().map(|s| (s.at_secs, s.inflight_limit() as f64)).collect();
    let levels: Vec<(f64, f64)> =
        run.status.iter().map(|s| (s.at_secs, f64::from(s.level().min(LEVEL_ALL_OPEN)))).collect();
    let p = phase.as_secs_f64();
    let follows = backend
        .service_changes
        .iter()
        .map(|c| {
            let at = c.at.as_secs_f64();
            let next = at + p;
            let limit_before = workload_analysis::median_in(&limits, at - p / 2.0, at);
            let limit_after = workload_analysis::median_in(&limits, next - p / 2.0, next);
            let level_before = workload_analysis::median_in(&levels, at - p / 2.0, at);
            let level_after = workload_analysis::median_in(&levels, next - p / 2.0, next);
            Follow {
                at_secs: at,
                service_ms: c.service_time.as_secs_f64() * 1000.0,
                limit_before,
                limit_after,
                // Within a quarter (and at least one slot) of where it settles.
                // Within a quarter (and at least one slot) of where it settles.
                limit_follow_secs: follow(&limits, at, next, limit_before, limit_after, |t| {
                    (t / 4.0).max(1.0)
                }),
                level_before,
                level_after,
                // Within a quarter of a business class of where it settles.
                // Within a quarter of a business class of where it settles.
                level_follow_secs: follow(&levels, at, next, level_before, level_after, |_| 32.0),
            }
        })
        .collect();
    let phase_success = (0..3)
        .map(|i| {
            let from = i as f64 * p;
            workload_analysis::success_by_class(&run.report.events, from, from + p, 3)
        })
        .collect();
    Ok(ShiftResult {
        app: app.label.clone(),
        contender: Kind::Weir.label().into(),
        multiple: config.shift_load,
        follows,
        phase_success,
        timeline: timeline(&run.report.events, 3, 0.25),
        status: run.status,
    })
}

/// Seconds after `at` until `samples` stay within `band(after)` of `after`; None when it
/// never does, or when `after` is within that band of `before` (nothing to follow).
fn follow(
    samples: &[(f64, f64)],
    at: f64,
    next: f64,
    before: Option<f64>,
    after: Option<f64>,
    band: impl Fn(f64) -> f64,
) -> Option<f64> {
    let (before, after) = (before?, after?);
    let band = band(after);
    if (after - before).abs() <= band {
        return None;
    }
    workload_analysis::follow_secs(samples, at, next, after, band)
}

async fn stall_run(app: &App, config: &ScenarioConfig) -> anyhow::Result<StallResult> {
    let from = Duration::from_secs(5);
    let to = from + config.stall_for;
    let end = to + Duration::from_secs(7);
    let mut backend = app.config.clone();
    backend.stall = Some(Stall { from, to });
    let rps = app.capacity.measured_rps;
    let phases = vec![Phase { rate_per_sec: rps * config.stall_load, duration: end }];
    let mix = &config.mixes[0];
    let run = run_once(&backend, Kind::Weir, config, |target| {
        let mut spec = config.spec(target, phases, mix);
        // Wait past the deadline, to see how late the sidecar answers.
        spec.client_grace = Duration::from_millis(1000);
        spec
    })
    .await?;
    let (f, t) = (from.as_secs_f64(), to.as_secs_f64());
    let events = &run.report.events;
    let during: Vec<Event> =
        events.iter().filter(|e| e.at_secs >= f && e.at_secs < t).copied().collect();
    let counts = workload_analysis::counts(&during, f, t, None);
    let mut answered: Vec<f64> = during
        .iter()
        .filter(|e| e.ending != load::Ending::TimedOut)
        .map(|e| e.latency_ms)
        .collect();
    let within =
        during.iter().filter(|e| e.ending != load::Ending::TimedOut && e.latency_ms <= 600.0);
    let answered_within_600ms = within.count() as f64 / during.len().max(1) as f64;
    let answered_max_ms =
        answered.iter().copied().fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
    let answered_p99_ms = workload_analysis::quantile(&mut answered, 0.99);
    let overloaded_after_secs =
        run.status.iter().find(|s| s.at_secs >= f && s.doc.overloaded).map(|s| s.at_secs - f);
    let levels: Vec<(f64, f64)> =
        run.status.iter().map(|s| (s.at_secs, f64::from(s.level().min(LEVEL_ALL_OPEN)))).collect();
    let level_open_after_secs = workload_analysis::follow_secs(
        &levels,
        t,
        end.as_secs_f64(),
        f64::from(LEVEL_ALL_OPEN),
        0.0,
    );
    let recovery_secs =
        workload_analysis::recovery_secs(events, t, end.as_secs_f64(), 3, None, 0.99, 2.0);
    Ok(StallResult {
        app: app.label.clone(),
        contender: Kind::Weir.label().into(),
        multiple: config.stall_load,
        stall_from_secs: f,
        stall_to_secs: t,
        during: counts.into(),
        answered_p99_ms,
        answered_max_ms,
        answered_within_600ms,
        overloaded_after_secs,
        level_open_after_secs,
        recovery_secs,
        critical_success_before: workload_analysis::counts(events, 1.0, f, Some(0)).success(),
        timeline: timeline(events, 3, 0.25),
        status: run.status,
    })
}
