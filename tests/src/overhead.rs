//! Proxy overhead: tiny requests, closed loop, through each contender pinned to one CPU.
//! The client is `wrk` for HTTP/1.1 when installed, else (and always for h2c) the Rust
//! client here.

use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Serialize;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::load::Protocol;

#[cfg(test)]
mod tests;

/// What a closed-loop client measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ClientResult {
    pub requests: u64,
    pub errors: u64,
    pub seconds: f64,
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// `connections` loops of GET, each waiting for its answer before sending the next.
/// h2c multiplexes the loops over `connections / 16` (at least one) connections.
pub async fn closed_loop(
    target: SocketAddr,
    protocol: Protocol,
    connections: usize,
    duration: Duration,
) -> anyhow::Result<ClientResult> {
    anyhow::ensure!(target.ip().is_loopback(), "overhead client targets 127.0.0.1 only");
    let until = Instant::now() + duration;
    let uri: http::Uri = format!("http://{target}/").parse()?;
    let mut tasks = tokio::task::JoinSet::new();
    match protocol {
        Protocol::Http1 => {
            for _ in 0..connections {
                let stream = tokio::net::TcpStream::connect(target).await?;
                stream.set_nodelay(true)?;
                let (sender, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                tokio::spawn(conn);
                tasks.spawn(loop_on(Sender::Http1(sender), uri.clone(), until));
            }
        }
        Protocol::H2c => {
            for _ in 0..connections.div_ceil(16).max(1) {
                let stream = tokio::net::TcpStream::connect(target).await?;
                stream.set_nodelay(true)?;
                let (sender, conn) = hyper::client::conn::http2::handshake(
                    TokioExecutor::new(),
                    TokioIo::new(stream),
                )
                .await?;
                tokio::spawn(conn);
                for _ in 0..16.min(connections) {
                    tasks.spawn(loop_on(Sender::H2(sender.clone()), uri.clone(), until));
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
    Http1(hyper::client::conn::http1::SendRequest<Empty<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Empty<Bytes>>),
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("static histogram bounds are valid")
}

async fn loop_on(mut sender: Sender, uri: http::Uri, until: Instant) -> (Histogram<u64>, u64) {
    let mut latency = histogram();
    let mut errors = 0;
    while Instant::now() < until {
        let Ok(request) = http::Request::get(uri.clone()).body(Empty::<Bytes>::new()) else {
            break;
        };
        let sent = Instant::now();
        let response = match &mut sender {
            Sender::Http1(s) => {
                if s.ready().await.is_err() {
                    break;
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
    (result.rps > 0.0).then_some(result)
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
