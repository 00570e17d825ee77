//! The apps of the call graph that call others: the entry's gateway (E) and the costly
//! middle service (A). Each request takes one of the app's workers for its whole stay (its
//! own work, modelled as time a worker is held, and every downstream call), the way a
//! thread-per-request service spends its pool; a request whose deadline passes while it
//! waits for a worker is answered 504 without work (a deadline-aware app).
//!
//! Routes: `/x/...` (API X) makes the `x_calls` in sequence, `/y/...` (API Y) the `y_calls`;
//! each call must succeed for the request to succeed. Calls carry the priority the entry
//! stamped, the remaining budget, the harness's absolute deadline and the caller's request
//! id and trace context (what a sidecar could correlate its egress calls by).
//!
//! A failed call becomes the app's answer, labelled in `x-weir-shed` with the place the
//! failure was made (`b-door`, `a-egress-b`, `b-timeout`...), so the client learns where
//! each refusal happened whatever sits between the hops (weir, HAProxy, nothing); a
//! refusal's `retry-after` is passed on, as a polite app would.
//!
//! Work is counted in worker-seconds per API: all of it, and the part spent on requests
//! that failed or finished after their deadline (wasted).

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use weir_workload::backend::HttpServer;

use super::client::{REQUEST_ID, TRACEPARENT};

/// The refusal-reason header weir writes, reused by the apps for the place of a failure.
pub const SHED: &str = "x-weir-shed";

/// weir's own `x-weir-shed` values; anything else was written by an app of this graph.
const WEIR_LABELS: [&str; 4] = ["overload", "deadline", "downstream-level", "route-level"];

/// The place a refusal was made, as seen by `caller` calling `downstream` (`label`: the
/// answer's `x-weir-shed`).
pub fn place_of_refusal(label: Option<&str>, caller: &str, downstream: &str) -> String {
    match label {
        // The caller's own egress refused it from the downstream's cached level.
        Some("downstream-level") => format!("{caller}-egress-{downstream}"),
        Some("deadline") => format!("{downstream}-door-deadline"),
        // weir's inbound in front of the downstream by the level of the route's downstreams
        // (per-route levels): told apart from its own level, which says the hop itself is
        // saturated.
        Some("route-level") => format!("{downstream}-door-route"),
        // weir's inbound in front of the downstream by its own level, or HAProxy's (no label).
        Some("overload") | None => format!("{downstream}-door"),
        Some(placed) => placed.to_string(),
    }
}

/// The place of a failure that is not a refusal (`status`: 504, 502...).
pub fn place_of_error(label: Option<&str>, downstream: &str, status: u16) -> String {
    match label {
        Some(placed) if !WEIR_LABELS.contains(&placed) => placed.to_string(),
        _ => format!("{downstream}-{status}"),
    }
}

/// Where a downstream call goes.
#[derive(Clone, Debug)]
pub struct Downstream {
    /// Short name for labels and counts (`a`, `b`, `c`).
    pub name: &'static str,
    /// Where the app sends the call: its own sidecar's egress, or the downstream's front.
    pub via: SocketAddr,
    /// The downstream's authority (`Host`): what an egress routes by.
    pub authority: String,
}

#[derive(Clone, Debug)]
pub struct HopAppConfig {
    /// Short name for labels (`e`, `a`).
    pub name: &'static str,
    pub workers: usize,
    /// Time a worker is held for the app's own work, before the calls.
    pub work: Duration,
    pub x_calls: Vec<Downstream>,
    pub y_calls: Vec<Downstream>,
}

/// One app of the graph, serving on 127.0.0.1.
pub struct HopApp {
    config: HopAppConfig,
    workers: Arc<Semaphore>,
    client: Client<HttpConnector, Empty<Bytes>>,
    stats: AppStats,
}

#[derive(Default)]
struct ApiStats {
    /// Requests that got a worker.
    served: AtomicU64,
    ok: AtomicU64,
    /// Deadline passed while waiting for a worker.
    late: AtomicU64,
    busy_ns: AtomicU64,
    wasted_ns: AtomicU64,
    /// Successful downstream calls of requests that failed later (their work is wasted).
    wasted_calls: AtomicU64,
}

#[derive(Default)]
struct CallStats {
    sent: AtomicU64,
    ok: AtomicU64,
    /// Refused by this hop's own egress (never left the pod).
    refused_at_egress: AtomicU64,
    /// Refused by the downstream's proxy (crossed the network).
    refused_downstream: AtomicU64,
    failed: AtomicU64,
}

struct AppStats {
    apis: [ApiStats; 2],
    calls: BTreeMap<&'static str, CallStats>,
}

/// An app's counters at one moment (cumulative).
#[derive(Clone, Debug, Default, Serialize)]
pub struct AppSnapshot {
    pub served: [u64; 2],
    pub ok: [u64; 2],
    pub late: [u64; 2],
    pub busy_secs: [f64; 2],
    pub wasted_secs: [f64; 2],
    pub wasted_calls: [u64; 2],
    pub calls: BTreeMap<String, CallSnapshot>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct CallSnapshot {
    pub sent: u64,
    pub ok: u64,
    pub refused_at_egress: u64,
    pub refused_downstream: u64,
    pub failed: u64,
}

impl CallSnapshot {
    /// Calls that crossed the network to the downstream's hop (all but the egress's own
    /// refusals).
    pub fn reached(&self) -> u64 {
        self.sent.saturating_sub(self.refused_at_egress)
    }

    fn minus(&self, e: &CallSnapshot) -> CallSnapshot {
        CallSnapshot {
            sent: self.sent.saturating_sub(e.sent),
            ok: self.ok.saturating_sub(e.ok),
            refused_at_egress: self.refused_at_egress.saturating_sub(e.refused_at_egress),
            refused_downstream: self.refused_downstream.saturating_sub(e.refused_downstream),
            failed: self.failed.saturating_sub(e.failed),
        }
    }
}

impl AppSnapshot {
    /// What happened between `earlier` and this snapshot.
    pub fn minus(&self, earlier: &AppSnapshot) -> AppSnapshot {
        let u = |a: [u64; 2], b: [u64; 2]| [a[0].saturating_sub(b[0]), a[1].saturating_sub(b[1])];
        let f = |a: [f64; 2], b: [f64; 2]| [(a[0] - b[0]).max(0.0), (a[1] - b[1]).max(0.0)];
        AppSnapshot {
            served: u(self.served, earlier.served),
            ok: u(self.ok, earlier.ok),
            late: u(self.late, earlier.late),
            busy_secs: f(self.busy_secs, earlier.busy_secs),
            wasted_secs: f(self.wasted_secs, earlier.wasted_secs),
            wasted_calls: u(self.wasted_calls, earlier.wasted_calls),
            calls: self
                .calls
                .iter()
                .map(|(k, v)| {
                    let e = earlier.calls.get(k).cloned().unwrap_or_default();
                    (k.clone(), v.minus(&e))
                })
                .collect(),
        }
    }

    pub fn busy(&self) -> f64 {
        self.busy_secs.iter().sum()
    }

    pub fn wasted(&self) -> f64 {
        self.wasted_secs.iter().sum()
    }

    pub fn call(&self, name: &str) -> CallSnapshot {
        self.calls.get(name).cloned().unwrap_or_default()
    }
}

/// The caller's headers an app passes on to its downstream calls.
struct Passed {
    business: Option<String>,
    user: Option<String>,
    harness_deadline: Option<String>,
    request_id: Option<String>,
    traceparent: Option<String>,
}

impl HopApp {
    pub fn new(config: HopAppConfig) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(usize::MAX)
            .build(connector);
        let calls = config
            .x_calls
            .iter()
            .chain(&config.y_calls)
            .map(|d| (d.name, CallStats::default()))
            .collect();
        HopApp {
            workers: Arc::new(Semaphore::new(config.workers.clamp(1, Semaphore::MAX_PERMITS))),
            client,
            stats: AppStats { apis: Default::default(), calls },
            config,
        }
    }

    pub fn snapshot(&self) -> AppSnapshot {
        let s = &self.stats;
        let u = |f: fn(&ApiStats) -> &AtomicU64| [0, 1].map(|i| f(&s.apis[i]).load(Relaxed));
        let secs = |f: fn(&ApiStats) -> &AtomicU64| {
            [0, 1].map(|i| f(&s.apis[i]).load(Relaxed) as f64 / 1e9)
        };
        AppSnapshot {
            served: u(|a| &a.served),
            ok: u(|a| &a.ok),
            late: u(|a| &a.late),
            busy_secs: secs(|a| &a.busy_ns),
            wasted_secs: secs(|a| &a.wasted_ns),
            wasted_calls: u(|a| &a.wasted_calls),
            calls: s
                .calls
                .iter()
                .map(|(name, c)| {
                    let snap = CallSnapshot {
                        sent: c.sent.load(Relaxed),
                        ok: c.ok.load(Relaxed),
                        refused_at_egress: c.refused_at_egress.load(Relaxed),
                        refused_downstream: c.refused_downstream.load(Relaxed),
                        failed: c.failed.load(Relaxed),
                    };
                    (name.to_string(), snap)
                })
                .collect(),
        }
    }

    /// Binds an ephemeral port on 127.0.0.1 and serves until the returned guard is dropped.
    pub async fn serve(self: Arc<Self>) -> anyhow::Result<(SocketAddr, HttpServer)> {
        let handler = move |req| {
            let app = self.clone();
            async move {
                // Its own task: a caller that hangs up does not stop the work (a thread does
                // not notice a closed socket either).
                tokio::spawn(async move { app.handle(req).await })
                    .await
                    .unwrap_or_else(|_| answer(500, "app-panic".into(), None))
            }
        };
        let server = HttpServer::bind(([127, 0, 0, 1], 0).into(), handler).await?;
        Ok((server.addr(), server))
    }

    async fn handle(&self, req: hyper::Request<Incoming>) -> hyper::Response<Full<Bytes>> {
        let arrived = Instant::now();
        let me = self.config.name;
        let header =
            |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        let budget = header("x-request-timeout-ms").and_then(|v| v.parse::<u64>().ok());
        let deadline = arrived + Duration::from_millis(budget.unwrap_or(500));
        let passed = Passed {
            business: header("x-business-priority"),
            user: header("x-user-priority"),
            harness_deadline: header(crate::DEADLINE_HEADER),
            request_id: header(REQUEST_ID),
            traceparent: header(TRACEPARENT),
        };
        let api = usize::from(req.uri().path().starts_with("/y"));
        let path = req.uri().path().to_string();
        drop(req);
        let stats = &self.stats.apis[api];
        let permit =
            match tokio::time::timeout_at(deadline, self.workers.clone().acquire_owned()).await {
                Ok(Ok(permit)) => permit,
                _ => {
                    stats.late.fetch_add(1, Relaxed);
                    return answer(504, format!("{me}-late"), None);
                }
            };
        stats.served.fetch_add(1, Relaxed);
        let started = Instant::now();
        if !self.config.work.is_zero() {
            tokio::time::sleep(self.config.work).await;
        }
        let calls = if api == 0 { &self.config.x_calls } else { &self.config.y_calls };
        let mut succeeded = 0u64;
        let mut failure = None;
        for d in calls {
            match self.call(d, &path, &passed, deadline).await {
                None => succeeded += 1,
                Some(answer) => {
                    failure = Some(answer);
                    break;
                }
            }
        }
        drop(permit);
        let held = started.elapsed().as_nanos() as u64;
        stats.busy_ns.fetch_add(held, Relaxed);
        let in_time = passed
            .harness_deadline
            .as_deref()
            .and_then(|d| d.parse::<u64>().ok())
            .is_none_or(|d| crate::unix_micros() <= d);
        if failure.is_none() && in_time {
            stats.ok.fetch_add(1, Relaxed);
        } else {
            stats.wasted_ns.fetch_add(held, Relaxed);
            stats.wasted_calls.fetch_add(succeeded, Relaxed);
        }
        failure.unwrap_or_else(|| hyper::Response::new(Full::new(Bytes::from_static(b"ok\n"))))
    }

    /// One call; `None` when it succeeded, else this app's answer to its caller.
    async fn call(
        &self,
        d: &Downstream,
        path: &str,
        passed: &Passed,
        deadline: Instant,
    ) -> Option<hyper::Response<Full<Bytes>>> {
        let me = self.config.name;
        let stats = self.stats.calls.get(d.name)?;
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Some(answer(504, format!("{me}-budget"), None));
        }
        stats.sent.fetch_add(1, Relaxed);
        // E passes the client's path on (A routes by it); A calls its downstreams' one route.
        let path = if me == "e" { path.to_string() } else { format!("/{}", d.name) };
        let mut builder = http::Request::get(format!("http://{}{path}", d.via))
            .header(http::header::HOST, &d.authority)
            .header("x-request-timeout-ms", remaining.as_millis().max(1) as u64);
        for (name, value) in [
            ("x-business-priority", &passed.business),
            ("x-user-priority", &passed.user),
            (crate::DEADLINE_HEADER, &passed.harness_deadline),
            (REQUEST_ID, &passed.request_id),
            (TRACEPARENT, &passed.traceparent),
        ] {
            if let Some(v) = value {
                builder = builder.header(name, v);
            }
        }
        let Ok(request) = builder.body(Empty::new()) else {
            stats.failed.fetch_add(1, Relaxed);
            return Some(answer(502, format!("{me}-bad-request"), None));
        };
        let exchange = async {
            let response = self.client.request(request).await?;
            let (parts, body) = response.into_parts();
            body.collect().await?;
            anyhow::Ok(parts)
        };
        let parts = match tokio::time::timeout_at(deadline, exchange).await {
            Ok(Ok(parts)) => parts,
            Ok(Err(_)) => {
                stats.failed.fetch_add(1, Relaxed);
                return Some(answer(502, format!("{}-error", d.name), None));
            }
            Err(_) => {
                stats.failed.fetch_add(1, Relaxed);
                return Some(answer(504, format!("{}-timeout", d.name), None));
            }
        };
        let label = parts.headers.get(SHED).and_then(|v| v.to_str().ok());
        let grpc = parts.headers.get("grpc-status").and_then(|v| v.to_str().ok());
        match (parts.status.as_u16(), grpc) {
            (200..=299, None | Some("0")) => {
                stats.ok.fetch_add(1, Relaxed);
                None
            }
            (503, _) | (_, Some("8")) => {
                let place = place_of_refusal(label, me, d.name);
                if label == Some("downstream-level") {
                    stats.refused_at_egress.fetch_add(1, Relaxed);
                } else {
                    stats.refused_downstream.fetch_add(1, Relaxed);
                }
                let retry_after = parts.headers.get(http::header::RETRY_AFTER).cloned();
                Some(answer(503, place, retry_after))
            }
            (status, _) => {
                stats.failed.fetch_add(1, Relaxed);
                let place = place_of_error(label, d.name, status);
                Some(answer(if status == 504 { 504 } else { 502 }, place, None))
            }
        }
    }
}

fn answer(
    status: u16,
    place: String,
    retry_after: Option<http::HeaderValue>,
) -> hyper::Response<Full<Bytes>> {
    let mut resp = hyper::Response::new(Full::new(Bytes::new()));
    *resp.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
    if let Ok(v) = http::HeaderValue::from_str(&place) {
        resp.headers_mut().insert(SHED, v);
    }
    if let Some(v) = retry_after {
        resp.headers_mut().insert(http::header::RETRY_AFTER, v);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_name_the_hop_that_refused() {
        assert_eq!(place_of_refusal(Some("downstream-level"), "a", "b"), "a-egress-b");
        assert_eq!(place_of_refusal(Some("overload"), "a", "b"), "b-door");
        assert_eq!(place_of_refusal(None, "a", "b"), "b-door", "HAProxy writes no label");
        assert_eq!(place_of_refusal(Some("route-level"), "client", "e"), "e-door-route");
        assert_eq!(place_of_refusal(Some("deadline"), "e", "a"), "a-door-deadline");
        assert_eq!(place_of_refusal(Some("a-egress-b"), "e", "a"), "a-egress-b");
        assert_eq!(place_of_refusal(None, "client", "e"), "e-door");
        assert_eq!(place_of_error(None, "a", 504), "a-504");
        assert_eq!(place_of_error(Some("b-timeout"), "a", 504), "b-timeout");
        assert_eq!(place_of_error(Some("overload"), "a", 502), "a-502");
    }
}
