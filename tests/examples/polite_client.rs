//! A polite client: what the README's client contract asks of an app or a device calling a
//! service behind weir, in real code (hyper + tokio).
//!
//! - A refusal is a signal, not an error: `503` with `retry-after` (HTTP), or
//!   `grpc-status: 8` with `grpc-retry-pushback-ms` (gRPC), never reached the app, so it is
//!   safe to retry (even a POST) — but no sooner than the server asked.
//! - Never an immediate retry: every retry waits at least `base`. Retry `n` waits the larger
//!   of the server's hint and the backoff step `base * 2^(n-1)` (at most `cap`), with jitter
//!   so refused clients do not come back in step: a hint is waited in full plus up to 50%,
//!   a bare backoff step is drawn from its upper half ("equal jitter").
//! - A `502`/`504` (gRPC 14/4) or no answer may mean the app is still working: it is retried
//!   with backoff only because this example's calls are idempotent (see `call`).
//! - Bounded: at most `max_attempts`, and never past the caller's own budget (a retry that
//!   could only start after it is not made); each attempt carries the budget left in
//!   `x-request-timeout-ms`. A negative pushback means "do not retry".
//! - A per-session breaker: after `breaker_after` calls in a row that ended refused or
//!   failed (their retries spent), the session stops sending for a cool-down (the larger of
//!   the last hint and a step that doubles per further failure, at most `breaker_max`),
//!   answering locally; the first call after it is a probe, and a success closes it.
//! - Marked: every attempt carries the class it was given (a header the entry's table
//!   matches) and the same user id (set by the gateway that authenticated the user: a new id
//!   per retry would draw a new user level).
//!
//! Run against a weir egress or inbound listener:
//! `cargo run -p weir-tests --example polite_client -- http://127.0.0.1:15102/path 3`
#![allow(dead_code)] // also compiled into proxy/tests/e2e/egress_polite_client.rs

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use rand::Rng;

/// How hard to try.
#[derive(Debug, Clone)]
pub struct Policy {
    pub max_attempts: u32,
    /// Shortest wait before any retry, and the first step of the exponential backoff.
    pub base: Duration,
    /// Longest backoff step (a server's hint may ask for more, and is honoured).
    pub cap: Duration,
    /// The caller's whole budget for the call, retries included.
    pub budget: Duration,
    /// Calls in a row that ended refused or failed before the session's breaker opens.
    pub breaker_after: u32,
    /// Longest the breaker stays open at a time.
    pub breaker_max: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            max_attempts: 4,
            base: Duration::from_millis(50),
            cap: Duration::from_secs(2),
            budget: Duration::from_secs(5),
            breaker_after: 3,
            breaker_max: Duration::from_secs(30),
        }
    }
}

/// One attempt's answer.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// What the call came to.
#[derive(Debug)]
pub struct Outcome {
    /// The last answer (`None`: no attempt got one, or the breaker was open).
    pub answer: Option<Answer>,
    pub attempts: u32,
    /// The waits between attempts, in order.
    pub waits: Vec<Duration>,
    /// Not sent at all: the session's breaker was open.
    pub short_circuited: bool,
}

/// What an answer (or its absence) says about retrying.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Retry {
    /// Done: success, or an error a retry cannot fix (4xx, other gRPC errors).
    No,
    /// Refused with a hint: wait at least this long.
    After(Duration),
    /// Failed without a hint (502, 504, gRPC 14, no answer): back off.
    Backoff,
}

/// Reads the answer the way the wire contract defines refusals.
pub fn classify(answer: Option<&Answer>) -> Retry {
    let Some(a) = answer else { return Retry::Backoff };
    let header = |n: &str| a.headers.get(n).and_then(|v| v.to_str().ok());
    if let Some(status) = header("grpc-status") {
        return match status {
            "8" => match header("grpc-retry-pushback-ms").map(str::parse::<i64>) {
                Some(Ok(ms)) if ms < 0 => Retry::No,
                Some(Ok(ms)) => Retry::After(Duration::from_millis(ms as u64)),
                _ => Retry::Backoff,
            },
            "14" | "4" => Retry::Backoff,
            _ => Retry::No,
        };
    }
    match a.status {
        StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS => {
            match header("retry-after").map(str::parse::<u64>) {
                Some(Ok(secs)) => Retry::After(Duration::from_secs(secs)),
                _ => Retry::Backoff,
            }
        }
        StatusCode::BAD_GATEWAY | StatusCode::GATEWAY_TIMEOUT => Retry::Backoff,
        _ => Retry::No,
    }
}

/// The backoff step of retry number `attempt` (1 = the first retry): `base * 2^(attempt-1)`,
/// at most `cap`.
pub fn backoff_step(attempt: u32, policy: &Policy) -> Duration {
    policy.base.saturating_mul(1 << attempt.max(1).saturating_sub(1).min(16)).min(policy.cap)
}

/// The wait before retry number `attempt` (1 = the first retry): never below `base`.
/// With a hint, the larger of the hint and the backoff step, plus up to 50% jitter (never
/// sooner than asked); without one, the backoff step drawn from its upper half ("equal
/// jitter"), so waits spread out yet still grow.
pub fn wait_before(retry: Retry, attempt: u32, policy: &Policy, rng: &mut impl Rng) -> Duration {
    let step = backoff_step(attempt, policy);
    let wait = match retry {
        Retry::No => return Duration::ZERO,
        Retry::After(hint) => {
            let wait = hint.max(step).max(policy.base);
            wait + wait.mul_f64(rng.random_range(0.0..0.5))
        }
        Retry::Backoff => step.mul_f64(rng.random_range(0.5..=1.0)),
    };
    wait.max(policy.base)
}

/// The session's breaker: calls that ended refused or failed in a row, and until when it
/// answers locally instead of sending.
#[derive(Debug, Default)]
pub struct Breaker {
    failed_in_a_row: u32,
    open_until: Option<Instant>,
}

impl Breaker {
    /// Whether a call may be sent now (closed, or open but past its cool-down: a probe).
    pub fn allows(&self, now: Instant) -> bool {
        self.open_until.is_none_or(|until| now >= until)
    }

    /// Records how a call ended: `hint` is the last refusal's hint, if any.
    pub fn record(&mut self, ok: bool, hint: Option<Duration>, now: Instant, policy: &Policy) {
        if ok {
            *self = Breaker::default();
            return;
        }
        self.failed_in_a_row += 1;
        if self.failed_in_a_row >= policy.breaker_after.max(1) {
            // Doubles with each failure past the threshold (a failed probe included).
            let beyond = self.failed_in_a_row - policy.breaker_after.max(1) + 1;
            let step = policy.base.saturating_mul(1 << beyond.min(16)).min(policy.breaker_max);
            let cooldown = hint.unwrap_or_default().max(step).min(policy.breaker_max);
            self.open_until = Some(now + cooldown);
        }
    }
}

/// A hyper client that follows the contract. Clones share one session (one breaker).
#[derive(Clone)]
pub struct PoliteClient {
    client: Client<HttpConnector, Full<Bytes>>,
    pub policy: Policy,
    breaker: Arc<Mutex<Breaker>>,
}

impl PoliteClient {
    pub fn new(policy: Policy) -> Self {
        let client = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        PoliteClient { client, policy, breaker: Arc::default() }
    }

    /// Sends what `request` builds (once per attempt) until it succeeds, is refused for
    /// good, or the attempts or the budget run out; answers locally while the session's
    /// breaker is open. Each attempt carries the remaining budget in `x-request-timeout-ms`.
    ///
    /// Refusals are retried whatever the method (they never reached the app). So are 502,
    /// 504 and silence, which may have reached it: `request` must build an idempotent
    /// request (a GET, or a POST carrying an idempotency key the app honours).
    pub async fn call(&self, request: impl Fn() -> Request<Full<Bytes>>) -> Outcome {
        let start = Instant::now();
        let mut outcome =
            Outcome { answer: None, attempts: 0, waits: Vec::new(), short_circuited: false };
        if !self.breaker.lock().unwrap_or_else(|e| e.into_inner()).allows(start) {
            outcome.short_circuited = true;
            return outcome;
        }
        let mut rng = rand::rng();
        let mut hint = None;
        let retry = loop {
            let remaining = self.policy.budget.saturating_sub(start.elapsed());
            let mut req = request();
            req.headers_mut().insert("x-request-timeout-ms", (remaining.as_millis() as u64).into());
            outcome.attempts += 1;
            outcome.answer =
                tokio::time::timeout(remaining, self.once(req)).await.ok().and_then(Result::ok);
            let retry = classify(outcome.answer.as_ref());
            if let Retry::After(h) = retry {
                hint = Some(h);
            }
            if retry == Retry::No || outcome.attempts >= self.policy.max_attempts {
                break retry;
            }
            let wait = wait_before(retry, outcome.attempts, &self.policy, &mut rng);
            if start.elapsed() + wait >= self.policy.budget {
                break retry; // the retry could only start after the budget: don't.
            }
            outcome.waits.push(wait);
            tokio::time::sleep(wait).await;
        };
        // A 4xx is final but says nothing about the service's health: it closes the breaker
        // like a success.
        let mut breaker = self.breaker.lock().unwrap_or_else(|e| e.into_inner());
        breaker.record(retry == Retry::No, hint, Instant::now(), &self.policy);
        outcome
    }

    async fn once(&self, req: Request<Full<Bytes>>) -> Result<Answer, String> {
        let resp = self.client.request(req).await.map_err(|e| e.to_string())?;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok(Answer { status: parts.status, headers: parts.headers, body })
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| "http://127.0.0.1:15102/".into());
    // A device's class, in a header the entry's table matches (the entry replaces
    // `x-business-priority` itself): see the README's client contract. An app calling
    // through its own egress forwards the `x-business-priority` / `x-user-priority` it
    // received instead.
    let class = args.next().unwrap_or_else(|| "foreground".into());
    let client = PoliteClient::new(Policy::default());
    let outcome = client
        .call(|| {
            Request::get(&url)
                .header("x-client-class", &class)
                .body(Full::new(Bytes::new()))
                .expect("a valid request")
        })
        .await;
    match &outcome.answer {
        None if outcome.short_circuited => println!("not sent: the session's breaker is open"),
        Some(a) => println!(
            "{} after {} attempt(s), waits {:?}",
            a.status, outcome.attempts, outcome.waits
        ),
        None => {
            println!("no answer after {} attempt(s), waits {:?}", outcome.attempts, outcome.waits)
        }
    }
}
