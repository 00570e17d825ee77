//! Proxy overhead benchmark (see BENCHMARKS.md):
//! `cargo build --release -p proxy && cargo run --release -p weir-tests --bin overhead-bench -- [--quick]`
//!
//! Layout on a 2-core machine: every proxy runs alone on CPU 1 (`taskset -c 1`, one
//! worker/thread each); the client and the backend share CPU 0. Each contender is measured
//! `--rounds` times, interleaved, and the median round is reported.

use clap::Parser;
use serde::Serialize;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use weir_harness::backend::{BackendConfig, CapacityBackend};
use weir_harness::contender::{self, Contender, Kind};
use weir_harness::load::Protocol;
use weir_harness::overhead::{self, ClientResult};
use weir_harness::procfs;
use weir_harness::report::Machine;

#[derive(Parser, Debug)]
#[command(about = "Proxy overhead: weir vs direct, nginx and HAProxy, one pinned worker each")]
struct Args {
    /// One short round per contender.
    #[arg(long)]
    quick: bool,
    /// Seconds of load per measurement.
    #[arg(long)]
    seconds: Option<u64>,
    #[arg(long)]
    rounds: Option<usize>,
    /// Concurrent closed-loop connections (h2c: streams, 16 per connection).
    #[arg(long, default_value_t = 64)]
    connections: usize,
    #[arg(long, value_delimiter = ',', default_values = ["http1", "h2c"])]
    protocols: Vec<Protocol>,
    #[arg(long, value_delimiter = ',', default_values = ["direct", "nginx", "haproxy", "weir"])]
    contenders: Vec<Kind>,
    /// HTTP/1.1 client: wrk when installed (default), or the built-in Rust client.
    #[arg(long)]
    rust_client: bool,
    #[arg(long)]
    weir_bin: Option<PathBuf>,
    #[arg(long)]
    out: Option<PathBuf>,
    /// Internal: serve the zero-work backend on this address and never return.
    #[arg(long, hide = true)]
    serve_backend: Option<SocketAddr>,
}

#[derive(Clone, Debug, Serialize)]
struct Measurement {
    contender: String,
    protocol: Protocol,
    client: String,
    result: ClientResult,
    cpu_us_per_request: Option<f64>,
    idle_rss_mb: Option<f64>,
    loaded_rss_mb: Option<f64>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(addr) = args.serve_backend {
        return serve_backend(addr);
    }
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let weir_bin = args.weir_bin.clone().unwrap_or_else(|| workspace.join("target/release/weir"));
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
                "{} not found: `cargo build --release -p proxy`",
                weir_bin.display()
            )),
            _ => None,
        };
        match missing {
            Some(e) => eprintln!("skipping {}: {e}", kind.label()),
            None => contenders.push(kind),
        }
    }
    // The client (this process, or wrk) and the backend live on CPU 0; proxies on CPU 1.
    let own_pid = std::process::id().to_string();
    Command::new(&taskset)
        .args(["-a", "-p", "-c", "0", &own_pid])
        .stdout(Stdio::null())
        .status()?;
    let backend_addr = contender::free_port()?;
    let mut backend = Command::new(&taskset)
        .args(["-c", "0"])
        .arg(std::env::current_exe()?)
        .arg("--serve-backend")
        .arg(backend_addr.to_string())
        .stdout(Stdio::null())
        .spawn()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let measured = runtime.block_on(async {
        wait_listening(backend_addr, &mut backend).await?;
        let mut all = Vec::new();
        for &protocol in &args.protocols {
            for round in 0..rounds {
                for &kind in &contenders {
                    let opts = contender::Options {
                        weir_bin: weir_bin.clone(),
                        max_inflight: 1024,
        weir_max_inflight: Some(1024),
                        pin_cpu: (kind != Kind::Direct).then_some(1),
                        protocol,
                        queue_timeout: Duration::from_millis(500),
                    };
                    let use_wrk = if protocol == Protocol::Http1 { wrk.clone() } else { None };
                    let m = measure(kind, backend_addr, &opts, use_wrk, &args, seconds).await?;
                    eprintln!(
                        "round {} {:?} {:<13} {:>8.0} rps  p50 {:.3} ms  p99 {:.3} ms  cpu/req {}",
                        round + 1,
                        protocol,
                        kind.label(),
                        m.result.rps,
                        m.result.p50_ms,
                        m.result.p99_ms,
                        m.cpu_us_per_request.map_or("-".into(), |c| format!("{c:.1} us")),
                    );
                    all.push(m);
                }
            }
        }
        anyhow::Ok(all)
    });
    let _ = backend.kill();
    let _ = backend.wait();
    let measured = measured?;
    let medians = medians(&measured);
    let machine = Machine::probe();
    let client = if wrk.is_some() { "wrk (HTTP/1.1), Rust client (h2c)" } else { "Rust client" };
    let markdown = format!(
        "{}- client: {client}, {} connections, {seconds} s x {rounds} rounds (median round shown)\n\n{}\n`{}`\n",
        machine.markdown(),
        args.connections,
        table(&medians),
        std::env::args().collect::<Vec<_>>().join(" ")
    );
    std::fs::create_dir_all(&out)?;
    let json = serde_json::json!({ "machine": machine, "medians": medians, "all": measured });
    std::fs::write(out.join("overhead.json"), serde_json::to_vec_pretty(&json)?)?;
    std::fs::write(out.join("overhead.md"), &markdown)?;
    println!("{markdown}");
    Ok(())
}

async fn measure(
    kind: Kind,
    backend: SocketAddr,
    opts: &contender::Options,
    wrk: Option<PathBuf>,
    args: &Args,
    seconds: u64,
) -> anyhow::Result<Measurement> {
    let proxy = Contender::start(kind, backend, opts).await?;
    let pid = proxy.pid();
    // A short warm-up so pools, caches and allocators are in their working state.
    let _ = overhead::closed_loop(
        proxy.addr,
        opts.protocol,
        args.connections,
        Duration::from_millis(500),
    )
    .await?;
    let idle_rss = pid.and_then(procfs::rss_bytes);
    let cpu_before = pid.and_then(procfs::cpu_time);
    let result = match &wrk {
        Some(wrk) => run_wrk(wrk, proxy.addr, args.connections, seconds)?,
        None => {
            overhead::closed_loop(
                proxy.addr,
                opts.protocol,
                args.connections,
                Duration::from_secs(seconds),
            )
            .await?
        }
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
        contender: kind.label().into(),
        protocol: opts.protocol,
        client: if wrk.is_some() { "wrk".into() } else { "rust".into() },
        result,
        cpu_us_per_request,
        idle_rss_mb: idle_rss.map(mb),
        loaded_rss_mb: loaded_rss.map(mb),
    })
}

fn run_wrk(
    wrk: &PathBuf,
    target: SocketAddr,
    connections: usize,
    seconds: u64,
) -> anyhow::Result<ClientResult> {
    let output = Command::new("taskset")
        .args(["-c", "0"])
        .arg(wrk)
        .args(["-t1", &format!("-c{connections}"), &format!("-d{seconds}s"), "--latency"])
        .arg(format!("http://{target}/"))
        .output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    overhead::parse_wrk(&text).ok_or_else(|| anyhow::anyhow!("could not read wrk's output: {text}"))
}

/// Bounded poll until the backend process accepts connections.
async fn wait_listening(addr: SocketAddr, child: &mut Child) -> anyhow::Result<()> {
    for _ in 0..500 {
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("backend exited early: {status}");
        }
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    anyhow::bail!("backend did not listen on {addr} within 5 s")
}

fn serve_backend(addr: SocketAddr) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let config = BackendConfig::new(1 << 20, Duration::ZERO);
        let _backend = CapacityBackend::start_on(config, addr).await?;
        std::future::pending::<()>().await;
        anyhow::Ok(())
    })
}

/// The median round (by requests/s) of each contender and protocol.
fn medians(all: &[Measurement]) -> Vec<Measurement> {
    let mut keys: Vec<(String, Protocol)> = Vec::new();
    for m in all {
        let key = (m.contender.clone(), m.protocol);
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys.into_iter()
        .filter_map(|(name, protocol)| {
            let mut runs: Vec<&Measurement> =
                all.iter().filter(|m| m.contender == name && m.protocol == protocol).collect();
            runs.sort_by(|a, b| a.result.rps.total_cmp(&b.result.rps));
            runs.get(runs.len() / 2).map(|m| (*m).clone())
        })
        .collect()
}

fn table(medians: &[Measurement]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| protocol | contender | requests/s | p50 | p99 | CPU us/request | RSS idle / loaded | rps vs nginx | CPU vs nginx | rps vs HAProxy | CPU vs HAProxy |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for m in medians {
        let find =
            |name: &str| medians.iter().find(|o| o.contender == name && o.protocol == m.protocol);
        let ratio =
            |other: Option<&Measurement>, f: &dyn Fn(&Measurement) -> Option<f64>| match other
                .and_then(|o| Some((f(m)?, f(o)?)))
            {
                Some((a, b)) if b > 0.0 && m.contender != "direct" => format!("{:.2}", a / b),
                _ => "-".into(),
            };
        let rps = |x: &Measurement| Some(x.result.rps);
        let cpu = |x: &Measurement| x.cpu_us_per_request;
        let rss = match (m.idle_rss_mb, m.loaded_rss_mb) {
            (Some(a), Some(b)) => format!("{a:.1} / {b:.1} MB"),
            _ => "-".into(),
        };
        let _ = writeln!(
            s,
            "| {:?} | {} | {:.0} | {:.3} ms | {:.3} ms | {} | {} | {} | {} | {} | {} |",
            m.protocol,
            m.contender,
            m.result.rps,
            m.result.p50_ms,
            m.result.p99_ms,
            m.cpu_us_per_request.map_or("-".into(), |c| format!("{c:.1}")),
            rss,
            ratio(find("nginx"), &rps),
            ratio(find("nginx"), &cpu),
            ratio(find("haproxy"), &rps),
            ratio(find("haproxy"), &cpu),
        );
    }
    s
}
