//! The overload benchmark: measure the backend's capacity, then offer multiples of it
//! (steady levels and a 0.5x -> 3x -> 0.5x step) through each contender in turn. Every
//! run gets a fresh proxy process and a reset backend, so no run inherits a backlog or a
//! learned admission level from the one before.

use serde::Serialize;
use std::time::Duration;

use crate::backend::{BackendConfig, BackendSnapshot, CapacityBackend};
use crate::contender::{self, Contender, Kind};
use crate::load::{self, ClassReport, LoadSpec, Phase, Protocol, SecondReport};
use crate::status::{StatusPoller, StatusSample};

mod analysis;
#[cfg(test)]
mod tests;

pub use analysis::{fmt_secs as analysis_fmt, settle_secs, StepAnalysis};

#[derive(Clone, Debug, Serialize)]
pub struct ScenarioConfig {
    pub backend: BackendConfig,
    pub loads: Vec<f64>,
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub load_duration: Duration,
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub warmup: Duration,
    /// Offered multiples of the step, each held for `step_phase`.
    pub step: Vec<f64>,
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub step_phase: Duration,
    pub contenders: Vec<Kind>,
    pub protocol: Protocol,
    #[serde(serialize_with = "crate::report::ser_millis")]
    pub deadline: Duration,
    /// weir's overload threshold, for "queuing back under threshold".
    #[serde(serialize_with = "crate::report::ser_millis")]
    pub queuing_threshold: Duration,
    #[serde(skip)]
    pub options: contender::Options,
}

#[derive(Clone, Debug, Serialize)]
pub struct Capacity {
    pub nominal_rps: f64,
    pub measured_rps: f64,
}

/// One contender at one steady offered load (numbers over the steady part).
#[derive(Clone, Debug, Serialize)]
pub struct LoadResult {
    pub contender: String,
    pub multiple: f64,
    pub offered_rps: f64,
    pub goodput_rps: f64,
    pub goodput_ratio: f64,
    pub classes: Vec<ClassReport>,
    pub ok_p99_ms: f64,
    pub refused_p50_ms: f64,
    /// Share of requests not served: refused, timed out or failed.
    pub unserved_fraction: f64,
    /// What capacity requires: `1 - 1/multiple` above 1x, else 0.
    pub ideal_unserved_fraction: f64,
    /// Share of the backend's busy time spent on requests whose deadline had passed.
    pub wasted_work_fraction: f64,
    pub backend: BackendSnapshot,
    /// weir's `/v1/status`, sampled every 200 ms (empty for the others).
    pub status: Vec<StatusSample>,
}

#[derive(Clone, Debug, Serialize)]
pub struct StepResult {
    pub contender: String,
    pub phases: Vec<Phase>,
    pub series: Vec<SecondReport>,
    pub status: Vec<StatusSample>,
    pub analysis: StepAnalysis,
    pub backend: BackendSnapshot,
}

#[derive(Clone, Debug, Serialize)]
pub struct BenchResult {
    pub config: ScenarioConfig,
    pub capacity: Capacity,
    pub loads: Vec<LoadResult>,
    pub steps: Vec<StepResult>,
    pub skipped: Vec<String>,
}

// === impl ScenarioConfig ===

impl ScenarioConfig {
    fn spec(&self, target: std::net::SocketAddr, phases: Vec<Phase>, warmup: Duration) -> LoadSpec {
        let mut spec = LoadSpec::new(target, phases);
        spec.protocol = self.protocol;
        spec.deadline = self.deadline;
        spec.warmup = warmup;
        spec
    }
}

/// Runs everything; `progress` gets one line per finished run.
pub async fn run(
    config: ScenarioConfig,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<BenchResult> {
    let backend = CapacityBackend::start(config.backend.clone()).await?;
    let capacity = measure_capacity(&backend, &config).await?;
    progress(&format!(
        "capacity: nominal {:.0} rps, measured {:.0} rps",
        capacity.nominal_rps, capacity.measured_rps
    ));
    let mut result = BenchResult {
        config: config.clone(),
        capacity,
        loads: Vec::new(),
        steps: Vec::new(),
        skipped: Vec::new(),
    };
    let rps = result.capacity.measured_rps;
    for &kind in &config.contenders {
        for &multiple in &config.loads {
            let phases =
                vec![Phase { rate_per_sec: rps * multiple, duration: config.load_duration }];
            match run_once(&backend, kind, &config, phases, config.warmup).await {
                Ok((report, snapshot, status)) => {
                    let mut r = load_result(kind, multiple, rps, report, snapshot);
                    r.status = status;
                    progress(&format!(
                        "{:<13} {:>4.1}x  goodput {:>5.1}%  p99 {:>6.1} ms  refused p50 {:>6.2} ms",
                        kind.label(),
                        multiple,
                        r.goodput_ratio * 100.0,
                        r.ok_p99_ms,
                        r.refused_p50_ms
                    ));
                    result.loads.push(r);
                }
                Err(e) => {
                    progress(&format!("{:<13} skipped: {e:#}", kind.label()));
                    result.skipped.push(format!("{}: {e:#}", kind.label()));
                    break;
                }
            }
        }
        if result.skipped.iter().any(|s| s.starts_with(kind.label())) {
            continue;
        }
        let phases: Vec<Phase> = config
            .step
            .iter()
            .map(|m| Phase { rate_per_sec: rps * m, duration: config.step_phase })
            .collect();
        let (report, snapshot, status) =
            run_once(&backend, kind, &config, phases.clone(), Duration::ZERO).await?;
        let analysis = StepAnalysis::of(&report.series, &phases, rps, &config);
        progress(&format!(
            "{:<13} step   settle {}  recover {}",
            kind.label(),
            analysis::fmt_secs(analysis.settle_secs),
            analysis::fmt_secs(analysis.recover_secs)
        ));
        result.steps.push(StepResult {
            contender: kind.label().into(),
            phases,
            series: report.series,
            status,
            analysis,
            backend: snapshot,
        });
    }
    Ok(result)
}

/// Offers 1.5x the nominal capacity directly and counts completions per second once the
/// backend is saturated.
async fn measure_capacity(
    backend: &CapacityBackend,
    config: &ScenarioConfig,
) -> anyhow::Result<Capacity> {
    let nominal = backend.config().nominal_capacity();
    anyhow::ensure!(nominal.is_finite(), "the overload benchmark needs a non-zero service time");
    backend.reset();
    let phases = vec![Phase { rate_per_sec: nominal * 1.5, duration: Duration::from_secs(3) }];
    let mut spec = config.spec(backend.addr(), phases, Duration::ZERO);
    // Nobody gives up during the measurement, so an app that cancels abandoned work
    // (`cancel_on_disconnect`) is measured at full speed too.
    spec.deadline = Duration::from_secs(10);
    let run = load::LoadRun::start(spec)?;
    // Sample the completion counter at fixed offsets: the first second fills the queue.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let first = backend.snapshot().completed;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let second = backend.snapshot().completed;
    run.finish().await?;
    backend.reset();
    let measured = (second - first) as f64 / 2.0;
    anyhow::ensure!(measured > 0.0, "the backend completed nothing while saturated");
    Ok(Capacity { nominal_rps: nominal, measured_rps: measured })
}

async fn run_once(
    backend: &CapacityBackend,
    kind: Kind,
    config: &ScenarioConfig,
    phases: Vec<Phase>,
    warmup: Duration,
) -> anyhow::Result<(load::LoadReport, BackendSnapshot, Vec<StatusSample>)> {
    backend.reset();
    let contender = Contender::start(kind, backend.addr(), &config.options).await?;
    let poller =
        contender.admin.map(|admin| StatusPoller::start(admin, Duration::from_millis(200)));
    let report = load::run(config.spec(contender.addr, phases, warmup)).await?;
    let snapshot = backend.snapshot();
    let status = poller.map(StatusPoller::stop).unwrap_or_default();
    drop(contender);
    backend.reset();
    Ok((report, snapshot, status))
}

fn load_result(
    kind: Kind,
    multiple: f64,
    capacity: f64,
    report: load::LoadReport,
    backend: BackendSnapshot,
) -> LoadResult {
    let sent = report.sent().max(1) as f64;
    LoadResult {
        contender: kind.label().into(),
        multiple,
        offered_rps: report.offered(),
        goodput_rps: report.goodput(),
        goodput_ratio: report.goodput() / capacity,
        ok_p99_ms: report.all_ok_p99_ms,
        refused_p50_ms: report.all_refused_p50_ms,
        unserved_fraction: 1.0 - report.ok() as f64 / sent,
        ideal_unserved_fraction: if multiple > 1.0 { 1.0 - 1.0 / multiple } else { 0.0 },
        wasted_work_fraction: if backend.busy_seconds > 0.0 {
            backend.wasted_busy_seconds / backend.busy_seconds
        } else {
            0.0
        },
        classes: report.classes,
        backend,
        status: Vec::new(),
    }
}
