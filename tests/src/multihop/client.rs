//! The multi-hop benchmark's clients: open-loop Poisson arrivals of two APIs (X through the
//! bottleneck, Y through the healthy service), three business classes each, a population of
//! users, a budget per attempt, and optionally retries of refusals the way the README's
//! client contract asks (the larger of `retry-after` and an exponential backoff step, with
//! jitter, at most `max_retries` times, the same `x-user-id` on every attempt).
//!
//! Latency is measured from the scheduled arrival (no coordinated omission). Every request
//! is logged once, when its last attempt ended, with the place its last refusal came from
//! (the `x-weir-shed` label the hops put on it, see [`super::app`]) and when it ended, so
//! goodput is counted by completion inside the measured span ([`ClientRun::ok_completed`]):
//! a retried request succeeds seconds after it was scheduled, and counting it at its
//! scheduled time credited the span with work done after the load. No retry starts after the
//! load's end.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp};
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use crate::load::{Ending, Event};

/// The two APIs, in the order their classes are numbered (`api * 3 + class`).
pub const APIS: [&str; 2] = ["x", "y"];
pub const CLASSES: [&str; 3] = ["critical", "normal", "background"];

/// The event class of `api` (0 = X, 1 = Y) and business `class` (0..3).
pub fn event_class(api: usize, class: usize) -> u16 {
    (api * CLASSES.len() + class) as u16
}

/// A stretch of constant offered load: X and Y arrivals per second.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Stretch {
    pub x_rps: f64,
    pub y_rps: f64,
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub duration: Duration,
}

/// How refused requests are retried.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct RetryPolicy {
    /// Retries after the first attempt (DAGOR's experiments: 3).
    pub max_retries: u32,
    /// The first backoff step; step `n` is `base * 2^(n-1)`, at most `cap`.
    #[serde(serialize_with = "crate::report::ser_millis")]
    pub base: Duration,
    #[serde(serialize_with = "crate::report::ser_millis")]
    pub cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { max_retries: 3, base: Duration::from_millis(50), cap: Duration::from_secs(2) }
    }
}

impl RetryPolicy {
    /// Wait before retry number `retry` (1 = the first): the larger of the server's hint and
    /// the backoff step, times a jitter factor in [1, 1.5) so refused clients do not come
    /// back in step.
    pub fn wait(&self, retry: u32, hint: Option<Duration>, rng: &mut impl Rng) -> Duration {
        let step = self.base.saturating_mul(1 << (retry.max(1) - 1).min(16)).min(self.cap);
        let wait = hint.map_or(step, |h| h.max(step));
        wait.mul_f64(rng.random_range(1.0..1.5))
    }
}

#[derive(Clone, Debug)]
pub struct ClientSpec {
    pub target: SocketAddr,
    pub stretches: Vec<Stretch>,
    /// Shares of critical / normal / background, the same for both APIs.
    pub mix: [f64; 3],
    pub users: u32,
    /// Each attempt's budget (`x-request-timeout-ms`); the client gives up at its end.
    pub budget: Duration,
    /// Requests scheduled before this offset are logged but not counted in totals.
    pub warmup: Duration,
    pub seed: u64,
    pub retry: Option<RetryPolicy>,
}

impl ClientSpec {
    pub fn duration(&self) -> Duration {
        self.stretches.iter().map(|s| s.duration).sum()
    }
}

/// How one request (all its attempts) ended.
#[derive(Clone, Debug, Serialize)]
pub struct RequestLog {
    pub api: u8,
    pub class: u8,
    /// Scheduled send of the first attempt, seconds since the start.
    pub at_secs: f64,
    /// From the scheduled send to the last attempt's end.
    pub latency_ms: f64,
    /// The last attempt's end, seconds since the start.
    pub end_secs: f64,
    pub ending: Ending,
    /// Where the last attempt failed (`e-door`, `a-egress-b`, ...; `timeout` when the client
    /// gave up; empty when it succeeded).
    pub place: String,
    pub attempts: u8,
}

impl RequestLog {
    pub fn event(&self) -> Event {
        Event {
            class: event_class(self.api as usize, self.class as usize),
            at_secs: self.at_secs,
            latency_ms: self.latency_ms,
            ending: self.ending,
        }
    }
}

/// What a run of the clients gives back.
#[derive(Clone, Debug, Default)]
pub struct ClientRun {
    pub requests: Vec<RequestLog>,
    /// Attempts' failures by place, every attempt of the counted span (retries included).
    pub attempt_places: BTreeMap<String, u64>,
    pub attempts: u64,
    pub duration_secs: f64,
    pub warmup_secs: f64,
}

impl ClientRun {
    pub fn counted(&self) -> impl Iterator<Item = &RequestLog> {
        let warm = self.warmup_secs;
        self.requests.iter().filter(move |r| r.at_secs >= warm)
    }

    pub fn events(&self) -> Vec<Event> {
        self.requests.iter().map(RequestLog::event).collect()
    }

    pub fn counted_secs(&self) -> f64 {
        (self.duration_secs - self.warmup_secs).max(1e-9)
    }

    /// Requests of `api` that succeeded inside the counted span, whenever they were
    /// scheduled: goodput by completion time (a request scheduled in the warm-up that
    /// succeeds after it counts; one that succeeds after the load's end does not).
    pub fn ok_completed(&self, api: u8) -> u64 {
        let (from, to) = (self.warmup_secs, self.duration_secs);
        self.requests
            .iter()
            .filter(|r| r.api == api && r.ending == Ending::Ok)
            .filter(|r| r.end_secs >= from && r.end_secs <= to)
            .count() as u64
    }
}

/// Per-request headers that let a hop correlate its outbound calls with the inbound
/// request they serve (what a per-route level learns from): the apps forward both.
pub const REQUEST_ID: &str = "x-request-id";
pub const TRACEPARENT: &str = "traceparent";

struct Shared {
    spec: ClientSpec,
    client: Client<HttpConnector, Empty<Bytes>>,
    user_priorities: Vec<u8>,
    start: Instant,
    logs: Mutex<Vec<RequestLog>>,
    attempt_places: Mutex<BTreeMap<String, u64>>,
    attempts: AtomicU64,
}

/// Runs the clients to completion: every arrival of every stretch, then every request's
/// last attempt (each bounded by its budget, retries by `max_retries` waits).
pub async fn run(spec: ClientSpec) -> anyhow::Result<ClientRun> {
    anyhow::ensure!(spec.target.ip().is_loopback(), "clients target 127.0.0.1 only");
    anyhow::ensure!(spec.users > 0, "clients need at least one user");
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client =
        Client::builder(TokioExecutor::new()).pool_max_idle_per_host(usize::MAX).build(connector);
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed);
    let user_priorities = (0..spec.users).map(|_| rng.random_range(0..128u8)).collect();
    let shared = Arc::new(Shared {
        spec: spec.clone(),
        client,
        user_priorities,
        start: Instant::now(),
        logs: Mutex::new(Vec::new()),
        attempt_places: Mutex::new(BTreeMap::new()),
        attempts: AtomicU64::new(0),
    });
    let mut tasks = tokio::task::JoinSet::new();
    let mut stretch_start = shared.start;
    let mut id = 0u64;
    for stretch in &spec.stretches {
        let end = stretch_start + stretch.duration;
        let rate = stretch.x_rps + stretch.y_rps;
        let mut next = stretch_start;
        let gaps = Exp::new(rate).ok().filter(|_| rate.is_finite() && rate > 0.0);
        if let Some(gaps) = gaps {
            loop {
                next += Duration::from_secs_f64(gaps.sample(&mut rng));
                if next >= end {
                    break;
                }
                tokio::time::sleep_until(next).await;
                let api = usize::from(rng.random::<f64>() * rate >= stretch.x_rps);
                let class = pick_class(&spec.mix, rng.random::<f64>());
                let user = rng.random_range(0..spec.users);
                let jitter_seed = rng.random::<u64>();
                id += 1;
                let shared = shared.clone();
                tasks.spawn(async move {
                    shared.request(id, api, class, user, next, jitter_seed).await;
                });
                // Reap finished requests so the set stays as large as what is in flight.
                while tasks.try_join_next().is_some() {}
            }
        }
        tokio::time::sleep_until(end).await;
        stretch_start = end;
    }
    while tasks.join_next().await.is_some() {}
    let logs = std::mem::take(&mut *shared.logs.lock().unwrap_or_else(|e| e.into_inner()));
    let places =
        std::mem::take(&mut *shared.attempt_places.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(ClientRun {
        requests: logs,
        attempt_places: places,
        attempts: shared.attempts.load(Relaxed),
        duration_secs: spec.duration().as_secs_f64(),
        warmup_secs: spec.warmup.as_secs_f64(),
    })
}

fn pick_class(mix: &[f64; 3], draw: f64) -> usize {
    let total: f64 = mix.iter().sum();
    let mut point = draw * total;
    for (i, share) in mix.iter().enumerate() {
        point -= share;
        if point < 0.0 {
            return i;
        }
    }
    mix.len() - 1
}

/// One attempt's result.
enum Attempt {
    Ok,
    /// A refusal (503, or gRPC 8) from `place`, with the server's hint.
    Refused {
        place: String,
        hint: Option<Duration>,
    },
    /// Any other failure (504, 502, an app's own error) from `place`.
    Failed {
        place: String,
    },
    TimedOut,
    Error,
}

impl Shared {
    async fn request(
        &self,
        id: u64,
        api: usize,
        class: usize,
        user: u32,
        scheduled: Instant,
        jitter_seed: u64,
    ) {
        let spec = &self.spec;
        let mut rng = rand::rngs::StdRng::seed_from_u64(jitter_seed);
        let counted = scheduled.duration_since(self.start) >= spec.warmup;
        // Retries stop with the load: one that would start after it is not made.
        let load_end = self.start + spec.duration();
        let mut attempts = 0u8;
        let mut deadline = scheduled + spec.budget;
        let (ending, place) = loop {
            attempts += 1;
            if counted {
                self.attempts.fetch_add(1, Relaxed);
            }
            let result = self.attempt(id, api, class, user, deadline, attempts).await;
            let (ending, place, hint) = match result {
                Attempt::Ok => break (Ending::Ok, String::new()),
                Attempt::Refused { place, hint } => (Ending::Refused, place, Some(hint)),
                Attempt::Failed { place } => (Ending::Error, place, None),
                Attempt::TimedOut => (Ending::TimedOut, "timeout".to_string(), None),
                Attempt::Error => (Ending::Error, "connection".to_string(), None),
            };
            if counted {
                let mut places = self.attempt_places.lock().unwrap_or_else(|e| e.into_inner());
                *places.entry(place.clone()).or_default() += 1;
            }
            // Only refusals are retried: a refusal never reached the app, so retrying it is
            // safe; a timeout or a 504 may still be running somewhere.
            let Some(hint) = hint else { break (ending, place) };
            let Some(policy) = spec.retry else { break (ending, place) };
            let retry = u32::from(attempts);
            if retry > policy.max_retries {
                break (ending, place);
            }
            let wait = policy.wait(retry, hint, &mut rng);
            if Instant::now() + wait >= load_end {
                break (ending, place);
            }
            tokio::time::sleep(wait).await;
            deadline = Instant::now() + spec.budget;
        };
        let log = RequestLog {
            api: api as u8,
            class: class as u8,
            at_secs: scheduled.duration_since(self.start).as_secs_f64(),
            latency_ms: scheduled.elapsed().as_secs_f64() * 1e3,
            end_secs: self.start.elapsed().as_secs_f64(),
            ending,
            place,
            attempts,
        };
        self.logs.lock().unwrap_or_else(|e| e.into_inner()).push(log);
    }

    async fn attempt(
        &self,
        id: u64,
        api: usize,
        class: usize,
        user: u32,
        deadline: Instant,
        attempt: u8,
    ) -> Attempt {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Attempt::TimedOut;
        }
        let path = format!("/{}/{}", APIS[api], CLASSES[class]);
        let builder = http::Request::get(format!("http://{}{path}", self.spec.target))
            .header("x-request-timeout-ms", remaining.as_millis().max(1) as u64)
            .header(crate::DEADLINE_HEADER, crate::unix_micros() + remaining.as_micros() as u64)
            // What a device would claim: an entry sidecar replaces both; HAProxy and the
            // direct graph take the business class as sent.
            .header("x-business-priority", class as u16)
            .header("x-user-priority", u16::from(self.user_priorities[user as usize]))
            .header("x-user-id", format!("user-{user}"))
            .header(REQUEST_ID, format!("{id:016x}-{attempt}"))
            .header(TRACEPARENT, format!("00-{id:032x}-{:016x}-01", u64::from(attempt)));
        let Ok(request) = builder.body(Empty::new()) else { return Attempt::Error };
        let exchange = async {
            let response = self.client.request(request).await?;
            let (parts, body) = response.into_parts();
            body.collect().await?;
            anyhow::Ok(parts)
        };
        let parts = match tokio::time::timeout_at(deadline, exchange).await {
            Err(_) => return Attempt::TimedOut,
            Ok(Err(_)) => return Attempt::Error,
            Ok(Ok(parts)) => parts,
        };
        let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
        let grpc = header("grpc-status");
        let label = header(super::app::SHED);
        match (parts.status.as_u16(), grpc) {
            (200..=299, None | Some("0")) => Attempt::Ok,
            (503, _) | (_, Some("8")) => Attempt::Refused {
                place: super::app::place_of_refusal(label, "client", "e"),
                hint: retry_hint(&parts.headers),
            },
            (status, _) => {
                Attempt::Failed { place: super::app::place_of_error(label, "e", status) }
            }
        }
    }
}

/// `retry-after` (seconds) or `grpc-retry-pushback-ms`, when present and well formed.
pub fn retry_hint(headers: &http::HeaderMap) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(ms) = header("grpc-retry-pushback-ms").and_then(|v| v.trim().parse::<u64>().ok()) {
        return Some(Duration::from_millis(ms));
    }
    header("retry-after").and_then(|v| v.trim().parse::<u64>().ok()).map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_waits_take_the_larger_of_hint_and_step_with_jitter() {
        let policy = RetryPolicy::default();
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for _ in 0..100 {
            let w = policy.wait(1, Some(Duration::from_secs(1)), &mut rng);
            assert!(w >= Duration::from_secs(1) && w < Duration::from_millis(1500), "{w:?}");
            let w = policy.wait(3, None, &mut rng);
            assert!(w >= Duration::from_millis(200) && w < Duration::from_millis(300), "{w:?}");
            let w = policy.wait(3, Some(Duration::from_millis(10)), &mut rng);
            assert!(w >= Duration::from_millis(200), "the step wins over a small hint: {w:?}");
        }
    }

    #[test]
    fn classes_are_drawn_by_share() {
        let mix = [0.1, 0.3, 0.6];
        assert_eq!(pick_class(&mix, 0.05), 0);
        assert_eq!(pick_class(&mix, 0.2), 1);
        assert_eq!(pick_class(&mix, 0.99), 2);
        assert_eq!(event_class(1, 2), 5);
    }

    #[test]
    fn hints_are_read_from_either_header() {
        let mut h = http::HeaderMap::new();
        assert_eq!(retry_hint(&h), None);
        h.insert("retry-after", "2".parse().unwrap());
        assert_eq!(retry_hint(&h), Some(Duration::from_secs(2)));
        h.insert("grpc-retry-pushback-ms", "250".parse().unwrap());
        assert_eq!(retry_hint(&h), Some(Duration::from_millis(250)));
    }
}
