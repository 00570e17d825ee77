//! `weir demo`: one command that shows weir under overload on any machine.
//!
//! It starts, all in this process on 127.0.0.1 ephemeral ports, a capacity-model app
//! (`weir_workload::backend`), a sidecar in front of it ([`crate::Sidecar`]) and an
//! open-loop load of three business classes that steps 0.5x -> 3x -> 0.5x the app's
//! capacity, shows a live view (admission level, queuing time, per-class admitted and
//! refused per second) and ends with a summary table and the recovery after the drop
//! (how long until every class is served again).
//!
//! Wiring for the CLI (`cli.rs`):
//! ```text
//! Command::Demo(crate::demo::DemoArgs)   =>   crate::demo::run(args) -> std::process::ExitCode
//! ```

use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use weir_workload::backend::{BackendConfig, CapacityBackend};
use weir_workload::load::{LoadReport, LoadRun, LoadSpec, Phase, SecondReport};
use weir_workload::status::StatusSample;

use crate::config::SidecarConfig;
use crate::sidecar::Sidecar;

/// The app's service time; its worker count follows from `--capacity`.
const SERVICE_TIME: Duration = Duration::from_millis(20);
/// The step, as multiples of capacity, in equal thirds of the run.
const STEP: [f64; 3] = [0.5, 3.0, 0.5];

#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Length of the run in seconds (0.5x, 3x, 0.5x the capacity, a third each).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(6..=3600))]
    pub seconds: u64,
    /// The demo app's capacity in requests per second (20 ms per request, so this many / 50 workers).
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u32).range(50..=5000))]
    pub capacity: u32,
    /// Print one plain line per second instead of the live view.
    #[arg(long)]
    pub no_tty: bool,
}

/// Runs the demo; a failure to start prints one line and exits 1.
pub fn run(args: DemoArgs) -> ExitCode {
    match execute(&args) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("weir demo: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The demo itself, printing as it goes; returns what the load saw.
pub fn execute(args: &DemoArgs) -> Result<LoadReport, String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let workers = ((args.capacity as f64 * SERVICE_TIME.as_secs_f64()).round() as usize).max(1);
    let service_time = Duration::from_secs_f64(workers as f64 / args.capacity as f64);
    let backend_config = BackendConfig::new(workers, service_time);
    let backend = runtime
        .block_on(CapacityBackend::start(backend_config))
        .map_err(|e| format!("cannot start the demo app: {e}"))?;

    let mut config = SidecarConfig::default();
    config.inbound.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    config.inbound.app = backend.addr();
    // No `max_inflight`: the demo shows the shipped defaults, which find the app's
    // concurrency themselves.
    config.inbound.threads = 1;
    config.admin.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    let sidecar = Sidecar::start(config).map_err(|e| format!("cannot start the sidecar: {e}"))?;

    let third = Duration::from_secs_f64(args.seconds as f64 / 3.0);
    let capacity = args.capacity as f64;
    let phases: Vec<Phase> =
        STEP.iter().map(|m| Phase { rate_per_sec: capacity * m, duration: third }).collect();
    let spec = LoadSpec::new(sidecar.inbound_addr(), phases);
    let classes: Vec<String> = spec.classes.iter().map(|c| c.name.clone()).collect();
    let plain = args.no_tty || !std::io::stdout().is_terminal();
    println!(
        "weir demo: app {} ({workers} workers x {:.1} ms = {capacity:.0} rps), sidecar {}, admin {}",
        backend.addr(),
        service_time.as_secs_f64() * 1000.0,
        sidecar.inbound_addr(),
        sidecar.admin_addr()
    );
    println!("load: {} over {} s\n", step_text(capacity), args.seconds);

    let report = runtime.block_on(async {
        let run = LoadRun::start(spec).map_err(|e| e.to_string())?;
        let mut view = View { plain, classes: &classes, drawn: 0, total: args.seconds };
        let client = weir_workload::status::admin_client();
        // Tick just after each second's requests have all finished (deadline 500 ms).
        let start = tokio::time::Instant::now();
        let mut tick =
            tokio::time::interval_at(start + Duration::from_millis(1600), Duration::from_secs(1));
        for second in 0..args.seconds {
            tick.tick().await;
            let status =
                weir_workload::status::fetch(&client, sidecar.admin_addr(), second as f64).await;
            let series = run.recorder().series();
            view.draw(second, args.seconds, capacity, series.get(second as usize), status.as_ref());
        }
        run.finish().await.map_err(|e| e.to_string())
    })?;
    println!("\n{}", summary(&report, capacity, args.seconds));
    drop(sidecar);
    drop(backend);
    Ok(report)
}

fn step_text(capacity: f64) -> String {
    STEP.iter().map(|m| format!("{m}x ({:.0} rps)", m * capacity)).collect::<Vec<_>>().join(" -> ")
}

/// The live view: redrawn in place on a terminal, one line per second otherwise.
struct View<'a> {
    plain: bool,
    classes: &'a [String],
    drawn: usize,
    total: u64,
}

impl View<'_> {
    fn draw(
        &mut self,
        second: u64,
        total: u64,
        capacity: f64,
        s: Option<&SecondReport>,
        status: Option<&StatusSample>,
    ) {
        let multiple = STEP[((second * 3) / total.max(1)).min(2) as usize];
        let level = status.map_or_else(|| "?".into(), |s| s.doc.level.clone());
        let overloaded = status.map_or("?", |s| if s.doc.overloaded { "yes" } else { "no" });
        let queuing =
            status.and_then(|s| s.doc.mean_queuing_ms).map_or("-".into(), |q| format!("{q:.1} ms"));
        let limit = status.map_or("?".into(), |s| s.inflight_limit().to_string());
        let count = |v: Option<&Vec<u64>>, i: usize| v.and_then(|v| v.get(i)).copied().unwrap_or(0);
        let mut out = String::new();
        if self.plain {
            let _ = write!(
                out,
                "t={:>3}s load={multiple}x level={level} overloaded={overloaded} queuing={queuing} limit={limit}",
                second + 1
            );
            for (i, name) in self.classes.iter().enumerate() {
                let _ = write!(
                    out,
                    " {name}={}/{}",
                    count(s.map(|s| &s.ok), i),
                    count(s.map(|s| &s.refused), i)
                );
            }
            println!("{out} (admitted/refused per s)");
            return;
        }
        let width = 40;
        let done = ((second + 1) as usize * width) / self.total.max(1) as usize;
        let _ = writeln!(
            out,
            "[{}{}] {:>3}/{} s   offered {multiple}x ({:.0} rps)",
            "#".repeat(done),
            "-".repeat(width - done),
            second + 1,
            self.total,
            multiple * capacity
        );
        let _ = writeln!(
            out,
            "admission level {level:<8} overloaded {overloaded:<4} queuing {queuing:<9} in-flight limit {limit}"
        );
        let _ = writeln!(
            out,
            "{:<12} {:>11} {:>10} {:>10}",
            "class", "admitted/s", "refused/s", "late/s"
        );
        for (i, name) in self.classes.iter().enumerate() {
            let late = count(s.map(|s| &s.timed_out), i) + count(s.map(|s| &s.errors), i);
            let _ = writeln!(
                out,
                "{name:<12} {:>11} {:>10} {:>10}",
                count(s.map(|s| &s.ok), i),
                count(s.map(|s| &s.refused), i),
                late
            );
        }
        let lines = out.lines().count();
        let mut stdout = std::io::stdout().lock();
        if self.drawn > 0 {
            // Move up over the previous frame and clear it.
            let _ = write!(stdout, "\x1b[{}A\x1b[J", self.drawn);
        }
        let _ = stdout.write_all(out.as_bytes());
        let _ = stdout.flush();
        self.drawn = lines;
    }
}

/// Per phase and class: sent, success, refused; then latency over the whole run.
fn summary(report: &LoadReport, capacity: f64, seconds: u64) -> String {
    let mut s = String::new();
    let per_phase = (seconds as usize).div_ceil(3).max(1);
    let _ = writeln!(s, "| phase | class | sent | ok | refused | late | success |");
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|");
    for (p, multiple) in STEP.iter().enumerate() {
        let range = (p * per_phase).min(report.series.len())
            ..((p + 1) * per_phase).min(report.series.len());
        let seconds = &report.series[range];
        for (i, class) in report.classes.iter().enumerate() {
            let sum = |f: &dyn Fn(&SecondReport) -> &Vec<u64>| -> u64 {
                seconds.iter().map(|s| f(s).get(i).copied().unwrap_or(0)).sum()
            };
            let sent = sum(&|s| &s.sent);
            let ok = sum(&|s| &s.ok);
            let late = sum(&|s| &s.timed_out) + sum(&|s| &s.errors);
            let success = if sent == 0 { 100.0 } else { ok as f64 * 100.0 / sent as f64 };
            let _ = writeln!(
                s,
                "| {multiple}x | {} | {sent} | {ok} | {} | {late} | {success:.1}% |",
                class.name,
                sum(&|s| &s.refused)
            );
        }
        let ok: u64 = seconds.iter().map(|s| SecondReport::total(&s.ok)).sum();
        let goodput = ok as f64 / seconds.len().max(1) as f64;
        let _ = writeln!(
            s,
            "| {multiple}x | **goodput** | | {goodput:.0}/s | | | {:.0}% of capacity |",
            goodput * 100.0 / capacity
        );
    }
    let _ = writeln!(s, "\n{}", recovery_line(report, seconds));
    let _ = writeln!(
        s,
        "admitted latency p50 {:.1} ms, p99 {:.1} ms; refusals answered in p50 {:.2} ms, p99 {:.2} ms",
        report.all_ok_p50_ms, report.all_ok_p99_ms, report.all_refused_p50_ms, report.all_refused_p99_ms
    );
    s
}

/// When every class was served again after the load fell back to 0.5x: the earliest
/// moment from which each class keeps >= 99% success to the end of the run.
fn recovery_line(report: &LoadReport, seconds: u64) -> String {
    use weir_workload::analysis::recovery_secs;
    let drop_at = seconds as f64 * 2.0 / 3.0;
    let end = seconds as f64;
    let classes = report.classes.len();
    let fmt = |r: Option<f64>| r.map_or("not within the run".to_string(), |r| format!("{r:.1} s"));
    let all = recovery_secs(&report.events, drop_at, end, classes, None, 0.99, 1.0);
    let per_class: Vec<String> = report
        .classes
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let r = recovery_secs(&report.events, drop_at, end, classes, Some(k as u16), 0.99, 1.0);
            format!("{} {}", c.name, fmt(r))
        })
        .collect();
    format!(
        "recovery after the drop to 0.5x: every class at >= 99% success after {} ({})",
        fmt(all),
        per_class.join(", ")
    )
}
