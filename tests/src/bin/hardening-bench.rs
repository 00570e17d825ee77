//! The hardening benchmark (see BENCHMARKS.md, "Hardening"): issue 17's attacks, each run
//! against a release weir next to a well-behaved caller, the caller's latency unattacked and
//! attacked back to back, weir's fds and RSS.
//!
//! ```sh
//! cargo build --release -p proxy --bin weir -p weir-tests --bin hardening-bench
//! target/release/hardening-bench                          # every attack, ~2 minutes
//! target/release/hardening-bench --attacks validate-flood,idle-h2 --phase-secs 5
//! ```

use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

use weir_harness::bench_cli::{BenchRun, RunnerArgs};
use weir_harness::hardening::{self, AttackKind, HardeningConfig};

#[derive(Parser, Debug)]
#[command(about = "Hardening: issue 17's attacks beside a well-behaved caller, on a release weir")]
struct Args {
    /// The attacks to run [default: all].
    #[arg(long, value_enum, value_delimiter = ',')]
    attacks: Option<Vec<AttackKind>>,
    /// Seconds the caller is measured alone, and again during the attack.
    #[arg(long, default_value_t = 3.0)]
    phase_secs: f64,
    /// Milliseconds between two of the caller's requests.
    #[arg(long, default_value_t = 5)]
    pace_ms: u64,
    /// Run the attackers' tasks on the caller's runtime (two threads shared with the caller)
    /// instead of their own.
    #[arg(long)]
    shared_runtime: bool,
    /// Name of the report files (`<name>.md`, `<name>.json` in --out).
    #[arg(long, default_value = "hardening-latest")]
    name: String,
    #[command(flatten)]
    runner: RunnerArgs,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let config = HardeningConfig {
        attacks: args.attacks.clone().unwrap_or_else(|| AttackKind::ALL.to_vec()),
        phase: Duration::from_secs_f64(args.phase_secs),
        pace: Duration::from_millis(args.pace_ms),
        weir_bin: args.runner.weir_bin(&workspace)?,
        workspace: workspace.clone(),
        shared_runtime: args.shared_runtime,
    };
    // Two workers: the caller and the attackers share them, as the machine's 2 cores.
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let bench = BenchRun::start();
    eprintln!(
        "hardening-bench: load average {}; weir = {}",
        bench.loadavg_before(),
        config.weir_bin.display()
    );
    let results = runtime.block_on(hardening::run(config.clone(), |line| eprintln!("{line}")))?;
    let out = args.runner.out_dir(workspace.join("tests/bench/out"))?;
    let markdown =
        bench.report(&out, &args.name, &results, &hardening::markdown(&results, &config))?;
    println!("{markdown}");
    eprintln!("wrote {}/{}.{{json,md}}", out.display(), args.name);
    Ok(())
}
