//! Deterministic overload simulation through the real admission engine.
//!
//! `cargo run --release -p admission-core --example simulate -- --load 3 --law dagor`
//! `... -- --step 0.5,3,0.5 --seconds 90 --json`

mod sim;

use std::process::ExitCode;
use std::time::Duration;

use admission_core::{EngineConfig, Law};
use clap::Parser;

#[derive(Parser)]
#[command(about = "Simulate a sidecar + app under Poisson overload through the real engine")]
struct Args {
    /// Offered load as a multiple of capacity (ignored with --step).
    #[arg(long, default_value_t = 3.0)]
    load: f64,
    /// Load phases of equal length, e.g. `0.5,3,0.5`.
    #[arg(long, value_delimiter = ',')]
    step: Option<Vec<f64>>,
    /// Control law.
    #[arg(long, value_enum, default_value = "goodput")]
    law: LawArg,
    /// Number of equal business classes (0 is the most important).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(1..=255))]
    classes: u8,
    #[arg(long, default_value_t = 60)]
    seconds: u32,
    #[arg(long, default_value_t = 32)]
    workers: u32,
    /// Service time per request, milliseconds.
    #[arg(long, default_value_t = 10)]
    service_ms: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the summary (with every window) as JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LawArg {
    Dagor,
    Goodput,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let phases = args.step.unwrap_or_else(|| vec![args.load]);
    if phases.is_empty() || phases.iter().any(|l| !(l.is_finite() && *l >= 0.0)) {
        eprintln!("error: loads must be finite and non-negative");
        return ExitCode::from(64);
    }
    if args.workers == 0 || args.service_ms == 0 || (args.seconds as usize) < phases.len() {
        eprintln!("error: need workers > 0, service-ms > 0 and at least one second per phase");
        return ExitCode::from(64);
    }
    let law = match args.law {
        LawArg::Dagor => Law::Dagor,
        LawArg::Goodput => Law::Goodput,
    };
    let cfg = sim::SimConfig {
        workers: args.workers,
        service: Duration::from_millis(args.service_ms),
        phases,
        seconds: args.seconds,
        classes: args.classes,
        seed: args.seed,
        engine: EngineConfig { law, ..EngineConfig::default() },
        ..sim::SimConfig::default()
    };
    let summary = sim::run(&cfg);
    if args.json {
        match serde_json::to_string_pretty(&summary) {
            Ok(json) => println!("{json}"),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
        return ExitCode::SUCCESS;
    }
    println!("  sec  load  offered admitted completed dropped  queue_ms  level    cap/s ovl");
    for w in &summary.windows {
        println!(
            "{:5} {:5.2} {:8} {:8} {:9} {:7} {:9.1}  {:7} {:6.0} {}",
            w.second,
            w.load,
            w.offered,
            w.admitted,
            w.completed,
            w.gate_dropped,
            w.mean_queuing_ms,
            w.level,
            w.capacity_estimate.unwrap_or(0.0),
            if w.overloaded { "*" } else { "" }
        );
    }
    let s = &summary;
    println!(
        "\nlaw {} capacity {:.0}/s phases {:?}; steady from second {}",
        s.law, s.capacity_per_sec, s.phases, s.steady_from
    );
    println!("goodput/capacity   {:.4}", s.goodput_ratio);
    println!(
        "shed fraction      {:.4} (ideal {:.4}, error {:+.2} pp)",
        s.shed_fraction, s.ideal_shed_fraction, s.shed_error_pp
    );
    println!("oscillation        {:.4} (stddev admitted/window / capacity)", s.oscillation);
    println!("mean queuing       {:.1} ms", s.mean_queuing_ms);
    let per_phase: Vec<String> = s.phase_oscillation.iter().map(|o| format!("{o:.4}")).collect();
    println!("oscillation/phase  {}", per_phase.join(", "));
    let settle: Vec<String> = s
        .settle_windows
        .iter()
        .map(|w| w.map_or_else(|| "never".to_string(), |w| w.to_string()))
        .collect();
    println!("settle windows     {} (per step)", settle.join(", "));
    for c in &s.classes {
        println!(
            "class {:3}          success {:.4} (offered {:.2}x capacity)",
            c.business, c.success, c.load
        );
    }
    ExitCode::SUCCESS
}
