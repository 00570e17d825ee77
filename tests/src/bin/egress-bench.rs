//! The egress benchmark (see BENCHMARKS.md, "Egress: chain, fan-out, expiry"):
//! `cargo build --release -p proxy --bin weir -p weir-tests && target/release/egress-bench [--quick]`

use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

use weir_harness::bench_cli::{parse_app, parse_mix, BenchRun, RunnerArgs};
use weir_harness::egress_bench::{self, EgressBenchConfig, Suite};

#[derive(Parser, Debug)]
#[command(about = "Egress benchmark: chain, fan-out and expiry through two weir sidecars")]
struct Args {
    /// About a minute in all: 10 s runs (expiry 15 s).
    #[arg(long)]
    quick: bool,
    #[arg(long, value_delimiter = ',', default_values = ["chain", "fanout", "expiry"])]
    suites: Vec<Suite>,
    /// App B (the bottleneck) as WORKERSxMS.
    #[arg(long, default_value = "4x40")]
    app_b: String,
    /// Milliseconds of hashing app A does per request before calling B.
    #[arg(long, default_value_t = 1.0)]
    app_a_ms: f64,
    /// Offered load at B, as a multiple of its capacity (chain and fan-out).
    #[arg(long, default_value_t = 3.0)]
    multiple: f64,
    /// Class mix critical/normal/background in percent.
    #[arg(long, default_value = "10/30/60")]
    mix: String,
    #[command(flatten)]
    runner: RunnerArgs,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let weir_bin = args.runner.weir_bin(&workspace)?;
    let app_b = parse_app(&args.app_b)?;
    anyhow::ensure!(!app_b.service_time.is_zero(), "app B needs a service time");
    let s = Duration::from_secs;
    let (run, warmup, phase, degraded, after) =
        if args.quick { (s(10), s(4), s(4), s(5), s(6)) } else { (s(20), s(5), s(6), s(8), s(10)) };
    let config = EgressBenchConfig {
        suites: args.suites.clone(),
        app_b,
        app_a_work: Duration::from_secs_f64(args.app_a_ms.max(0.0) / 1000.0),
        multiple: args.multiple,
        run,
        warmup,
        expiry_phase: phase,
        expiry_degraded: degraded,
        expiry_after: after,
        expiry_load: 0.6,
        slowdown: 3,
        mix: parse_mix(&args.mix)?,
        seed: args.runner.seed,
        weir_bin,
    };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let bench = BenchRun::start();
    let result = runtime.block_on(egress_bench::run(config, |line| eprintln!("{line}")))?;
    let out = args.runner.out_dir(workspace.join("tests/bench/out/egress"))?;
    let markdown = bench.report(&out, "egress", &result, &egress_bench::markdown(&result))?;
    let plots = egress_bench::write_plots(&result, &out)?;
    println!("{markdown}");
    eprintln!("wrote {}/egress.{{json,md}} and {}", out.display(), plots.join(", "));
    Ok(())
}
