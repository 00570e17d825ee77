//! A healthy **async** middle hop whose level spares a route (issue 20's "no harm", the
//! middle hop's worker bound): app A runs a task per request and holds nothing while a call
//! waits, so its concurrency is bounded only by what it is offered.
//!
//! ```text
//! X load --> weir A (inbound + egress) --> app A (async) --(A's egress)--> weir B --> app B
//! Y load -->                               X: x_work, then a call to B     B_WORKERS x B_SERVICE
//!                                          Y: y_work, A alone               (X at 3x: overloaded)
//! ```
//!
//! B (weir B with `max_inflight` hand-set to B's workers: B's own limit is not under test)
//! is overloaded, so X's calls wait on B and hold most of what A holds: A's per-route
//! level spares Y (the light route) and its worker bound caps everything at A (lent slots
//! included) at the most A held in a clean 100 ms window plus an eighth, while it spares and
//! for 2 s after. The bound is right for an app that holds a worker while it waits (the
//! [`super::middle_hop`] case); A here holds nothing, and Y's bursts need far more
//! concurrency than the calm before them showed. The question: is Y refused, slowed or
//! starved by the bound? Y: `y_calm_rps` for `calm`, then bursts of `y_burst_rps` for
//! `burst_on` every `burst_on + burst_off`.
//!
//! Variants (each on fresh apps and sidecars): weir's shipped defaults at A with the egress
//! role on (the case under test); the same with the adaptive limit off (neither limit nor
//! worker bound); with per-route levels off (no sparing, so no worker bound: the limit alone); the
//! egress role off (A calls weir B directly); a single hop (X calls nothing: two routes of
//! different cost, no downstream); no weir at A (the no-harm reference: Y's refusals,
//! throughput and p99 are judged against it).
//!
//! weir A runs with `weir::limit=debug`: every change of its worker bound (the in-flight
//! ceiling) is read back from its log, beside `/v1/status` every 100 ms (the logs are kept
//! in the output directory).
//!
//! **What it showed on 22b5818** (`--quick`, load average 3-6): the defaults harm Y. X's
//! own time 2 ms, Y's 50 ms: Y refused 1409 / 77 of 3188 in two rounds, p50 296 / 227 ms
//! against 52 ms without weir at A. The cause is the own time judged as a mean over routes:
//! a window with more of the slower route reads as a queue, so the worker bound never grows
//! in Y's bursts (and a later window of mostly X lowers its baseline and drops its clean
//! peaks: 51 -> 20 -> 12), and the knee search cuts the limit (3-13 for the single hop).
//! With X at 20 ms the limit holds (per_route off and the single hop meet every target)
//! but the worker bound stays at 46 for 10 s under bursts that need ~60: Y p99 296 ms.
//! With both at 50 ms the bound grows an eighth per 100 ms: Y p99 70.5 ms against 56.2.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::time::Instant;

use super::middle_hop::{AppA, Downstream, ASYNC_WORKERS};
use super::{p99_bound_ms, start_weir, LimitStats};
use crate::backend::{BackendConfig, CapacityBackend};
use crate::contender::free_port;
use crate::load::{self, ClassSpec, Ending, LoadReport, LoadSpec, Phase};
use crate::status::StatusPoller;
use crate::weir_process::WeirProcess;

#[derive(Clone, Debug, Serialize)]
pub struct AsyncMiddleHopConfig {
    /// X's work at A before its call to B.
    #[serde(serialize_with = "crate::report::ser_millis")]
    pub x_work: Duration,
    /// Y's work at A (all of Y).
    #[serde(serialize_with = "crate::report::ser_millis")]
    pub y_work: Duration,
    pub b_workers: usize,
    #[serde(serialize_with = "crate::report::ser_millis")]
    pub b_service: Duration,
    /// X's offered rate as a multiple of B's capacity.
    pub x_multiple_of_b: f64,
    pub y_calm_rps: f64,
    pub y_burst_rps: f64,
    /// Y at its calm rate before the first burst.
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub calm: Duration,
    #[serde(serialize_with = "crate::report::ser_millis")]
    pub burst_on: Duration,
    #[serde(serialize_with = "crate::report::ser_millis")]
    pub burst_off: Duration,
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub run: Duration,
    /// Not counted (X's overload of B settles, A's level starts sparing Y).
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub warmup: Duration,
    pub mix: [f64; 3],
    pub seed: u64,
    /// The variants run (in this order; reversed in even rounds).
    pub variants: Vec<Variant>,
    /// Where weir A's log of each run is kept (`async-middle-hop-<variant>-r<round>.log`).
    #[serde(skip)]
    pub keep_logs: Option<std::path::PathBuf>,
}

impl AsyncMiddleHopConfig {
    /// X: 2 ms at A then B (8 x 100 ms = 80/s) at 3x; Y: 50 ms at A, 100/s calm (5 at
    /// once), bursts of 800/s (40 at once) for 500 ms every 1.5 s from the fourth second.
    pub fn standard(run: Duration, warmup: Duration, seed: u64) -> Self {
        AsyncMiddleHopConfig {
            x_work: Duration::from_millis(2),
            y_work: Duration::from_millis(50),
            b_workers: 8,
            b_service: Duration::from_millis(100),
            x_multiple_of_b: 3.0,
            y_calm_rps: 100.0,
            y_burst_rps: 800.0,
            calm: Duration::from_secs(4),
            burst_on: Duration::from_millis(500),
            burst_off: Duration::from_millis(1000),
            run,
            warmup,
            mix: [0.1, 0.3, 0.6],
            seed,
            variants: Variant::ALL.to_vec(),
            keep_logs: None,
        }
    }

    /// A smaller case for the e2e test (a debug build of weir): X 2 ms then B (4 x 100 ms =
    /// 40/s) at 3x; Y 100 ms at A, 40/s calm (4 at once), bursts of 300/s (30 at once) for
    /// 600 ms every 1.5 s from the third second.
    pub fn e2e(seed: u64) -> Self {
        AsyncMiddleHopConfig {
            y_work: Duration::from_millis(100),
            b_workers: 4,
            y_calm_rps: 40.0,
            y_burst_rps: 300.0,
            calm: Duration::from_secs(3),
            burst_on: Duration::from_millis(600),
            burst_off: Duration::from_millis(900),
            ..Self::standard(Duration::from_secs(9), Duration::from_secs(2), seed)
        }
    }

    pub fn b_capacity(&self) -> f64 {
        BackendConfig::new(self.b_workers, self.b_service).nominal_capacity()
    }

    pub fn x_rate(&self) -> f64 {
        self.x_multiple_of_b * self.b_capacity()
    }

    /// Y's phases: calm, then bursts, up to `run`.
    pub fn y_phases(&self) -> Vec<Phase> {
        let mut phases = vec![Phase { rate_per_sec: self.y_calm_rps, duration: self.calm }];
        let mut at = self.calm;
        while at < self.run {
            for (rate, length) in
                [(self.y_burst_rps, self.burst_on), (self.y_calm_rps, self.burst_off)]
            {
                let length = length.min(self.run.saturating_sub(at));
                if !length.is_zero() {
                    phases.push(Phase { rate_per_sec: rate, duration: length });
                    at += length;
                }
            }
        }
        phases
    }

    /// Whether Y's request scheduled at `at_secs` falls in a burst.
    pub fn in_burst(&self, at_secs: f64) -> bool {
        let since = at_secs - self.calm.as_secs_f64();
        let period = (self.burst_on + self.burst_off).as_secs_f64();
        since >= 0.0 && since % period < self.burst_on.as_secs_f64()
    }
}

/// What sits at A.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// weir's shipped defaults, the egress role on (per-route levels and the worker bound
    /// come with it).
    DefaultsEgressOn,
    /// As above with `egress.per_route.enabled: false`: nothing is spared, so the worker
    /// bound never applies.
    PerRouteOff,
    /// weir's defaults at A, egress role off (A calls weir B directly).
    EgressOff,
    /// No weir at A (weir B stays): the reference.
    NoWeirAtA,
    /// The defaults with the egress role on and `adaptive_inflight: false`: the limit fixed at
    /// `max_inflight`, and no worker bound (a fixed limit is no middle hop's).
    LimitOff,
    /// weir's defaults at A, X calling nothing (a single hop whose two routes differ in
    /// cost): the limit alone, without a downstream.
    SingleHop,
}

impl Variant {
    pub const ALL: [Variant; 6] = [
        Variant::NoWeirAtA,
        Variant::DefaultsEgressOn,
        Variant::LimitOff,
        Variant::PerRouteOff,
        Variant::EgressOff,
        Variant::SingleHop,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Variant::DefaultsEgressOn => "weir defaults, egress on",
            Variant::PerRouteOff => "weir defaults, egress on, per_route off (no worker bound)",
            Variant::EgressOff => "weir defaults, egress off",
            Variant::NoWeirAtA => "no weir at A",
            Variant::LimitOff => {
                "weir egress on, adaptive_inflight off (no limit, no worker bound)"
            }
            Variant::SingleHop => "weir defaults, X calls nothing (single hop, two routes)",
        }
    }

    fn egress(self) -> bool {
        matches!(self, Variant::DefaultsEgressOn | Variant::PerRouteOff | Variant::LimitOff)
    }
}

/// One API's counted part.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ApiStats {
    pub sent: u64,
    pub ok: u64,
    pub refused: u64,
    pub timed_out: u64,
    pub errors: u64,
    pub throughput_rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Y only: its requests scheduled inside a burst.
    pub burst_p99_ms: f64,
    pub burst_max_ms: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct VariantResult {
    pub variant: Variant,
    pub label: String,
    pub round: usize,
    pub x: ApiStats,
    pub y: ApiStats,
    /// weir A's `/v1/status` every 100 ms.
    pub a_limit: Option<LimitStats>,
    /// weir A's in-flight ceiling (the worker bound, or `max_inflight`) at each change:
    /// `(seconds since the load started, ceiling)`, from its `weir::limit` log.
    pub a_ceiling: Vec<(f64, u64)>,
    /// weir A's adaptive limit at each change: `(seconds, to)`, from the same log.
    pub a_limit_changes: Vec<(f64, u64)>,
    /// The lowest ceiling seen, and the seconds it was below `max_inflight`.
    pub a_ceiling_min: Option<u64>,
    pub a_bound_secs: f64,
    /// App A every 100 ms: `(seconds, requests in its handlers, X's calls in flight)`.
    pub a_app_series: Vec<(f64, usize, usize)>,
    pub a_app_peak: usize,
}

/// Y under the defaults (egress on) against no weir at A (medians over rounds).
#[derive(Clone, Debug, Serialize)]
pub struct YVerdict {
    pub refused: u64,
    pub timed_out_or_failed_over_reference: i64,
    pub throughput_ratio: f64,
    pub p99_ms: f64,
    pub reference_p99_ms: f64,
    pub p99_bound_ms: f64,
    pub pass: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct AsyncMiddleHopResult {
    pub config: AsyncMiddleHopConfig,
    pub variants: Vec<VariantResult>,
    /// Per variant with weir at A: Y's verdict against no weir at A.
    pub verdicts: Vec<(Variant, YVerdict)>,
}

pub async fn run(
    config: &AsyncMiddleHopConfig,
    weir_bin: &Path,
    rounds: usize,
    progress: &mut impl FnMut(String),
) -> anyhow::Result<AsyncMiddleHopResult> {
    let mut variants = Vec::new();
    for round in 0..rounds.max(1) {
        let mut order = config.variants.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        for variant in order {
            let r = run_variant(config, weir_bin, variant, round + 1).await?;
            progress(format!(
                "async middle hop r{} {:<58} Y ok {} refused {} timeout {} err {} {:.1} rps p50 {:.1} p99 {:.1} (bursts p99 {:.1} max {:.1}) ms; X ok {} refused {}; A ceiling min {} ({:.1} s bound), app peak {}, limit {}",
                r.round,
                r.label,
                r.y.ok,
                r.y.refused,
                r.y.timed_out,
                r.y.errors,
                r.y.throughput_rps,
                r.y.p50_ms,
                r.y.p99_ms,
                r.y.burst_p99_ms,
                r.y.burst_max_ms,
                r.x.ok,
                r.x.refused,
                r.a_ceiling_min.map_or("-".into(), |c| c.to_string()),
                r.a_bound_secs,
                r.a_app_peak,
                r.a_limit.as_ref().map_or("-".into(), |l| format!("{}/{}/{}", l.min, l.median, l.max)),
            ));
            variants.push(r);
        }
    }
    let verdicts = Variant::ALL
        .into_iter()
        .filter(|&v| v != Variant::NoWeirAtA)
        .filter_map(|v| verdict(&variants, v).map(|y| (v, y)))
        .collect();
    Ok(AsyncMiddleHopResult { config: config.clone(), variants, verdicts })
}

fn median(v: Vec<f64>) -> f64 {
    crate::overhead::median(&v).unwrap_or(0.0)
}

/// Y of `variant` against Y with no weir at A: medians of throughput and p99, counts summed.
pub fn verdict(variants: &[VariantResult], variant: Variant) -> Option<YVerdict> {
    let of = |v: Variant| -> Vec<&ApiStats> {
        variants.iter().filter(|r| r.variant == v).map(|r| &r.y).collect()
    };
    let (weir, reference) = (of(variant), of(Variant::NoWeirAtA));
    if weir.is_empty() || reference.is_empty() {
        return None;
    }
    let med = |s: &[&ApiStats], f: fn(&ApiStats) -> f64| median(s.iter().map(|y| f(y)).collect());
    let unserved = |s: &[&ApiStats]| s.iter().map(|y| (y.timed_out + y.errors) as i64).sum::<i64>();
    let refused = weir.iter().map(|y| y.refused).sum();
    let throughput_ratio =
        med(&weir, |y| y.throughput_rps) / med(&reference, |y| y.throughput_rps).max(1e-9);
    let (p99_ms, reference_p99_ms) = (med(&weir, |y| y.p99_ms), med(&reference, |y| y.p99_ms));
    let bound = p99_bound_ms(reference_p99_ms);
    Some(YVerdict {
        refused,
        timed_out_or_failed_over_reference: unserved(&weir) - unserved(&reference),
        throughput_ratio,
        p99_ms,
        reference_p99_ms,
        p99_bound_ms: bound,
        pass: refused == 0 && (throughput_ratio * 100.0).round() / 100.0 >= 0.98 && p99_ms <= bound,
    })
}

/// The configuration of weir A (egress role on or off, per-route levels on or off), with
/// every limit change logged.
fn weir_a_yaml(
    app: std::net::SocketAddr,
    egress: Option<std::net::SocketAddr>,
    per_route: bool,
) -> String {
    let mut yaml = format!(
        "inbound:\n  listen: 127.0.0.1:0\n  app: {app}\nadmin:\n  listen: 127.0.0.1:0\nlog:\n  filter: warn,weir::limit=debug\n"
    );
    if let Some(egress) = egress {
        let _ = write!(yaml, "egress:\n  enabled: true\n  listen: {egress}\n");
        if !per_route {
            yaml.push_str("  per_route:\n    enabled: false\n");
        }
    }
    yaml
}

/// `weir run` with `yaml`; the process (its log is read back) and the temporary directory
/// holding the configuration.
async fn start_weir_logged(
    weir_bin: &Path,
    yaml: &str,
) -> anyhow::Result<(WeirProcess, tempfile::TempDir)> {
    anyhow::ensure!(weir_bin.is_file(), "{} not found", weir_bin.display());
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("weir.yaml");
    std::fs::write(&cfg, yaml)?;
    let mut command = Command::new(weir_bin);
    command.arg("run").arg("--config").arg(&cfg);
    // The configuration's filter, whatever the bench's environment says.
    command.env_remove("RUST_LOG").env("NO_COLOR", "1");
    command.stdin(Stdio::null()).stdout(Stdio::null());
    let weir = WeirProcess::start(command, Duration::from_secs(10))
        .await
        .map_err(|e| anyhow::anyhow!("weir A: {e}"))?;
    Ok((weir, dir))
}

/// One run of `variant` (fresh apps and sidecars), `weir_bin` at A and B.
pub async fn run_variant(
    config: &AsyncMiddleHopConfig,
    weir_bin: &Path,
    variant: Variant,
    round: usize,
) -> anyhow::Result<VariantResult> {
    let backend =
        CapacityBackend::start(BackendConfig::new(config.b_workers, config.b_service)).await?;
    // B's own limit is not under test: hand-set to its workers, so its level sheds its
    // overload at once (with the defaults, B's limit can stay at its ceiling for seconds
    // and X's calls then wait out their budget in B's app: issue 19's stuck limit).
    let b_limit = format!("  max_inflight: {}\n  adaptive_inflight: false\n", config.b_workers);
    let weir_b = start_weir(weir_bin, backend.addr(), &b_limit).await?;
    let a_egress = free_port()?;
    let call = if variant.egress() {
        Downstream::ThroughEgress { egress: a_egress, authority: weir_b.addr.to_string() }
    } else if variant == Variant::SingleHop {
        Downstream::None
    } else {
        Downstream::Direct(weir_b.addr)
    };
    let app_a = Arc::new(AppA::new(ASYNC_WORKERS, config.x_work, config.y_work, call, true));
    let app_a_server = app_a.clone().serve().await?;
    let app_a_addr = app_a_server.addr();
    let weir_a = match variant {
        Variant::NoWeirAtA => None,
        v => {
            let egress = v.egress().then_some(a_egress);
            let mut yaml = weir_a_yaml(app_a_addr, egress, v != Variant::PerRouteOff);
            if v == Variant::LimitOff {
                yaml = yaml.replacen("inbound:\n", "inbound:\n  adaptive_inflight: false\n", 1);
            }
            Some(start_weir_logged(weir_bin, &yaml).await?)
        }
    };
    let target = weir_a.as_ref().map_or(app_a_addr, |(w, _)| w.listeners.inbound);
    let poller = weir_a
        .as_ref()
        .map(|(w, _)| StatusPoller::start(w.listeners.admin, Duration::from_millis(100)));

    let spec = |path: &str, api: &str, phases: Vec<Phase>, seed: u64| {
        let mut spec = LoadSpec::new(target, phases);
        spec.classes = ["critical", "normal", "background"]
            .into_iter()
            .zip(config.mix)
            .enumerate()
            .map(|(b, (name, share))| ClassSpec {
                name: format!("{api} {name}"),
                business: b as u8,
                weight: share,
            })
            .collect();
        spec.path = path.into();
        spec.warmup = config.warmup;
        spec.seed = seed;
        spec
    };
    let x_spec = spec(
        "/x",
        "X",
        vec![Phase { rate_per_sec: config.x_rate(), duration: config.run }],
        config.seed,
    );
    let y_spec = spec("/y", "Y", config.y_phases(), config.seed.wrapping_add(1));
    let started_wall = SystemTime::now();
    let started = Instant::now();
    let x_run = load::LoadRun::start(x_spec)?;
    let y_run = load::LoadRun::start(y_spec)?;
    let series = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sampler = {
        let (app, sink) = (app_a.clone(), series.clone());
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(Duration::from_millis(100));
            loop {
                ticks.tick().await;
                let sample = (started.elapsed().as_secs_f64(), app.busy(), app.calling());
                sink.lock().unwrap_or_else(|e| e.into_inner()).push(sample);
            }
        })
    };
    let reports = (x_run.finish().await, y_run.finish().await);
    sampler.abort();
    let (x_report, y_report) = (reports.0?, reports.1?);
    let a_app_series = std::mem::take(&mut *series.lock().unwrap_or_else(|e| e.into_inner()));
    let a_limit = poller.and_then(|p| LimitStats::from_samples(&p.stop()));
    let log = weir_a.as_ref().map(|(w, _)| w.stderr()).unwrap_or_default();
    if let (Some(dir), Some(_)) = (&config.keep_logs, &weir_a) {
        let name = format!(
            "async-middle-hop-{}-r{round}.log",
            serde_json::to_value(variant)?.as_str().unwrap_or("variant")
        );
        std::fs::write(dir.join(name), &log)?;
    }
    let a_ceiling = log_series(&log, started_wall, "worker bound", "ceiling=");
    let a_limit_changes = log_series(&log, started_wall, " from=", " to=");
    drop(weir_a);
    drop(weir_b);
    drop(app_a_server);

    let max_inflight = 256;
    let a_ceiling_min = a_ceiling.iter().map(|&(_, c)| c).min();
    let a_bound_secs = bound_secs(&a_ceiling, max_inflight, config.run.as_secs_f64());
    let a_app_peak = a_app_series.iter().map(|s| s.1).max().unwrap_or(0);
    Ok(VariantResult {
        variant,
        label: variant.label().into(),
        round,
        x: api_stats(&x_report, config, false),
        y: api_stats(&y_report, config, true),
        a_limit,
        a_ceiling,
        a_limit_changes,
        a_ceiling_min,
        a_bound_secs,
        a_app_series,
        a_app_peak,
    })
}

/// Counts of the counted part; latency quantiles from its events (Y: also within bursts).
fn api_stats(report: &LoadReport, config: &AsyncMiddleHopConfig, y: bool) -> ApiStats {
    let sum = |f: fn(&load::ClassReport) -> u64| report.classes.iter().map(f).sum::<u64>();
    let warmup = config.warmup.as_secs_f64();
    let mut ok: Vec<f64> = Vec::new();
    let mut burst: Vec<f64> = Vec::new();
    for e in report.events.iter().filter(|e| e.at_secs >= warmup && e.ending == Ending::Ok) {
        ok.push(e.latency_ms);
        if y && config.in_burst(e.at_secs) {
            burst.push(e.latency_ms);
        }
    }
    ok.sort_by(f64::total_cmp);
    burst.sort_by(f64::total_cmp);
    let q = |v: &[f64], q: f64| {
        if v.is_empty() {
            0.0
        } else {
            v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1]
        }
    };
    ApiStats {
        sent: report.sent(),
        ok: report.ok(),
        refused: report.refused(),
        timed_out: sum(|c| c.timed_out),
        errors: sum(|c| c.errors),
        throughput_rps: report.goodput(),
        p50_ms: q(&ok, 0.5),
        p99_ms: q(&ok, 0.99),
        burst_p99_ms: q(&burst, 0.99),
        burst_max_ms: burst.last().copied().unwrap_or(0.0),
    }
}

/// `(seconds since `start`, value)` of each line of weir's text log that contains `marker`,
/// the value the number after `field` (`2026-12-02T07:12:13.123456Z DEBUG weir::limit:
/// worker bound ceiling=22 ...`).
pub fn log_series(log: &str, start: SystemTime, marker: &str, field: &str) -> Vec<(f64, u64)> {
    let start_of_day = start.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() % 86_400.0);
    log.lines()
        .filter(|l| l.contains(marker))
        .filter_map(|line| {
            let stamp = line.split_whitespace().next()?;
            let clock = stamp.split('T').nth(1)?.trim_end_matches('Z');
            let mut parts = clock.split(':');
            let (h, m, s): (f64, f64, f64) = (
                parts.next()?.parse().ok()?,
                parts.next()?.parse().ok()?,
                parts.next()?.parse().ok()?,
            );
            let mut at = h * 3600.0 + m * 60.0 + s - start_of_day;
            if at < -43_200.0 {
                at += 86_400.0;
            }
            let value = line.split(field).nth(1)?.split_whitespace().next()?.parse().ok()?;
            Some(((at * 1000.0).round() / 1000.0, value))
        })
        .collect()
}

/// Seconds of `[0, end]` with the ceiling below `max_inflight`.
fn bound_secs(series: &[(f64, u64)], max_inflight: u64, end: f64) -> f64 {
    let mut total = 0.0;
    for (i, &(at, ceiling)) in series.iter().enumerate() {
        let until = series.get(i + 1).map_or(end, |n| n.0).min(end);
        if ceiling < max_inflight && until > at.max(0.0) {
            total += until - at.max(0.0);
        }
    }
    total
}

// === report ===

pub fn markdown(r: &AsyncMiddleHopResult) -> String {
    let c = &r.config;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "#### Async middle hop, egress role on, sparing engaged\n\n\
         App A async (a task per request, nothing held while it waits). API X: {} ms at A, then a call to B \
         through A's egress; B {}x{} ms ({:.0} rps), X at {:.0} rps ({}x B). API Y: {} ms at A alone, {:.0} rps \
         calm, then from {} s bursts of {:.0} rps for {} ms every {} ms ({:.0} then {:.0} at once at A). \
         {} s runs, the first {} s not counted. Y is judged against no weir at A: 0 refusals, throughput \
         >= 0.98x, p99 <= max(reference + 5 ms, 1.1x).\n",
        c.x_work.as_secs_f64() * 1e3,
        c.b_workers,
        c.b_service.as_secs_f64() * 1e3,
        c.b_capacity(),
        c.x_rate(),
        c.x_multiple_of_b,
        c.y_work.as_secs_f64() * 1e3,
        c.y_calm_rps,
        c.calm.as_secs_f64(),
        c.y_burst_rps,
        c.burst_on.as_millis(),
        (c.burst_on + c.burst_off).as_millis(),
        c.y_calm_rps * c.y_work.as_secs_f64(),
        c.y_burst_rps * c.y_work.as_secs_f64(),
        c.run.as_secs_f64(),
        c.warmup.as_secs_f64(),
    );
    let _ = writeln!(
        s,
        "| variant | round | Y ok rps (refused / timed out / failed) | Y p50 / p99 ms | Y in bursts p99 / max ms | \
         X ok rps (refused) | A's limit (status) min/med/max, lowest logged | A's ceiling min (s below 256) | A's queue max | app A peak at once |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for v in &r.variants {
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} ({} / {} / {}) | {:.1} / {:.1} | {:.1} / {:.1} | {:.1} ({}) | {} | {} | {} | {} |",
            v.label,
            v.round,
            v.y.throughput_rps,
            v.y.refused,
            v.y.timed_out,
            v.y.errors,
            v.y.p50_ms,
            v.y.p99_ms,
            v.y.burst_p99_ms,
            v.y.burst_max_ms,
            v.x.throughput_rps,
            v.x.refused,
            v.a_limit.as_ref().map_or("-".into(), |l| format!(
                "{}/{}/{}, {}",
                l.min,
                l.median,
                l.max,
                v.a_limit_changes.iter().map(|c| c.1).min().map_or("-".into(), |m| m.to_string())
            )),
            v.a_ceiling_min.map_or("-".into(), |m| format!("{m} ({:.1} s)", v.a_bound_secs)),
            v.a_limit.as_ref().map_or("-".into(), |l| l.max_queue_depth.to_string()),
            v.a_app_peak,
        );
    }
    s.push('\n');
    for (variant, y) in &r.verdicts {
        let _ = writeln!(
            s,
            "- {}: Y refused {}, timed out or failed {:+} vs reference, throughput {:.3}x, p99 {:.1} ms vs bound {:.1} \
             (reference {:.1}): {}",
            variant.label(),
            y.refused,
            y.timed_out_or_failed_over_reference,
            y.throughput_ratio,
            y.p99_ms,
            y.p99_bound_ms,
            y.reference_p99_ms,
            if y.pass { "met" } else { "**missed**" },
        );
    }
    s
}
