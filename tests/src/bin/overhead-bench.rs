//! Proxy overhead, side by side in one run (see BENCHMARKS.md, "Proxy overhead"):
//!
//! ```sh
//! cargo build --release -p proxy --bin weir -p weir-tests --bin overhead-bench
//! ./target/release/overhead-bench            # direct, nginx, HAProxy, weir
//! ./target/release/overhead-bench --quick    # 3 s x 1 round: a smoke run
//! # Fast app, one worker thread (issue 20): weir's shipped defaults (`weir-defaults`)
//! # against nginx-as-proxy, in front of nginx returning 2 bytes (HTTP/1.1 only) and the
//! # zero-work app (h2c), after an 8-connection warm-up:
//! ./target/release/overhead-bench --fast-app
//! ```
//!
//! `--fast-app` is `--apps nginx,rust --contenders nginx,weir-defaults --workloads
//! http1-c32,h2c-c32x10 --warmup-connections 8 --rounds 5 --seconds 5` (wrk -t1 -c32;
//! h2load -t1 -c32 -m10), the HTTP/1.1 workload only against the nginx app.
//!
//! Layout on a 2-core machine: every proxy runs alone on CPU 1 (`taskset -c 1`, one
//! worker/thread each); the client and the app share CPU 0. Every round measures every
//! workload on every contender (the contender order rotates each round), each contender
//! freshly started; the report shows each metric's median over the rounds, as a ratio to
//! nginx's in the same workload.

use clap::Parser;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use weir_harness::bench_cli;
use weir_harness::contender::{self, Contender, Kind};
use weir_harness::load::Protocol;
use weir_harness::noharm::nginx_app::{Listener, NginxApp};
use weir_harness::overhead::{self, BodySize, ClientResult, Measurement, WeirReading, Workload};
use weir_harness::procfs;
use weir_harness::prom::Metrics;
use weir_harness::report::Machine;

/// Who stands between the client and the app.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Who {
    Direct,
    Nginx,
    Haproxy,
    /// weir, `threads: 1`, `max_inflight: 1024`.
    Weir,
    /// weir's shipped defaults (adaptive limit on, `app_protocol: auto`), `threads: 1`.
    WeirDefaults,
}

impl Who {
    fn label(self) -> &'static str {
        match self {
            Who::WeirDefaults => "weir-defaults",
            other => other.kind().label(),
        }
    }

    fn kind(self) -> Kind {
        match self {
            Who::Direct => Kind::Direct,
            Who::Nginx => Kind::Nginx,
            Who::Haproxy => Kind::Haproxy,
            Who::Weir | Who::WeirDefaults => Kind::Weir,
        }
    }
}

/// The app behind the proxies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum App {
    /// The zero-work Rust app: HTTP/1.1 and h2c on one port.
    Rust,
    /// nginx answering `200 ok` (2 bytes), HTTP/1.1 only.
    Nginx,
}

impl App {
    fn label(self) -> &'static str {
        match self {
            App::Rust => "rust",
            App::Nginx => "nginx",
        }
    }
}

#[derive(Parser, Debug)]
#[command(about = "Proxy overhead: direct, nginx, HAProxy and weir, one pinned worker each")]
struct Args {
    /// One short round: a smoke run (3 s per measurement unless --seconds).
    #[arg(long)]
    quick: bool,
    /// Seconds of load per measurement (default 10).
    #[arg(long)]
    seconds: Option<u64>,
    /// Interleaved rounds (default 3).
    #[arg(long)]
    rounds: Option<usize>,
    /// Workloads: `http1-cN`, `h2c-cN`, with `-4k` for a 4 KiB POST answered with 4 KiB.
    #[arg(
        long,
        value_delimiter = ',',
        default_values = ["http1-c64", "http1-c8", "http1-c64-4k", "http1-c8-4k", "h2c-c64", "h2c-c64-4k"]
    )]
    workloads: Vec<String>,
    #[arg(
        long,
        value_delimiter = ',',
        default_values = ["direct", "nginx", "haproxy", "weir"]
    )]
    contenders: Vec<Who>,
    /// The apps behind the proxies, each measured in turn.
    #[arg(long, value_delimiter = ',', default_values = ["rust"])]
    apps: Vec<App>,
    /// Warm each contender up with this many connections (default: the workload's own).
    #[arg(long)]
    warmup_connections: Option<usize>,
    /// Seconds of warm-up before each measurement.
    #[arg(long, default_value_t = 0.5)]
    warmup_secs: f64,
    /// The fast-app comparison of issue 20 (see the module documentation).
    #[arg(long)]
    fast_app: bool,
    /// HTTP/1.1 client: wrk when installed (default), or the built-in Rust client.
    #[arg(long)]
    rust_client: bool,
    /// The weir binary (default: `weir` next to this binary, else target/release/weir).
    #[arg(long)]
    weir_bin: Option<PathBuf>,
    #[arg(long)]
    out: Option<PathBuf>,
    /// Internal: serve the zero-work app on this address (port 0: any; the bound address is
    /// the first line on stdout) and never return.
    #[arg(long, hide = true)]
    serve_backend: Option<SocketAddr>,
}

fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if let Some(addr) = args.serve_backend {
        return serve_backend(addr);
    }
    if args.fast_app {
        args.apps = vec![App::Nginx, App::Rust];
        args.contenders = vec![Who::Nginx, Who::WeirDefaults];
        args.workloads = vec!["http1-c32".into(), "h2c-c32x10".into()];
        args.warmup_connections = Some(8);
        args.rounds = Some(args.rounds.unwrap_or(5));
        args.seconds = Some(args.seconds.unwrap_or(5));
    }
    let workloads = args
        .workloads
        .iter()
        .map(|w| Workload::parse(w).map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let weir_bin = args.weir_bin.clone().unwrap_or_else(|| bench_cli::default_weir_bin(&workspace));
    let out = args.out.clone().unwrap_or_else(|| workspace.join("tests/bench/out"));
    let seconds = args.seconds.unwrap_or(if args.quick { 3 } else { 10 });
    let rounds = args.rounds.unwrap_or(if args.quick { 1 } else { 3 });
    let taskset = contender::require("taskset")?;
    let wrk = if args.rust_client { None } else { contender::require("wrk").ok() };
    if wrk.is_none() && !args.rust_client {
        eprintln!("wrk not found (apt-get install -y wrk): using the built-in Rust client");
    }
    let h2load = if args.rust_client { None } else { contender::require("h2load").ok() };
    if h2load.is_none() && !args.rust_client && workloads.iter().any(|w| w.streams.is_some()) {
        eprintln!("h2load not found (apt-get install -y nghttp2-client): using the Rust client");
    }
    let mut contenders = Vec::new();
    for who in args.contenders.iter().copied() {
        let missing = match who.kind() {
            Kind::Nginx => contender::require("nginx").err(),
            Kind::Haproxy => contender::require("haproxy").err(),
            k if k.is_weir() && !weir_bin.is_file() => Some(anyhow::anyhow!(
                "{} not found: `cargo build --release -p proxy --bin weir`",
                weir_bin.display()
            )),
            _ => None,
        };
        match missing {
            Some(e) => eprintln!("skipping {}: {e}", who.label()),
            None => contenders.push(who),
        }
    }
    eprintln!(
        "overhead-bench: {} apps x {} workloads x {} contenders x {rounds} rounds x {seconds} s; weir = {}; load average {}",
        args.apps.len(),
        workloads.len(),
        contenders.len(),
        weir_bin.display(),
        bench_cli::loadavg(),
    );
    let loadavg_before = bench_cli::loadavg();
    // The client (this process, or wrk) and the app live on CPU 0; proxies on CPU 1.
    let own_pid = std::process::id().to_string();
    Command::new(&taskset)
        .args(["-a", "-p", "-c", "0", &own_pid])
        .stdout(Stdio::null())
        .status()?;
    let scripts = tempfile::tempdir()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let warmup = Warmup {
        connections: args.warmup_connections,
        duration: Duration::from_secs_f64(args.warmup_secs.max(0.0)),
    };
    let measured = runtime.block_on(async {
        let mut all = Vec::new();
        for &app in &args.apps {
            let (backend_addr, _backend) = start_app(app, &taskset).await?;
            for round in 0..rounds {
            let mut order = contenders.clone();
            let turns = round % order.len().max(1);
            order.rotate_left(turns);
            for &workload in &workloads {
                if args.fast_app && app == App::Rust && workload.protocol == Protocol::Http1 {
                    // The fast-app comparison's HTTP/1.1 case is against the nginx app only.
                    continue;
                }
                for &who in &order {
                    let use_wrk =
                        if workload.protocol == Protocol::Http1 { wrk.clone() } else { None };
                    let use_h2load = if workload.streams.is_some() { h2load.clone() } else { None };
                    let m = measure(
                        who,
                        workload,
                        backend_addr,
                        &weir_bin,
                        Clients { wrk: use_wrk, h2load: use_h2load, scripts: scripts.path() },
                        warmup,
                        seconds,
                    )
                    .await?;
                    eprintln!(
                        "{} round {} {:<13} {:<13} {:>8.0} rps  p50 {:.3} ms  p99 {:.3} ms  cpu/req {}  rss {} / {} MB{}{}",
                        app.label(),
                        round + 1,
                        workload.label(),
                        who.label(),
                        m.result.rps,
                        m.result.p50_ms,
                        m.result.p99_ms,
                        m.cpu_us_per_request.map_or("-".into(), |c| format!("{c:.1} us")),
                        m.idle_rss_mb.map_or("-".into(), |r| format!("{r:.1}")),
                        m.loaded_rss_mb.map_or("-".into(), |r| format!("{r:.1}")),
                        if m.result.errors > 0 {
                            format!("  ERRORS {} (503: {})", m.result.errors, m.result.refused)
                        } else {
                            String::new()
                        },
                        m.weir_after.as_ref().map_or(String::new(), |w| format!(
                            "  limit {} level {} overloaded {} shed overload {} deadline {}",
                            w.max_inflight, w.level, w.overloaded, w.shed_overload, w.shed_deadline
                        )),
                    );
                    all.push(Measurement { round: round + 1, app: app.label().into(), ..m });
                }
            }
            }
        }
        anyhow::Ok(all)
    });
    let measured = measured?;
    let summaries = overhead::summarise(&measured);
    let machine = Machine::probe();
    let client = format!(
        "{} (HTTP/1.1), {} (h2c)",
        if wrk.is_some() { "wrk -t1" } else { "the Rust client" },
        if h2load.is_some() {
            "h2load -t1 (cNxM workloads), the Rust client (16 streams per connection otherwise)"
        } else {
            "the Rust client"
        }
    );
    let warm = match warmup.connections {
        Some(c) => format!("{} s warm-up with {c} connections", warmup.duration.as_secs_f64()),
        None => {
            format!("{} s warm-up with the workload's connections", warmup.duration.as_secs_f64())
        }
    };
    let markdown = format!(
        "{}- load average before / after: {} / {}\n- client: {client}; {warm}; {seconds} s x {rounds} rounds, median of each metric\n\n{}\n`{}`\n",
        machine.markdown(),
        loadavg_before,
        bench_cli::loadavg(),
        overhead::markdown(&summaries),
        std::env::args().collect::<Vec<_>>().join(" ")
    );
    std::fs::create_dir_all(&out)?;
    let json = serde_json::json!({ "machine": machine, "summaries": summaries, "all": measured });
    std::fs::write(out.join("overhead.json"), serde_json::to_vec_pretty(&json)?)?;
    std::fs::write(out.join("overhead.md"), &markdown)?;
    println!("{markdown}");
    Ok(())
}

/// The external clients available for this measurement.
struct Clients<'a> {
    wrk: Option<PathBuf>,
    h2load: Option<PathBuf>,
    scripts: &'a Path,
}

/// How each contender is warmed up before it is measured.
#[derive(Clone, Copy)]
struct Warmup {
    connections: Option<usize>,
    duration: Duration,
}

async fn measure(
    who: Who,
    workload: Workload,
    backend: SocketAddr,
    weir_bin: &Path,
    clients: Clients<'_>,
    warmup: Warmup,
    seconds: u64,
) -> anyhow::Result<Measurement> {
    let kind = who.kind();
    let opts = contender::Options {
        weir_bin: weir_bin.to_path_buf(),
        max_inflight: 1024,
        weir_max_inflight: Some(1024),
        pin_cpu: (kind != Kind::Direct).then_some(1),
        protocol: workload.protocol,
        queue_timeout: Duration::from_millis(500),
    };
    let proxy = match who {
        Who::WeirDefaults => start_weir_defaults(weir_bin, backend).await?,
        _ => Contender::start(kind, backend, &opts).await?,
    };
    let pid = proxy.pid();
    let idle_rss = pid.and_then(procfs::rss_bytes);
    // A warm-up so pools, caches, allocators (and weir's adaptive limit) are in their
    // working state: the issue's case warms up with fewer connections than it measures.
    let warm =
        Workload { connections: warmup.connections.unwrap_or(workload.connections), ..workload };
    if !warmup.duration.is_zero() {
        let _ = overhead::closed_loop(proxy.addr, warm, warmup.duration).await?;
    }
    let cpu_before = pid.and_then(procfs::cpu_time);
    let (result, client) = match (&clients.wrk, &clients.h2load) {
        (Some(wrk), _) => (run_wrk(wrk, proxy.addr, workload, clients.scripts, seconds)?, "wrk"),
        (None, Some(h2load)) => {
            (run_h2load(h2load, proxy.addr, workload, clients.scripts, seconds)?, "h2load")
        }
        (None, None) => (
            overhead::closed_loop(proxy.addr, workload, Duration::from_secs(seconds)).await?,
            "rust",
        ),
    };
    let cpu_after = pid.and_then(procfs::cpu_time);
    let loaded_rss = pid.and_then(procfs::rss_bytes);
    let weir_after = match proxy.admin {
        Some(admin) => weir_status(admin).await,
        None => None,
    };
    let cpu_us_per_request = match (cpu_before, cpu_after) {
        (Some(a), Some(b)) if result.requests > 0 => {
            Some((b - a).as_secs_f64() * 1e6 / result.requests as f64)
        }
        _ => None,
    };
    let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
    Ok(Measurement {
        round: 0,
        app: String::new(),
        workload,
        contender: who.label().into(),
        client: client.into(),
        result,
        cpu_us_per_request,
        idle_rss_mb: idle_rss.map(mb),
        loaded_rss_mb: loaded_rss.map(mb),
        weir_after,
    })
}

/// weir's shipped defaults (only the addresses, one worker thread), pinned to CPU 1 like
/// every proxy here.
async fn start_weir_defaults(weir_bin: &Path, app: SocketAddr) -> anyhow::Result<Contender> {
    let yaml = format!(
        "inbound:\n  listen: 127.0.0.1:0\n  app: {app}\n  threads: 1\nadmin:\n  listen: 127.0.0.1:0\nlog:\n  filter: warn\n"
    );
    let weir = Contender::weir_with_config(weir_bin, &yaml).await?;
    if let Some(pid) = weir.pid() {
        // Every thread it has (they are all started by now), and those it starts later
        // inherit the affinity.
        Command::new(contender::require("taskset")?)
            .args(["-a", "-p", "-c", "1", &pid.to_string()])
            .stdout(Stdio::null())
            .status()?;
    }
    Ok(weir)
}

async fn weir_status(admin: SocketAddr) -> Option<WeirReading> {
    use http_body_util::BodyExt;
    let client = weir_harness::status::admin_client();
    let sample = weir_harness::status::fetch(&client, admin, 0.0).await?;
    // Why it refused (h2load and wrk only see 503s).
    let metrics = async {
        let uri = format!("http://{admin}/metrics").parse::<http::Uri>().ok()?;
        let response = client.get(uri).await.ok()?;
        let body = response.into_body().collect().await.ok()?.to_bytes();
        Some(Metrics::parse(&String::from_utf8_lossy(&body)))
    };
    let metrics = tokio::time::timeout(Duration::from_secs(1), metrics).await.ok().flatten();
    let shed = |outcome: &str| {
        metrics.as_ref().map_or(0, |m| m.sum("weir_requests_total", "inbound", outcome) as u64)
    };
    Some(WeirReading {
        max_inflight: sample.doc.max_inflight,
        level: sample.doc.level,
        overloaded: sample.doc.overloaded,
        shed_overload: shed("shed_overload"),
        shed_deadline: shed("shed_deadline"),
    })
}

/// The app, on CPU 0 with the client: the zero-work app as a child process of this
/// program, or nginx.
async fn start_app(
    app: App,
    taskset: &Path,
) -> anyhow::Result<(SocketAddr, Box<dyn std::any::Any>)> {
    match app {
        App::Rust => {
            let child = Command::new(taskset)
                .args(["-c", "0"])
                .arg(std::env::current_exe()?)
                .arg("--serve-backend")
                .arg("127.0.0.1:0")
                .stdout(Stdio::piped())
                .spawn()?;
            let mut child = KillOnDrop(child);
            let addr = read_bound_addr(&mut child.0)?;
            Ok((addr, Box::new(child)))
        }
        App::Nginx => {
            let nginx = NginxApp::start(Listener::Http1, Some(0))?;
            Ok((nginx.addr, Box::new(nginx)))
        }
    }
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run_h2load(
    h2load: &Path,
    target: SocketAddr,
    workload: Workload,
    scripts: &Path,
    seconds: u64,
) -> anyhow::Result<ClientResult> {
    let log = scripts.join("h2load.log");
    let _ = std::fs::remove_file(&log);
    let mut command = Command::new("taskset");
    command.args(["-c", "0"]).arg(h2load).args([
        "-t1".to_string(),
        format!("-c{}", workload.connections),
        format!("-m{}", workload.streams.unwrap_or(16)),
        format!("-D{seconds}"),
        format!("--log-file={}", log.display()),
    ]);
    if workload.body == BodySize::Kib4 {
        // The 4 KiB POST: h2load sends a file's bytes as the body.
        let body = scripts.join("body-4k");
        std::fs::write(&body, vec![b'x'; overhead::BODY_4K])?;
        command.arg("-d").arg(body);
    }
    let output = command.arg(format!("http://{target}{}", workload.path())).output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    overhead::parse_h2load(&text, &log_text)
        .ok_or_else(|| anyhow::anyhow!("could not read h2load's output: {text}"))
}

fn run_wrk(
    wrk: &Path,
    target: SocketAddr,
    workload: Workload,
    scripts: &Path,
    seconds: u64,
) -> anyhow::Result<ClientResult> {
    let mut command = Command::new("taskset");
    command.args(["-c", "0"]).arg(wrk).args([
        "-t1",
        &format!("-c{}", workload.connections),
        &format!("-d{seconds}s"),
        "--latency",
    ]);
    if let Some(script) = workload.wrk_script() {
        let path = scripts.join(format!("{}.lua", workload.label()));
        std::fs::write(&path, script)?;
        command.arg("-s").arg(path);
    }
    let output = command.arg(format!("http://{target}{}", workload.path())).output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    overhead::parse_wrk(&text).ok_or_else(|| anyhow::anyhow!("could not read wrk's output: {text}"))
}

/// The address the `--serve-backend` child bound: the first line it prints (a bounded wait:
/// the read ends when it exits).
fn read_bound_addr(child: &mut Child) -> anyhow::Result<SocketAddr> {
    use std::io::BufRead as _;
    let stdout = child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line)?;
    line.trim().parse().map_err(|_| anyhow::anyhow!("the app did not report its address: {line:?}"))
}

fn serve_backend(addr: SocketAddr) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        // The parent reads the port from here; nothing else is printed.
        println!("{}", listener.local_addr()?);
        overhead::serve_zero_work(listener).await?;
        anyhow::Ok(())
    })
}
