//! The no-harm benchmark (see BENCHMARKS.md, "No harm"): weir's shipped defaults against
//! direct in front of healthy apps, a middle hop with the egress role on, and the first
//! requests after an overload and a second of silence.
//!
//! ```sh
//! cargo build --release -p proxy --bin weir -p weir-tests --bin noharm-bench
//! target/release/noharm-bench --quick              # a few minutes
//! target/release/noharm-bench                      # the full grid, 2 interleaved rounds
//! target/release/noharm-bench --weir-bin ../loop/target/release/weir --out /tmp/loop
//! ```

use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

use weir_harness::bench_cli::{self, parse_mix, BenchRun, RunnerArgs};
use weir_harness::load::Protocol;
use weir_harness::noharm::{
    self,
    async_middle_hop::{AsyncMiddleHopConfig, Variant as AsyncVariant},
    middle_hop::MiddleHopConfig,
    silence::SilenceConfig,
    AppCase, LoadCase, NoHarmConfig,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Part {
    /// Apps x loads, weir against direct.
    Grid,
    MiddleHop,
    /// A healthy async middle hop whose level spares its light route (not in the default
    /// parts: `--parts async-middle-hop`).
    AsyncMiddleHop,
    Silence,
}

#[derive(Parser, Debug)]
#[command(about = "No harm: weir's shipped defaults against direct, in front of healthy apps")]
struct Args {
    /// A few minutes: 4 apps, 4 s runs, 1 round, shorter middle hop.
    #[arg(long)]
    quick: bool,
    #[arg(long, value_delimiter = ',', default_values = ["grid", "middle-hop", "silence"])]
    parts: Vec<Part>,
    /// Apps instead of the built-in grid: `nginx` or WORKERSxMS, each with the standard
    /// loads (0.1x, 0.5x, 0.9x, on/off, idle-then-burst).
    #[arg(long, value_delimiter = ',')]
    apps: Option<Vec<String>>,
    /// Only these loads of each app [default: all]: `steady0.1`, `steady0.5`, `steady0.9`,
    /// `on-off`, `idle-burst` (a focused A/B of one case, e.g. `--apps 1x1 --loads
    /// steady0.9 --rounds 5`).
    #[arg(long, value_delimiter = ',')]
    loads: Option<Vec<String>>,
    /// The rate nginx's loads are multiples of (nginx itself serves far more; this is what
    /// the open-loop generator offers comfortably on this machine).
    #[arg(long, default_value_t = 4000.0)]
    nginx_rps: f64,
    /// Seconds of each steady / on-off run [default: 10; --quick 4].
    #[arg(long)]
    run_secs: Option<f64>,
    /// Seconds at the start of each run not counted [default: 2; --quick 1].
    #[arg(long)]
    warmup_secs: Option<f64>,
    /// Interleaved rounds per case [default: 2; --quick 1].
    #[arg(long)]
    rounds: Option<usize>,
    /// The callers' protocol.
    #[arg(long, value_enum, default_value_t = Protocol::Http1)]
    protocol: Protocol,
    /// Class mix critical/normal/background in percent.
    #[arg(long, default_value = "10/30/60")]
    mix: String,
    /// Extra lines under weir's `inbound:` (default: none, the shipped defaults), e.g.
    /// "  max_inflight: 8\n" to compare a hand-set limit.
    #[arg(long, default_value = "")]
    weir_inbound: String,
    /// Async middle hop: X's work at A before its call (ms).
    #[arg(long, default_value_t = 2.0)]
    amh_x_work_ms: f64,
    /// Async middle hop: Y's work at A (ms).
    #[arg(long, default_value_t = 50.0)]
    amh_y_work_ms: f64,
    /// Async middle hop: Y's rate in its bursts (rps).
    #[arg(long, default_value_t = 800.0)]
    amh_y_burst_rps: f64,
    /// Async middle hop: the variants to run [default: all].
    #[arg(long, value_enum, value_delimiter = ',')]
    amh_variants: Option<Vec<AsyncVariant>>,
    #[command(flatten)]
    runner: RunnerArgs,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let weir_bin = args.runner.weir_bin(&workspace)?;
    let secs = |s: f64| Duration::from_secs_f64(s);
    let run = secs(args.run_secs.unwrap_or(if args.quick { 4.0 } else { 10.0 }));
    let warmup = secs(args.warmup_secs.unwrap_or(if args.quick { 1.0 } else { 2.0 }));
    let rounds = args.rounds.unwrap_or(if args.quick { 1 } else { 2 });
    let mut apps: Vec<AppCase> = match &args.apps {
        Some(list) => {
            list.iter().map(|a| parse_app(a, args.nginx_rps)).collect::<anyhow::Result<_>>()?
        }
        None if args.quick => noharm::quick_apps(args.nginx_rps),
        None => noharm::full_apps(args.nginx_rps),
    };
    if let Some(wanted) = &args.loads {
        for name in wanted {
            anyhow::ensure!(
                LOAD_NAMES.contains(&name.as_str()),
                "--loads: unknown load {name:?} (one of {})",
                LOAD_NAMES.join(", ")
            );
        }
        for app in &mut apps {
            app.loads.retain(|l| wanted.iter().any(|w| w == load_name(l)));
        }
    }
    let wants = |p: Part| args.parts.contains(&p);
    let mut weir_inbound = args.weir_inbound.replace("\\n", "\n");
    if !weir_inbound.is_empty() && !weir_inbound.ends_with('\n') {
        weir_inbound.push('\n');
    }
    let (mh_run, mh_warmup) =
        if args.quick { (secs(8.0), secs(3.0)) } else { (secs(20.0), secs(5.0)) };
    let out = args.runner.out_dir(workspace.join("tests/bench/out/noharm"))?;
    let config = NoHarmConfig {
        apps: if wants(Part::Grid) { apps } else { vec![] },
        run,
        warmup,
        rounds,
        protocol: args.protocol,
        mix: parse_mix(&args.mix)?,
        seed: args.runner.seed,
        middle_hop: wants(Part::MiddleHop)
            .then(|| MiddleHopConfig::issue_20(mh_run, mh_warmup, args.runner.seed)),
        async_middle_hop: wants(Part::AsyncMiddleHop).then(|| {
            let (run, warmup) = if args.quick { (12.0, 2.0) } else { (20.0, 2.0) };
            AsyncMiddleHopConfig {
                x_work: secs(args.amh_x_work_ms / 1000.0),
                y_work: secs(args.amh_y_work_ms / 1000.0),
                y_burst_rps: args.amh_y_burst_rps,
                variants: args.amh_variants.clone().unwrap_or_else(|| AsyncVariant::ALL.to_vec()),
                keep_logs: Some(out.clone()),
                ..AsyncMiddleHopConfig::standard(secs(run), secs(warmup), args.runner.seed)
            }
        }),
        silence: wants(Part::Silence)
            .then(|| SilenceConfig { seed: args.runner.seed, ..SilenceConfig::default() }),
        weir_extra: weir_inbound,
        weir_bin,
    };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let bench = BenchRun::start();
    eprintln!(
        "noharm-bench: load average {}; weir = {}",
        bench.loadavg_before(),
        config.weir_bin.display()
    );
    let result = runtime.block_on(noharm::run(config, |line| eprintln!("{line}")))?;
    let markdown = bench.report(&out, "noharm", &result, &noharm::markdown(&result))?;
    let plots = noharm::write_plots(&result, &out)?;
    println!("{markdown}");
    eprintln!("wrote {}/noharm.{{json,md}} and {}", out.display(), plots.join(", "));
    Ok(())
}

/// The names `--loads` accepts.
const LOAD_NAMES: [&str; 5] = ["steady0.1", "steady0.5", "steady0.9", "on-off", "idle-burst"];

/// A load's `--loads` name (a steady load of another multiple matches none).
fn load_name(load: &LoadCase) -> &'static str {
    match *load {
        LoadCase::Steady { multiple: 0.1 } => "steady0.1",
        LoadCase::Steady { multiple: 0.5 } => "steady0.5",
        LoadCase::Steady { multiple: 0.9 } => "steady0.9",
        LoadCase::Steady { .. } => "steady",
        LoadCase::OnOff { .. } => "on-off",
        LoadCase::IdleBurst { .. } => "idle-burst",
    }
}

/// `nginx` or `WORKERSxMS`, with the standard loads.
fn parse_app(text: &str, nginx_rps: f64) -> anyhow::Result<AppCase> {
    let standard = |workers: usize| {
        vec![
            LoadCase::Steady { multiple: 0.1 },
            LoadCase::Steady { multiple: 0.5 },
            LoadCase::Steady { multiple: 0.9 },
            LoadCase::OnOff { multiple: 1.5, on_ms: 500, off_ms: 500 },
            LoadCase::idle_burst_for(workers),
        ]
    };
    if text == "nginx" {
        return Ok(AppCase::nginx(nginx_rps, standard(64)));
    }
    let app = bench_cli::parse_app(text)?;
    Ok(AppCase::model(app.workers, app.service_time, standard(app.workers)))
}
