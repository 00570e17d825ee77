//! After an overload, silence: an overload of three classes on the capacity-model app, then
//! `silence` without a request, then one request of every class (its least important user,
//! 127). What `/v1/status` says when they are sent, whether each is admitted, and how long
//! after the last answer of the overload the level read open and not overloaded (polled
//! every 50 ms).

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::{fmt_level, from_report, http_client, send_one, start_weir, RunStats, LEVEL_OPEN};
use crate::backend::{BackendConfig, CapacityBackend};
use crate::load::{self, LoadSpec, Outcome, Phase, Protocol};
use crate::status::{self, StatusPoller};

#[derive(Clone, Debug, Serialize)]
pub struct SilenceConfig {
    pub workers: usize,
    #[serde(serialize_with = "crate::report::ser_millis")]
    pub service_time: Duration,
    /// The overload, as a multiple of the app's capacity, and how long.
    pub multiple: f64,
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub overload: Duration,
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub silence: Duration,
    pub seed: u64,
}

impl Default for SilenceConfig {
    fn default() -> Self {
        SilenceConfig {
            workers: 4,
            service_time: Duration::from_millis(20),
            multiple: 3.0,
            overload: Duration::from_secs(3),
            silence: Duration::from_secs(1),
            seed: 7,
        }
    }
}

/// One class's first request after the silence.
#[derive(Clone, Debug, Serialize)]
pub struct ClassProbe {
    pub business: u8,
    pub user: u8,
    /// `ok`, `refused (<x-weir-shed>)`, `timed out`, `error`.
    pub outcome: String,
    pub admitted: bool,
    pub latency_ms: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct SilenceRun {
    pub contender: String,
    /// The overload itself (refusals show it was one).
    pub overload: RunStats,
    /// `/v1/status` right before the first request after the silence (weir only).
    pub level_before: Option<String>,
    pub overloaded_before: Option<bool>,
    pub probes: Vec<ClassProbe>,
    /// From the overload's last answer until `/v1/status` read an open level and not
    /// overloaded; `None` if not within the silence.
    pub open_after_secs: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SilenceResult {
    pub config: SilenceConfig,
    pub runs: Vec<SilenceRun>,
}

pub async fn run(
    config: &SilenceConfig,
    weir_bin: &Path,
    mix: [f64; 3],
    progress: &mut impl FnMut(String),
) -> anyhow::Result<SilenceResult> {
    let mut runs = Vec::new();
    for through_weir in [false, true] {
        let app = BackendConfig::new(config.workers, config.service_time);
        let capacity = app.nominal_capacity();
        let backend = CapacityBackend::start(app).await?;
        let weir =
            if through_weir { Some(start_weir(weir_bin, backend.addr(), "").await?) } else { None };
        let target = weir.as_ref().map_or(backend.addr(), |w| w.addr);
        let admin = weir.as_ref().and_then(|w| w.admin);
        let poller = admin.map(|a| StatusPoller::start(a, Duration::from_millis(50)));
        let started = Instant::now();

        let phases =
            vec![Phase { rate_per_sec: config.multiple * capacity, duration: config.overload }];
        let mut spec = LoadSpec::new(target, phases);
        spec.classes = load::classes_with_shares(mix);
        spec.seed = config.seed;
        let report = load::run(spec).await?;
        // Every request of the overload has its answer (or gave up): the silence starts.
        let quiet_from = started.elapsed().as_secs_f64();
        tokio::time::sleep(config.silence).await;

        let before = match admin {
            Some(a) => status::fetch(&status::admin_client(), a, 0.0).await,
            None => None,
        };
        let client = http_client(Protocol::Http1);
        let mut probes = Vec::new();
        for business in 0..3u8 {
            let (outcome, took) =
                send_one(&client, target, business, 127, Duration::from_millis(500)).await;
            probes.push(ClassProbe {
                business,
                user: 127,
                admitted: outcome == Outcome::Ok,
                outcome: match outcome {
                    Outcome::Ok => "ok".into(),
                    Outcome::Refused(why) => format!("refused ({why})"),
                    Outcome::TimedOut => "timed out".into(),
                    Outcome::Error => "error".into(),
                },
                latency_ms: took.as_secs_f64() * 1000.0,
            });
        }
        let samples = poller.map(StatusPoller::stop).unwrap_or_default();
        let silence_end = quiet_from + config.silence.as_secs_f64();
        let open_after_secs = samples
            .iter()
            .filter(|s| s.at_secs >= quiet_from && s.at_secs <= silence_end)
            .find(|s| s.doc.level_compound == LEVEL_OPEN && !s.doc.overloaded)
            .map(|s| s.at_secs - quiet_from);
        let mut overload = from_report(&report);
        overload.contender = if through_weir { "weir" } else { "direct" }.into();
        progress(format!(
            "silence {:<6} overload refused {} of {}; after {} s: {}{}",
            overload.contender,
            overload.refused,
            overload.sent,
            config.silence.as_secs_f64(),
            probes
                .iter()
                .map(|p| format!("class {} {}", p.business, p.outcome))
                .collect::<Vec<_>>()
                .join(", "),
            before.as_ref().map_or(String::new(), |b| format!(
                "; status level {} overloaded {}",
                b.doc.level, b.doc.overloaded
            )),
        ));
        runs.push(SilenceRun {
            contender: overload.contender.clone(),
            overload,
            level_before: before.as_ref().map(|b| b.doc.level.clone()),
            overloaded_before: before.as_ref().map(|b| b.doc.overloaded),
            probes,
            open_after_secs,
        });
        drop(weir);
    }
    Ok(SilenceResult { config: config.clone(), runs })
}

pub fn markdown(r: &SilenceResult) -> String {
    let c = &r.config;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "#### After an overload, {} s of silence\n\n\
         App {}x{} ms ({:.0} rps); {}x its capacity for {} s, then {} s without a request, then one request of \
         each class (user 127, the least important of the class). Open: the first `/v1/status` (every 50 ms) \
         reading level {} and not overloaded, after the overload's last answer. (Direct: the app still \
         works through the backlog its callers abandoned, as a thread pool does.)\n",
        c.silence.as_secs_f64(),
        c.workers,
        c.service_time.as_secs_f64() * 1000.0,
        BackendConfig::new(c.workers, c.service_time).nominal_capacity(),
        c.multiple,
        c.overload.as_secs_f64(),
        c.silence.as_secs_f64(),
        fmt_level(LEVEL_OPEN),
    );
    let _ = writeln!(
        s,
        "| contender | overload refused | status before (level, overloaded) | class 0 | class 1 | class 2 | open after | all admitted |\n|---|---:|---|---|---|---|---:|---|"
    );
    for run in &r.runs {
        let probe = |b: u8| {
            run.probes.iter().find(|p| p.business == b).map_or("-".into(), |p| p.outcome.clone())
        };
        let _ = writeln!(
            s,
            "| {} | {} of {} | {} | {} | {} | {} | {} | {} |",
            run.contender,
            run.overload.refused,
            run.overload.sent,
            match (&run.level_before, run.overloaded_before) {
                (Some(l), Some(o)) => format!("{l}, {o}"),
                _ => "-".into(),
            },
            probe(0),
            probe(1),
            probe(2),
            match (run.contender.as_str(), run.open_after_secs) {
                ("direct", _) => "-".into(),
                (_, Some(t)) => format!("{t:.2} s"),
                (_, None) => format!("not within {} s", c.silence.as_secs_f64()),
            },
            if run.probes.iter().all(|p| p.admitted) { "yes" } else { "**no**" },
        );
    }
    s
}
