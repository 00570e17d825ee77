//! The fairness benchmark (BENCHMARKS.md, "Fairness"): the `weir` binary as an entry
//! sidecar stamps one business class and hashes each request's `x-user-id` into a user
//! level that is re-keyed every few seconds; the load is 3x the app's capacity, so about a
//! third of the user levels are admitted at any moment. Over many re-key periods every user
//! should be admitted about as often as every other (issue 11: within 5 percentage points of
//! the class mean), and the set of refused users should change at every re-key.
//!
//! Each schedule (docs/design.md, "Priorities") gets a fresh weir and a fresh app; the
//! measured window is whole periods (for the balanced schedule, whole cycles, aligned to the
//! Unix clock the way the entry counts them), after a lead-in that lets the control loop
//! find its level.

use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::backend::{BackendConfig, BackendSnapshot, CapacityBackend};
use crate::contender::Contender;
use crate::load::{ClassSpec, Ending, LoadRun, LoadSpec, Phase, UserEvent};

/// A request this close to a period boundary may be stamped in the neighbouring period
/// (the entry reads the clock when it receives it); it still counts for its user's ratio,
/// but not for the refused set of either period.
const BOUNDARY_GUARD_US: u64 = 50_000;

/// The re-key schedule under test, as the priority table spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    Balanced,
    Independent,
}

impl Schedule {
    pub fn label(self) -> &'static str {
        match self {
            Schedule::Balanced => "balanced",
            Schedule::Independent => "independent",
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct FairnessConfig {
    #[serde(skip)]
    pub weir_bin: PathBuf,
    pub app: BackendConfig,
    /// Offered load as a multiple of the app's nominal capacity.
    pub load: f64,
    pub users: u32,
    /// Users take turns instead of being drawn at random (see [`LoadSpec::users_round_robin`]).
    pub users_round_robin: bool,
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub rekey_every: Duration,
    /// Periods per balanced cycle.
    pub cycle_periods: u32,
    /// Measured periods per schedule: whole cycles of `cycle_periods`.
    pub cycles: u32,
    /// Load before the measured window, so the control loop has found its level.
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub lead_in: Duration,
    pub schedules: Vec<Schedule>,
    #[serde(serialize_with = "crate::report::ser_millis")]
    pub deadline: Duration,
    pub seed: u64,
}

impl FairnessConfig {
    pub fn periods(&self) -> u32 {
        self.cycle_periods * self.cycles
    }
}

/// Quantiles of the per-user success ratios, in percent.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Spread {
    pub users: usize,
    pub mean_pct: f64,
    pub min_pct: f64,
    pub p5_pct: f64,
    pub median_pct: f64,
    pub p95_pct: f64,
    pub max_pct: f64,
    pub stddev_pp: f64,
    /// The largest distance of one user's ratio from the class mean (the target:
    /// at most 5).
    pub max_abs_dev_pp: f64,
    /// Users further than 5 points from the mean.
    pub users_beyond_5pp: usize,
}

/// One re-key boundary: how much the refused set of the period before it shares with the
/// one after it.
#[derive(Clone, Debug, Serialize)]
pub struct Boundary {
    /// Index of the period after the boundary within the measured window.
    pub period: u32,
    pub refused_before: usize,
    pub refused_after: usize,
    /// |before ∩ after| / |before ∪ after|; 1.0 means the set did not change.
    pub jaccard: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ScheduleResult {
    pub schedule: Schedule,
    /// Unix seconds of the measured window.
    pub window_from_unix: f64,
    pub window_to_unix: f64,
    pub periods: u32,
    pub spread: Spread,
    /// Every user's success ratio (ok / sent), in user order.
    pub user_success: Vec<f64>,
    pub boundaries: Vec<Boundary>,
    pub jaccard_min: f64,
    pub jaccard_median: f64,
    pub jaccard_max: f64,
    /// Boundaries where the refused set stayed the same (the target: none).
    pub unchanged_boundaries: usize,
    /// Share of requests admitted in each period of the window.
    pub period_success: Vec<f64>,
    pub sent: u64,
    pub ok: u64,
    pub refused: u64,
    pub timed_out: u64,
    pub errors: u64,
    pub offered_rps: f64,
    pub goodput_rps: f64,
    pub app: BackendSnapshot,
    /// `/proc/loadavg` before and after the run.
    pub loadavg_before: String,
    pub loadavg_after: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct FairnessResult {
    pub config: FairnessConfig,
    pub nominal_capacity_rps: f64,
    pub runs: Vec<ScheduleResult>,
}

/// Runs every schedule of `config` one after the other.
pub async fn run(
    config: FairnessConfig,
    log: impl Fn(String) + Send + Sync,
) -> anyhow::Result<FairnessResult> {
    let mut runs = Vec::new();
    for schedule in config.schedules.clone() {
        log(format!("fairness: {} schedule", schedule.label()));
        let result = run_schedule(&config, schedule, &log).await?;
        log(format!(
            "fairness: {}: max |user - mean| {:.1} pp over {} periods, Jaccard median {:.2}, \
             {} unchanged re-keys, goodput {:.0}/s",
            schedule.label(),
            result.spread.max_abs_dev_pp,
            result.periods,
            result.jaccard_median,
            result.unchanged_boundaries,
            result.goodput_rps
        ));
        runs.push(result);
    }
    Ok(FairnessResult { nominal_capacity_rps: config.app.nominal_capacity(), config, runs })
}

/// The priority table of the run: everything in one business class, user levels from
/// `x-user-id`.
pub fn table_yaml(schedule: Schedule, rekey_every: Duration, cycle_periods: u32) -> String {
    format!(
        "default_business: 10\nrules: []\nuser:\n  header: x-user-id\n  rekey_every: {}s\n  \
         schedule: {}\n  cycle_periods: {cycle_periods}\n",
        rekey_every.as_secs(),
        schedule.label()
    )
}

fn weir_yaml(app: std::net::SocketAddr, dir: &Path) -> String {
    format!(
        "inbound:\n  listen: 127.0.0.1:0\n  app: {app}\n  threads: 1\n  entry: true\n\
         admin:\n  listen: 127.0.0.1:0\n  table_file: {dir}/table.yaml\n  user_secret_file: {dir}/secret\n\
         log:\n  filter: warn\n",
        dir = dir.display()
    )
}

fn unix_now() -> Duration {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default()
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim().to_string()
}

/// When the measured window starts: the first boundary of an alignment unit (a cycle for
/// the balanced schedule, a period otherwise) at least `lead_in` from `now`.
pub fn window_start(now: Duration, lead_in: Duration, unit: Duration) -> Duration {
    let unit_us = unit.as_micros().max(1);
    let earliest = (now + lead_in).as_micros();
    Duration::from_micros((earliest.div_ceil(unit_us) * unit_us) as u64)
}

async fn run_schedule(
    config: &FairnessConfig,
    schedule: Schedule,
    log: &(impl Fn(String) + Send + Sync),
) -> anyhow::Result<ScheduleResult> {
    let backend = CapacityBackend::start(config.app.clone()).await?;
    let table = table_yaml(schedule, config.rekey_every, config.cycle_periods);
    let files = tempfile::tempdir()?;
    std::fs::write(files.path().join("table.yaml"), &table)?;
    std::fs::write(files.path().join("secret"), "fairness-bench-secret\n")?;
    let yaml = weir_yaml(backend.addr(), files.path());
    let weir = Contender::weir_with_config(&config.weir_bin, &yaml).await?;
    let period = config.rekey_every;
    let unit = match schedule {
        Schedule::Balanced => period * config.cycle_periods,
        Schedule::Independent => period,
    };
    // Start the load `lead_in` before a boundary; for the balanced schedule this can mean
    // waiting up to one cycle first (idle: nothing is sent).
    let now = unix_now();
    let from = window_start(now, config.lead_in, unit);
    let start_at = from - config.lead_in;
    if start_at > now {
        log(format!(
            "fairness: waiting {:.0} s for a cycle boundary",
            (start_at - now).as_secs_f64()
        ));
        tokio::time::sleep(start_at - now).await;
    }
    let window = period * config.periods();
    let to = from + window;
    // The last requests are sent just after the window closes; they are not counted.
    let duration = (to - unix_now()) + Duration::from_millis(200);
    let capacity = config.app.nominal_capacity();
    let mut spec =
        LoadSpec::new(weir.addr, vec![Phase { rate_per_sec: capacity * config.load, duration }]);
    spec.classes = vec![ClassSpec { name: "all".into(), business: 10, weight: 1.0 }];
    spec.users = config.users;
    spec.users_round_robin = config.users_round_robin;
    spec.send_user_id = true;
    // The entry stamps its own priorities (and would strip these anyway).
    spec.send_priority_headers = false;
    spec.deadline = config.deadline;
    spec.seed = config.seed;
    let loadavg_before = loadavg();
    backend.reset();
    let run = LoadRun::start(spec)?;
    let recorder = run.recorder().clone();
    run.finish().await?;
    let loadavg_after = loadavg();
    let events = recorder.user_events();
    drop(weir);
    let analysis = analyse(&events, config.users, from, period, config.periods());
    let window_secs = window.as_secs_f64();
    Ok(ScheduleResult {
        schedule,
        window_from_unix: from.as_secs_f64(),
        window_to_unix: to.as_secs_f64(),
        periods: config.periods(),
        offered_rps: analysis.sent as f64 / window_secs,
        goodput_rps: analysis.ok as f64 / window_secs,
        spread: analysis.spread,
        user_success: analysis.user_success,
        jaccard_min: analysis.jaccard_quantiles[0],
        jaccard_median: analysis.jaccard_quantiles[1],
        jaccard_max: analysis.jaccard_quantiles[2],
        unchanged_boundaries: analysis.boundaries.iter().filter(|b| b.jaccard >= 1.0).count(),
        boundaries: analysis.boundaries,
        period_success: analysis.period_success,
        sent: analysis.sent,
        ok: analysis.ok,
        refused: analysis.refused,
        timed_out: analysis.timed_out,
        errors: analysis.errors,
        app: backend.snapshot(),
        loadavg_before,
        loadavg_after,
    })
}

/// What [`analyse`] reads from a run's per-user log.
#[derive(Clone, Debug, Default)]
pub struct Analysis {
    pub spread: Spread,
    pub user_success: Vec<f64>,
    pub boundaries: Vec<Boundary>,
    /// Min, median, max.
    pub jaccard_quantiles: [f64; 3],
    pub period_success: Vec<f64>,
    pub sent: u64,
    pub ok: u64,
    pub refused: u64,
    pub timed_out: u64,
    pub errors: u64,
}

/// Per-user success ratios and per-period refused sets over `periods` periods of length
/// `period` from `from` (Unix time). A user is in a period's refused set when more than
/// half of their requests in it were not answered successfully.
pub fn analyse(
    events: &[UserEvent],
    users: u32,
    from: Duration,
    period: Duration,
    periods: u32,
) -> Analysis {
    let (from_us, period_us) = (from.as_micros() as u64, period.as_micros().max(1) as u64);
    let to_us = from_us + period_us * u64::from(periods);
    let users = users as usize;
    let mut sent = vec![0u64; users];
    let mut ok = vec![0u64; users];
    // Per period and user: (requests, failures), guarded requests left out.
    let mut cells = vec![vec![(0u32, 0u32); users]; periods as usize];
    let mut a = Analysis::default();
    for e in events.iter().filter(|e| (from_us..to_us).contains(&e.sent_unix_us)) {
        let u = e.user as usize;
        if u >= users {
            continue;
        }
        let success = e.ending == Ending::Ok;
        sent[u] += 1;
        ok[u] += u64::from(success);
        a.sent += 1;
        match e.ending {
            Ending::Ok => a.ok += 1,
            Ending::Refused => a.refused += 1,
            Ending::TimedOut => a.timed_out += 1,
            Ending::Error => a.errors += 1,
        }
        let offset = e.sent_unix_us - from_us;
        let (p, into) = ((offset / period_us) as usize, offset % period_us);
        if into >= BOUNDARY_GUARD_US && period_us - into >= BOUNDARY_GUARD_US {
            let cell = &mut cells[p][u];
            cell.0 += 1;
            cell.1 += u32::from(!success);
        }
    }
    a.user_success =
        (0..users).filter(|u| sent[*u] > 0).map(|u| ok[u] as f64 / sent[u] as f64).collect();
    a.spread = spread(&a.user_success);
    a.period_success = cells
        .iter()
        .map(|row| {
            let (n, failed) =
                row.iter().fold((0u64, 0u64), |(n, f), c| (n + u64::from(c.0), f + u64::from(c.1)));
            if n == 0 {
                0.0
            } else {
                1.0 - failed as f64 / n as f64
            }
        })
        .collect();
    let refused_sets: Vec<Vec<bool>> =
        cells.iter().map(|row| row.iter().map(|c| c.0 > 0 && 2 * c.1 > c.0).collect()).collect();
    for p in 1..refused_sets.len() {
        let (before, after) = (&refused_sets[p - 1], &refused_sets[p]);
        let both = before.iter().zip(after).filter(|(x, y)| **x && **y).count();
        let either = before.iter().zip(after).filter(|(x, y)| **x || **y).count();
        a.boundaries.push(Boundary {
            period: p as u32,
            refused_before: before.iter().filter(|x| **x).count(),
            refused_after: after.iter().filter(|x| **x).count(),
            jaccard: if either == 0 { 1.0 } else { both as f64 / either as f64 },
        });
    }
    let mut j: Vec<f64> = a.boundaries.iter().map(|b| b.jaccard).collect();
    j.sort_by(f64::total_cmp);
    if !j.is_empty() {
        a.jaccard_quantiles = [j[0], j[j.len() / 2], j[j.len() - 1]];
    }
    a
}

/// Quantiles and the largest distance from the mean of per-user ratios (in `0..=1`).
pub fn spread(ratios: &[f64]) -> Spread {
    if ratios.is_empty() {
        return Spread::default();
    }
    let mut sorted = ratios.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let q = |x: f64| sorted[((x * (n - 1) as f64).round() as usize).min(n - 1)] * 100.0;
    let mean = sorted.iter().sum::<f64>() / n as f64;
    let var = sorted.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n as f64;
    let dev = |r: &f64| (r - mean).abs() * 100.0;
    Spread {
        users: n,
        mean_pct: mean * 100.0,
        min_pct: q(0.0),
        p5_pct: q(0.05),
        median_pct: q(0.5),
        p95_pct: q(0.95),
        max_pct: q(1.0),
        stddev_pp: var.sqrt() * 100.0,
        max_abs_dev_pp: sorted.iter().map(dev).fold(0.0, f64::max),
        // A hair of tolerance: ratios of integer counts land exactly on 5 points.
        users_beyond_5pp: sorted.iter().filter(|r| dev(r) > 5.0 + 1e-9).count(),
    }
}

/// The markdown report.
pub fn markdown(r: &FairnessResult) -> String {
    use std::fmt::Write as _;
    let c = &r.config;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "One business class, {} users{}, load {:.0}x the app's nominal capacity ({} workers x {:.0} ms = {:.0}/s), \
         re-key every {} s, balanced cycle {} periods, {} measured periods per schedule ({} s), deadline {} ms.\n",
        c.users,
        if c.users_round_robin { " taking turns" } else { " drawn at random" },
        c.load,
        c.app.workers,
        c.app.service_time.as_secs_f64() * 1000.0,
        r.nominal_capacity_rps,
        c.rekey_every.as_secs(),
        c.cycle_periods,
        c.periods(),
        (c.rekey_every * c.periods()).as_secs(),
        c.deadline.as_millis(),
    );
    let _ = writeln!(
        s,
        "| schedule | periods | mean | min | p5 | median | p95 | max | stddev | max \\|user - mean\\| | users > 5 pp | Jaccard min / median / max | unchanged re-keys | offered | goodput | timeouts | loadavg before / after |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for run in &r.runs {
        let p = &run.spread;
        let _ = writeln!(
            s,
            "| {} | {} | {:.1}% | {:.1}% | {:.1}% | {:.1}% | {:.1}% | {:.1}% | {:.1} pp | **{:.1} pp** | {} of {} | {:.2} / {:.2} / {:.2} | {} of {} | {:.0}/s | {:.0}/s | {} | {} / {} |",
            run.schedule.label(),
            run.periods,
            p.mean_pct,
            p.min_pct,
            p.p5_pct,
            p.median_pct,
            p.p95_pct,
            p.max_pct,
            p.stddev_pp,
            p.max_abs_dev_pp,
            p.users_beyond_5pp,
            p.users,
            run.jaccard_min,
            run.jaccard_median,
            run.jaccard_max,
            run.unchanged_boundaries,
            run.boundaries.len(),
            run.offered_rps,
            run.goodput_rps,
            run.timed_out,
            run.loadavg_before,
            run.loadavg_after,
        );
    }
    s
}

#[cfg(test)]
mod tests;

/// `fairness.svg`: each schedule's per-user success ratios, sorted, against the class mean
/// +- 5 points; and the Jaccard overlap of the refused sets at every re-key.
pub fn plot(r: &FairnessResult, path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("plotting: {e}");
    let colors = [RGBColor(31, 119, 180), RGBColor(214, 39, 40), RGBColor(44, 160, 44)];
    let root = SVGBackend::new(path, (1200, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let panels = root.split_evenly((1, 2));
    let mut ratios = crate::plot::panel_chart(
        &panels[0],
        "per-user success ratio, sorted",
        ("users (percentile)", 0f64..100f64),
        ("success %", 0f64..100f64),
    )?;
    for (i, run) in r.runs.iter().enumerate() {
        let color = colors[i % colors.len()];
        let mut sorted = run.user_success.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len().max(2) - 1;
        let points: Vec<(f64, f64)> = sorted
            .iter()
            .enumerate()
            .map(|(k, v)| (k as f64 * 100.0 / n as f64, v * 100.0))
            .collect();
        let label = format!(
            "{} (max |user - mean| {:.1} pp)",
            run.schedule.label(),
            run.spread.max_abs_dev_pp
        );
        crate::plot::line(&mut ratios, points, &label, color)?;
        let mean = run.spread.mean_pct;
        for band in [mean - 5.0, mean + 5.0] {
            ratios
                .draw_series(DashedLineSeries::new(
                    vec![(0.0, band), (100.0, band)],
                    4,
                    4,
                    color.mix(0.6).stroke_width(1),
                ))
                .map_err(|e| err(&e))?;
        }
    }
    crate::plot::legend(&mut ratios, SeriesLabelPosition::UpperLeft)?;
    let periods = r.runs.iter().map(|run| run.periods).max().unwrap_or(1) as f64;
    let mut overlap = crate::plot::panel_chart(
        &panels[1],
        "refused set overlap at each re-key (Jaccard)",
        ("period", 0f64..periods),
        ("|before ∩ after| / |before ∪ after|", 0f64..1.05f64),
    )?;
    for (i, run) in r.runs.iter().enumerate() {
        let color = colors[i % colors.len()];
        let points: Vec<(f64, f64)> =
            run.boundaries.iter().map(|b| (f64::from(b.period), b.jaccard)).collect();
        crate::plot::line(&mut overlap, points, run.schedule.label(), color)?;
    }
    crate::plot::legend(&mut overlap, SeriesLabelPosition::UpperRight)?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
