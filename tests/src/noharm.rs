//! The no-harm benchmark (issue 20; BENCHMARKS.md, "No harm"): weir with its shipped
//! defaults (the embedded configuration: no `max_inflight`, no tuning; only the addresses
//! are set) against direct, in front of apps that are *not* overloaded, the state a sidecar
//! lives in almost all the time.
//!
//! - **Apps**: nginx (`return 200 "ok"`, about 50 us; HTTP/1.1 only) and the capacity-model
//!   app of the workload crate (`WORKERSxMS`: from 1 ms to 1 s of service, 1 to 64 workers).
//! - **Loads** (open loop, Poisson, the same seed for both contenders): steady 0.1x / 0.5x /
//!   0.9x of the app's capacity; on/off bursts (bursts above capacity that fit the budget,
//!   then silence); idle-then-burst (a few sequential requests, then bursts of concurrent
//!   requests the app can serve at once, with idle spells between).
//! - **Middle hop** ([`middle_hop`]): an app that calls a downstream through its sidecar's
//!   egress, the downstream overloaded; goodput per API against the ideal, weir's defaults
//!   against a hand-set `max_inflight` and against the egress role off.
//! - **Async middle hop** ([`async_middle_hop`]): a healthy async app whose level spares
//!   its light route while its other route's downstream is overloaded; the light route's
//!   bursts against no weir at the app (the middle hop's worker bound must not cost them).
//! - **Silence** ([`silence`]): after an overload and a second of silence, the next request
//!   of every class, and when `/v1/status` reads open again.
//!
//! Per case: refusals, throughput and p50 / p99 against direct, and weir's in-flight limit
//! over time (`/v1/status` `max_inflight`, every 100 ms). The targets (issue 20): no
//! refusal; throughput >= 0.98x direct; p99 <= direct + 5 ms, or 1.1x direct if larger.
//!
//! Each case runs direct and weir back to back (the order alternates per round), each on
//! a fresh app and a fresh weir process.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use tokio::time::Instant;

use crate::backend::{BackendConfig, CapacityBackend};
use crate::contender::Contender;
use crate::load::{self, LoadReport, LoadSpec, Outcome, Phase, Protocol};
use crate::status::{StatusPoller, StatusSample};

pub mod async_middle_hop;
pub mod middle_hop;
pub mod nginx_app;
pub mod silence;

#[cfg(test)]
mod tests;

use nginx_app::{Listener, NginxApp};

/// Compound level of a fully open admission level (255.127).
pub const LEVEL_OPEN: u16 = 255 * 128 + 127;

// === what to run ===

/// One app of the grid.
#[derive(Clone, Debug, Serialize)]
pub struct AppCase {
    pub label: String,
    /// nginx (`return 200`), else the capacity model.
    pub nginx: bool,
    pub workers: usize,
    #[serde(serialize_with = "crate::report::ser_millis")]
    pub service_time: Duration,
    /// What the load multiples are of: the model's capacity as measured before its cases
    /// (the lower of nominal and measured: a sleeping worker of 1 ms takes longer on a busy
    /// machine), or (nginx) a rate the load generator can offer on this machine (nginx
    /// itself serves far more).
    pub capacity_rps: f64,
    /// The model's `workers / service_time`.
    pub nominal_rps: f64,
    /// Completions per second with every worker busy, measured directly before the cases.
    pub measured_rps: Option<f64>,
    pub loads: Vec<LoadCase>,
}

impl AppCase {
    /// The capacity model of `workers` x `service_time`.
    pub fn model(workers: usize, service_time: Duration, loads: Vec<LoadCase>) -> Self {
        let config = BackendConfig::new(workers, service_time);
        AppCase {
            label: app_label(workers, service_time),
            nginx: false,
            workers,
            service_time,
            capacity_rps: config.nominal_capacity(),
            nominal_rps: config.nominal_capacity(),
            measured_rps: None,
            loads,
        }
    }

    /// nginx, with loads as multiples of `rate_rps`.
    pub fn nginx(rate_rps: f64, loads: Vec<LoadCase>) -> Self {
        AppCase {
            label: "nginx".into(),
            nginx: true,
            workers: 1,
            service_time: Duration::from_micros(50),
            capacity_rps: rate_rps,
            nominal_rps: rate_rps,
            measured_rps: None,
            loads,
        }
    }

    /// The budget its callers give (`x-request-timeout-ms`): weir's default task timeout,
    /// or four service times for a slow app (a 1 s app's callers do not give it 500 ms).
    pub fn budget(&self) -> Duration {
        Duration::from_millis(500).max(self.service_time * 4)
    }
}

/// `8x10ms`, `64x1s`.
pub fn app_label(workers: usize, service_time: Duration) -> String {
    let ms = service_time.as_secs_f64() * 1000.0;
    if ms >= 1000.0 {
        format!("{workers}x{}s", ms / 1000.0)
    } else {
        format!("{workers}x{ms}ms")
    }
}

/// One load on one app.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LoadCase {
    /// Poisson arrivals at `multiple` x capacity.
    Steady { multiple: f64 },
    /// `on_ms` at `multiple` x capacity, then `off_ms` of silence, repeated.
    OnOff { multiple: f64, on_ms: u64, off_ms: u64 },
    /// `warmup` sequential requests, then `bursts` bursts of `burst` concurrent requests,
    /// each after `idle_ms` of silence.
    IdleBurst { warmup: usize, burst: usize, bursts: usize, idle_ms: u64 },
}

impl LoadCase {
    pub fn label(&self) -> String {
        match *self {
            LoadCase::Steady { multiple } => format!("steady {multiple}x"),
            LoadCase::OnOff { multiple, on_ms, off_ms } => {
                format!("on/off {multiple}x {on_ms}/{off_ms} ms")
            }
            LoadCase::IdleBurst { warmup, burst, bursts, idle_ms } => {
                format!("idle-burst {warmup} seq + {bursts}x{burst} after {idle_ms} ms idle")
            }
        }
    }

    /// The idle-then-burst case for an app of `workers`: bursts of about a third of its
    /// workers (at least 2, at most 20), the 20 for 64 workers.
    pub fn idle_burst_for(workers: usize) -> LoadCase {
        let burst = ((workers as f64 * 0.3).ceil() as usize).clamp(2, 20);
        LoadCase::IdleBurst { warmup: 10, burst, bursts: 3, idle_ms: 1000 }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct NoHarmConfig {
    pub apps: Vec<AppCase>,
    /// Each steady / on-off run, and its first part not counted.
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub run: Duration,
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub warmup: Duration,
    /// Interleaved rounds of each case (direct and weir alternate who goes first).
    pub rounds: usize,
    pub protocol: Protocol,
    /// critical / normal / background shares of the load.
    pub mix: [f64; 3],
    pub seed: u64,
    pub middle_hop: Option<middle_hop::MiddleHopConfig>,
    pub async_middle_hop: Option<async_middle_hop::AsyncMiddleHopConfig>,
    pub silence: Option<silence::SilenceConfig>,
    /// The weir configuration's extra lines (none: the shipped defaults).
    pub weir_extra: String,
    #[serde(skip)]
    pub weir_bin: PathBuf,
}

/// The grid `--quick` runs: a few minutes.
pub fn quick_apps(nginx_rps: f64) -> Vec<AppCase> {
    let ms = Duration::from_millis;
    let standard = |workers: usize| {
        vec![
            LoadCase::Steady { multiple: 0.1 },
            LoadCase::Steady { multiple: 0.5 },
            LoadCase::Steady { multiple: 0.9 },
            LoadCase::OnOff { multiple: 1.5, on_ms: 500, off_ms: 500 },
            LoadCase::idle_burst_for(workers),
        ]
    };
    vec![
        AppCase::nginx(nginx_rps, standard(64)),
        AppCase::model(1, ms(1), standard(1)),
        AppCase::model(8, ms(10), standard(8)),
        AppCase::model(64, ms(100), standard(64)),
    ]
}

/// The full grid. Apps whose Poisson queue at 0.9x would average above the 20 ms overload
/// threshold by itself (one worker of 10 ms and more) run only up to 0.5x: at 0.9x their
/// own queue is an overload by DAGOR's definition, with or without weir.
pub fn full_apps(nginx_rps: f64) -> Vec<AppCase> {
    let ms = Duration::from_millis;
    let loads = |workers: usize, up_to_09: bool| {
        let mut loads =
            vec![LoadCase::Steady { multiple: 0.1 }, LoadCase::Steady { multiple: 0.5 }];
        if up_to_09 {
            loads.push(LoadCase::Steady { multiple: 0.9 });
            loads.push(LoadCase::OnOff { multiple: 1.5, on_ms: 500, off_ms: 500 });
        }
        loads.push(LoadCase::idle_burst_for(workers));
        loads
    };
    vec![
        AppCase::nginx(nginx_rps, loads(64, true)),
        AppCase::model(1, ms(1), loads(1, true)),
        AppCase::model(4, ms(1), loads(4, true)),
        AppCase::model(1, ms(10), loads(1, false)),
        AppCase::model(8, ms(10), loads(8, true)),
        AppCase::model(16, ms(10), loads(16, true)),
        AppCase::model(64, ms(100), loads(64, true)),
        AppCase::model(64, ms(1000), loads(64, true)),
    ]
}

// === what comes back ===

/// One contender's run of one case.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RunStats {
    pub contender: String,
    pub round: usize,
    pub sent: u64,
    pub ok: u64,
    pub refused: u64,
    pub timed_out: u64,
    pub errors: u64,
    pub refused_by_reason: BTreeMap<String, u64>,
    /// Successful responses per second over the counted part (idle-burst: per second of
    /// the bursts' makespans).
    pub throughput_rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// weir only: the in-flight limit and the level over the run.
    pub limit: Option<LimitStats>,
}

/// weir's `/v1/status` over one run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LimitStats {
    pub min: u64,
    pub median: u64,
    pub max: u64,
    /// Samples reading `overloaded: true`, as a share.
    pub overloaded_share: f64,
    /// The lowest level seen (compound; 32767 = open).
    pub min_level: u16,
    pub max_queue_depth: u64,
    /// `(seconds, max_inflight, inflight, queue_depth, level_compound, overloaded)`.
    pub series: Vec<(f64, u64, u64, u64, u16, bool)>,
}

impl LimitStats {
    pub fn from_samples(samples: &[StatusSample]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        let mut limits: Vec<u64> = samples.iter().map(|s| s.doc.max_inflight).collect();
        limits.sort_unstable();
        let overloaded = samples.iter().filter(|s| s.doc.overloaded).count();
        Some(LimitStats {
            min: limits[0],
            median: limits[limits.len() / 2],
            max: limits[limits.len() - 1],
            overloaded_share: overloaded as f64 / samples.len() as f64,
            min_level: samples.iter().map(|s| s.doc.level_compound).min().unwrap_or(LEVEL_OPEN),
            max_queue_depth: samples.iter().map(|s| s.doc.queue_depth).max().unwrap_or(0),
            series: samples
                .iter()
                .map(|s| {
                    let d = &s.doc;
                    let at = (s.at_secs * 1000.0).round() / 1000.0;
                    (at, d.max_inflight, d.inflight, d.queue_depth, d.level_compound, d.overloaded)
                })
                .collect(),
        })
    }
}

/// The targets of issue 20 for one case, weir against direct.
#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    pub refusals: u64,
    /// Requests weir did not serve that direct did (refused, timed out or failed).
    pub unserved_over_direct: i64,
    pub throughput_ratio: f64,
    pub p50_ratio: f64,
    pub p99_ratio: f64,
    /// max(direct + 5 ms, 1.1 x direct).
    pub p99_bound_ms: f64,
    pub zero_refusals: bool,
    pub throughput_ok: bool,
    pub p99_ok: bool,
    pub pass: bool,
}

/// The bound on weir's p99 given direct's: direct + 5 ms or 1.1x direct, whichever is
/// larger.
pub fn p99_bound_ms(direct_p99_ms: f64) -> f64 {
    (direct_p99_ms + 5.0).max(direct_p99_ms * 1.1)
}

/// Judges weir's (median) run against direct's. `rate_matters`: false for idle-then-burst,
/// whose "throughput" (burst requests over the bursts' makespans) is reported but not
/// judged: a few requests of ~10 ms make it a latency figure, which the p99 bound judges.
pub fn verdict(direct: &RunStats, weir: &RunStats, rate_matters: bool) -> Verdict {
    let ratio = |a: f64, b: f64| {
        if b > 0.0 {
            a / b
        } else if a > 0.0 {
            f64::INFINITY
        } else {
            1.0
        }
    };
    let unserved = |r: &RunStats| (r.sent - r.ok.min(r.sent)) as i64;
    let throughput_ratio = ratio(weir.throughput_rps, direct.throughput_rps);
    let bound = p99_bound_ms(direct.p99_ms);
    let zero_refusals = weir.refused == 0;
    // Two decimals, as reported: 0.98 is 0.98.
    let throughput_ok = !rate_matters || (throughput_ratio * 100.0).round() / 100.0 >= 0.98;
    let p99_ok = weir.p99_ms <= bound;
    Verdict {
        refusals: weir.refused,
        unserved_over_direct: unserved(weir) - unserved(direct),
        throughput_ratio,
        p50_ratio: ratio(weir.p50_ms, direct.p50_ms),
        p99_ratio: ratio(weir.p99_ms, direct.p99_ms),
        p99_bound_ms: bound,
        zero_refusals,
        throughput_ok,
        p99_ok,
        pass: zero_refusals && throughput_ok && p99_ok,
    }
}

/// One app and one load: every round of both contenders, and the verdict on the medians.
#[derive(Clone, Debug, Serialize)]
pub struct CaseResult {
    pub app: String,
    pub load: LoadCase,
    pub offered_rps: f64,
    #[serde(serialize_with = "crate::report::ser_millis")]
    pub budget: Duration,
    pub direct: RunStats,
    pub weir: RunStats,
    pub verdict: Verdict,
    pub rounds: Vec<RunStats>,
}

#[derive(Clone, Debug, Serialize)]
pub struct NoHarmResult {
    pub config: NoHarmConfig,
    pub cases: Vec<CaseResult>,
    pub middle_hop: Option<middle_hop::MiddleHopResult>,
    pub async_middle_hop: Option<async_middle_hop::AsyncMiddleHopResult>,
    pub silence: Option<silence::SilenceResult>,
}

/// Medians over rounds (counts summed; the limit of the first weir round kept whole, the
/// others' summaries merged).
pub fn combine(runs: &[&RunStats]) -> RunStats {
    let Some(first) = runs.first() else { return RunStats::default() };
    let med = |f: fn(&RunStats) -> f64| {
        let v: Vec<f64> = runs.iter().map(|r| f(r)).collect();
        crate::overhead::median(&v).unwrap_or(0.0)
    };
    let mut reasons = BTreeMap::new();
    for r in runs {
        for (k, v) in &r.refused_by_reason {
            *reasons.entry(k.clone()).or_insert(0) += v;
        }
    }
    let limit = first.limit.clone().map(|mut l| {
        for r in runs.iter().skip(1).filter_map(|r| r.limit.as_ref()) {
            l.min = l.min.min(r.min);
            l.max = l.max.max(r.max);
            l.overloaded_share = l.overloaded_share.max(r.overloaded_share);
            l.min_level = l.min_level.min(r.min_level);
            l.max_queue_depth = l.max_queue_depth.max(r.max_queue_depth);
        }
        l
    });
    RunStats {
        contender: first.contender.clone(),
        round: 0,
        sent: runs.iter().map(|r| r.sent).sum(),
        ok: runs.iter().map(|r| r.ok).sum(),
        refused: runs.iter().map(|r| r.refused).sum(),
        timed_out: runs.iter().map(|r| r.timed_out).sum(),
        errors: runs.iter().map(|r| r.errors).sum(),
        refused_by_reason: reasons,
        throughput_rps: med(|r| r.throughput_rps),
        p50_ms: med(|r| r.p50_ms),
        p99_ms: med(|r| r.p99_ms),
        limit,
    }
}

// === running ===

/// The app under test, for one run.
enum RunningApp {
    Model(CapacityBackend),
    Nginx(SocketAddr),
}

impl RunningApp {
    fn addr(&self) -> SocketAddr {
        match self {
            RunningApp::Model(b) => b.addr(),
            RunningApp::Nginx(a) => *a,
        }
    }
}

/// weir with the shipped defaults in front of `app` (plus `extra` lines under
/// `inbound:`, empty for the defaults).
pub async fn start_weir(
    weir_bin: &Path,
    app: SocketAddr,
    extra: &str,
) -> anyhow::Result<Contender> {
    let any: SocketAddr = ([127, 0, 0, 1], 0).into();
    let yaml = weir_yaml(any, app, any, extra);
    Contender::weir_with_config(weir_bin, &yaml).await
}

/// The configuration of a shipped-defaults sidecar: addresses only (and quiet logs).
pub fn weir_yaml(listen: SocketAddr, app: SocketAddr, admin: SocketAddr, extra: &str) -> String {
    format!(
        "inbound:\n  listen: {listen}\n  app: {app}\n{extra}admin:\n  listen: {admin}\nlog:\n  filter: warn\n"
    )
}

/// Runs the suite; `progress` gets a line per run.
pub async fn run(
    config: NoHarmConfig,
    mut progress: impl FnMut(String),
) -> anyhow::Result<NoHarmResult> {
    let mut cases = Vec::new();
    let mut apps = config.apps.clone();
    for app in &mut apps {
        if app.nginx {
            continue;
        }
        let measured = measure_capacity(app.workers, app.service_time).await?;
        app.measured_rps = Some(measured);
        app.capacity_rps = app.nominal_rps.min(measured);
        progress(format!(
            "{:<9} capacity: nominal {:.0} rps, measured {:.0} rps; loads are multiples of {:.0}",
            app.label, app.nominal_rps, measured, app.capacity_rps
        ));
    }
    for app in &apps {
        let nginx = if app.nginx { Some(NginxApp::start(Listener::Http1, None)?) } else { None };
        for &load in &app.loads {
            let mut rounds = Vec::new();
            for round in 0..config.rounds.max(1) {
                let order: [bool; 2] = if round % 2 == 0 { [false, true] } else { [true, false] };
                for weir in order {
                    let running = match &nginx {
                        Some(n) => RunningApp::Nginx(n.addr),
                        None => RunningApp::Model(
                            CapacityBackend::start(BackendConfig::new(
                                app.workers,
                                app.service_time,
                            ))
                            .await?,
                        ),
                    };
                    let mut stats = run_one(&config, app, load, &running, weir).await?;
                    stats.round = round + 1;
                    progress(format!(
                        "{:<9} {:<44} {:<6} r{} ok {:>6} refused {:>5} timeout {:>4} err {:>4} {:>8.1} rps p50 {:>8.2} p99 {:>8.2} ms{}",
                        app.label,
                        load.label(),
                        stats.contender,
                        round + 1,
                        stats.ok,
                        stats.refused,
                        stats.timed_out,
                        stats.errors,
                        stats.throughput_rps,
                        stats.p50_ms,
                        stats.p99_ms,
                        stats.limit.as_ref().map_or(String::new(), |l| format!(
                            "  limit {}/{}/{} overloaded {:.0}% level>={}",
                            l.min,
                            l.median,
                            l.max,
                            l.overloaded_share * 100.0,
                            fmt_level(l.min_level)
                        )),
                    ));
                    rounds.push(stats);
                }
            }
            let of = |name: &str| -> Vec<&RunStats> {
                rounds.iter().filter(|r| r.contender == name).collect()
            };
            let direct = combine(&of("direct"));
            let weir = combine(&of("weir"));
            let rate_matters = !matches!(load, LoadCase::IdleBurst { .. });
            let verdict = verdict(&direct, &weir, rate_matters);
            let offered_rps = match load {
                LoadCase::Steady { multiple } => multiple * app.capacity_rps,
                LoadCase::OnOff { multiple, on_ms, off_ms } => {
                    multiple * app.capacity_rps * on_ms as f64 / (on_ms + off_ms) as f64
                }
                LoadCase::IdleBurst { .. } => 0.0,
            };
            cases.push(CaseResult {
                app: app.label.clone(),
                load,
                offered_rps,
                budget: app.budget(),
                direct,
                weir,
                verdict,
                rounds,
            });
        }
    }
    let middle_hop = match &config.middle_hop {
        Some(mh) => Some(middle_hop::run(mh, &config.weir_bin, &mut progress).await?),
        None => None,
    };
    let async_middle_hop = match &config.async_middle_hop {
        Some(a) => {
            Some(async_middle_hop::run(a, &config.weir_bin, config.rounds, &mut progress).await?)
        }
        None => None,
    };
    let silence = match &config.silence {
        Some(s) => Some(silence::run(s, &config.weir_bin, config.mix, &mut progress).await?),
        None => None,
    };
    let config = NoHarmConfig { apps, ..config };
    Ok(NoHarmResult { config, cases, middle_hop, async_middle_hop, silence })
}

/// Completions per second of a fresh capacity-model app with every worker busy: 1.2x its
/// nominal capacity offered directly for 4 s, completions counted over the last 3 (as the
/// overload benchmark measures its apps).
pub async fn measure_capacity(workers: usize, service_time: Duration) -> anyhow::Result<f64> {
    let backend = CapacityBackend::start(BackendConfig::new(workers, service_time)).await?;
    let nominal = backend.config().nominal_capacity();
    let phases = vec![Phase { rate_per_sec: nominal * 1.2, duration: Duration::from_secs(4) }];
    let mut spec = LoadSpec::new(backend.addr(), phases);
    // Nobody gives up during the measurement.
    spec.deadline = Duration::from_secs(10).max(service_time * 20);
    let run = load::LoadRun::start(spec)?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let first = backend.snapshot().completed;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let second = backend.snapshot().completed;
    // The backlog is dropped rather than waited for.
    backend.reset();
    run.finish().await?;
    let measured = (second - first) as f64 / 3.0;
    anyhow::ensure!(measured > 0.0, "the app completed nothing while saturated");
    Ok(measured)
}

async fn run_one(
    config: &NoHarmConfig,
    app: &AppCase,
    load: LoadCase,
    running: &RunningApp,
    through_weir: bool,
) -> anyhow::Result<RunStats> {
    let weir = if through_weir {
        Some(start_weir(&config.weir_bin, running.addr(), &config.weir_extra).await?)
    } else {
        None
    };
    let target = weir.as_ref().map_or(running.addr(), |w| w.addr);
    let poller = weir
        .as_ref()
        .and_then(|w| w.admin)
        .map(|admin| StatusPoller::start(admin, Duration::from_millis(100)));
    let mut stats = match load {
        LoadCase::Steady { multiple } => {
            let phases =
                vec![Phase { rate_per_sec: multiple * app.capacity_rps, duration: config.run }];
            let report = load::run(spec(config, app, target, phases)).await?;
            from_report(&report)
        }
        LoadCase::OnOff { multiple, on_ms, off_ms } => {
            let period = Duration::from_millis(on_ms + off_ms);
            let cycles = (config.run.as_secs_f64() / period.as_secs_f64()).ceil().max(1.0) as usize;
            let mut phases = Vec::with_capacity(cycles * 2);
            for _ in 0..cycles {
                phases.push(Phase {
                    rate_per_sec: multiple * app.capacity_rps,
                    duration: Duration::from_millis(on_ms),
                });
                phases.push(Phase { rate_per_sec: 0.0, duration: Duration::from_millis(off_ms) });
            }
            let report = load::run(spec(config, app, target, phases)).await?;
            from_report(&report)
        }
        LoadCase::IdleBurst { warmup, burst, bursts, idle_ms } => {
            idle_burst(config.protocol, target, app.budget(), warmup, burst, bursts, idle_ms).await
        }
    };
    stats.contender = if through_weir { "weir" } else { "direct" }.into();
    stats.limit = poller.and_then(|p| LimitStats::from_samples(&p.stop()));
    drop(weir);
    Ok(stats)
}

fn spec(config: &NoHarmConfig, app: &AppCase, target: SocketAddr, phases: Vec<Phase>) -> LoadSpec {
    let mut spec = LoadSpec::new(target, phases);
    spec.protocol = config.protocol;
    spec.classes = load::classes_with_shares(config.mix);
    spec.deadline = app.budget();
    spec.warmup = config.warmup;
    spec.seed = config.seed;
    spec
}

/// Counts and latency of the counted part of a load run.
pub fn from_report(report: &LoadReport) -> RunStats {
    let mut reasons = BTreeMap::new();
    for class in &report.classes {
        for (k, v) in &class.refused_by_reason {
            *reasons.entry(k.clone()).or_insert(0) += v;
        }
    }
    RunStats {
        sent: report.sent(),
        ok: report.ok(),
        refused: report.refused(),
        timed_out: report.classes.iter().map(|c| c.timed_out).sum(),
        errors: report.classes.iter().map(|c| c.errors).sum(),
        refused_by_reason: reasons,
        throughput_rps: report.goodput(),
        p50_ms: report.all_ok_p50_ms,
        p99_ms: report.all_ok_p99_ms,
        ..RunStats::default()
    }
}

/// The client the idle-then-burst case uses.
pub fn http_client(protocol: Protocol) -> Client<HttpConnector, Empty<Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .http2_only(protocol == Protocol::H2c)
        .pool_max_idle_per_host(usize::MAX)
        .build(connector)
}

/// One GET with priority `business.user` and a budget, as the load generator sends it;
/// the outcome and how long it took.
pub async fn send_one(
    client: &Client<HttpConnector, Empty<Bytes>>,
    target: SocketAddr,
    business: u8,
    user: u8,
    budget: Duration,
) -> (Outcome, Duration) {
    let started = Instant::now();
    let deadline_us = crate::unix_micros() + budget.as_micros() as u64;
    let request = http::Request::get(format!("http://{target}/work"))
        .header("x-business-priority", business.to_string())
        .header("x-user-priority", user.to_string())
        .header("x-request-timeout-ms", budget.as_millis().to_string())
        .header(crate::DEADLINE_HEADER, deadline_us.to_string())
        .body(Empty::new());
    let Ok(request) = request else { return (Outcome::Error, started.elapsed()) };
    let exchange = async {
        let response = client.request(request).await?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await?;
        anyhow::Ok((parts, body.trailers().cloned()))
    };
    let outcome = match tokio::time::timeout(budget, exchange).await {
        Err(_) => Outcome::TimedOut,
        Ok(Err(_)) => Outcome::Error,
        Ok(Ok((parts, trailers))) => Outcome::classify(&parts, trailers.as_ref()),
    };
    (outcome, started.elapsed())
}

/// `warmup` sequential requests, then `bursts` x (`idle_ms` of silence, `burst` requests at
/// once). Counts and latency are the bursts'; throughput is burst requests served per
/// second of the bursts' makespans.
async fn idle_burst(
    protocol: Protocol,
    target: SocketAddr,
    budget: Duration,
    warmup: usize,
    burst: usize,
    bursts: usize,
    idle_ms: u64,
) -> RunStats {
    let client = http_client(protocol);
    for i in 0..warmup {
        let _ = send_one(&client, target, 1, (i % 128) as u8, budget).await;
    }
    let mut stats = RunStats::default();
    let mut latencies = Vec::new();
    let mut makespan = Duration::ZERO;
    for _ in 0..bursts {
        tokio::time::sleep(Duration::from_millis(idle_ms)).await;
        let started = Instant::now();
        let requests: Vec<_> = (0..burst)
            .map(|i| {
                let client = client.clone();
                // Every class and a spread of users, as a burst of real callers.
                let (business, user) = ((i % 3) as u8, ((i * 37) % 128) as u8);
                tokio::spawn(async move { send_one(&client, target, business, user, budget).await })
            })
            .collect();
        for request in requests {
            let Ok((outcome, took)) = request.await else { continue };
            stats.sent += 1;
            match outcome {
                Outcome::Ok => {
                    stats.ok += 1;
                    latencies.push(took.as_secs_f64() * 1000.0);
                }
                Outcome::Refused(reason) => {
                    stats.refused += 1;
                    *stats.refused_by_reason.entry(reason).or_insert(0) += 1;
                }
                Outcome::TimedOut => stats.timed_out += 1,
                Outcome::Error => stats.errors += 1,
            }
        }
        makespan += started.elapsed();
    }
    latencies.sort_by(f64::total_cmp);
    let q = |q: f64| {
        if latencies.is_empty() {
            0.0
        } else {
            latencies[((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1]
        }
    };
    stats.p50_ms = q(0.5);
    stats.p99_ms = q(0.99);
    stats.throughput_rps = stats.ok as f64 / makespan.as_secs_f64().max(1e-9);
    stats
}

// === the report ===

/// `B.U` of a compound level.
pub fn fmt_level(compound: u16) -> String {
    format!("{}.{}", compound / 128, compound % 128)
}

fn yes(ok: bool) -> &'static str {
    if ok {
        "yes"
    } else {
        "**no**"
    }
}

/// The tables: one row per case, then the middle hop and the silence.
pub fn markdown(r: &NoHarmResult) -> String {
    let mut s = String::new();
    let c = &r.config;
    let _ = writeln!(
        s,
        "weir: the shipped defaults{} (binary `{}`). Loads: open loop, Poisson, seed {}, classes {:.0}/{:.0}/{:.0}% \
         critical/normal/background, {:?} callers; each run {} s, the first {} s not counted; {} interleaved round(s) \
         per case (medians; counts summed). Targets: 0 refusals, throughput >= 0.98x direct (not judged for \
         idle-then-burst, where it is burst requests over the bursts' makespans), p99 <= max(direct + 5 ms, 1.1x direct). \
         Limit: weir's `/v1/status` `max_inflight` every 100 ms (min / median / max over the run).\n",
        if c.weir_extra.is_empty() { String::new() } else { format!(" plus `{}`", c.weir_extra.trim().replace('\n', "; ")) },
        c.weir_bin.display(),
        c.seed,
        c.mix[0] * 100.0,
        c.mix[1] * 100.0,
        c.mix[2] * 100.0,
        c.protocol,
        c.run.as_secs_f64(),
        c.warmup.as_secs_f64(),
        c.rounds,
    );
    let passed = r.cases.iter().filter(|k| k.verdict.pass).count();
    let models: Vec<String> = c
        .apps
        .iter()
        .filter_map(|a| {
            a.measured_rps.map(|m| format!("{} {:.0} of nominal {:.0}", a.label, m, a.nominal_rps))
        })
        .collect();
    if !models.is_empty() {
        let _ = writeln!(
            s,
            "Capacity-model apps measured (rps, every worker busy; loads are multiples of the lower): {}.\n",
            models.join("; ")
        );
    }
    if r.cases.is_empty() {
        let _ = writeln!(s, "No grid cases in this run (`--parts` left the grid out).\n");
    } else {
        let _ = writeln!(s, "**{passed} of {} cases meet every target.**\n", r.cases.len());
    }
    let _ = writeln!(
        s,
        "| app | load | offered rps | refused (weir) | not served direct / weir | throughput weir/direct | \
         p50 direct / weir ms | p99 direct / weir ms (bound) | limit min/med/max | overloaded | lowest level | pass |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for k in &r.cases {
        let (d, w, v) = (&k.direct, &k.weir, &k.verdict);
        let unserved = |r: &RunStats| r.sent - r.ok.min(r.sent);
        let limit = w.limit.as_ref();
        let reasons = if w.refused_by_reason.is_empty() {
            String::new()
        } else {
            format!(
                " ({})",
                w.refused_by_reason
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {}{} | {} / {} of {} | {:.3} | {:.2} / {:.2} | {:.2} / {:.2} ({:.1}) | {} | {} | {} | {} |",
            k.app,
            k.load.label(),
            if k.offered_rps > 0.0 { format!("{:.0}", k.offered_rps) } else { "-".into() },
            w.refused,
            reasons,
            unserved(d),
            unserved(w),
            w.sent,
            v.throughput_ratio,
            d.p50_ms,
            w.p50_ms,
            d.p99_ms,
            w.p99_ms,
            v.p99_bound_ms,
            limit.map_or("-".into(), |l| format!("{}/{}/{}", l.min, l.median, l.max)),
            limit.map_or("-".into(), |l| format!("{:.0}%", l.overloaded_share * 100.0)),
            limit.map_or("-".into(), |l| fmt_level(l.min_level)),
            yes(v.pass),
        );
    }
    if let Some(mh) = &r.middle_hop {
        s.push('\n');
        s.push_str(&middle_hop::markdown(mh));
    }
    if let Some(am) = &r.async_middle_hop {
        s.push('\n');
        s.push_str(&async_middle_hop::markdown(am));
    }
    if let Some(si) = &r.silence {
        s.push('\n');
        s.push_str(&silence::markdown(si));
    }
    s
}

/// Per app, the limit over time of each load's first weir round (`limit-<app>.svg`).
pub fn write_plots(r: &NoHarmResult, dir: &Path) -> anyhow::Result<Vec<String>> {
    use plotters::prelude::*;
    let mut written = Vec::new();
    let mut apps: Vec<&str> = Vec::new();
    for k in &r.cases {
        if !apps.contains(&k.app.as_str()) {
            apps.push(&k.app);
        }
    }
    for app in apps {
        let cases: Vec<&CaseResult> = r.cases.iter().filter(|k| k.app == app).collect();
        let name = format!("limit-{}.svg", app.replace(['.', ' '], "_"));
        let path = dir.join(&name);
        let root = SVGBackend::new(&path, (1000, 300 * cases.len() as u32)).into_drawing_area();
        root.fill(&WHITE).map_err(crate::plot::err)?;
        let panels = root.split_evenly((cases.len(), 1));
        for (case, panel) in cases.iter().zip(panels.iter()) {
            let Some(weir) = case.rounds.iter().find(|r| r.contender == "weir") else { continue };
            let Some(limit) = &weir.limit else { continue };
            let t_max = limit.series.last().map_or(1.0, |p| p.0).max(1.0);
            let y_max = limit.series.iter().map(|p| p.1.max(p.2 + p.3)).max().unwrap_or(1) as f64
                * 1.1
                + 1.0;
            let lines = vec![
                (
                    "max_inflight".to_string(),
                    limit.series.iter().map(|p| (p.0, p.1 as f64)).collect(),
                ),
                ("inflight".to_string(), limit.series.iter().map(|p| (p.0, p.2 as f64)).collect()),
                ("queued".to_string(), limit.series.iter().map(|p| (p.0, p.3 as f64)).collect()),
            ];
            crate::plot::time_panel(
                panel,
                &format!("{app}, {}: weir's in-flight limit", case.load.label()),
                "requests",
                t_max,
                y_max,
                lines,
            )?;
        }
        root.present().map_err(crate::plot::err)?;
        written.push(name);
    }
    Ok(written)
}
