//! Proxy overhead, side by side in one run (see BENCHMARKS.md, "Proxy overhead"):
//!
//! ```sh
//! cargo build --release -p proxy --bin weir -p weir-tests --bin overhead-bench
//! ./target/release/overhead-bench            # direct, nginx, HAProxy, weir
//! ./target/release/overhead-bench --quick    # 3 s x 1 round: a smoke run
//! ```
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
use weir_harness::overhead::{self, ClientResult, Measurement, Workload};
use weir_harness::procfs;
use weir_harness::report::Machine;

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
    contenders: Vec<Kind>,
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
    let args = Args::parse();
    if let Some(addr) = args.serve_backend {
        return serve_backend(addr);
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
    let mut contenders = Vec::new();
    for kind in args.contenders.iter().copied() {
        let missing = match kind {
            Kind::Nginx => contender::require("nginx").err(),
            Kind::Haproxy => contender::require("haproxy").err(),
            k if k.is_weir() && !weir_bin.is_file() => Some(anyhow::anyhow!(
                "{} not found: `cargo build --release -p proxy --bin weir`",
                weir_bin.display()
            )),
            _ => None,
        };
        match missing {
            Some(e) => eprintln!("skipping {}: {e}", kind.label()),
            None => contenders.push(kind),
        }
    }
    eprintln!(
        "overhead-bench: {} workloads x {} contenders x {rounds} rounds x {seconds} s; weir = {}",
        workloads.len(),
        contenders.len(),
        weir_bin.display()
    );
    // The client (this process, or wrk) and the app live on CPU 0; proxies on CPU 1.
    let own_pid = std::process::id().to_string();
    Command::new(&taskset)
        .args(["-a", "-p", "-c", "0", &own_pid])
        .stdout(Stdio::null())
        .status()?;
    let mut backend = Command::new(&taskset)
        .args(["-c", "0"])
        .arg(std::env::current_exe()?)
        .arg("--serve-backend")
        .arg("127.0.0.1:0")
        .stdout(Stdio::piped())
        .spawn()?;
    let backend_addr = read_bound_addr(&mut backend)?;
    let scripts = tempfile::tempdir()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let measured = runtime.block_on(async {
        wait_listening(backend_addr, &mut backend).await?;
        let mut all = Vec::new();
        for round in 0..rounds {
            let mut order = contenders.clone();
            let turns = round % order.len().max(1);
            order.rotate_left(turns);
            for &workload in &workloads {
                for &kind in &order {
                    let use_wrk =
                        if workload.protocol == Protocol::Http1 { wrk.clone() } else { None };
                    let m = measure(
                        kind,
                        workload,
                        backend_addr,
                        &weir_bin,
                        use_wrk,
                        scripts.path(),
                        seconds,
                    )
                    .await?;
                    eprintln!(
                        "round {} {:<13} {:<13} {:>8.0} rps  p50 {:.3} ms  p99 {:.3} ms  cpu/req {}  rss {} / {} MB{}",
                        round + 1,
                        workload.label(),
                        kind.label(),
                        m.result.rps,
                        m.result.p50_ms,
                        m.result.p99_ms,
                        m.cpu_us_per_request.map_or("-".into(), |c| format!("{c:.1} us")),
                        m.idle_rss_mb.map_or("-".into(), |r| format!("{r:.1}")),
                        m.loaded_rss_mb.map_or("-".into(), |r| format!("{r:.1}")),
                        if m.result.errors > 0 {
                            format!("  ERRORS {}", m.result.errors)
                        } else {
                            String::new()
                        },
                    );
                    all.push(Measurement { round: round + 1, ..m });
                }
            }
        }
        anyhow::Ok(all)
    });
    let _ = backend.kill();
    let _ = backend.wait();
    let measured = measured?;
    let summaries = overhead::summarise(&measured);
    let machine = Machine::probe();
    let client = if wrk.is_some() {
        "wrk -t1 (HTTP/1.1), the Rust client (h2c: 16 streams per connection)"
    } else {
        "the Rust client (h2c: 16 streams per connection)"
    };
    let markdown = format!(
        "{}- client: {client}; {seconds} s x {rounds} rounds, median of each metric\n\n{}\n`{}`\n",
        machine.markdown(),
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

async fn measure(
    kind: Kind,
    workload: Workload,
    backend: SocketAddr,
    weir_bin: &Path,
    wrk: Option<PathBuf>,
    scripts: &Path,
    seconds: u64,
) -> anyhow::Result<Measurement> {
    let opts = contender::Options {
        weir_bin: weir_bin.to_path_buf(),
        max_inflight: 1024,
        weir_max_inflight: Some(1024),
        pin_cpu: (kind != Kind::Direct).then_some(1),
        protocol: workload.protocol,
        queue_timeout: Duration::from_millis(500),
    };
    let proxy = Contender::start(kind, backend, &opts).await?;
    let pid = proxy.pid();
    let idle_rss = pid.and_then(procfs::rss_bytes);
    // A short warm-up so pools, caches and allocators are in their working state.
    let _ = overhead::closed_loop(proxy.addr, workload, Duration::from_millis(500)).await?;
    let cpu_before = pid.and_then(procfs::cpu_time);
    let result = match &wrk {
        Some(wrk) => run_wrk(wrk, proxy.addr, workload, scripts, seconds)?,
        None => overhead::closed_loop(proxy.addr, workload, Duration::from_secs(seconds)).await?,
    };
    let cpu_after = pid.and_then(procfs::cpu_time);
    let loaded_rss = pid.and_then(procfs::rss_bytes);
    let cpu_us_per_request = match (cpu_before, cpu_after) {
        (Some(a), Some(b)) if result.requests > 0 => {
            Some((b - a).as_secs_f64() * 1e6 / result.requests as f64)
        }
        _ => None,
    };
    let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
    Ok(Measurement {
        round: 0,
        workload,
        contender: kind.label().into(),
        client: if wrk.is_some() { "wrk".into() } else { "rust".into() },
        result,
        cpu_us_per_request,
        idle_rss_mb: idle_rss.map(mb),
        loaded_rss_mb: loaded_rss.map(mb),
    })
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

/// Bounded poll until the app process accepts connections.
async fn wait_listening(addr: SocketAddr, child: &mut Child) -> anyhow::Result<()> {
    for _ in 0..500 {
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("app exited early: {status}");
        }
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    anyhow::bail!("app did not listen on {addr} within 5 s")
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
