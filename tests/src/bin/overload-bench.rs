//! The overload benchmark (see BENCHMARKS.md):
//! `cargo build --release -p proxy -p weir-tests && target/release/overload-bench [--quick]`

use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

use weir_harness::bench_cli::{self, RunnerArgs};
use weir_harness::contender::{self, Kind};
use weir_harness::load::Protocol;
use weir_harness::report::{self, Machine};
use weir_harness::scenario::{self, Mix, ScenarioConfig, Suite};

#[derive(Parser, Debug)]
#[command(about = "Overload benchmark: weir's laws vs HAProxy vs direct, side by side")]
struct Args {
    /// A few minutes in all: one app and mix for the step, 6 s phases, shorter runs.
    #[arg(long)]
    quick: bool,
    /// Which suites to run.
    #[arg(long, value_delimiter = ',', default_values = ["step", "steady", "adaptive", "shift", "stall"])]
    suites: Vec<Suite>,
    /// Apps of the step suite as WORKERSxMS (the first also serves the other suites).
    #[arg(long, value_delimiter = ',', default_values = ["4x10", "8x20"])]
    apps: Vec<String>,
    /// Class mixes critical/normal/background in percent.
    #[arg(long, value_delimiter = ',', default_values = ["10/30/60", "20/30/50"])]
    mixes: Vec<String>,
    /// Seconds of each step phase (0.5x, 3x, 0.5x) [default: 15; with --quick 6].
    #[arg(long)]
    step_secs: Option<u64>,
    /// Steady loads as multiples of the measured capacity
    /// [default: 0.8,1.5,3,6,10; with --quick 0.8,3,10].
    #[arg(long, value_delimiter = ',')]
    loads: Option<Vec<f64>>,
    /// Worker counts of the adaptive suite's apps.
    #[arg(long, value_delimiter = ',', default_values = ["1", "4", "16", "64"])]
    adaptive_workers: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_values = ["weir", "weir-dagor", "weir-goodput", "haproxy", "direct"])]
    contenders: Vec<Kind>,
    /// Burn CPU for the service time instead of sleeping.
    #[arg(long)]
    busy_wait: bool,
    /// The app abandons a request when its connection closes (default: it finishes it).
    #[arg(long)]
    app_cancels: bool,
    #[arg(long, value_enum, default_value_t = Protocol::Http1)]
    protocol: Protocol,
    /// Give weir a fixed `max_inflight` (default: none, weir finds the app's concurrency).
    #[arg(long)]
    weir_max_inflight: Option<usize>,
    #[command(flatten)]
    runner: RunnerArgs,
}

fn parse_mix(text: &str) -> anyhow::Result<Mix> {
    bench_cli::parse_mix(text).map(Mix::new)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let weir_bin = args.runner.weir_bin(&workspace)?;
    let mut contenders = args.contenders.clone();
    if contenders.contains(&Kind::Haproxy) {
        if let Err(e) = contender::require("haproxy") {
            eprintln!("skipping haproxy: {e}");
            contenders.retain(|k| *k != Kind::Haproxy);
        }
    }
    let mut apps =
        args.apps.iter().map(|a| bench_cli::parse_app(a)).collect::<anyhow::Result<Vec<_>>>()?;
    let mut mixes = args.mixes.iter().map(|m| parse_mix(m)).collect::<anyhow::Result<Vec<_>>>()?;
    for app in &mut apps {
        app.busy_wait = args.busy_wait;
        app.cancel_on_disconnect = args.app_cancels;
    }
    if args.quick {
        apps.truncate(1);
        mixes.truncate(1);
    }
    let step_secs = args.step_secs.unwrap_or(if args.quick { 6 } else { 15 });
    let (load_secs, warmup, adaptive_secs, shift_secs, stall_secs) =
        if args.quick { (5, 1, 5, 5, 5) } else { (10, 2, 10, 10, 10) };
    let config = ScenarioConfig {
        suites: args.suites.clone(),
        options: contender::Options {
            weir_bin,
            max_inflight: apps.first().map_or(1, |a| a.workers),
            weir_max_inflight: args.weir_max_inflight,
            pin_cpu: None,
            protocol: args.protocol,
            queue_timeout: Duration::from_millis(500),
        },
        apps,
        mixes,
        step: vec![0.5, 3.0, 0.5],
        step_phase: Duration::from_secs(step_secs),
        loads: args.loads.clone().unwrap_or_else(|| {
            if args.quick {
                vec![0.8, 3.0, 10.0]
            } else {
                vec![0.8, 1.5, 3.0, 6.0, 10.0]
            }
        }),
        load_duration: Duration::from_secs(load_secs),
        warmup: Duration::from_secs(warmup),
        adaptive_workers: args.adaptive_workers.clone(),
        adaptive_capacity: 400.0,
        adaptive_duration: Duration::from_secs(adaptive_secs),
        shift_phase: Duration::from_secs(shift_secs),
        shift_load: 0.7,
        stall_for: Duration::from_secs(stall_secs),
        stall_load: 0.5,
        contenders,
        protocol: args.protocol,
        deadline: Duration::from_millis(500),
        seed: args.runner.seed,
    };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let started = std::time::Instant::now();
    let weir_version = weir_version(&config.options.weir_bin);
    let result = runtime.block_on(scenario::run(config, |line| eprintln!("{line}")))?;
    let machine = Machine::probe();
    let markdown = format!(
        "{}- weir: {weir_version}\n\n{}\n{}",
        machine.markdown(),
        report::overload_markdown(&result),
        bench_cli::run_footer(started)
    );
    let out = args.runner.out_dir(workspace.join("tests/bench/out"))?;
    let json = serde_json::json!({ "machine": machine, "weir": weir_version, "result": result });
    bench_cli::write_report(&out, "overload", &json, &markdown)?;
    let plots = weir_harness::plot::write_all(&result, &out)?;
    println!("{markdown}");
    eprintln!("wrote {}/overload.{{json,md}} and {}", out.display(), plots.join(", "));
    Ok(())
}

/// `weir --version` and the binary's modification time, to say which build was measured.
fn weir_version(bin: &std::path::Path) -> String {
    let version = std::process::Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let built = std::fs::metadata(bin)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or("?".into(), |d| format!("{} (unix)", d.as_secs()));
    format!("{} {version}, built {built}", bin.display())
}
