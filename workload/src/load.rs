//! Open-loop load: requests arrive as a Poisson process whatever the target does, the way
//! users do, so a slow target builds a queue instead of slowing the load down.
//!
//! Each request belongs to a business class (weighted mix) and a user (uniform over a
//! population, each user with a fixed user priority); it carries the priority headers of
//! docs/design.md ("Wire contract"), a relative deadline (`x-request-timeout-ms`) and the
//! absolute one the capacity backend reads ([`crate::DEADLINE_HEADER`]). The client gives up at the
//! deadline. Latency is measured from the scheduled arrival, so a stalled sender cannot
//! hide queuing (no coordinated omission).

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp};
use serde::Serialize;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

mod recorder;
#[cfg(test)]
mod tests;

pub use recorder::{
    ClassReport, Ending, Event, LoadReport, Outcome, Recorder, SecondReport, UserEvent,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Http1,
    H2c,
}

#[derive(Clone, Debug, Serialize)]
pub struct ClassSpec {
    pub name: String,
    pub business: u8,
    /// Share of the arrivals (weights are normalised).
    pub weight: f64,
}

/// A stretch of constant offered load.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Phase {
    pub rate_per_sec: f64,
    #[serde(serialize_with = "crate::ser_secs")]
    pub duration: Duration,
}

#[derive(Clone, Debug)]
pub struct LoadSpec {
    pub target: SocketAddr,
    pub protocol: Protocol,
    pub phases: Vec<Phase>,
    pub classes: Vec<ClassSpec>,
    pub users: u32,
    /// Send `x-user-id` (for an entry sidecar to hash).
    pub send_user_id: bool,
    /// Send precomputed `x-business-priority` / `x-user-priority`.
    pub send_priority_headers: bool,
    pub deadline: Duration,
    /// How long past `deadline` the client still waits for an answer before it gives up
    /// (zero: it gives up at the deadline). A grace shows how late a proxy answers a
    /// request whose budget ran out.
    pub client_grace: Duration,
    /// Requests sent before this offset count in the series but not in the steady totals.
    pub warmup: Duration,
    pub seed: u64,
    pub path: String,
    /// Per class (in `classes` order), a path instead of `path`: an entry sidecar's
    /// priority table classifies by path and ignores the priority headers sent. Empty: all
    /// classes use `path`.
    pub class_paths: Vec<String>,
    /// Users take turns (request `k` is user `k mod users`) instead of being drawn at
    /// random, so every user sends the same number of requests in any stretch of time: a
    /// per-user comparison then measures the proxy, not the draw.
    pub users_round_robin: bool,
}

impl LoadSpec {
    /// Three classes and defaults shared by the benchmarks and the demo.
    pub fn new(target: SocketAddr, phases: Vec<Phase>) -> Self {
        LoadSpec {
            target,
            protocol: Protocol::Http1,
            phases,
            classes: default_classes(),
            users: 1000,
            send_user_id: true,
            send_priority_headers: true,
            deadline: Duration::from_millis(500),
            client_grace: Duration::ZERO,
            warmup: Duration::ZERO,
            seed: 7,
            path: "/work".into(),
            class_paths: Vec::new(),
            users_round_robin: false,
        }
    }

    pub fn duration(&self) -> Duration {
        self.phases.iter().map(|p| p.duration).sum()
    }
}

/// 10% critical (b=0), 30% normal (b=1), 60% background (b=2): the critical class alone
/// stays inside capacity up to 10x overload.
pub fn default_classes() -> Vec<ClassSpec> {
    classes_with_shares([0.1, 0.3, 0.6])
}

/// critical (b=0), normal (b=1) and background (b=2) in the given shares.
pub fn classes_with_shares(shares: [f64; 3]) -> Vec<ClassSpec> {
    ["critical", "normal", "background"]
        .into_iter()
        .zip(shares)
        .enumerate()
        .map(|(business, (name, weight))| ClassSpec {
            name: name.into(),
            business: business as u8,
            weight,
        })
        .collect()
}

/// A load run in progress; [`LoadRun::recorder`] can be read live.
pub struct LoadRun {
    recorder: Arc<Recorder>,
    task: tokio::task::JoinHandle<()>,
}

impl LoadRun {
    pub fn start(spec: LoadSpec) -> anyhow::Result<Self> {
        anyhow::ensure!(!spec.classes.is_empty(), "load needs at least one class");
        anyhow::ensure!(spec.users > 0, "load needs at least one user");
        anyhow::ensure!(spec.target.ip().is_loopback(), "load targets 127.0.0.1 only");
        let recorder = Arc::new(Recorder::new(&spec));
        let task = tokio::spawn(generate(spec, recorder.clone()));
        Ok(LoadRun { recorder, task })
    }

    pub fn recorder(&self) -> &Arc<Recorder> {
        &self.recorder
    }

    /// Waits for the last arrival and for every request to finish (each is bounded by
    /// its deadline), then reports.
    pub async fn finish(self) -> anyhow::Result<LoadReport> {
        self.task.await?;
        Ok(self.recorder.report())
    }
}

/// Runs the load to completion.
pub async fn run(spec: LoadSpec) -> anyhow::Result<LoadReport> {
    LoadRun::start(spec)?.finish().await
}

struct Request {
    class: usize,
    user: u32,
    user_priority: u8,
    scheduled: Instant,
}

async fn generate(spec: LoadSpec, recorder: Arc<Recorder>) {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(spec.protocol == Protocol::H2c)
        .pool_max_idle_per_host(usize::MAX)
        .build(connector);
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed);
    let user_priorities: Vec<u8> = (0..spec.users).map(|_| rng.random_range(0..128)).collect();
    let total_weight: f64 = spec.classes.iter().map(|c| c.weight.max(0.0)).sum();
    let spec = Arc::new(spec);
    // Each in-flight request holds a sender; when all are dropped, everything finished.
    let (done_tx, mut done_rx) = tokio::sync::mpsc::channel::<()>(1);

    let start = recorder.start();
    let mut phase_start = start;
    let mut sent = 0u64;
    for phase in spec.phases.iter() {
        let phase_end = phase_start + phase.duration;
        let mut next = phase_start;
        let gaps = Exp::new(phase.rate_per_sec).ok().filter(|_| phase.rate_per_sec > 0.0);
        while let Some(gaps) = gaps.as_ref() {
            next += Duration::from_secs_f64(gaps.sample(&mut rng));
            if next >= phase_end {
                break;
            }
            tokio::time::sleep_until(next).await;
            let user = if spec.users_round_robin {
                (sent % u64::from(spec.users)) as u32
            } else {
                rng.random_range(0..spec.users)
            };
            sent += 1;
            let request = Request {
                class: pick_class(&spec.classes, total_weight, rng.random::<f64>()),
                user,
                user_priority: user_priorities[user as usize],
                scheduled: next,
            };
            let (client, spec, recorder, done) =
                (client.clone(), spec.clone(), recorder.clone(), done_tx.clone());
            tokio::spawn(async move {
                let sent_unix_us = crate::unix_micros();
                let outcome = send(&client, &spec, &request).await;
                recorder.record_user(request.user, sent_unix_us, &outcome);
                recorder.record(request.class, request.scheduled, Instant::now(), outcome);
                drop(done);
            });
        }
        tokio::time::sleep_until(phase_end).await;
        phase_start = phase_end;
    }
    drop(done_tx);
    let _ = done_rx.recv().await;
}

fn pick_class(classes: &[ClassSpec], total_weight: f64, draw: f64) -> usize {
    let mut point = draw * total_weight;
    for (i, class) in classes.iter().enumerate() {
        point -= class.weight.max(0.0);
        if point < 0.0 {
            return i;
        }
    }
    classes.len() - 1
}

async fn send(
    client: &Client<HttpConnector, Empty<Bytes>>,
    spec: &LoadSpec,
    r: &Request,
) -> Outcome {
    // The budget left at send time (the sender may run a little behind schedule).
    let remaining = (r.scheduled + spec.deadline).saturating_duration_since(Instant::now());
    let path = spec.class_paths.get(r.class).unwrap_or(&spec.path);
    let mut builder = http::Request::get(format!("http://{}{path}", spec.target))
        .header("x-request-timeout-ms", remaining.as_millis() as u64)
        .header(crate::DEADLINE_HEADER, crate::unix_micros() + remaining.as_micros() as u64);
    if spec.send_priority_headers {
        builder = builder
            .header("x-business-priority", u16::from(spec.classes[r.class].business))
            .header("x-user-priority", u16::from(r.user_priority));
    }
    if spec.send_user_id {
        builder = builder.header("x-user-id", format!("user-{}", r.user));
    }
    let Ok(request) = builder.body(Empty::new()) else { return Outcome::Error };
    let exchange = async {
        let response = client.request(request).await?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await?;
        Ok::<_, anyhow::Error>((parts, body.trailers().cloned()))
    };
    match tokio::time::timeout_at(r.scheduled + spec.deadline + spec.client_grace, exchange).await {
        Err(_) => Outcome::TimedOut,
        Ok(Err(_)) => Outcome::Error,
        Ok(Ok((parts, trailers))) => Outcome::classify(&parts, trailers.as_ref()),
    }
}
