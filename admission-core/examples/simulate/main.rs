//! Deterministic overload simulation through the real admission engine, adaptive limit
//! and deadline gate.
//!
//! `cargo run --release -p admission-core --example simulate -- --step 0.5,3,0.5 --seconds 45 --compare`
//! `... -- --load 3 --law capacity --workers 8 --service-ms 20 --json`

mod sim;

use std::process::ExitCode;
use std::time::Duration;

use admission_core::{EngineConfig, Law};
use clap::Parser;
use sim::{Inflight, SimConfig, Summary};

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
    #[arg(long, value_enum, default_value = "capacity")]
    law: LawArg,
    /// Run every law with the same seed and print them side by side.
    #[arg(long)]
    compare: bool,
    /// Shares of the business classes, most important first, e.g. `10,30,60`.
    #[arg(long, value_delimiter = ',', default_value = "1,1,1")]
    mix: Vec<f64>,
    #[arg(long, default_value_t = 60)]
    seconds: u32,
    /// The app's concurrency (it queues the rest internally, unbounded).
    #[arg(long, default_value_t = 4)]
    workers: u32,
    /// Service time per request, milliseconds.
    #[arg(long, default_value_t = 10)]
    service_ms: u64,
    /// A fixed in-flight limit (default: adaptive).
    #[arg(long)]
    max_inflight: Option<usize>,
    /// Ceiling of the adaptive in-flight limit.
    #[arg(long, default_value_t = 256)]
    ceiling: usize,
    /// Turn the refusal at the door off.
    #[arg(long)]
    no_door: bool,
    /// Under overload, the longest wait (ms; 0 = off): the door refuses a longer expected
    /// wait, a waiter past it evicts the less important behind it and is then dropped.
    #[arg(long, default_value_t = 30)]
    overload_max_wait_ms: u64,
    /// `from_s,to_s,factor`: multiply the service time meanwhile.
    #[arg(long, value_delimiter = ',')]
    slowdown: Option<Vec<f64>>,
    /// `from_ms,for_ms`: the app answers nothing meanwhile.
    #[arg(long, value_delimiter = ',')]
    stall: Option<Vec<u64>>,
    /// `on_ms,off_ms`: bursts; each phase's load runs for `on_ms`, then nothing arrives for
    /// `off_ms`, repeated (e.g. `--load 1.5 --on-off 500,500`).
    #[arg(long, value_delimiter = ',')]
    on_off: Option<Vec<u64>>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the summary (with every window and the 100 ms trace) as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LawArg {
    Dagor,
    Goodput,
    Capacity,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let phases = args.step.clone().unwrap_or_else(|| vec![args.load]);
    if phases.is_empty() || phases.iter().any(|l| !(l.is_finite() && *l >= 0.0)) {
        eprintln!("error: loads must be finite and non-negative");
        return ExitCode::from(64);
    }
    if args.workers == 0 || args.service_ms == 0 || (args.seconds as usize) < phases.len() {
        eprintln!("error: need workers > 0, service-ms > 0 and at least one second per phase");
        return ExitCode::from(64);
    }
    if args.mix.is_empty()
        || args.mix.len() > 256
        || args.mix.iter().any(|m| !m.is_finite() || *m < 0.0)
    {
        eprintln!("error: --mix needs 1 to 256 non-negative shares");
        return ExitCode::from(64);
    }
    let slowdown = match args.slowdown.as_deref() {
        None => None,
        Some(&[from, to, f]) if from >= 0.0 && to >= from && f > 0.0 => {
            Some((from as u32, to as u32, f))
        }
        Some(_) => {
            eprintln!("error: --slowdown takes from_s,to_s,factor");
            return ExitCode::from(64);
        }
    };
    let stall = match args.stall.as_deref() {
        None => None,
        Some(&[from, len]) => Some((from, len)),
        Some(_) => {
            eprintln!("error: --stall takes from_ms,for_ms");
            return ExitCode::from(64);
        }
    };
    let on_off = match args.on_off.as_deref() {
        None => None,
        Some(&[on, off]) if on > 0 => Some((on, off)),
        Some(_) => {
            eprintln!("error: --on-off takes on_ms,off_ms (on_ms > 0)");
            return ExitCode::from(64);
        }
    };
    let laws: Vec<Law> = if args.compare {
        vec![Law::Capacity, Law::Goodput, Law::Dagor]
    } else {
        vec![match args.law {
            LawArg::Dagor => Law::Dagor,
            LawArg::Goodput => Law::Goodput,
            LawArg::Capacity => Law::Capacity,
        }]
    };
    let runs: Vec<Summary> = laws
        .iter()
        .map(|&law| {
            sim::run(&SimConfig {
                workers: args.workers,
                service: Duration::from_millis(args.service_ms),
                phases: phases.clone(),
                seconds: args.seconds,
                mix: args.mix.clone(),
                seed: args.seed,
                engine: EngineConfig { law, ..EngineConfig::default() },
                inflight: args
                    .max_inflight
                    .map_or(Inflight::Adaptive(args.ceiling), Inflight::Fixed),
                door: !args.no_door,
                overload_max_wait: Duration::from_millis(args.overload_max_wait_ms),
                slowdown,
                stall,
                on_off,
                ..SimConfig::default()
            })
        })
        .collect();
    if args.json {
        match serde_json::to_string_pretty(&runs) {
            Ok(json) => println!("{json}"),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
        return ExitCode::SUCCESS;
    }
    if runs.len() == 1 {
        print_windows(&runs[0]);
    }
    for s in &runs {
        print_summary(s);
    }
    ExitCode::SUCCESS
}

fn print_windows(s: &Summary) {
    println!("  sec  load  offered admitted completed dropped queue_ms  level   limit   cap/s ovl  success/class");
    for w in &s.windows {
        let success: Vec<String> = w.class_success.iter().map(|x| format!("{:.2}", x)).collect();
        println!(
            "{:5} {:5.2} {:8} {:8} {:9} {:7} {:8.1}  {:7} {:5} {:7.0} {:3}  {}",
            w.second,
            w.load,
            w.offered,
            w.admitted,
            w.completed,
            w.gate_dropped,
            w.mean_queuing_ms,
            w.level,
            w.inflight_limit,
            w.capacity_estimate.unwrap_or(0.0),
            if w.overloaded { "*" } else { "" },
            success.join(" ")
        );
    }
}

fn print_summary(s: &Summary) {
    println!(
        "\n== law {} | in-flight {} | capacity {:.0}/s | phases {:?}",
        s.law, s.inflight, s.capacity_per_sec, s.phases
    );
    println!(
        "steady (from second {}): goodput/capacity {:.4}, shed {:.4} (ideal {:.4}, error {:+.2} pp), oscillation {:.4}, mean queuing {:.1} ms",
        s.steady_from, s.goodput_ratio, s.shed_fraction, s.ideal_shed_fraction, s.shed_error_pp, s.oscillation, s.mean_queuing_ms
    );
    let settle: Vec<String> = s
        .settle_windows
        .iter()
        .map(|w| w.map_or_else(|| "never".to_string(), |w| w.to_string()))
        .collect();
    println!("settle windows per step: {}", settle.join(", "));
    for (s, f) in s.strict_settle_s.iter().zip(&s.strict_failures) {
        println!(
            "strict settle: {} (failing spans: {})",
            s.map_or("never".into(), |s| format!("{s:.1} s")),
            f.join(" ")
        );
    }
    println!("phase  load  goodput  refused  timeouts/refusals  p50/p90/p99 ms (from 2nd s)  first cut  all classes >=99% after  limit at end  success per class");
    for (p, (r, l)) in s.phase_reports.iter().zip(&s.phase_end_limit).enumerate() {
        let classes: Vec<String> = r.classes.iter().map(|c| format!("{:.4}", c.success)).collect();
        println!(
            "{:5} {:5.2}  {:7.4}  {:7.4}  {:17.4}  {:6.1}/{:5.1}/{:5.1}             {:>9}  {:>23}  {:12}  {}",
            p,
            r.load,
            r.goodput_ratio,
            r.refused_fraction,
            r.timeout_share,
            r.p50_ms,
            r.p90_ms,
            r.p99_ms,
            r.first_cut_ms.map_or("-".into(), |m| format!("{m} ms")),
            r.recovered_after_s.map_or("never".into(), |m| format!("{m} s")),
            l,
            classes.join(" ")
        );
    }
}
