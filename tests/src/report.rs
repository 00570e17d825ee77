//! Markdown tables, machine facts and serde helpers for the benchmark outputs.

use serde::Serialize;
use std::fmt::Write as _;

use crate::scenario::{analysis_fmt, BenchResult};

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

/// The overload benchmark's tables.
pub fn overload_markdown(r: &BenchResult) -> String {
    let mut s = String::new();
    let c = &r.config;
    let _ = writeln!(
        s,
        "Backend: {} workers x {} ms ({}), nominal {:.0} rps, measured capacity **{:.0} rps**. \
         Deadline {} ms; classes critical(b=0) 10%, normal(b=1) 30%, background(b=2) 60%; {:?}.\n",
        c.backend.workers,
        c.backend.service_time.as_millis(),
        match (c.backend.busy_wait, c.backend.cancel_on_disconnect) {
            (false, false) => "sleep; finishes abandoned work",
            (true, false) => "busy-wait; finishes abandoned work",
            (false, true) => "sleep; cancels work on disconnect",
            (true, true) => "busy-wait; cancels work on disconnect",
        },
        r.capacity.nominal_rps,
        r.capacity.measured_rps,
        c.deadline.as_millis(),
        c.protocol,
    );
    let _ = writeln!(
        s,
        "| contender | load | goodput/capacity | critical ok | normal ok | background ok | admitted p99 | refusal p50 | unserved (ideal) | wasted work | app peak inside |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for l in &r.loads {
        let class = |i: usize| l.classes.get(i).map_or("-".into(), |c| pct(c.success_ratio()));
        let _ = writeln!(
            s,
            "| {} | {:.1}x | {} | {} | {} | {} | {:.1} ms | {} | {} ({}) | {} | {} |",
            l.contender,
            l.multiple,
            pct(l.goodput_ratio),
            class(0),
            class(1),
            class(2),
            l.ok_p99_ms,
            if l.classes.iter().any(|c| c.refused > 0) {
                format!("{:.2} ms", l.refused_p50_ms)
            } else {
                "-".into()
            },
            pct(l.unserved_fraction),
            pct(l.ideal_unserved_fraction),
            pct(l.wasted_work_fraction),
            l.backend.peak_outstanding,
        );
    }
    let _ = writeln!(s, "\nStep {:?}x, {} s each:\n", c.step, c.step_phase.as_secs());
    let _ = writeln!(
        s,
        "| contender | settle (goodput >= 95% and queuing < {} ms) | goodput >= 95% | recover (< 1% unserved) | goodput, 2nd half of high phase | wasted work |",
        c.queuing_threshold.as_millis()
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|");
    for step in &r.steps {
        let a = &step.analysis;
        let wasted = if step.backend.busy_seconds > 0.0 {
            step.backend.wasted_busy_seconds / step.backend.busy_seconds
        } else {
            0.0
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |",
            step.contender,
            analysis_fmt(a.settle_secs),
            analysis_fmt(a.goodput_settle_secs),
            analysis_fmt(a.recover_secs),
            pct(a.high_phase_goodput_ratio),
            pct(wasted),
        );
    }
    for skipped in &r.skipped {
        let _ = writeln!(s, "\nSkipped: {skipped}");
    }
    s
}
