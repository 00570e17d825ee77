//! A polite client: what the README's client contract asks of an app or a device calling a
//! service behind weir, in ~150 lines of real code (hyper + tokio).
//!
//! - A refusal is a signal, not an error: `503` with `retry-after` (HTTP), or
//!   `grpc-status: 8` with `grpc-retry-pushback-ms` (gRPC), is retried no sooner than the
//!   server asked, plus jitter so refused clients do not come back in step.
//! - Never an immediate retry: every retry waits at least `base`; without a hint (502, 504,
//!   a reset) the wait doubles per attempt up to `cap`, with jitter.
//! - Bounded: at most `max_attempts`, and never past the caller's own budget (a retry that
//!   could only start after it is not made). A negative pushback means "do not retry".
//! - Marked: every attempt carries the class (`x-business-priority`) it was given.
//!
//! Run against a weir egress or inbound listener:
//! `cargo run -p weir-tests --example polite_client -- http://127.0.0.1:15102/path 3`
#![allow(dead_code)] // also compiled into proxy/tests/e2e/egress_polite_client.rs

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
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            max_attempts: 4,
            base: Duration::from_millis(50),
            cap: Duration::from_secs(2),
            budget: Duration::from_secs(5),
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
    /// The last answer (`None`: no attempt got one).
    pub answer: Option<Answer>,
    pub attempts: u32,
    /// The waits between attempts, in order.
    pub waits: Vec<Duration>,
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

/// The wait before retry number `attempt` (1 = the first retry): never below `base`.
/// A hint is honoured in full plus up to 50% jitter; a backoff step is drawn from its upper
/// half ("equal jitter"), so waits spread out yet still grow.
pub fn wait_before(retry: Retry, attempt: u32, policy: &Policy, rng: &mut impl Rng) -> Duration {
    let wait = match retry {
        Retry::No => return Duration::ZERO,
        Retry::After(hint) => {
            let hint = hint.max(policy.base);
            hint + hint.mul_f64(rng.random_range(0.0..0.5))
        }
        Retry::Backoff => {
            let step = policy.base.saturating_mul(1 << (attempt - 1).min(16)).min(policy.cap);
            step.mul_f64(rng.random_range(0.5..=1.0))
        }
    };
    wait.max(policy.base)
}

/// A hyper client that follows the contract.
#[derive(Clone)]
pub struct PoliteClient {
    client: Client<HttpConnector, Full<Bytes>>,
    pub policy: Policy,
}

impl PoliteClient {
    pub fn new(policy: Policy) -> Self {
        let client = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        PoliteClient { client, policy }
    }

    /// Sends what `request` builds (once per attempt) until it succeeds, is refused for
    /// good, or the attempts or the budget run out. Each attempt carries the remaining budget
    /// in `x-request-timeout-ms`.
    pub async fn call(&self, request: impl Fn() -> Request<Full<Bytes>>) -> Outcome {
        let start = Instant::now();
        let mut rng = rand::rng();
        let mut outcome = Outcome { answer: None, attempts: 0, waits: Vec::new() };
        loop {
            let remaining = self.policy.budget.saturating_sub(start.elapsed());
            let mut req = request();
            req.headers_mut().insert("x-request-timeout-ms", (remaining.as_millis() as u64).into());
            outcome.attempts += 1;
            outcome.answer =
                tokio::time::timeout(remaining, self.once(req)).await.ok().and_then(Result::ok);
            let retry = classify(outcome.answer.as_ref());
            if retry == Retry::No || outcome.attempts >= self.policy.max_attempts {
                return outcome;
            }
            let wait = wait_before(retry, outcome.attempts, &self.policy, &mut rng);
            if start.elapsed() + wait >= self.policy.budget {
                return outcome; // the retry could only start after the budget: don't.
            }
            outcome.waits.push(wait);
            tokio::time::sleep(wait).await;
        }
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
    let business = args.next().unwrap_or_else(|| "0".into());
    let client = PoliteClient::new(Policy::default());
    let outcome = client
        .call(|| {
            Request::get(&url)
                .header("x-business-priority", &business)
                .body(Full::new(Bytes::new()))
                .expect("a valid request")
        })
        .await;
    match &outcome.answer {
        Some(a) => println!(
            "{} after {} attempt(s), waits {:?}",
            a.status, outcome.attempts, outcome.waits
        ),
        None => {
            println!("no answer after {} attempt(s), waits {:?}", outcome.attempts, outcome.waits)
        }
    }
}
