//! The README's example client (`tests/examples/polite_client.rs`), tested: it reads
//! refusals as the wire contract defines them, never retries at once, honours the server's
//! hint plus jitter, backs off exponentially without one, and stays within its budget — and,
//! end to end through a real weir egress, it waits out a downstream's refusals and gets
//! through once the downstream has recovered.

use crate::support;

#[path = "../../../tests/examples/polite_client.rs"]
mod polite_client;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use polite_client::{classify, wait_before, Answer, Breaker, Policy, PoliteClient, Retry};
use support::backend::Backend;

fn answer(status: u16, headers: &[(&'static str, &'static str)]) -> Answer {
    let mut h = HeaderMap::new();
    for (k, v) in headers {
        h.insert(*k, v.parse().unwrap());
    }
    Answer { status: StatusCode::from_u16(status).unwrap(), headers: h, body: Bytes::new() }
}

#[test]
fn refusals_are_read_as_the_wire_contract_defines_them() {
    let after = |s| Retry::After(Duration::from_secs(s));
    assert_eq!(classify(Some(&answer(503, &[("retry-after", "1")]))), after(1));
    assert_eq!(classify(Some(&answer(503, &[]))), Retry::Backoff);
    assert_eq!(classify(Some(&answer(502, &[]))), Retry::Backoff);
    assert_eq!(classify(Some(&answer(504, &[]))), Retry::Backoff);
    assert_eq!(classify(None), Retry::Backoff, "no answer at all");
    assert_eq!(classify(Some(&answer(200, &[]))), Retry::No);
    assert_eq!(classify(Some(&answer(404, &[]))), Retry::No);
    let grpc = |status, pushback| {
        let mut h = vec![("grpc-status", status)];
        if let Some(p) = pushback {
            h.push(("grpc-retry-pushback-ms", p));
        }
        classify(Some(&answer(200, &h)))
    };
    assert_eq!(grpc("8", Some("250")), Retry::After(Duration::from_millis(250)));
    assert_eq!(grpc("8", Some("-1")), Retry::No, "negative pushback: do not retry");
    assert_eq!(grpc("8", None), Retry::Backoff);
    assert_eq!(grpc("14", None), Retry::Backoff);
    assert_eq!(grpc("3", None), Retry::No);
}

#[test]
fn waits_honour_the_hint_add_jitter_grow_and_are_never_zero() {
    let policy = Policy::default();
    let mut rng = rand::rng();
    let hint = Duration::from_millis(400);
    let waits: Vec<_> =
        (0..200).map(|_| wait_before(Retry::After(hint), 1, &policy, &mut rng)).collect();
    assert!(waits.iter().all(|w| *w >= hint && *w <= hint.mul_f64(1.5)), "{waits:?}");
    let distinct: std::collections::HashSet<_> = waits.iter().collect();
    assert!(distinct.len() > 100, "jittered, not in step");
    // A zero hint still waits `base`: never an immediate retry.
    let zero = wait_before(Retry::After(Duration::ZERO), 1, &policy, &mut rng);
    assert!(zero >= policy.base);
    // Backoff: each step's range doubles up to the cap.
    for attempt in 1..=8u32 {
        let step = policy.base.saturating_mul(1 << (attempt - 1)).min(policy.cap);
        for _ in 0..50 {
            let w = wait_before(Retry::Backoff, attempt, &policy, &mut rng);
            assert!(w >= (step / 2).max(policy.base) && w <= step, "attempt {attempt}: {w:?}");
        }
    }
}

#[test]
fn a_hint_below_the_backoff_step_waits_the_step() {
    let policy = Policy::default();
    let mut rng = rand::rng();
    // Retry 4: the step is 400 ms, the hint 100 ms: the larger wins, plus jitter.
    for _ in 0..50 {
        let w = wait_before(Retry::After(Duration::from_millis(100)), 4, &policy, &mut rng);
        assert!(w >= Duration::from_millis(400) && w <= Duration::from_millis(600), "{w:?}");
    }
}

#[test]
fn the_session_breaker_opens_after_failed_calls_probes_and_closes_on_success() {
    let policy = Policy { breaker_after: 3, ..Policy::default() };
    let mut breaker = Breaker::default();
    let t0 = Instant::now();
    let hint = Some(Duration::from_secs(1));
    breaker.record(false, hint, t0, &policy);
    breaker.record(false, hint, t0, &policy);
    assert!(breaker.allows(t0), "two failed calls: still closed");
    breaker.record(false, hint, t0, &policy);
    assert!(!breaker.allows(t0), "three in a row: open");
    assert!(!breaker.allows(t0 + Duration::from_millis(999)), "for the hint at least");
    assert!(breaker.allows(t0 + Duration::from_secs(1)), "then one probe may go");
    // The probe fails: open again, for a step that doubles with each failure.
    let t1 = t0 + Duration::from_secs(1);
    breaker.record(false, None, t1, &policy);
    assert!(!breaker.allows(t1 + Duration::from_millis(199)), "4 failures: 50 ms x 2^2");
    assert!(breaker.allows(t1 + policy.breaker_max), "never longer than breaker_max");
    // A success closes it.
    breaker.record(true, None, t1 + policy.breaker_max, &policy);
    assert!(breaker.allows(t1 + policy.breaker_max));
    breaker.record(false, None, t1 + policy.breaker_max, &policy);
    assert!(breaker.allows(t1 + policy.breaker_max), "the count started again");
}

/// A downstream that answers with a scripted level and counts what reaches it.
async fn downstream(open: Arc<AtomicBool>, seen: Arc<AtomicU64>) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let (open, seen) = (open.clone(), seen.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_req: Request<_>| {
                    seen.fetch_add(1, Relaxed);
                    let level = if open.load(Relaxed) { "255.127" } else { "0.0" };
                    let mut resp = Response::new(Full::new(Bytes::from_static(b"ok")));
                    resp.headers_mut().insert("x-admission-level", level.parse().unwrap());
                    resp.headers_mut().insert("content-type", "application/grpc".parse().unwrap());
                    resp.headers_mut().insert("grpc-status", "0".parse().unwrap());
                    async move { Ok::<_, Infallible>(resp) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_weir_egress_it_waits_out_refusals_and_gets_through_after_recovery() {
    let (open, seen) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let down = downstream(open.clone(), seen.clone()).await;
    let app = Backend::start().await;
    let pushback = Duration::from_millis(100);
    let expiry = Duration::from_millis(400);
    let weir = support::sidecar(app.addr, |c| {
        c.egress.enabled = true;
        c.egress.listen = "127.0.0.1:0".parse().unwrap();
        c.egress.level_expiry = expiry;
        c.inbound.retry_after = pushback;
    });
    let egress = weir.egress().unwrap().addr();
    let request = || {
        Request::post(format!("http://{egress}/pkg.Svc/Call"))
            .header("host", down.to_string())
            .header("content-type", "application/grpc")
            .header("x-business-priority", "5")
            .body(Full::new(Bytes::from_static(b"\0\0\0\0\0")))
            .unwrap()
    };

    // The first call teaches the egress the downstream's level 0.0 (and succeeds).
    let client = PoliteClient::new(Policy { max_attempts: 3, ..Policy::default() });
    let first = client.call(request).await;
    assert_eq!(first.attempts, 1);
    assert_eq!(seen.load(Relaxed), 1);

    // Refused locally three times: each retry waited the pushback at least, with jitter.
    let t = Instant::now();
    let refused = client.call(request).await;
    let a = refused.answer.as_ref().expect("answered");
    assert_eq!(a.headers["grpc-status"], "8");
    assert_eq!(a.headers["x-weir-shed"], "downstream-level");
    assert_eq!(refused.attempts, 3);
    assert_eq!(refused.waits.len(), 2);
    assert!(refused.waits.iter().all(|w| *w >= pushback && *w <= pushback.mul_f64(1.5)));
    assert!(t.elapsed() >= pushback * 2, "never an immediate retry");
    assert_eq!(seen.load(Relaxed), 1, "the refusals never left the caller's pod");

    // The downstream recovers: once the cached level expires, a retry gets through.
    open.store(true, Relaxed);
    let patient = PoliteClient::new(Policy { max_attempts: 20, ..Policy::default() });
    let t = Instant::now();
    let through = patient.call(request).await;
    let a = through.answer.as_ref().expect("answered");
    assert_eq!(a.headers["grpc-status"], "0", "{through:?}");
    assert!(through.attempts >= 2, "the first attempt met the cached refusal");
    // Through soon after the expiry (400 ms): within seconds, where a cache that never
    // expired would exhaust the client's 20 attempts and answer grpc-status 8.
    assert!(t.elapsed() < expiry + Duration::from_secs(3), "took {:?}", t.elapsed());
    weir.stop();
}
