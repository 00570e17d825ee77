//! Markdown tables, machine facts and serde helpers for the benchmark outputs.

use serde::Serialize;
use std::fmt::Write as _;

use crate::scenario::{fmt_secs as analysis_fmt, BenchResult};

pub use weir_workload::{ser_millis, ser_secs};

/// What the numbers were measured on.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub kernel: String,
    pub haproxy: String,
    pub nginx: String,
}

impl Machine {
    pub fn probe() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, v)| v.trim())
            })
            .unwrap_or("unknown")
            .to_string();
        let first_line = |program: &str, arg: &str| {
            std::process::Command::new(program)
                .arg(arg)
                .output()
                .ok()
                .map(|o| {
                    let text = if o.stdout.is_empty() { o.stderr } else { o.stdout };
                    String::from_utf8_lossy(&text).lines().next().unwrap_or("").trim().to_string()
                })
                .unwrap_or_else(|| "not installed".into())
        };
        Machine {
            cpu,
            // Count the machine's CPUs, not this process's affinity (the overhead bench pins itself).
            cores: cpuinfo.lines().filter(|l| l.starts_with("processor")).count().max(1),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .into(),
            haproxy: first_line("haproxy", "-v"),
            nginx: first_line("nginx", "-v"),
        }
    }

    pub fn markdown(&self) -> String {
        format!(
            "- CPU: {} x {} cores (shared by load generator, backend and proxy)\n- kernel {}\n- {}\n- {}\n",
            self.cpu, self.cores, self.kernel, self.haproxy, self.nginx
        )
    }
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn pct_opt(x: Option<f64>) -> String {
    x.map_or("-".into(), pct)
}

fn ms_opt(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.0}"))
}

fn num_opt(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.0}"))
}

/// A follow time, or `unchanged` when the value settled within its band of where it was.
fn follow_fmt(
    secs: Option<f64>,
    before: Option<f64>,
    after: Option<f64>,
    band: impl Fn(f64) -> f64,
) -> String {
    match (secs, before, after) {
        (None, Some(b), Some(a)) if (a - b).abs() <= band(a) => "unchanged".into(),
        _ => analysis_fmt(secs),
    }
}

/// Per-class figures as "a / b / c".
fn per_class(values: impl Iterator<Item = String>) -> String {
    values.collect::<Vec<_>>().join(" / ")
}

/// The overload benchmark's tables.
pub fn overload_markdown(r: &BenchResult) -> String {
    let mut s = String::new();
    let c = &r.config;
    let _ = writeln!(
        s,
        "Deadline {} ms; classes critical (b=0) / normal (b=1) / background (b=2); {:?}; seed {}. \
         weir runs with its shipped defaults (no `max_inflight`); HAProxy with `maxconn` = the app's workers.\n",
        c.deadline.as_millis(),
        c.protocol,
        c.seed
    );
    let _ = writeln!(s, "| app | nominal | measured capacity |\n|---|---:|---:|");
    for app in &r.apps {
        let _ = writeln!(
            s,
            "| {} | {:.0} rps | {:.0} rps |",
            app.label, app.capacity.nominal_rps, app.capacity.measured_rps
        );
    }
    if !r.steps.is_empty() {
        let _ = writeln!(
            s,
            "\n#### Step {:?}x, {} s each\n\n\
             settle: from the jump until every 500 ms window serves >= 90% of capacity with admitted p90 <= S + 40 ms; \
             recovery: from the drop until every class keeps >= 99% success; timeouts: share of the refusals that reached \
             clients as 500 ms timeouts instead of fast 503s; latency from the 2nd second of the spike on; goodput over \
             the high phase; success per class (critical / normal / background).\n",
            c.step,
            c.step_phase.as_secs()
        );
        let _ = writeln!(
            s,
            "| app | mix | contender | settle | recovery | timeouts / refusals | admitted p50 / p90 / p99 ms | high-phase goodput | top class (high) | success from drop + 2 s | recovery per class |"
        );
        let _ = writeln!(s, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for step in &r.steps {
            let m = &step.metrics;
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} ({} of {}) | {} / {} / {} | {} | {:.2}% | {} | {} |",
                step.app,
                step.mix,
                step.contender,
                analysis_fmt(m.settle_secs),
                analysis_fmt(m.recovery_secs),
                pct_opt(m.timeout_share),
                m.timed_out,
                m.timed_out + m.refused,
                ms_opt(m.admitted_p50_ms),
                ms_opt(m.admitted_p90_ms),
                ms_opt(m.admitted_p99_ms),
                pct(m.high_goodput_ratio),
                m.top_class_success_high * 100.0,
                per_class(m.classes.iter().map(|c| pct(c.success_after_drop))),
                per_class(m.classes.iter().map(|c| analysis_fmt(c.recovery_secs))),
            );
        }
    }
    if !r.loads.is_empty() {
        let app = r.apps.first().map_or("-".to_string(), |a| a.label.clone());
        let _ = writeln!(
            s,
            "\n#### Steady loads (app {app}, mix {}), {} s each, first {} s not counted\n\n\
             shed vs ideal: share not served minus `1 - 1/load` (percentage points); vs direct: the same load through nothing.\n",
            c.mixes.first().map_or("-", |m| m.name.as_str()),
            c.load_duration.as_secs(),
            c.warmup.as_secs()
        );
        let _ = writeln!(
            s,
            "| contender | load | goodput / capacity | admitted p50 / p99 ms | shed vs ideal | top class | refused + timed out | throughput vs direct | p99 vs direct | weir limit | app peak inside |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for l in &r.loads {
            let direct = r
                .loads
                .iter()
                .find(|d| d.contender == "direct" && (d.multiple - l.multiple).abs() < 1e-9);
            let vs = |f: &dyn Fn(&crate::scenario::LoadResult) -> f64| {
                direct.filter(|d| f(d) > 0.0).map_or("-".into(), |d| format!("{:.2}", f(l) / f(d)))
            };
            let _ = writeln!(
                s,
                "| {} | {:.1}x | {} | {:.0} / {:.0} | {:+.1} pp | {} | {} | {} | {} | {} | {} |",
                l.contender,
                l.multiple,
                pct(l.goodput_ratio),
                l.ok_p50_ms,
                l.ok_p99_ms,
                l.shed_excess_pp(),
                l.classes
                    .first()
                    .map_or("-".into(), |c| format!("{:.2}%", c.success_ratio() * 100.0)),
                l.refused + l.timed_out,
                vs(&|x| x.goodput_rps),
                vs(&|x| x.ok_p99_ms),
                num_opt(l.inflight_limit),
                l.backend.peak_outstanding,
            );
        }
    }
    if !r.adaptive.is_empty() {
        let _ = writeln!(
            s,
            "\n#### Adaptive in-flight limit (weir defaults; apps of W workers, each at {:.0} rps nominal), {} s per run\n",
            c.adaptive_capacity,
            c.adaptive_duration.as_secs()
        );
        let _ = writeln!(
            s,
            "| app | limit at 0.8x | limit at 3x | app peak inside at 3x | admitted p99 at 3x | goodput at 3x | throughput at 0.8x (direct) | p99 at 0.8x (direct) | refused at 0.8x |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for a in &r.adaptive {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {:.0} ms | {} | {:.0} ({}) rps | {:.0} ({}) ms | {} |",
                a.app,
                num_opt(a.limit_at_low),
                num_opt(a.limit_at_high),
                a.app_peak_inside_at_high,
                a.p99_at_high_ms,
                pct(a.goodput_at_high_ratio),
                a.throughput_at_low_rps,
                num_opt(a.direct_throughput_at_low_rps),
                a.p99_at_low_ms,
                num_opt(a.direct_p99_at_low_ms),
                a.refused_at_low,
            );
        }
    }
    for shift in &r.shifts {
        let _ = writeln!(
            s,
            "\n#### App {} slows to 2S and recovers ({:.1}x its normal capacity offered; {} s per phase)\n\n\
             follows: until the value stays within a quarter of where it settles (limit; at least 1) or a quarter class (level, clamped at 3.0); \
             `unchanged` when it settles within that band of where it was.\n",
            shift.app,
            shift.multiple,
            c.shift_phase.as_secs()
        );
        let _ = writeln!(
            s,
            "| at | service time | limit before -> after | limit follows in | level before -> after | level follows in | success in the phase after |"
        );
        let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|---:|");
        for (i, f) in shift.follows.iter().enumerate() {
            let level = |x: Option<f64>| x.map_or("-".into(), |v| format!("{:.2}", v / 128.0));
            let _ = writeln!(
                s,
                "| {:.0} s | {:.0} ms | {} -> {} | {} | {} -> {} | {} | {} |",
                f.at_secs,
                f.service_ms,
                num_opt(f.limit_before),
                num_opt(f.limit_after),
                follow_fmt(f.limit_follow_secs, f.limit_before, f.limit_after, |t| (t / 4.0)
                    .max(1.0)),
                level(f.level_before),
                level(f.level_after),
                follow_fmt(f.level_follow_secs, f.level_before, f.level_after, |_| 32.0),
                shift
                    .phase_success
                    .get(i + 1)
                    .map_or("-".into(), |v| per_class(v.iter().map(|x| pct(*x)))),
            );
        }
    }
    for stall in &r.stalls {
        let d = &stall.during;
        let _ = writeln!(
            s,
            "\n#### App {} stops answering from {:.0} s to {:.0} s ({:.1}x offered; clients wait up to 1.5 s to see late answers)\n",
            stall.app, stall.stall_from_secs, stall.stall_to_secs, stall.multiple
        );
        let _ = writeln!(
            s,
            "| sent during the stall | ok / refused (503) / other answer (e.g. 504) / no answer in 1.5 s | answered p99 / max | answered within 600 ms | /v1/status overloaded after | level open again after the app's return | every class >= 99% after | critical success before the stall |"
        );
        let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|---:|---:|");
        let _ = writeln!(
            s,
            "| {} | {} / {} / {} / {} | {} / {} ms | {} | {} | {} | {} | {} |",
            d.sent,
            d.ok,
            d.refused,
            d.errors,
            d.timed_out,
            ms_opt(stall.answered_p99_ms),
            ms_opt(stall.answered_max_ms),
            pct(stall.answered_within_600ms),
            analysis_fmt(stall.overloaded_after_secs),
            analysis_fmt(stall.level_open_after_secs),
            analysis_fmt(stall.recovery_secs),
            pct(stall.critical_success_before),
        );
    }
    for skipped in &r.skipped {
        let _ = writeln!(s, "\nSkipped: {skipped}");
    }
    s
}
