//! The fairness benchmark (see BENCHMARKS.md, "Fairness"):
//! `cargo build --release -p proxy --bin weir -p weir-tests && target/release/fairness-bench`
//!
//! The `weir` binary as an entry sidecar, one business class, 3x the app's capacity, a few
//! hundred users whose levels are re-keyed every few seconds; the balanced and the
//! independent re-key schedules side by side over the same number of periods.

use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

use weir_harness::backend::BackendConfig;
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
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// The `weir` binary [default: target/release/weir next to this program].
    #[arg(long)]
    weir_bin: Option<PathBuf>,
    /// Where JSON, markdown and the SVG go [default: tests/bench/out/fairness].
    #[arg(long)]
    out: Option<PathBuf>,
}

fn parse_app(text: &str) -> anyhow::Result<BackendConfig> {
    let (workers, ms) = text
        .split_once('x')
        .ok_or_else(|| anyhow::anyhow!("app `{text}`: expected WORKERSxMS, e.g. 4x20"))?;
    Ok(BackendConfig::new(
        workers.trim().parse()?,
        Duration::from_secs_f64(ms.trim().parse::<f64>()? / 1000.0),
    ))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let weir_bin = args.weir_bin.clone().unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|d| d.join("weir")))
            .filter(|p| p.is_file())
            .unwrap_or_else(|| workspace.join("target/release/weir"))
    });
    anyhow::ensure!(
        weir_bin.is_file(),
        "{} not found (build it: `cargo build --release -p proxy --bin weir`, or pass --weir-bin)",
        weir_bin.display()
    );
    anyhow::ensure!(args.rekey_secs >= 1, "--rekey-secs must be at least 1");
    anyhow::ensure!(
        args.cycle_periods >= 1 && args.cycles >= 1,
        "--cycle-periods and --cycles must be at least 1 (weir refuses more than 1024 periods)"
    );
    let config = FairnessConfig {
        weir_bin,
        app: parse_app(&args.app)?,
        load: args.load,
        users: args.users,
        users_round_robin: !args.random_users,
        rekey_every: Duration::from_secs(args.rekey_secs),
        cycle_periods: args.cycle_periods,
        cycles: args.cycles,
        lead_in: Duration::from_secs(args.lead_in_secs),
        schedules: args.schedules.clone(),
        deadline: Duration::from_millis(500),
        seed: args.seed,
    };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let started = std::time::Instant::now();
    let result = runtime.block_on(fairness::run(config, |line| eprintln!("{line}")))?;
    let machine = Machine::probe();
    let markdown = format!(
        "{}\n{}\nRun took {:.0} s: `{}`\n",
        machine.markdown(),
        fairness::markdown(&result),
        started.elapsed().as_secs_f64(),
        std::env::args().collect::<Vec<_>>().join(" ")
    );
    let out = args.out.clone().unwrap_or_else(|| workspace.join("tests/bench/out/fairness"));
    std::fs::create_dir_all(&out)?;
    let json = serde_json::json!({ "machine": machine, "result": result });
    std::fs::write(out.join("fairness.json"), serde_json::to_vec_pretty(&json)?)?;
    std::fs::write(out.join("fairness.md"), &markdown)?;
    fairness::plot(&result, &out.join("fairness.svg"))?;
    println!("{markdown}");
    eprintln!("wrote {}/fairness.{{json,md,svg}}", out.display());
    Ok(())
}
