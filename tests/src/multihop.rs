//! The multi-hop benchmark (issue 19; BENCHMARKS.md, "Multi-hop"): DAGOR across a call
//! graph of real `weir` processes on 127.0.0.1.
//!
//! ```text
//! clients --> E (entry) --> A (costly: W workers, each request holds one for its own work
//!                              |        and for every call it makes)
//!                              +-- API X: calls B k times in sequence (DAGOR's M^k); B is
//!                              |          the bottleneck; every call must succeed
//!                              +-- API Y: calls C once; C is healthy
//! ```
//!
//! Contenders ([`Topology`]): nothing in front of the apps; weir's inbound role at every
//! hop; weir's inbound role plus the egress role at E and A (one-hop propagation, what
//! weir ships); the per-route multi-hop level (a hook: skipped with a clear line until weir
//! has it); HAProxy at every hop. Suites ([`Suite`]): steady open-loop loads at multiples of
//! the bottleneck, M^k for k = 1..3, a 0.5x -> 3x -> 0.5x step, and clients that retry
//! refusals.
//!
//! **The ideal** ([`ideal`]): X at B's capacity over k (no more than offered) plus all of Y
//! (no more than C's capacity), bounded by A's workers — each X holds one of A's workers
//! for A's work plus k of B's service times, each Y for A's work plus C's service time; if
//! A's workers cannot hold both, the API that holds a worker for less is served first (the
//! most requests per worker-second). X's classes are served in priority order, so the
//! ideal success of each class follows.
//!
//! Counts come from the clients (every request, where its last refusal was made), from
//! the apps (worker-seconds, wasted worker-seconds, what each call became), from each
//! sidecar's `/metrics` every 100 ms (refusals per place, levels, cached levels), and from
//! the capacity backends.

use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

pub mod app;
pub mod client;
pub mod graph;
mod report;
pub mod sampler;

pub use client::RetryPolicy;
pub use graph::{Apps, MultihopHook, Topology};
pub use report::{markdown, write_plots};

use client::{ClientRun, ClientSpec, Stretch, CLASSES};
use graph::Graph;
use sampler::{Sample, Sampler, Targets};
use weir_workload::analysis;

/// Which runs to make.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Suite {
    /// Constant loads at `multiples` of the bottleneck, k = `k`.
    Steady,
    /// X success against f_sat/f for every k in `mk`, at `mk_multiple`.
    Mk,
    /// 0.5x -> 3x -> 0.5x of the bottleneck (X; Y constant).
    Step,
    /// Clients retry refusals up to `retry.max_retries` times, at `retry_multiple`.
    Retry,
}

#[derive(Clone, Debug, Serialize)]
pub struct MultihopConfig {
    pub suites: Vec<Suite>,
    pub contenders: Vec<Topology>,
    pub apps: Apps,
    /// Calls A makes to B per X request (steady, step and retry suites).
    pub k: usize,
    /// Y's offered load, requests per second (constant in every run).
    pub y_rps: f64,
    /// Steady loads: X's calls at B as multiples of B's capacity.
    pub multiples: Vec<f64>,
    pub mk: Vec<usize>,
    pub mk_multiple: f64,
    pub step: Vec<f64>,
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub step_phase: Duration,
    pub retry_multiple: f64,
    pub retry: RetryPolicy,
    /// Before each steady, M^k and retry run's load: this long at 0.5x of the bottleneck
    /// (not counted), so the sidecars have seen ordinary traffic before the overload, as
    /// in production. Zero: the overload meets sidecars that have seen nothing.
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub lead_in: Duration,
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub run: Duration,
    /// The part of each steady run not counted (levels settling), after the lead-in.
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub warmup: Duration,
    /// critical / normal / background shares, both APIs.
    pub mix: [f64; 3],
    pub users: u32,
    /// Each attempt's budget.
    #[serde(serialize_with = "crate::report::ser_millis")]
    pub budget: Duration,
    pub seed: u64,
    #[serde(skip)]
    pub weir_bin: PathBuf,
    /// The per-route contender's configuration, once weir has the feature.
    #[serde(skip)]
    pub multihop: Option<MultihopHook>,
}

/// What the ideal serves, requests per second.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Ideal {
    pub x_rps: f64,
    pub y_rps: f64,
}

impl Ideal {
    pub fn total(&self) -> f64 {
        self.x_rps + self.y_rps
    }
}

/// The ideal goodput for X and Y offered at these rates (see the module docs).
pub fn ideal(apps: &Apps, k: usize, x_offered: f64, y_offered: f64) -> Ideal {
    let x_max = x_offered.min(apps.b.nominal_capacity() / k.max(1) as f64);
    let y_max = y_offered.min(apps.c.nominal_capacity());
    let hold_x = (apps.a_work + apps.b.service_time * k as u32).as_secs_f64();
    let hold_y = (apps.a_work + apps.c.service_time).as_secs_f64();
    let workers = apps.a_workers as f64;
    // Fill the API that holds a worker for less first: the most requests per worker-second.
    let fill = |first_max: f64, first_hold: f64, second_max: f64, second_hold: f64| {
        let first = first_max.min(workers / first_hold.max(1e-9));
        let left = (workers - first * first_hold).max(0.0);
        (first, second_max.min(left / second_hold.max(1e-9)))
    };
    if hold_x <= hold_y {
        let (x, y) = fill(x_max, hold_x, y_max, hold_y);
        Ideal { x_rps: x, y_rps: y }
    } else {
        let (y, x) = fill(y_max, hold_y, x_max, hold_x);
        Ideal { x_rps: x, y_rps: y }
    }
}

/// Each class's ideal success when `served` of `offered` requests per second can be served
/// and classes are served in priority order (critical first).
pub fn class_ideal(served: f64, offered: f64, mix: [f64; 3]) -> [f64; 3] {
    let total: f64 = mix.iter().sum::<f64>().max(1e-9);
    let mut left = served;
    mix.map(|share| {
        let demand = offered * share / total;
        let got = left.min(demand).max(0.0);
        left -= got;
        if demand > 0.0 {
            got / demand
        } else {
            1.0
        }
    })
}

/// One class of one API over the counted span.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ClassTally {
    pub name: String,
    pub sent: u64,
    pub ok: u64,
    pub success: f64,
    pub ideal_success: f64,
    /// This class's failed requests by where their last attempt failed (JSON only: which
    /// hop a top-class failure came from).
    pub places: BTreeMap<String, u64>,
}

/// One API over the counted span.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ApiReport {
    pub sent: u64,
    pub ok: u64,
    pub refused: u64,
    pub timed_out: u64,
    pub errors: u64,
    pub offered_rps: f64,
    pub goodput_rps: f64,
    pub ideal_rps: f64,
    pub success: f64,
    pub classes: Vec<ClassTally>,
    pub ok_p50_ms: Option<f64>,
    pub ok_p99_ms: Option<f64>,
    /// Requests that failed, by where their last attempt failed (`e-door`, `a-egress-b`,
    /// `b-door`, `timeout`...).
    pub places: BTreeMap<String, u64>,
}

impl ApiReport {
    /// Share of this API's refusals made at the entry: E's door or E's egress.
    pub fn refused_at_entry(&self) -> Option<f64> {
        let refusals = || self.places.iter().filter(|(p, _)| is_refusal(p));
        let refused: u64 = refusals().map(|(_, n)| n).sum();
        let at_entry: u64 = refusals().filter(|(p, _)| p.starts_with("e-")).map(|(_, n)| n).sum();
        (refused > 0).then(|| at_entry as f64 / refused as f64)
    }
}

/// Places that are refusals (a door or an egress), not timeouts or errors.
pub fn is_refusal(place: &str) -> bool {
    place.contains("-door") || place.contains("-egress-")
}

/// Refusals per place from the sidecars' own counters over the counted span (weir
/// topologies only).
#[derive(Clone, Debug, Default, Serialize)]
pub struct SidecarPlaces {
    pub e_door: f64,
    pub e_egress: f64,
    pub a_door: f64,
    pub a_egress: f64,
    pub b_door: f64,
    pub c_door: f64,
    /// What reached B's and C's sidecars (admitted + refused).
    pub b_received: f64,
    pub c_received: f64,
}

impl SidecarPlaces {
    pub fn b_refused_share(&self) -> f64 {
        self.b_door / self.b_received.max(1.0)
    }
}

/// Work over the counted span, worker-seconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Work {
    /// A's workers, per API: all, and spent on requests that failed or came too late.
    pub a_busy: [f64; 2],
    pub a_wasted: [f64; 2],
    pub c_busy: f64,
    /// C's work on Y requests whose client had given up by the time it finished.
    pub c_wasted: f64,
    pub b_busy: f64,
    pub b_wasted: f64,
    /// B's calls that succeeded inside X requests that failed anyway (a later call failed,
    /// or the answer came after the client's deadline).
    pub b_calls_wasted: u64,
    pub b_completed: u64,
    /// Most requests inside app B at once (waiting for a worker or served): far above its
    /// workers, the queue sat in the app, where a proxy in front cannot see it.
    pub b_peak_inside: u64,
}

impl Work {
    /// Upstream work wasted: A's and C's worker-seconds on requests that failed later, as
    /// a share of all their worker-seconds.
    pub fn upstream_wasted_share(&self) -> f64 {
        let busy = self.a_busy.iter().sum::<f64>() + self.c_busy;
        let wasted = self.a_wasted.iter().sum::<f64>() + self.c_wasted;
        wasted / busy.max(1e-9)
    }

    pub fn a_wasted_share(&self) -> f64 {
        self.a_wasted.iter().sum::<f64>() / self.a_busy.iter().sum::<f64>().max(1e-9)
    }
}

/// One sidecar over the counted span, from its `/metrics`: medians of its in-flight limit
/// and of what was at its app, the longest queue seen in weir, and the lowest level.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HopSummary {
    pub inflight_limit: Option<f64>,
    pub inflight: Option<f64>,
    pub queue_max: Option<f64>,
    pub level_min: Option<f64>,
}

/// Attempts and what reached the bottleneck, over the counted span.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Attempts {
    pub requests: u64,
    pub x_requests: u64,
    pub attempts: u64,
    /// A's calls to B that crossed the network (all but A's egress refusals).
    pub b_reached: u64,
    /// `b_reached` over the calls the X requests needed (`x_requests * k`).
    pub b_per_needed_call: f64,
}

/// When the levels moved in a step run (seconds).
#[derive(Clone, Debug, Default, Serialize)]
pub struct LevelTiming {
    /// From the step up until B's level first refuses a class in use.
    pub b_cut_after_step: Option<f64>,
    /// From B's cut until A's egress caches a cut level for B / E's egress a cut level for A
    /// (negative: the cache cut first, from its own hop's overload).
    pub a_sees_cut: Option<f64>,
    pub e_sees_cut: Option<f64>,
    /// From the step down until B's level admits every class again and stays so.
    pub b_open_after_drop: Option<f64>,
    /// From B's re-opening until A's / E's cached level re-opens (or expires) and stays so.
    pub a_sees_open: Option<f64>,
    pub e_sees_open: Option<f64>,
    /// X's route level as A advertises it to E: min(A's own level, A's cached level of B),
    /// the transition E's cache must follow whichever of A and B cuts (behind callers that
    /// refuse for it B itself may never cut). From the step up until it first refuses a
    /// class in use; from its cut until E's cached level of A first does.
    pub route_cut_after_step: Option<f64>,
    pub e_sees_route_cut: Option<f64>,
    /// From the step down until X's route level admits every class again and stays so;
    /// from then until E's cache does.
    pub route_open_after_drop: Option<f64>,
    pub e_sees_route_open: Option<f64>,
    /// Every cut of X's route level from the step up until 1 s after the drop: how long
    /// until E's cached level of A was at or under it (cuts superseded by a re-opening
    /// before E saw them are not counted), in seconds.
    pub e_follows_route_cuts: Vec<f64>,
    /// Of the high phase's samples, the share in which E's cache of A admitted more than
    /// X's route level at A (what A then refuses, or queues, that E would have refused).
    pub e_looser_share: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct StepReport {
    pub step_at: f64,
    pub drop_at: f64,
    pub end: f64,
    /// From the step up until every 500 ms window serves >= 90% of the high phase's ideal.
    pub settle_secs: Option<f64>,
    /// From the step down until every API and class keeps >= 99% success.
    pub recovery_secs: Option<f64>,
    pub high_ideal: Ideal,
    pub high_goodput_ratio: f64,
    pub high_x_top_success: f64,
    pub high_y_success: f64,
    /// Of the high phase's refusals and timeouts, the share that were timeouts.
    pub high_timeout_share: Option<f64>,
    pub levels: LevelTiming,
}

/// One contender under one load.
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    pub suite: Suite,
    pub contender: String,
    pub topology: Topology,
    pub k: usize,
    /// X's calls at B as a multiple of B's capacity (the high phase's, for a step).
    pub multiple: f64,
    pub retries: bool,
    pub ideal: Ideal,
    pub goodput_rps: f64,
    pub goodput_ratio: f64,
    pub x: ApiReport,
    pub y: ApiReport,
    /// f_sat / f: X's ideal success.
    pub x_success_target: f64,
    pub sidecars: Option<SidecarPlaces>,
    /// Per weir hop (`e`, `a`, `b`, `c`).
    pub hops: BTreeMap<String, HopSummary>,
    pub work: Work,
    pub attempts: Attempts,
    pub step: Option<StepReport>,
    /// The authority each hop is called by (what the egress caches are keyed by).
    pub authorities: BTreeMap<String, String>,
    /// Every 100 ms (kept for step runs; steady runs keep none, to keep the JSON small).
    pub samples: Vec<Sample>,
}

#[derive(Clone, Debug, Serialize)]
pub struct MultihopResult {
    pub config: MultihopConfig,
    pub runs: Vec<RunResult>,
    pub skipped: Vec<String>,
}

/// The line a run without the multi-hop hook prints for that contender.
pub const MULTIHOP_NOT_BUILT: &str = "multihop: not built yet: weir has no per-route level \
     (issue 19); once it does, pass --multihop-overlay FILE (YAML merged over each sidecar's \
     one-hop-egress config: keys all, e, a, b, c) and, if it lives in another build, \
     --multihop-weir-bin BIN";

/// One run's recipe.
#[derive(Clone, Debug)]
struct Scenario {
    suite: Suite,
    k: usize,
    multiple: f64,
    stretches: Vec<Stretch>,
    warmup: Duration,
    retry: Option<RetryPolicy>,
}

impl MultihopConfig {
    fn x_rps(&self, multiple: f64, k: usize) -> f64 {
        self.apps.b.nominal_capacity() * multiple / k.max(1) as f64
    }

    fn steady(&self, suite: Suite, multiple: f64, k: usize) -> Scenario {
        let lead_in =
            Stretch { x_rps: self.x_rps(0.5, k), y_rps: self.y_rps, duration: self.lead_in };
        let load =
            Stretch { x_rps: self.x_rps(multiple, k), y_rps: self.y_rps, duration: self.run };
        Scenario {
            suite,
            k,
            multiple,
            stretches: [lead_in, load].into_iter().filter(|s| !s.duration.is_zero()).collect(),
            warmup: self.lead_in + self.warmup,
            retry: None,
        }
    }

    fn scenarios(&self) -> Vec<Scenario> {
        let mut out = Vec::new();
        let runs = |s: Suite| self.suites.contains(&s);
        if runs(Suite::Steady) {
            out.extend(self.multiples.iter().map(|&m| self.steady(Suite::Steady, m, self.k)));
        }
        if runs(Suite::Mk) {
            // The steady suite's run at the same multiple already covers k = `k`.
            let covered = runs(Suite::Steady)
                && self.multiples.iter().any(|m| (m - self.mk_multiple).abs() < 1e-9);
            for &k in &self.mk {
                if !(covered && k == self.k) {
                    out.push(self.steady(Suite::Mk, self.mk_multiple, k));
                }
            }
        }
        if runs(Suite::Step) {
            let high = self.step.iter().copied().fold(0.0, f64::max);
            out.push(Scenario {
                suite: Suite::Step,
                k: self.k,
                multiple: high,
                stretches: self
                    .step
                    .iter()
                    .map(|&m| Stretch {
                        x_rps: self.x_rps(m, self.k),
                        y_rps: self.y_rps,
                        duration: self.step_phase,
                    })
                    .collect(),
                warmup: Duration::ZERO,
                retry: None,
            });
        }
        if runs(Suite::Retry) {
            let mut s = self.steady(Suite::Retry, self.retry_multiple, self.k);
            s.retry = Some(self.retry);
            out.push(s);
        }
        out
    }
}

/// Runs every scenario through every contender (contenders side by side for each load, so
/// a busier stretch of the shared machine hits them alike); `progress` gets a line per run.
pub async fn run(
    config: MultihopConfig,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<MultihopResult> {
    let mut result =
        MultihopResult { config: config.clone(), runs: Vec::new(), skipped: Vec::new() };
    let mut contenders = config.contenders.clone();
    if config.multihop.is_none() && contenders.contains(&Topology::Multihop) {
        contenders.retain(|t| *t != Topology::Multihop);
        progress(MULTIHOP_NOT_BUILT);
        result.skipped.push(MULTIHOP_NOT_BUILT.to_string());
    }
    let a = &config.apps;
    progress(&format!(
        "apps: E {} workers; A {} workers x {:.0} ms + its calls; B {} x {:.0} ms = {:.0} rps (bottleneck); C {} x {:.0} ms = {:.0} rps; Y {:.0} rps",
        a.e_workers,
        a.a_workers,
        a.a_work.as_secs_f64() * 1e3,
        a.b.workers,
        a.b.service_time.as_secs_f64() * 1e3,
        a.b.nominal_capacity(),
        a.c.workers,
        a.c.service_time.as_secs_f64() * 1e3,
        a.c.nominal_capacity(),
        config.y_rps,
    ));
    for scenario in config.scenarios() {
        for &topology in &contenders {
            match run_one(&config, topology, &scenario).await {
                Ok(r) => {
                    progress(&report::progress_line(&r));
                    result.runs.push(r);
                }
                Err(e) => {
                    let line = format!(
                        "{} {:?} {:.1}x k={}: failed: {e:#}",
                        topology.label(),
                        scenario.suite,
                        scenario.multiple,
                        scenario.k
                    );
                    progress(&line);
                    result.skipped.push(line);
                }
            }
        }
    }
    Ok(result)
}

async fn run_one(
    config: &MultihopConfig,
    topology: Topology,
    scenario: &Scenario,
) -> anyhow::Result<RunResult> {
    let start = || {
        Graph::start(topology, &config.apps, scenario.k, &config.weir_bin, config.multihop.as_ref())
    };
    // Ports are picked free, then bound by child processes: one retry covers the rare
    // port another process took in between.
    let graph = match start().await {
        Ok(graph) => graph,
        Err(_) => start().await?,
    };
    let spec = ClientSpec {
        target: graph.entry,
        stretches: scenario.stretches.clone(),
        mix: config.mix,
        users: config.users,
        budget: config.budget,
        warmup: scenario.warmup,
        seed: config.seed,
        retry: scenario.retry,
    };
    graph.b.reset();
    graph.c.reset();
    let sampler = Sampler::start(Targets {
        admins: graph.admins.clone(),
        app_e: graph.app_e.clone(),
        app_a: graph.app_a.clone(),
        b: graph.b.clone(),
        c: graph.c.clone(),
    });
    let clients = client::run(spec).await;
    // One last sample after every request has ended.
    tokio::time::sleep(sampler::SAMPLE_EVERY * 2).await;
    let samples = sampler.stop();
    let authorities = graph.authorities.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    drop(graph);
    let clients = clients?;
    Ok(analyse(config, topology, scenario, &clients, samples, authorities))
}

/// The first sample at or after `from` and the last one.
fn span(samples: &[Sample], from: f64) -> (Sample, Sample) {
    let first = samples.iter().find(|s| s.at_secs >= from).or(samples.first());
    (first.cloned().unwrap_or_default(), samples.last().cloned().unwrap_or_default())
}

fn analyse(
    config: &MultihopConfig,
    topology: Topology,
    scenario: &Scenario,
    clients: &ClientRun,
    samples: Vec<Sample>,
    authorities: BTreeMap<String, String>,
) -> RunResult {
    let warm = scenario.warmup.as_secs_f64();
    let secs = clients.counted_secs();
    let offered =
        |api: usize| clients.counted().filter(|r| r.api as usize == api).count() as f64 / secs;
    let (x_offered, y_offered) = (offered(0), offered(1));
    // The ideal of the load as scheduled (steady: one stretch; a step: over the whole run).
    let ideal_of = |s: &[Stretch]| {
        let total: f64 = s.iter().map(|s| s.duration.as_secs_f64()).sum::<f64>().max(1e-9);
        let (mut x, mut y) = (0.0, 0.0);
        for st in s {
            let i = ideal(&config.apps, scenario.k, st.x_rps, st.y_rps);
            let w = st.duration.as_secs_f64() / total;
            x += i.x_rps * w;
            y += i.y_rps * w;
        }
        Ideal { x_rps: x, y_rps: y }
    };
    // A steady run: the ideal of what was actually offered in the counted span (Poisson
    // counts drift from the rate a little); a step: of the schedule.
    let ideal = if scenario.suite != Suite::Step {
        ideal(&config.apps, scenario.k, x_offered, y_offered)
    } else {
        ideal_of(&scenario.stretches)
    };
    let x = api_report(clients, 0, secs, ideal.x_rps, x_offered, config.mix);
    let y = api_report(clients, 1, secs, ideal.y_rps, y_offered, config.mix);
    let goodput = x.goodput_rps + y.goodput_rps;

    let (first, last) = span(&samples, warm);
    let hop_delta = |name: &str, f: fn(&sampler::HopMetrics) -> f64| {
        let (a, b) = (first.hop(name), last.hop(name));
        b.map_or(0.0, f) - a.map_or(0.0, f)
    };
    let sidecars = (!last.hops.is_empty()).then(|| SidecarPlaces {
        e_door: hop_delta("e", |h| h.inbound_shed()),
        e_egress: hop_delta("e", |h| h.egress_shed()),
        a_door: hop_delta("a", |h| h.inbound_shed()),
        a_egress: hop_delta("a", |h| h.egress_shed()),
        b_door: hop_delta("b", |h| h.inbound_shed()),
        c_door: hop_delta("c", |h| h.inbound_shed()),
        b_received: hop_delta("b", |h| h.inbound_received()),
        c_received: hop_delta("c", |h| h.inbound_received()),
    });
    let hops = last
        .hops
        .keys()
        .map(|name| {
            let counted = samples.iter().filter(|s| s.at_secs >= warm);
            let values = |f: fn(&sampler::HopMetrics) -> Option<f64>| -> Vec<f64> {
                counted.clone().filter_map(|s| s.hop(name).and_then(f)).collect()
            };
            let max = |v: Vec<f64>| v.into_iter().reduce(f64::max);
            let summary = HopSummary {
                inflight_limit: analysis::quantile(&mut values(|h| h.inflight_limit), 0.5),
                inflight: analysis::quantile(&mut values(|h| h.inflight), 0.5),
                queue_max: max(values(|h| h.queue_depth)),
                level_min: values(|h| h.level).into_iter().reduce(f64::min),
            };
            (name.clone(), summary)
        })
        .collect();
    let app_a = last.app_a.minus(&first.app_a);
    let work = Work {
        a_busy: app_a.busy_secs,
        a_wasted: app_a.wasted_secs,
        c_busy: last.c.busy_seconds - first.c.busy_seconds,
        c_wasted: last.c.wasted_busy_seconds - first.c.wasted_busy_seconds,
        b_busy: last.b.busy_seconds - first.b.busy_seconds,
        b_wasted: last.b.wasted_busy_seconds - first.b.wasted_busy_seconds,
        b_calls_wasted: app_a.wasted_calls[0],
        b_completed: last.b.completed.saturating_sub(first.b.completed),
        b_peak_inside: last.b.peak_outstanding,
    };
    let x_requests = x.sent;
    let b_reached = app_a.call("b").reached();
    let attempts = Attempts {
        requests: x.sent + y.sent,
        x_requests,
        attempts: clients.attempts,
        b_reached,
        b_per_needed_call: b_reached as f64 / (x_requests * scenario.k as u64).max(1) as f64,
    };
    let step = (scenario.suite == Suite::Step)
        .then(|| step_report(config, scenario, clients, &samples, &authorities));
    RunResult {
        suite: scenario.suite,
        contender: topology.label().to_string(),
        topology,
        k: scenario.k,
        multiple: scenario.multiple,
        retries: scenario.retry.is_some(),
        ideal,
        goodput_rps: goodput,
        goodput_ratio: goodput / ideal.total().max(1e-9),
        x_success_target: if x_offered > 0.0 { (ideal.x_rps / x_offered).min(1.0) } else { 1.0 },
        x,
        y,
        sidecars,
        hops,
        work,
        attempts,
        step,
        authorities,
        samples: if scenario.suite == Suite::Step || keep_samples() { samples } else { Vec::new() },
    }
}

/// `MULTIHOP_KEEP_SAMPLES=1`: every run keeps its 100 ms samples in the JSON (per-second
/// traces of each hop's limit, queue, level and cached levels, for diagnosis).
fn keep_samples() -> bool {
    std::env::var_os("MULTIHOP_KEEP_SAMPLES").is_some_and(|v| v != "0")
}

fn api_report(
    clients: &ClientRun,
    api: usize,
    secs: f64,
    ideal_rps: f64,
    offered_rps: f64,
    mix: [f64; 3],
) -> ApiReport {
    use crate::load::Ending;
    let mut r = ApiReport { offered_rps, ideal_rps, ..ApiReport::default() };
    let ideal_classes = class_ideal(ideal_rps, offered_rps, mix);
    let mut classes: Vec<ClassTally> = CLASSES
        .iter()
        .zip(ideal_classes)
        .map(|(name, ideal)| ClassTally {
            name: name.to_string(),
            ideal_success: ideal,
            ..ClassTally::default()
        })
        .collect();
    let mut ok_latency = Vec::new();
    for q in clients.counted().filter(|q| q.api as usize == api) {
        r.sent += 1;
        let class = &mut classes[q.class as usize];
        class.sent += 1;
        match q.ending {
            Ending::Ok => {
                r.ok += 1;
                class.ok += 1;
                ok_latency.push(q.latency_ms);
            }
            Ending::Refused => r.refused += 1,
            Ending::TimedOut => r.timed_out += 1,
            Ending::Error => r.errors += 1,
        }
        if q.ending != Ending::Ok {
            *r.places.entry(q.place.clone()).or_default() += 1;
            *class.places.entry(q.place.clone()).or_default() += 1;
        }
    }
    for c in &mut classes {
        c.success = if c.sent == 0 { 1.0 } else { c.ok as f64 / c.sent as f64 };
    }
    r.classes = classes;
    r.success = if r.sent == 0 { 1.0 } else { r.ok as f64 / r.sent as f64 };
    // Goodput by completion inside the counted span (success rates stay per request
    // scheduled in it): with retries, a request scheduled in the span may succeed seconds
    // later, and crediting it at its scheduled time counted work done after the load.
    r.goodput_rps = clients.ok_completed(api as u8) as f64 / secs;
    r.ok_p50_ms = analysis::quantile(&mut ok_latency.clone(), 0.5);
    r.ok_p99_ms = analysis::quantile(&mut ok_latency, 0.99);
    r
}

/// The lowest level that admits every class in use: (2, 127), compound 2 * 128 + 127 (the
/// table uses business 0..=2, and a level (B, U) admits (b, u) <= (B, U)).
pub const LEVEL_ALL_OPEN: f64 = 2.0 * 128.0 + 127.0;

/// A hop's own level, or what `hop`'s egress caches for `downstream` (fully open when
/// nothing is cached), clamped at [`LEVEL_ALL_OPEN`].
fn level_series(samples: &[Sample], hop: &str, cached_of: Option<&str>) -> Option<Vec<(f64, f64)>> {
    samples.iter().any(|s| s.hop(hop).is_some()).then(|| {
        samples
            .iter()
            .filter_map(|s| {
                let h = s.hop(hop)?;
                let v = match cached_of {
                    None => h.level?,
                    Some(authority) => h.cached.get(authority).copied().unwrap_or(32767.0),
                };
                Some((s.at_secs, v.min(LEVEL_ALL_OPEN)))
            })
            .collect()
    })
}

/// X's route level at A as A advertises it: min(A's own level, A's cached level of B), at
/// each sample that scraped A, clamped at [`LEVEL_ALL_OPEN`].
fn route_series(samples: &[Sample], b_authority: &str) -> Option<Vec<(f64, f64)>> {
    let own = level_series(samples, "a", None)?;
    let cached = level_series(samples, "a", Some(b_authority))?;
    // Both come from the same scrape of A: the same samples, in order.
    Some(own.iter().zip(&cached).map(|(&(t, o), &(_, c))| (t, o.min(c))).collect())
}

/// Each cut of `source` (a sample lower than the one before it) in `[from, to)`: how long
/// until `view` was at or under the cut level. A cut that `source` re-opened past before
/// `view` got there is left out (superseded), as is one `view` never reached before `to`.
fn follow_cuts(source: &[(f64, f64)], view: &[(f64, f64)], from: f64, to: f64) -> Vec<f64> {
    let mut lags = Vec::new();
    for (i, w) in source.windows(2).enumerate() {
        let ((_, before), (at, level)) = (w[0], w[1]);
        if at < from || at >= to || level >= before {
            continue;
        }
        let reopened = source[i + 1..].iter().find(|&&(_, v)| v > level).map_or(to, |&(t, _)| t);
        if let Some(&(seen, _)) =
            view.iter().find(|&&(t, v)| t >= at && t < to.min(reopened) && v <= level)
        {
            lags.push(seen - at);
        }
    }
    lags
}

/// The share of `source`'s samples in `[from, to)` at which `view` (the sample at or just
/// before it) admitted more.
fn looser_share(source: &[(f64, f64)], view: &[(f64, f64)], from: f64, to: f64) -> Option<f64> {
    let (mut looser, mut n) = (0u32, 0u32);
    for &(t, level) in source.iter().filter(|(t, _)| *t >= from && *t < to) {
        let Some(&(_, seen)) = view.iter().take_while(|(tv, _)| *tv <= t).last() else {
            continue;
        };
        n += 1;
        looser += u32::from(seen > level);
    }
    (n > 0).then(|| f64::from(looser) / f64::from(n))
}

fn first_cut(series: &[(f64, f64)], from: f64, to: f64) -> Option<f64> {
    series.iter().find(|(t, v)| *t >= from && *t < to && *v < LEVEL_ALL_OPEN).map(|(t, _)| *t)
}

fn step_report(
    config: &MultihopConfig,
    scenario: &Scenario,
    clients: &ClientRun,
    samples: &[Sample],
    authorities: &BTreeMap<String, String>,
) -> StepReport {
    let bounds: Vec<f64> = scenario
        .stretches
        .iter()
        .scan(0.0, |t, s| {
            *t += s.duration.as_secs_f64();
            Some(*t)
        })
        .collect();
    // The highest stretch is the step up; the one after it the step down.
    let high = scenario
        .stretches
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.x_rps.total_cmp(&b.1.x_rps))
        .map_or(0, |(i, _)| i);
    let step_at = if high == 0 { 0.0 } else { bounds[high - 1] };
    let drop_at = bounds[high];
    let end = *bounds.last().unwrap_or(&drop_at);
    let st = scenario.stretches[high];
    let high_ideal = ideal(&config.apps, scenario.k, st.x_rps, st.y_rps);
    let events = clients.events();
    let budget_ms = config.budget.as_secs_f64() * 1e3;
    let settle_secs = analysis::settle_secs(
        &events,
        step_at,
        drop_at,
        analysis::SettleRule {
            capacity: high_ideal.total(),
            min_goodput: 0.9,
            max_p90_ms: budget_ms,
            window: 0.5,
        },
    );
    let classes = client::APIS.len() * CLASSES.len();
    let recovery_secs = analysis::recovery_secs(&events, drop_at, end, classes, None, 0.99, 2.0);
    let high_counts = analysis::counts(&events, step_at, drop_at, None);
    let x_top = analysis::counts(&events, step_at, drop_at, Some(client::event_class(0, 0)));
    let y_counts: Vec<_> = (0..3)
        .map(|c| analysis::counts(&events, step_at, drop_at, Some(client::event_class(1, c))))
        .collect();
    let y_ok: u64 = y_counts.iter().map(|c| c.ok).sum();
    let y_sent: u64 = y_counts.iter().map(|c| c.sent).sum();

    let b = level_series(samples, "b", None);
    let a_view = authorities.get("b").and_then(|auth| level_series(samples, "a", Some(auth)));
    let e_view = authorities.get("a").and_then(|auth| level_series(samples, "e", Some(auth)));
    // Re-opening is timed only for a level (or cache) that was cut during the high phase.
    let reopen = |series: &[(f64, f64)]| {
        first_cut(series, step_at, drop_at)?;
        analysis::follow_secs(series, drop_at, end, LEVEL_ALL_OPEN, 0.0).map(|d| drop_at + d)
    };
    let b_cut = b.as_deref().and_then(|s| first_cut(s, step_at, drop_at));
    let b_open = b.as_deref().and_then(reopen);
    let sees_cut = |view: &Option<Vec<(f64, f64)>>| {
        let cut = first_cut(view.as_deref()?, step_at, drop_at)?;
        Some(cut - b_cut?)
    };
    let sees_open = |view: &Option<Vec<(f64, f64)>>| Some(reopen(view.as_deref()?)? - b_open?);
    let route = authorities.get("b").and_then(|auth| route_series(samples, auth));
    let route_cut = route.as_deref().and_then(|s| first_cut(s, step_at, drop_at));
    let route_open = route.as_deref().and_then(reopen);
    let (e_follows_route_cuts, e_looser_share) = match (&route, &e_view) {
        (Some(route), Some(view)) => (
            follow_cuts(route, view, step_at, drop_at + 1.0),
            looser_share(route, view, step_at, drop_at),
        ),
        _ => (Vec::new(), None),
    };
    StepReport {
        step_at,
        drop_at,
        end,
        settle_secs,
        recovery_secs,
        high_ideal,
        high_goodput_ratio: high_counts.ok as f64
            / (drop_at - step_at).max(1e-9)
            / high_ideal.total().max(1e-9),
        high_x_top_success: x_top.success(),
        high_y_success: if y_sent == 0 { 1.0 } else { y_ok as f64 / y_sent as f64 },
        high_timeout_share: high_counts.timeout_share(),
        levels: LevelTiming {
            b_cut_after_step: b_cut.map(|t| t - step_at),
            a_sees_cut: sees_cut(&a_view),
            e_sees_cut: sees_cut(&e_view),
            b_open_after_drop: b_open.map(|t| t - drop_at),
            a_sees_open: sees_open(&a_view),
            e_sees_open: sees_open(&e_view),
            route_cut_after_step: route_cut.map(|t| t - step_at),
            e_sees_route_cut: e_view
                .as_deref()
                .and_then(|v| Some(first_cut(v, step_at, drop_at)? - route_cut?)),
            route_open_after_drop: route_open.map(|t| t - drop_at),
            e_sees_route_open: e_view.as_deref().and_then(|v| Some(reopen(v)? - route_open?)),
            e_follows_route_cuts,
            e_looser_share,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BackendConfig;

    fn apps(a_workers: usize) -> Apps {
        Apps {
            e_workers: 256,
            a_workers,
            a_work: Duration::from_millis(20),
            b: BackendConfig::new(4, Duration::from_millis(40)),
            c: BackendConfig::new(8, Duration::from_millis(10)),
        }
    }

    #[test]
    fn the_ideal_is_b_over_k_plus_y_when_a_has_room() {
        let i = ideal(&apps(16), 1, 300.0, 150.0);
        assert!((i.x_rps - 100.0).abs() < 1e-9 && (i.y_rps - 150.0).abs() < 1e-9, "{i:?}");
        let i = ideal(&apps(16), 3, 100.0, 150.0);
        assert!((i.x_rps - 100.0 / 3.0).abs() < 1e-9, "{i:?}");
        // Below B's capacity: all of X.
        let i = ideal(&apps(16), 1, 50.0, 150.0);
        assert!((i.x_rps - 50.0).abs() < 1e-9);
    }

    #[test]
    fn a_full_middle_hop_serves_the_cheaper_api_first() {
        // 4 workers: Y holds one for 30 ms (133/s max), X for 60 ms.
        let i = ideal(&apps(4), 1, 300.0, 150.0);
        assert!((i.y_rps - 4.0 / 0.03).abs() < 1e-6, "{i:?}");
        assert!(i.x_rps.abs() < 1e-6, "{i:?}");
        let i = ideal(&apps(6), 1, 300.0, 100.0);
        assert!((i.y_rps - 100.0).abs() < 1e-9);
        assert!((i.x_rps - (6.0 - 3.0) / 0.06).abs() < 1e-6, "{i:?}");
    }

    #[test]
    fn classes_fill_in_priority_order() {
        let c = class_ideal(100.0, 300.0, [0.1, 0.3, 0.6]);
        assert_eq!(c[0], 1.0);
        assert!((c[1] - 70.0 / 90.0).abs() < 1e-9);
        assert_eq!(c[2], 0.0);
        assert_eq!(class_ideal(10.0, 5.0, [1.0, 1.0, 1.0]), [1.0, 1.0, 1.0]);
    }

    #[test]
    fn refusal_places_are_told_from_timeouts() {
        assert!(is_refusal("e-door") && is_refusal("a-egress-b") && is_refusal("b-door-deadline"));
        assert!(!is_refusal("timeout") && !is_refusal("b-timeout") && !is_refusal("a-504"));
        let mut r = ApiReport::default();
        r.places.insert("e-door".into(), 3);
        r.places.insert("a-egress-b".into(), 1);
        r.places.insert("timeout".into(), 10);
        r.places.insert("e-504".into(), 10);
        assert_eq!(r.refused_at_entry(), Some(0.75), "timeouts and errors are not refusals");
    }

    /// The whole plumbing without a proxy: clients, both apps, both backends, the sampler
    /// and the analysis. Light load, so every request succeeds and every count adds up.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_direct_graph_serves_both_apis_and_counts_every_call() {
        let mut config = config();
        config.k = 2;
        config.warmup = Duration::ZERO;
        let scenario = Scenario {
            suite: Suite::Steady,
            k: 2,
            multiple: 0.2,
            stretches: vec![Stretch {
                x_rps: 10.0,
                y_rps: 20.0,
                duration: Duration::from_millis(1500),
            }],
            warmup: Duration::ZERO,
            retry: None,
        };
        let r = run_one(&config, Topology::Direct, &scenario).await.unwrap();
        assert!(r.x.sent > 0 && r.y.sent > 0, "{:?} {:?}", r.x, r.y);
        assert_eq!(r.x.ok, r.x.sent, "{:?}", r.x.places);
        assert_eq!(r.y.ok, r.y.sent, "{:?}", r.y.places);
        assert_eq!(r.attempts.b_reached, 2 * r.x.sent, "k calls to B per X request");
        assert_eq!(r.attempts.attempts, r.x.sent + r.y.sent, "no retries without a policy");
        assert!(r.work.a_busy[0] > 0.0 && r.work.a_wasted == [0.0, 0.0], "{:?}", r.work);
        assert!(r.sidecars.is_none() && r.hops.is_empty(), "no weir in the direct graph");
    }

    fn config() -> MultihopConfig {
        MultihopConfig {
            suites: vec![Suite::Steady, Suite::Mk, Suite::Step, Suite::Retry],
            contenders: vec![Topology::Direct],
            apps: apps(16),
            k: 1,
            y_rps: 150.0,
            multiples: vec![1.5, 3.0, 6.0],
            mk: vec![1, 2, 3],
            mk_multiple: 3.0,
            step: vec![0.5, 3.0, 0.5],
            step_phase: Duration::from_secs(10),
            retry_multiple: 3.0,
            retry: RetryPolicy::default(),
            lead_in: Duration::from_secs(3),
            run: Duration::from_secs(20),
            warmup: Duration::from_secs(5),
            mix: [0.1, 0.3, 0.6],
            users: 1000,
            budget: Duration::from_millis(500),
            seed: 7,
            weir_bin: PathBuf::new(),
            multihop: None,
        }
    }

    #[test]
    fn the_mk_suite_reuses_the_steady_run_at_its_multiple() {
        let config = config();
        let s = config.scenarios();
        let mk: Vec<usize> = s.iter().filter(|s| s.suite == Suite::Mk).map(|s| s.k).collect();
        assert_eq!(mk, vec![2, 3]);
        let step = s.iter().find(|s| s.suite == Suite::Step).unwrap();
        assert_eq!(step.stretches.len(), 3);
        assert!((step.stretches[1].x_rps - 300.0).abs() < 1e-9);
        let mk3 = s.iter().find(|s| s.suite == Suite::Mk && s.k == 3).unwrap();
        assert!((mk3.stretches[0].x_rps - 50.0 / 3.0).abs() < 1e-9, "the lead-in: 0.5x");
        assert!((mk3.stretches[1].x_rps - 100.0).abs() < 1e-9, "3x at B over 3 calls each");
        assert_eq!(mk3.warmup, Duration::from_secs(8), "the lead-in is not counted");
        assert!(s.iter().any(|s| s.suite == Suite::Retry && s.retry.is_some()));
    }

    #[test]
    fn e_follows_each_cut_of_the_route_until_it_reopens() {
        let at = |v: &[f64]| v.iter().enumerate().map(|(i, &v)| (i as f64 * 0.1, v)).collect();
        let open = LEVEL_ALL_OPEN;
        // The route cuts at 0.1 s and again at 0.4 s; E sees the first at 0.3 s, the second
        // at 0.5 s; a third cut (0.7 s) re-opens at 0.8 s before E sees it.
        let route: Vec<(f64, f64)> =
            at(&[open, 200.0, 200.0, 200.0, 150.0, 150.0, 150.0, 100.0, open]);
        let e: Vec<(f64, f64)> = at(&[open, open, open, 200.0, 200.0, 150.0, 150.0, 150.0, 150.0]);
        let lags = follow_cuts(&route, &e, 0.0, 1.0);
        assert_eq!(lags.len(), 2, "{lags:?}");
        assert!((lags[0] - 0.2).abs() < 1e-9 && (lags[1] - 0.1).abs() < 1e-9, "{lags:?}");
        // E admitted more than the route at 0.1, 0.2 and 0.4 s and at 0.7 s: 4 of 9.
        let share = looser_share(&route, &e, 0.0, 1.0).unwrap();
        assert!((share - 4.0 / 9.0).abs() < 1e-9, "{share}");
        assert!(looser_share(&route, &e, 5.0, 6.0).is_none());
    }
}
