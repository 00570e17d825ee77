//! The overload benchmark (see BENCHMARKS.md):
//! `cargo build --release -p proxy && cargo run --release -p weir-tests --bin overload-bench -- [--quick]`

use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

use weir_harness::backend::BackendConfig;
use weir_harness::contender::{self, Kind};
use weir_harness::load::Protocol;
use weir_harness::report::{self, Machine};
use weir_harness::scenario::{self, ScenarioConfig};

#[derive(Parser, Debug)]
#[command(about = "Overload benchmark: direct vs HAProxy vs weir, side by side")]
struct Args {
    /// Short runs (under 2 minutes in all) for a smoke check; numbers are noisier.
    #[arg(long)]
    quick: bool,
    /// Backend workers (W).
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Backend service time in ms (S); capacity = W / S.
    #[arg(long, default_value_t = 20)]
    service_ms: u64,
    /// Burn CPU for the service time instead of sleeping.
    #[arg(long)]
    busy_wait: bool,
    /// The app abandons a request when its connection closes (default: it finishes it).
    #[arg(long)]
    app_cancels: bool,
    /// Offered loads as multiples of the measured capacity
    /// [default: 0.8,1.5,3,6,10; with --quick 0.8,1.5,3,6].
    #[arg(long, value_delimiter = ',')]
    loads: Option<Vec<f64>>,
    #[arg(long, value_delimiter = ',', default_values = ["direct", "haproxy", "weir-dagor", "weir-goodput"])]
    contenders: Vec<Kind>,
    #[arg(long, value_enum, default_value_t = Protocol::Http1)]
    protocol: Protocol,
    /// The `weir` binary (built with `cargo build --release -p proxy`).
    #[arg(long)]
    weir_bin: Option<PathBuf>,
    /// Where JSON, markdown and SVGs go [default: tests/bench/out in the workspace].
    #[arg(long)]
    out: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let weir_bin = args.weir_bin.clone().unwrap_or_else(|| workspace.join("target/release/weir"));
    let mut contenders = args.contenders.clone();
    if contenders.contains(&Kind::Haproxy) {
        if let Err(e) = contender::require("haproxy") {
            eprintln!("skipping haproxy: {e}");
            contenders.retain(|k| *k != Kind::Haproxy);
        }
    }
    if contenders.iter().any(|k| k.is_weir()) && !weir_bin.is_file() {
        eprintln!(
            "skipping weir: {} not found (build it: `cargo build --release -p proxy`)",
            weir_bin.display()
        );
        contenders.retain(|k| !k.is_weir());
    }
    let (load_secs, warmup, step_phase) = if args.quick { (3, 1, 4) } else { (10, 3, 8) };
    let config = ScenarioConfig {
        backend: BackendConfig {
            workers: args.workers,
            service_time: Duration::from_millis(args.service_ms),
            busy_wait: args.busy_wait,
            cancel_on_disconnect: args.app_cancels,
        },
        loads: args.loads.clone().unwrap_or_else(|| {
            if args.quick {
                vec![0.8, 1.5, 3.0, 6.0]
            } else {
                vec![0.8, 1.5, 3.0, 6.0, 10.0]
            }
        }),
        load_duration: Duration::from_secs(load_secs),
        warmup: Duration::from_secs(warmup),
        step: vec![0.5, 3.0, 0.5],
        step_phase: Duration::from_secs(step_phase),
        contenders,
        protocol: args.protocol,
        deadline: Duration::from_millis(500),
        queuing_threshold: Duration::from_millis(20),
        options: contender::Options {
            weir_bin,
            max_inflight: args.workers,
            pin_cpu: None,
            protocol: args.protocol,
            queue_timeout: Duration::from_millis(500),
        },
    };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let started = std::time::Instant::now();
    let result = runtime.block_on(scenario::run(config, |line| eprintln!("{line}")))?;
    let machine = Machine::probe();
    let markdown = format!(
        "{}\n{}\nRun took {:.0} s: `{}`\n",
        machine.markdown(),
        report::overload_markdown(&result),
        started.elapsed().as_secs_f64(),
        std::env::args().collect::<Vec<_>>().join(" ")
    );
    let out = args.out.clone().unwrap_or_else(|| workspace.join("tests/bench/out"));
    std::fs::create_dir_all(&out)?;
    let json = serde_json::json!({ "machine": machine, "result": result });
    std::fs::write(out.join("overload.json"), serde_json::to_vec_pretty(&json)?)?;
    std::fs::write(out.join("overload.md"), &markdown)?;
    weir_harness::plot::write_all(&result, &out)?;
    println!("{markdown}");
    eprintln!("wrote {}/overload.{{json,md}}, goodput.svg, classes.svg, step.svg", out.display());
    Ok(())
}
