//! Proxy overhead: closed-loop load through each contender pinned to one CPU, in several
//! workloads (protocol x connections x body size), and the side-by-side report built from the
//! rounds: per-metric medians, each as a ratio to nginx.
//!
//! The client is `wrk` for HTTP/1.1 when installed, else the Rust client here; for h2c,
//! `h2load` when the workload names its streams per connection (`h2c-c32x10`) and it is
//! installed, else the Rust client. The app is [`serve_zero_work`] (no work, a tiny or a
//! 4 KiB answer; HTTP/1.1 and h2c) or nginx returning 2 bytes (HTTP/1.1 only).

use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Serialize;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::load::Protocol;

#[cfg(test)]
mod tests;

/// Size of the "4k" workload's request and response bodies.
pub const BODY_4K: usize = 4096;

/// The response body of the tiny workload.
const TINY: &[u8] = b"ok";

/// What each request carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BodySize {
    /// `GET /`, answered with 2 bytes.
    Tiny,
    /// `POST /4k` with 4 KiB, answered with 4 KiB.
    Kib4,
}

/// One measured situation: protocol, concurrent closed loops, body size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Workload {
    pub protocol: Protocol,
    /// Closed loops at once (HTTP/1.1: connections; h2c: streams, 16 per connection), or
    /// with `streams`, h2c connections.
    pub connections: usize,
    pub body: BodySize,
    /// h2c: `connections` connections of this many concurrent streams each (`h2c-c32x10`).
    pub streams: Option<usize>,
}

impl Workload {
    /// `http1-c64`, `http1-c8-4k`, `h2c-c64`, ...
    pub fn parse(s: &str) -> Result<Workload, String> {
        let mut parts = s.split('-');
        let protocol = match parts.next() {
            Some("http1") => Protocol::Http1,
            Some("h2c") => Protocol::H2c,
            _ => return Err(format!("{s}: expected http1-cN[-4k] or h2c-cN[-4k]")),
        };
        let count = parts
            .next()
            .and_then(|c| c.strip_prefix('c'))
            .ok_or_else(|| format!("{s}: expected a connection count like c64"))?;
        let (count, streams) = match count.split_once('x') {
            Some((c, m)) if protocol == Protocol::H2c => (c, Some(m)),
            Some(_) => return Err(format!("{s}: streams per connection (cNxM) are for h2c")),
            None => (count, None),
        };
        let connections = count
            .parse::<usize>()
            .ok()
            .filter(|c| *c > 0)
            .ok_or_else(|| format!("{s}: expected a connection count like c64"))?;
        let streams = match streams {
            None => None,
            Some(m) => Some(
                m.parse::<usize>()
                    .ok()
                    .filter(|m| *m > 0)
                    .ok_or_else(|| format!("{s}: expected streams like c32x10"))?,
            ),
        };
        let body = match parts.next() {
            None => BodySize::Tiny,
            Some("4k") => BodySize::Kib4,
            Some(other) => return Err(format!("{s}: unknown body size {other:?} (only 4k)")),
        };
        if parts.next().is_some() {
            return Err(format!("{s}: too many parts"));
        }
        Ok(Workload { protocol, connections, body, streams })
    }

    pub fn label(&self) -> String {
        let protocol = match self.protocol {
            Protocol::Http1 => "http1",
            Protocol::H2c => "h2c",
        };
        let body = match self.body {
            BodySize::Tiny => "",
            BodySize::Kib4 => "-4k",
        };
        let streams = self.streams.map_or(String::new(), |m| format!("x{m}"));
        format!("{protocol}-c{}{streams}{body}", self.connections)
    }

    /// Path the load asks for.
    pub fn path(&self) -> &'static str {
        match self.body {
            BodySize::Tiny => "/",
            BodySize::Kib4 => "/4k",
        }
    }

    /// wrk's Lua script for this workload, if it needs one (the 4 KiB POST).
    pub fn wrk_script(&self) -> Option<String> {
        match self.body {
            BodySize::Tiny => None,
            BodySize::Kib4 => Some(format!(
                "wrk.method = \"POST\"\nwrk.body = string.rep(\"x\", {BODY_4K})\n\
                 wrk.headers[\"Content-Type\"] = \"application/octet-stream\"\n"
            )),
        }
    }

    fn request(&self, uri: &http::Uri) -> Option<http::Request<Full<Bytes>>> {
        match self.body {
            BodySize::Tiny => http::Request::get(uri.clone()).body(Full::new(Bytes::new())).ok(),
            BodySize::Kib4 => http::Request::post(uri.clone())
                .header("content-type", "application/octet-stream")
                .body(Full::new(Bytes::from(vec![b'x'; BODY_4K])))
                .ok(),
        }
    }
}

/// The default workloads: HTTP/1.1 with 64 and 8 connections, tiny and 4 KiB; h2c with 64
/// streams, tiny and 4 KiB.
pub fn default_workloads() -> Vec<Workload> {
    ["http1-c64", "http1-c8", "http1-c64-4k", "http1-c8-4k", "h2c-c64", "h2c-c64-4k"]
        .into_iter()
        .map(|w| Workload::parse(w).expect("built-in workloads parse"))
        .collect()
}

// === the app ===

/// Serves the zero-work app on `listener` forever: HTTP/1.1 and h2c (prior knowledge) on one
/// port; `/4k` answers 4 KiB, anything else 2 bytes; request bodies are read and dropped.
pub async fn serve_zero_work(listener: tokio::net::TcpListener) -> std::io::Result<()> {
    let big = Bytes::from(vec![b'y'; BODY_4K]);
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let big = big.clone();
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let big = big.clone();
                    async move {
                        let body =
                            if req.uri().path() == "/4k" { big } else { Bytes::from_static(TINY) };
                        let _ = req.into_body().collect().await;
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(body)))
                    }
                });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

// === the Rust closed-loop client ===

/// What a closed-loop client measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ClientResult {
    pub requests: u64,
    pub errors: u64,
    /// Of the errors, answers `503` (a proxy's refusals; h2load only: wrk does not say).
    #[serde(default)]
    pub refused: u64,
    pub seconds: f64,
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// `workload.connections` loops, each waiting for its answer before sending the next.
/// h2c multiplexes the loops over `connections / 16` (at least one) connections; with
/// `streams`, `connections` connections of `streams` loops each.
pub async fn closed_loop(
    target: SocketAddr,
    workload: Workload,
    duration: Duration,
) -> anyhow::Result<ClientResult> {
    anyhow::ensure!(target.ip().is_loopback(), "overhead client targets 127.0.0.1 only");
    let until = Instant::now() + duration;
    let uri: http::Uri = format!("http://{target}{}", workload.path()).parse()?;
    let connections = workload.connections;
    let mut tasks = tokio::task::JoinSet::new();
    match workload.protocol {
        Protocol::Http1 => {
            for _ in 0..connections {
                let stream = tokio::net::TcpStream::connect(target).await?;
                stream.set_nodelay(true)?;
                let (sender, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                tokio::spawn(conn);
                tasks.spawn(loop_on(Sender::Http1(sender), workload, uri.clone(), until));
            }
        }
        Protocol::H2c => {
            let (conns, per_conn) = match workload.streams {
                Some(m) => (connections, m),
                None => (connections.div_ceil(16).max(1), 16.min(connections)),
            };
            for _ in 0..conns {
                let stream = tokio::net::TcpStream::connect(target).await?;
                stream.set_nodelay(true)?;
                let (sender, conn) = hyper::client::conn::http2::handshake(
                    TokioExecutor::new(),
                    TokioIo::new(stream),
                )
                .await?;
                tokio::spawn(conn);
                for _ in 0..per_conn {
                    let sender = Sender::H2(sender.clone());
                    tasks.spawn(loop_on(sender, workload, uri.clone(), until));
                }
            }
        }
    }
    let started = Instant::now();
    let mut latency = histogram();
    let mut result = ClientResult::default();
    while let Some(done) = tasks.join_next().await {
        let (h, errors) = done?;
        result.errors += errors;
        latency.add(&h).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    result.seconds = started.elapsed().as_secs_f64().max(duration.as_secs_f64());
    result.requests = latency.len();
    result.rps = result.requests as f64 / result.seconds;
    result.p50_ms = latency.value_at_quantile(0.5) as f64 / 1000.0;
    result.p99_ms = latency.value_at_quantile(0.99) as f64 / 1000.0;
    Ok(result)
}

enum Sender {
    Http1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("static histogram bounds are valid")
}

async fn loop_on(
    mut sender: Sender,
    workload: Workload,
    uri: http::Uri,
    until: Instant,
) -> (Histogram<u64>, u64) {
    let mut latency = histogram();
    let mut errors = 0;
    // hyper's connection-level client sends the URI as given and adds no `Host`; an HTTP/1.1
    // request without one is refused (by nginx with a 400, and by weir).
    let host = uri.authority().and_then(|a| http::HeaderValue::from_str(a.as_str()).ok());
    while Instant::now() < until {
        let Some(mut request) = workload.request(&uri) else { break };
        let sent = Instant::now();
        let response = match &mut sender {
            Sender::Http1(s) => {
                if s.ready().await.is_err() {
                    break;
                }
                if let Some(host) = &host {
                    request.headers_mut().insert(http::header::HOST, host.clone());
                }
                s.send_request(request).await
            }
            Sender::H2(s) => s.send_request(request).await,
        };
        let ok = match response {
            Ok(r) if r.status().is_success() => r.into_body().collect().await.is_ok(),
            _ => false,
        };
        if ok {
            let _ = latency.record((sent.elapsed().as_micros() as u64).max(1));
        } else {
            errors += 1;
            if errors > 1000 {
                break;
            }
        }
    }
    (latency, errors)
}

// === wrk ===

/// Parses `wrk --latency` output.
pub fn parse_wrk(output: &str) -> Option<ClientResult> {
    let mut result = ClientResult::default();
    let mut in_distribution = false;
    for line in output.lines().map(str::trim) {
        if line.starts_with("Latency Distribution") {
            in_distribution = true;
            continue;
        }
        if in_distribution {
            match line.split_whitespace().collect::<Vec<_>>()[..] {
                ["50%", v] => result.p50_ms = wrk_ms(v)?,
                ["99%", v] => result.p99_ms = wrk_ms(v)?,
                [q, _] if q.ends_with('%') => {}
                _ => in_distribution = false,
            }
        }
        if let Some(rest) = line.strip_prefix("Requests/sec:") {
            result.rps = rest.trim().parse().ok()?;
        }
        if let Some((n, rest)) = line.split_once(" requests in ") {
            result.requests = n.trim().parse().ok()?;
            result.seconds = wrk_ms(rest.split(',').next()?.trim())? / 1000.0;
        }
        if let Some(rest) = line.strip_prefix("Non-2xx or 3xx responses:") {
            result.errors += rest.trim().parse::<u64>().unwrap_or(0);
        }
    }
    // wrk counts every answer, refusals included: requests and their rate are the 2xx ones.
    if result.errors > 0 && result.seconds > 0.0 {
        result.requests = result.requests.saturating_sub(result.errors);
        result.rps = result.requests as f64 / result.seconds;
    }
    (result.seconds > 0.0).then_some(result)
}

// === h2load ===

/// Reads `h2load` (duration mode) output and its `--log-file` (one line per request: start
/// in us since the epoch, status, us to the end of the response). Requests counts only
/// those with a status: the ones cut off when the duration ended have none. Statuses other
/// than 2xx are errors (a refusal is a 503); requests/s is the 2xx answers'.
pub fn parse_h2load(output: &str, log: &str) -> Option<ClientResult> {
    let mut result = ClientResult::default();
    for line in output.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("finished in ") {
            let mut parts = rest.split(',');
            result.seconds = wrk_ms(parts.next()?.trim())? / 1000.0;
        }
    }
    let mut latency = histogram();
    for line in log.lines() {
        let mut fields = line.split('\t');
        let (_start, status, us) = (fields.next(), fields.next(), fields.next());
        let Some(status) = status.and_then(|s| s.trim().parse::<i64>().ok()) else { continue };
        let Some(us) = us.and_then(|s| s.trim().parse::<u64>().ok()) else { continue };
        match status {
            200..=299 => {
                let _ = latency.record(us.max(1));
            }
            503 => {
                result.errors += 1;
                result.refused += 1;
            }
            s if s >= 100 => result.errors += 1,
            _ => {}
        }
    }
    result.requests = latency.len();
    // h2load's own req/s counts every answer, refusals included: the rate of 2xx instead.
    result.rps = if result.seconds > 0.0 { result.requests as f64 / result.seconds } else { 0.0 };
    if !latency.is_empty() {
        result.p50_ms = latency.value_at_quantile(0.5) as f64 / 1000.0;
        result.p99_ms = latency.value_at_quantile(0.99) as f64 / 1000.0;
    }
    (result.seconds > 0.0).then_some(result)
}

/// "228.00us", "1.23ms", "10.00s", "1.5m" -> milliseconds.
fn wrk_ms(v: &str) -> Option<f64> {
    let split = v.find(|c: char| c.is_ascii_alphabetic())?;
    let (n, unit) = v.split_at(split);
    let n: f64 = n.parse().ok()?;
    Some(match unit {
        "us" => n / 1000.0,
        "ms" => n,
        "s" => n * 1000.0,
        "m" => n * 60_000.0,
        _ => return None,
    })
}

// === the report ===

/// One contender, one workload, one round.
#[derive(Clone, Debug, Serialize)]
pub struct Measurement {
    pub round: usize,
    /// The app behind the proxies (`rust`: the zero-work app; `nginx`: nginx returning 2
    /// bytes, HTTP/1.1 only).
    #[serde(default)]
    pub app: String,
    pub workload: Workload,
    pub contender: String,
    pub client: String,
    pub result: ClientResult,
    /// The proxy's CPU time (utime + stime, with its children) over requests served.
    pub cpu_us_per_request: Option<f64>,
    /// Right after start, before any request.
    pub idle_rss_mb: Option<f64>,
    /// Right after the measured load.
    pub loaded_rss_mb: Option<f64>,
    /// weir: `/v1/status` right after the measured load.
    pub weir_after: Option<WeirReading>,
}

/// What weir's `/v1/status` said.
#[derive(Clone, Debug, Serialize)]
pub struct WeirReading {
    pub max_inflight: u64,
    pub level: String,
    pub overloaded: bool,
    /// Refusals since start (warm-up included), from `weir_requests_total{role="inbound"}`.
    #[serde(default)]
    pub shed_overload: u64,
    #[serde(default)]
    pub shed_deadline: u64,
}

/// Medians over the rounds of one contender in one workload, each metric on its own.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub app: String,
    pub workload: Workload,
    pub contender: String,
    pub rounds: usize,
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub cpu_us_per_request: Option<f64>,
    pub idle_rss_mb: Option<f64>,
    pub loaded_rss_mb: Option<f64>,
    /// (max - min) / median of requests/s and of CPU per request over the rounds: the noise.
    pub rps_spread: f64,
    pub cpu_spread: Option<f64>,
    pub errors: u64,
    /// Of the errors, 503s (h2load).
    pub refused: u64,
    /// The median over rounds of this round's requests/s (CPU per request) over nginx's in
    /// the same round: a ratio the machine's drift between rounds does not move.
    pub rps_vs_nginx_per_round: Option<f64>,
    pub cpu_vs_nginx_per_round: Option<f64>,
    /// weir: the lowest `max_inflight` read after a round.
    pub weir_min_limit: Option<u64>,
    /// weir: refusals over every round (warm-ups included), by reason.
    pub weir_shed_overload: u64,
    pub weir_shed_deadline: u64,
}

/// The median of `values` (mean of the middle two for an even count); `None` if empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 { v[mid] } else { (v[mid - 1] + v[mid]) / 2.0 })
}

fn spread(values: &[f64]) -> Option<f64> {
    let m = median(values)?;
    let max = values.iter().copied().fold(f64::MIN, f64::max);
    let min = values.iter().copied().fold(f64::MAX, f64::min);
    (m > 0.0).then(|| (max - min) / m)
}

/// Per (app, workload, contender), in first-seen order: the median of every metric.
pub fn summarise(all: &[Measurement]) -> Vec<Summary> {
    let mut keys: Vec<(String, Workload, String)> = Vec::new();
    for m in all {
        let key = (m.app.clone(), m.workload, m.contender.clone());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys.into_iter()
        .map(|(app, workload, contender)| {
            let runs: Vec<&Measurement> = all
                .iter()
                .filter(|m| m.app == app && m.workload == workload && m.contender == contender)
                .collect();
            let of = |f: &dyn Fn(&Measurement) -> Option<f64>| -> Vec<f64> {
                runs.iter().filter_map(|m| f(m)).collect()
            };
            let rps = of(&|m| Some(m.result.rps));
            let cpu = of(&|m| m.cpu_us_per_request);
            // This contender's round against nginx's same round.
            let per_round = |f: &dyn Fn(&Measurement) -> Option<f64>| -> Option<f64> {
                let ratios: Vec<f64> = runs
                    .iter()
                    .filter_map(|m| {
                        let nginx = all.iter().find(|n| {
                            n.round == m.round
                                && n.app == m.app
                                && n.workload == m.workload
                                && n.contender == "nginx"
                        })?;
                        let (a, b) = (f(m)?, f(nginx)?);
                        (b > 0.0).then(|| a / b)
                    })
                    .collect();
                median(&ratios)
            };
            Summary {
                app,
                workload,
                contender,
                rounds: runs.len(),
                rps: median(&rps).unwrap_or(0.0),
                p50_ms: median(&of(&|m| Some(m.result.p50_ms))).unwrap_or(0.0),
                p99_ms: median(&of(&|m| Some(m.result.p99_ms))).unwrap_or(0.0),
                cpu_us_per_request: median(&cpu),
                idle_rss_mb: median(&of(&|m| m.idle_rss_mb)),
                loaded_rss_mb: median(&of(&|m| m.loaded_rss_mb)),
                rps_spread: spread(&rps).unwrap_or(0.0),
                cpu_spread: spread(&cpu),
                errors: runs.iter().map(|m| m.result.errors).sum(),
                refused: runs.iter().map(|m| m.result.refused).sum(),
                rps_vs_nginx_per_round: per_round(&|m| Some(m.result.rps)),
                cpu_vs_nginx_per_round: per_round(&|m| m.cpu_us_per_request),
                weir_min_limit: runs
                    .iter()
                    .filter_map(|m| m.weir_after.as_ref().map(|w| w.max_inflight))
                    .min(),
                weir_shed_overload: runs
                    .iter()
                    .filter_map(|m| m.weir_after.as_ref().map(|w| w.shed_overload))
                    .sum(),
                weir_shed_deadline: runs
                    .iter()
                    .filter_map(|m| m.weir_after.as_ref().map(|w| w.shed_deadline))
                    .sum(),
            }
        })
        .collect()
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "-".into(),
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.digits$}"))
}

/// The side-by-side table: medians, and ratios to nginx in the same app and workload.
pub fn markdown(summaries: &[Summary]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| app | workload | contender | requests/s | p50 | p99 | CPU us/req | RSS idle / loaded MB | \
         rps / nginx | p99 / nginx | CPU / nginx | idle RSS / nginx | per round: rps / CPU vs nginx | \
         spread rps / CPU | weir limit (lowest); refused overload / deadline |"
    );
    let _ =
        writeln!(s, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for m in summaries {
        let nginx = summaries
            .iter()
            .find(|o| o.app == m.app && o.workload == m.workload && o.contender == "nginx");
        let direct = m.contender == "direct";
        let vs = |a: Option<f64>, b: Option<f64>| if direct { "-".into() } else { ratio(a, b) };
        let errors = match (m.errors, m.refused) {
            (0, _) => String::new(),
            (e, 0) => format!(" ({e} errors)"),
            (e, r) => format!(" ({e} errors, {r} of them 503)"),
        };
        let per_round = match (direct, m.rps_vs_nginx_per_round) {
            (false, Some(r)) => format!("{r:.2} / {}", opt(m.cpu_vs_nginx_per_round, 2)),
            _ => "-".into(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {}{} | {:.0} | {:.3} ms | {:.3} ms | {} | {} / {} | {} | {} | {} | {} | {} | {:.0}% / {} | {} |",
            if m.app.is_empty() { "rust" } else { &m.app },
            m.workload.label(),
            m.contender,
            errors,
            m.rps,
            m.p50_ms,
            m.p99_ms,
            opt(m.cpu_us_per_request, 1),
            opt(m.idle_rss_mb, 1),
            opt(m.loaded_rss_mb, 1),
            vs(Some(m.rps), nginx.map(|n| n.rps)),
            vs(Some(m.p99_ms), nginx.map(|n| n.p99_ms)),
            vs(m.cpu_us_per_request, nginx.and_then(|n| n.cpu_us_per_request)),
            vs(m.idle_rss_mb, nginx.and_then(|n| n.idle_rss_mb)),
            per_round,
            m.rps_spread * 100.0,
            m.cpu_spread.map_or("-".into(), |c| format!("{:.0}%", c * 100.0)),
            m.weir_min_limit.map_or("-".into(), |l| {
                format!("{l}; {} / {}", m.weir_shed_overload, m.weir_shed_deadline)
            }),
        );
    }
    s
}
