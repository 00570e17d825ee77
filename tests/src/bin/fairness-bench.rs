//! The fairness benchmark (see BENCHMARKS.md, "Fairness"):
//! `cargo build --release -p proxy --bin weir -p weir-tests && target/release/fairness-bench`
//!
//! The `weir` binary as an entry sidecar, one business class, 3x the app's capacity, a few
//! hundred users whose levels are re-keyed every few seconds; the balanced and the
//! independent re-key schedules side by side over the same number of periods.

use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

use weir_harness::bench_cli::{self, RunnerArgs};
use weir_harness::fairness::{self, FairnessConfig, Schedule};
use weir_harness::report::Machine;

#[derive(Parser, Debug)]
#[command(about = "Fairness between users: balanced vs independent re-key schedules")]
struct Args {
    /// Users of the one business class.
    #[arg(long, default_value_t = 480)]
    users: u32,
    /// Draw each request's user at random instead of letting users take turns.
    #[arg(long)]
    random_users: bool,
    /// Re-key period in seconds.
    #[arg(long, default_value_t = 4)]
    rekey_secs: u64,
    /// Periods per balanced cycle (the per-user spread bound is one of them).
    #[arg(long, default_value_t = 30)]
    cycle_periods: u32,
    /// Measured cycles per schedule.
    #[arg(long, default_value_t = 2)]
    cycles: u32,
    /// Offered load as a multiple of the app's nominal capacity.
    #[arg(long, default_value_t = 3.0)]
    load: f64,
    /// The app as WORKERSxMS.
    #[arg(long, default_value = "4x20")]
    app: String,
    /// Seconds of load before the measured window.
    #[arg(long, default_value_t = 10)]
    lead_in_secs: u64,
    #[arg(long, value_delimiter = ',', default_values = ["balanced", "independent"])]
    schedules: Vec<Schedule>,
    #[command(flatten)]
    runner: RunnerArgs,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let weir_bin = args.runner.weir_bin(&workspace)?;
    anyhow::ensure!(args.rekey_secs >= 1, "--rekey-secs must be at least 1");
    anyhow::ensure!(
        args.cycle_periods >= 1 && args.cycles >= 1,
        "--cycle-periods and --cycles must be at least 1 (weir refuses more than 1024 periods)"
    );
    let config = FairnessConfig {
        weir_bin,
        app: bench_cli::parse_app(&args.app)?,
        load: args.load,
        users: args.users,
        users_round_robin: !args.random_users,
        rekey_every: Duration::from_secs(args.rekey_secs),
        cycle_periods: args.cycle_periods,
        cycles: args.cycles,
        lead_in: Duration::from_secs(args.lead_in_secs),
        schedules: args.schedules.clone(),
        deadline: Duration::from_millis(500),
        seed: args.runner.seed,
    };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let started = std::time::Instant::now();
    let result = runtime.block_on(fairness::run(config, |line| eprintln!("{line}")))?;
    let machine = Machine::probe();
    let markdown = format!(
        "{}\n{}\n{}",
        machine.markdown(),
        fairness::markdown(&result),
        bench_cli::run_footer(started)
    );
    let out = args.runner.out_dir(workspace.join("tests/bench/out/fairness"))?;
    let json = serde_json::json!({ "machine": machine, "result": result });
    bench_cli::write_report(&out, "fairness", &json, &markdown)?;
    fairness::plot(&result, &out.join("fairness.svg"))?;
    println!("{markdown}");
    eprintln!("wrote {}/fairness.{{json,md,svg}}", out.display());
    Ok(())
}
