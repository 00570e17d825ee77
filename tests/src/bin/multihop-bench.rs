//! The multi-hop benchmark (see BENCHMARKS.md, "Multi-hop"):
//! `cargo build --release -p proxy --bin weir -p weir-tests --bin multihop-bench && target/release/multihop-bench [--quick]`

use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

use weir_harness::bench_cli::{parse_app, parse_mix, BenchRun, RunnerArgs};
use weir_harness::multihop::{
    self, Apps, MultihopConfig, MultihopHook, RetryPolicy, Suite, Topology,
};

#[derive(Parser, Debug)]
#[command(
    about = "Multi-hop benchmark: entry E -> costly A -> bottleneck B (API X) / healthy C (API Y)"
)]
struct Args {
    /// A few minutes in all: 2 s lead-ins, 8 s runs (3 s not counted), 5 s step phases.
    #[arg(long)]
    quick: bool,
    #[arg(long, value_delimiter = ',', default_values = ["steady", "mk", "step", "retry"])]
    suites: Vec<Suite>,
    #[arg(long, value_delimiter = ',', default_values = ["direct", "inbound", "one-hop", "multihop", "haproxy"])]
    contenders: Vec<Topology>,
    /// App A, the costly middle hop, as WORKERSxMS (MS: its own work per request).
    #[arg(long, default_value = "16x20")]
    app_a: String,
    /// App B, the bottleneck, as WORKERSxMS.
    #[arg(long, default_value = "4x40")]
    app_b: String,
    /// App C, healthy, as WORKERSxMS.
    #[arg(long, default_value = "8x10")]
    app_c: String,
    /// Workers of the gateway app behind the entry (no work of its own).
    #[arg(long, default_value_t = 256)]
    e_workers: usize,
    /// Calls A makes to B per X request in the steady, step and retry runs.
    #[arg(long, default_value_t = 1)]
    k: usize,
    /// API Y's offered load, requests per second.
    #[arg(long, default_value_t = 150.0)]
    y_rps: f64,
    /// Steady loads: X's calls at B as multiples of B's capacity.
    #[arg(long, value_delimiter = ',', default_values = ["1.5", "3", "6"])]
    multiples: Vec<f64>,
    /// M^k: the values of k.
    #[arg(long, value_delimiter = ',', default_values = ["1", "2", "3"])]
    mk: Vec<usize>,
    #[arg(long, default_value_t = 3.0)]
    mk_multiple: f64,
    #[arg(long, value_delimiter = ',', default_values = ["0.5", "3", "0.5"])]
    step: Vec<f64>,
    #[arg(long, default_value_t = 3.0)]
    retry_multiple: f64,
    /// Seconds at 0.5x before each steady, M^k and retry run's load (not counted): the
    /// sidecars have seen ordinary traffic before the overload. 0: a cold start under overload.
    #[arg(long)]
    lead_in: Option<f64>,
    /// Retries of a refused request in the retry suite.
    #[arg(long, default_value_t = 3)]
    retries: u32,
    /// Class mix critical/normal/background in percent (both APIs).
    #[arg(long, default_value = "10/30/60")]
    mix: String,
    /// The per-route multi-hop contender's configuration: YAML merged over each sidecar's
    /// egress config (keys `all`, `e`, `a`, `b`, `c`) [default: none, weir's shipped
    /// defaults, which turn per-route levels on with the egress role].
    #[arg(long)]
    multihop_overlay: Option<PathBuf>,
    /// The `weir` binary for the multi-hop contender [default: --weir-bin].
    #[arg(long)]
    multihop_weir_bin: Option<PathBuf>,
    #[command(flatten)]
    runner: RunnerArgs,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let weir_bin = args.runner.weir_bin(&workspace)?;
    let (a, b, c) = (parse_app(&args.app_a)?, parse_app(&args.app_b)?, parse_app(&args.app_c)?);
    anyhow::ensure!(!b.service_time.is_zero(), "app B needs a service time");
    anyhow::ensure!(!c.service_time.is_zero(), "app C needs a service time");
    anyhow::ensure!(args.k >= 1 && args.mk.iter().all(|k| *k >= 1), "k must be at least 1");
    let multihop = match args.multihop_overlay {
        Some(overlay) => {
            let bin = args.multihop_weir_bin.clone().unwrap_or_else(|| weir_bin.clone());
            anyhow::ensure!(bin.is_file(), "{} not found", bin.display());
            Some(MultihopHook::load(bin, overlay)?)
        }
        // Per-route levels ship on with the egress role: the contender runs the shipped
        // defaults (of --multihop-weir-bin if given).
        None => {
            let bin = args.multihop_weir_bin.clone().unwrap_or_else(|| weir_bin.clone());
            Some(MultihopHook::shipped(bin))
        }
    };
    let s = Duration::from_secs;
    let (run, warmup, step_phase, lead_in) =
        if args.quick { (s(8), s(3), s(5), s(2)) } else { (s(20), s(5), s(10), s(3)) };
    let lead_in = args.lead_in.map_or(lead_in, |secs| Duration::from_secs_f64(secs.max(0.0)));
    let config = MultihopConfig {
        suites: args.suites.clone(),
        contenders: args.contenders.clone(),
        apps: Apps {
            e_workers: args.e_workers,
            a_workers: a.workers,
            a_work: a.service_time,
            b,
            c,
        },
        k: args.k,
        y_rps: args.y_rps,
        multiples: args.multiples.clone(),
        mk: args.mk.clone(),
        mk_multiple: args.mk_multiple,
        step: args.step.clone(),
        step_phase,
        retry_multiple: args.retry_multiple,
        retry: RetryPolicy { max_retries: args.retries, ..RetryPolicy::default() },
        lead_in,
        run,
        warmup,
        mix: parse_mix(&args.mix)?,
        users: 1000,
        budget: Duration::from_millis(500),
        seed: args.runner.seed,
        weir_bin,
        multihop,
    };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let bench = BenchRun::start();
    let result = runtime.block_on(multihop::run(config, |line| eprintln!("{line}")))?;
    let out = args.runner.out_dir(workspace.join("tests/bench/out/multihop"))?;
    let markdown = bench.report(&out, "multihop", &result, &multihop::markdown(&result))?;
    let plots = multihop::write_plots(&result, &out)?;
    println!("{markdown}");
    eprintln!("wrote {}/multihop.{{json,md}} and {}", out.display(), plots.join(", "));
    Ok(())
}
