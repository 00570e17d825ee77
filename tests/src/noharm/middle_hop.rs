//! A middle hop with the egress role on (issue 20): app A serves two APIs with a pool of
//! workers (a thread per request, as most apps):
//!
//! ```text
//! load --> weir A (inbound + egress) --> app A: 8 workers --(A's egress)--> weir B --> app B
//!          X: 20 ms of A's work, then a call to B (holding the worker)     bottleneck
//!          Y: 20 ms of A's work
//! ```
//!
//! X is offered at 3x B's capacity, Y at 0.5x A's. The ideal goodput is all of Y plus B's
//! capacity of X. App A forwards the inbound request's `x-request-id` / `traceparent` /
//! `x-b3-traceid` on its call to B, as traced apps do (one variant forwards nothing). Without a limit in front of A, A's workers wait on the overloaded B and
//! A's own queue grows where no sidecar sees it: both APIs time out. Variants: weir's
//! shipped defaults with the egress role on (the case under test), a hand-set
//! `max_inflight` (fixed, `adaptive_inflight: false`) with the egress role on, both with
//! the egress role off (A calls weir B directly), and no sidecar at all.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::{from_report, LimitStats, RunStats};
use crate::backend::{BackendConfig, CapacityBackend};
use crate::contender::{free_port, Contender};
use crate::load::{self, ClassSpec, LoadReport, LoadSpec, Phase};
use crate::status::StatusPoller;

#[derive(Clone, Debug, Serialize)]
pub struct MiddleHopConfig {
    pub a_workers: usize,
    #[serde(serialize_with = "crate::report::ser_millis")]
    pub a_work: Duration,
    pub b_workers: usize,
    #[serde(serialize_with = "crate::report::ser_millis")]
    pub b_service: Duration,
    /// X's offered rate as a multiple of B's capacity.
    pub x_multiple_of_b: f64,
    /// Y's offered rate as a multiple of A's capacity.
    pub y_multiple_of_a: f64,
    /// The hand-set `max_inflight` compared against (A's workers).
    pub hand_set: usize,
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub run: Duration,
    #[serde(serialize_with = "crate::report::ser_secs")]
    pub warmup: Duration,
    pub mix: [f64; 3],
    pub seed: u64,
}

impl MiddleHopConfig {
    /// The issue's case: 8 workers of 20 ms at A (400/s), B 2 x 40 ms (50/s); X at 150/s,
    /// Y at 200/s; the ideal goodput 250/s.
    pub fn issue_20(run: Duration, warmup: Duration, seed: u64) -> Self {
        MiddleHopConfig {
            a_workers: 8,
            a_work: Duration::from_millis(20),
            b_workers: 2,
            b_service: Duration::from_millis(40),
            x_multiple_of_b: 3.0,
            y_multiple_of_a: 0.5,
            hand_set: 8,
            run,
            warmup,
            mix: [0.1, 0.3, 0.6],
            seed,
        }
    }

    pub fn a_capacity(&self) -> f64 {
        self.a_workers as f64 / self.a_work.as_secs_f64()
    }

    pub fn b_capacity(&self) -> f64 {
        BackendConfig::new(self.b_workers, self.b_service).nominal_capacity()
    }

    pub fn x_rate(&self) -> f64 {
        self.x_multiple_of_b * self.b_capacity()
    }

    pub fn y_rate(&self) -> f64 {
        self.y_multiple_of_a * self.a_capacity()
    }

    /// All of Y, and as much of X as B can serve (A has room for both: X's own work at
    /// B's rate plus Y's stays under A's capacity).
    pub fn ideal_goodput(&self) -> f64 {
        self.y_rate() + self.x_rate().min(self.b_capacity())
    }
}

/// What sits where.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// weir's shipped defaults at A (egress role on) and B.
    DefaultsEgressOn,
    /// As [`Variant::DefaultsEgressOn`], app A forwarding no request id or trace context.
    DefaultsEgressOnNoIds,
    /// A: `max_inflight` = hand-set, fixed; egress role on.
    HandSetEgressOn,
    /// weir's shipped defaults at A (egress role off: A calls weir B directly) and B.
    DefaultsEgressOff,
    HandSetEgressOff,
    /// No sidecar anywhere.
    NoSidecar,
}

impl Variant {
    pub const ALL: [Variant; 6] = [
        Variant::DefaultsEgressOn,
        Variant::DefaultsEgressOnNoIds,
        Variant::HandSetEgressOn,
        Variant::DefaultsEgressOff,
        Variant::HandSetEgressOff,
        Variant::NoSidecar,
    ];

    pub fn label(self, hand_set: usize) -> String {
        match self {
            Variant::DefaultsEgressOn => "weir defaults, egress on".into(),
            Variant::DefaultsEgressOnNoIds => {
                "weir defaults, egress on, app forwards no request id".into()
            }
            Variant::HandSetEgressOn => format!("weir max_inflight {hand_set} (fixed), egress on"),
            Variant::DefaultsEgressOff => "weir defaults, egress off".into(),
            Variant::HandSetEgressOff => {
                format!("weir max_inflight {hand_set} (fixed), egress off")
            }
            Variant::NoSidecar => "no sidecar".into(),
        }
    }

    fn egress(self) -> bool {
        matches!(
            self,
            Variant::DefaultsEgressOn | Variant::DefaultsEgressOnNoIds | Variant::HandSetEgressOn
        )
    }

    fn hand_set(self) -> bool {
        matches!(self, Variant::HandSetEgressOn | Variant::HandSetEgressOff)
    }
}

/// One API's share of a run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ApiStats {
    pub sent: u64,
    pub ok: u64,
    pub refused: u64,
    pub timed_out: u64,
    pub errors: u64,
    pub goodput_rps: f64,
    /// Success per class (critical, normal, background).
    pub success_by_class: Vec<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct VariantResult {
    pub variant: Variant,
    pub label: String,
    pub goodput_rps: f64,
    pub goodput_vs_ideal: f64,
    pub x: ApiStats,
    pub y: ApiStats,
    pub all: RunStats,
    /// weir A's limit and level.
    pub a_limit: Option<LimitStats>,
    /// App A every 100 ms: `(seconds, waiting for a worker, workers busy, calls to B in
    /// flight)`, the queue in the app that weir A's status cannot show (its trace beside
    /// `a_limit`'s series).
    pub a_app_series: Vec<(f64, usize, usize, usize)>,
}

#[derive(Clone, Debug, Serialize)]
pub struct MiddleHopResult {
    pub config: MiddleHopConfig,
    pub ideal_rps: f64,
    pub variants: Vec<VariantResult>,
    /// Defaults with the egress role on, over the best hand-set variant (target >= 0.9).
    pub defaults_vs_best_hand_set: Option<f64>,
    /// Defaults with the egress role on: the share of requests that timed out or failed
    /// (A's 504s, the collapse the issue describes); target: none beyond 1%.
    pub defaults_failed_share: Option<f64>,
}

pub async fn run(
    config: &MiddleHopConfig,
    weir_bin: &Path,
    progress: &mut impl FnMut(String),
) -> anyhow::Result<MiddleHopResult> {
    let mut variants = Vec::new();
    for variant in Variant::ALL {
        let result = run_variant(config, weir_bin, variant).await?;
        progress(format!(
            "middle hop {:<42} goodput {:>6.1} rps ({:.2} of ideal): X {:.1} (refused {}, timed out {}, failed {}), Y {:.1} (refused {}, timed out {}, failed {}){}",
            result.label,
            result.goodput_rps,
            result.goodput_vs_ideal,
            result.x.goodput_rps,
            result.x.refused,
            result.x.timed_out,
            result.x.errors,
            result.y.goodput_rps,
            result.y.refused,
            result.y.timed_out,
            result.y.errors,
            result.a_limit.as_ref().map_or(String::new(), |l| format!(
                "; A's limit {}/{}/{}",
                l.min, l.median, l.max
            )),
        ));
        variants.push(result);
    }
    let goodput = |v: Variant| variants.iter().find(|r| r.variant == v).map(|r| r.goodput_rps);
    let best_hand_set = goodput(Variant::HandSetEgressOn)
        .into_iter()
        .chain(goodput(Variant::HandSetEgressOff))
        .fold(None, |m: Option<f64>, g| Some(m.map_or(g, |m| m.max(g))));
    let defaults_vs_best_hand_set = match (goodput(Variant::DefaultsEgressOn), best_hand_set) {
        (Some(d), Some(b)) if b > 0.0 => Some(d / b),
        _ => None,
    };
    let defaults_failed_share = variants
        .iter()
        .find(|r| r.variant == Variant::DefaultsEgressOn)
        .map(|r| (r.all.timed_out + r.all.errors) as f64 / r.all.sent.max(1) as f64);
    Ok(MiddleHopResult {
        config: config.clone(),
        ideal_rps: config.ideal_goodput(),
        variants,
        defaults_vs_best_hand_set,
        defaults_failed_share,
    })
}

async fn run_variant(
    config: &MiddleHopConfig,
    weir_bin: &Path,
    variant: Variant,
) -> anyhow::Result<VariantResult> {
    let backend =
        CapacityBackend::start(BackendConfig::new(config.b_workers, config.b_service)).await?;
    let sidecars = variant != Variant::NoSidecar;
    // weir B: the shipped defaults.
    let weir_b =
        if sidecars { Some(super::start_weir(weir_bin, backend.addr(), "").await?) } else { None };
    let b_target = weir_b.as_ref().map_or(backend.addr(), |w| w.addr);

    // App A is built with the address it calls B through, before weir A (which needs app A's
    // address) starts: A's egress port is picked here, the one pick-then-bind left
    // (contender.rs).
    let a_egress = free_port()?;
    let call = if variant.egress() {
        Downstream::ThroughEgress { egress: a_egress, authority: b_target.to_string() }
    } else {
        Downstream::Direct(b_target)
    };
    let forward_ids = variant != Variant::DefaultsEgressOnNoIds;
    let app_a =
        Arc::new(AppA::new(config.a_workers, config.a_work, config.a_work, call, forward_ids));
    // Serves until the end of this variant.
    let app_a_server = app_a.clone().serve().await?;
    let app_a_addr = app_a_server.addr();

    let weir_a = if sidecars {
        let (listen, admin) = ("127.0.0.1:0", "127.0.0.1:0");
        let mut inbound = String::new();
        if variant.hand_set() {
            let _ = write!(
                inbound,
                "  max_inflight: {}\n  adaptive_inflight: false\n",
                config.hand_set
            );
        }
        let egress = if variant.egress() {
            format!("egress:\n  enabled: true\n  listen: {a_egress}\n")
        } else {
            String::new()
        };
        let yaml = format!(
            "inbound:\n  listen: {listen}\n  app: {app_a_addr}\n{inbound}{egress}admin:\n  listen: {admin}\nlog:\n  filter: warn\n"
        );
        Some(Contender::weir_with_config(weir_bin, &yaml).await?)
    } else {
        None
    };
    let target = weir_a.as_ref().map_or(app_a_addr, |w| w.addr);
    let poller = weir_a
        .as_ref()
        .and_then(|w| w.admin)
        .map(|a| StatusPoller::start(a, Duration::from_millis(100)));

    let (x, y) = (config.x_rate(), config.y_rate());
    let mut classes = Vec::new();
    let mut paths = Vec::new();
    for (api, rate, path) in [("X", x, "/x"), ("Y", y, "/y")] {
        for (business, (name, share)) in
            ["critical", "normal", "background"].into_iter().zip(config.mix).enumerate()
        {
            classes.push(ClassSpec {
                name: format!("{api} {name}"),
                business: business as u8,
                weight: rate * share,
            });
            paths.push(path.to_string());
        }
    }
    let mut spec = LoadSpec::new(target, vec![Phase { rate_per_sec: x + y, duration: config.run }]);
    spec.classes = classes;
    spec.class_paths = paths;
    spec.warmup = config.warmup;
    spec.seed = config.seed;
    let a_app_series = Arc::new(std::sync::Mutex::new(Vec::new()));
    let app_sampler = {
        let (app, sink) = (app_a.clone(), a_app_series.clone());
        tokio::spawn(async move {
            let start = Instant::now();
            let mut ticks = tokio::time::interval(Duration::from_millis(100));
            loop {
                ticks.tick().await;
                let sample =
                    (start.elapsed().as_secs_f64(), app.waiting(), app.busy(), app.calling());
                sink.lock().unwrap_or_else(|e| e.into_inner()).push(sample);
            }
        })
    };
    let report = load::run(spec).await;
    app_sampler.abort();
    let a_app_series = std::mem::take(&mut *a_app_series.lock().unwrap_or_else(|e| e.into_inner()));
    let report = report?;
    let a_limit = poller.and_then(|p| LimitStats::from_samples(&p.stop()));
    drop(weir_a);
    drop(weir_b);

    let steady = report.steady_secs.max(1e-9);
    let api = |range: std::ops::Range<usize>| api_stats(&report, range, steady);
    let (x, y) = (api(0..3), api(3..6));
    let goodput = report.goodput();
    Ok(VariantResult {
        variant,
        label: variant.label(config.hand_set),
        goodput_rps: goodput,
        goodput_vs_ideal: goodput / config.ideal_goodput(),
        x,
        y,
        all: from_report(&report),
        a_limit,
        a_app_series,
    })
}

fn api_stats(report: &LoadReport, classes: std::ops::Range<usize>, steady_secs: f64) -> ApiStats {
    let of = &report.classes[classes];
    let ok: u64 = of.iter().map(|c| c.ok).sum();
    ApiStats {
        sent: of.iter().map(|c| c.sent).sum(),
        ok,
        refused: of.iter().map(|c| c.refused).sum(),
        timed_out: of.iter().map(|c| c.timed_out).sum(),
        errors: of.iter().map(|c| c.errors).sum(),
        goodput_rps: ok as f64 / steady_secs,
        success_by_class: of.iter().map(|c| c.success_ratio()).collect(),
    }
}

// === app A ===

/// Where app A sends X's call to B.
pub enum Downstream {
    /// Through A's egress listener, routed by `Host`.
    ThroughEgress {
        egress: SocketAddr,
        authority: String,
    },
    Direct(SocketAddr),
    /// No call: X is A's work alone (a single hop whose routes differ in cost).
    None,
}

/// App A: a pool of workers; each request holds one for A's work and, for X, for the call
/// to B too (an app's thread waits for its downstream). With a pool far above what it is
/// offered ([`ASYNC_WORKERS`]), it is an async app: nothing is held while a call waits.
pub struct AppA {
    workers: Semaphore,
    /// X's work before its call, and Y's work (all of Y).
    work: Duration,
    y_work: Duration,
    downstream: Downstream,
    /// Pass the inbound request's correlation headers on to B.
    forward_ids: bool,
    client: Client<HttpConnector, Empty<Bytes>>,
    /// Requests waiting for a worker, and calls to B in flight (for the trace).
    waiting: AtomicUsize,
    calling: AtomicUsize,
    pool: usize,
}

/// What a traced app forwards on its outbound calls.
const CORRELATION: [&str; 3] = ["x-request-id", "traceparent", "x-b3-traceid"];

/// A pool no load here comes near: an async app (a task per request, nothing held while it
/// waits on a downstream).
pub const ASYNC_WORKERS: usize = 100_000;

impl AppA {
    /// `workers` of `work` (X, before its call) and `y_work` (Y); X calls `downstream`,
    /// forwarding the inbound request's correlation headers if `forward_ids`.
    pub fn new(
        workers: usize,
        work: Duration,
        y_work: Duration,
        downstream: Downstream,
        forward_ids: bool,
    ) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(usize::MAX)
            .build(connector);
        AppA {
            workers: Semaphore::new(workers),
            work,
            y_work,
            downstream,
            forward_ids,
            client,
            waiting: AtomicUsize::new(0),
            calling: AtomicUsize::new(0),
            pool: workers,
        }
    }

    /// Requests waiting for a worker.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Relaxed)
    }

    /// Workers busy (an async app: requests in its handlers).
    pub fn busy(&self) -> usize {
        self.pool.saturating_sub(self.workers.available_permits())
    }

    /// X's calls to B in flight.
    pub fn calling(&self) -> usize {
        self.calling.load(Relaxed)
    }

    pub async fn serve(self: Arc<Self>) -> anyhow::Result<weir_workload::backend::HttpServer> {
        let handler = move |req| {
            let app = self.clone();
            async move { app.handle(req).await }
        };
        Ok(weir_workload::backend::HttpServer::bind(([127, 0, 0, 1], 0).into(), handler).await?)
    }

    async fn handle(&self, req: hyper::Request<Incoming>) -> hyper::Response<Full<Bytes>> {
        let arrived = Instant::now();
        let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
        let budget = header("x-request-timeout-ms").and_then(|v| v.parse::<u64>().ok());
        let deadline = arrived + Duration::from_millis(budget.unwrap_or(500));
        let business = header("x-business-priority").unwrap_or("255").to_string();
        let user = header("x-user-priority").unwrap_or("127").to_string();
        let harness_deadline = header(crate::DEADLINE_HEADER).map(str::to_string);
        let ids: Vec<(&str, http::HeaderValue)> = if self.forward_ids {
            CORRELATION
                .iter()
                .filter_map(|name| req.headers().get(*name).map(|v| (*name, v.clone())))
                .collect()
        } else {
            Vec::new()
        };
        let calls_b = req.uri().path() == "/x";
        // A worker, as long as it takes (the app's own queue; a thread pool does not shed).
        let worker = {
            let _waiting = Counted::new(&self.waiting);
            self.workers.acquire().await
        };
        let Ok(_worker) = worker else { return answer(503, None) };
        tokio::time::sleep(if calls_b { self.work } else { self.y_work }).await;
        if !calls_b {
            return answer(200, None);
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return answer(504, None);
        }
        let (uri, host) = match &self.downstream {
            Downstream::ThroughEgress { egress, authority } => {
                (format!("http://{egress}/work"), authority.clone())
            }
            Downstream::Direct(b) => (format!("http://{b}/work"), b.to_string()),
            Downstream::None => return answer(200, None),
        };
        let mut builder = http::Request::get(uri)
            .header(http::header::HOST, host)
            .header("x-business-priority", &business)
            .header("x-user-priority", &user)
            .header("x-request-timeout-ms", remaining.as_millis().max(1) as u64);
        if let Some(d) = harness_deadline {
            builder = builder.header(crate::DEADLINE_HEADER, d);
        }
        for (name, value) in ids {
            builder = builder.header(name, value);
        }
        let Ok(request) = builder.body(Empty::new()) else { return answer(502, None) };
        let exchange = async {
            let response = self.client.request(request).await?;
            let (parts, body) = response.into_parts();
            body.collect().await?;
            anyhow::Ok(parts)
        };
        let outcome = {
            let _calling = Counted::new(&self.calling);
            tokio::time::timeout_at(deadline, exchange).await
        };
        match outcome {
            Ok(Ok(parts)) => {
                let shed = parts.headers.get("x-weir-shed").cloned();
                answer(parts.status.as_u16(), shed)
            }
            Ok(Err(_)) => answer(502, None),
            Err(_) => answer(504, None),
        }
    }
}

/// One in a gauge while alive (a handler dropped mid-wait, its caller gone, counts out too).
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    fn new(gauge: &'a AtomicUsize) -> Self {
        gauge.fetch_add(1, Relaxed);
        Counted(gauge)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

fn answer(status: u16, shed: Option<http::HeaderValue>) -> hyper::Response<Full<Bytes>> {
    let mut resp = hyper::Response::new(Full::new(Bytes::new()));
    *resp.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
    if let Some(shed) = shed {
        resp.headers_mut().insert("x-weir-shed", shed);
    }
    resp
}

// === report ===

pub fn markdown(r: &MiddleHopResult) -> String {
    let c = &r.config;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "#### Middle hop, egress role on\n\n\
         App A: {} workers of {} ms ({:.0} rps of its own work); app B: {}x{} ms ({:.0} rps). \
         API X (A's work, then a call to B through A's egress) at {:.0} rps ({}x B), API Y (A's work only) at \
         {:.0} rps ({}x A); classes {:.0}/{:.0}/{:.0}% in each. Ideal goodput {:.0} rps. {} s runs, the first {} s not counted.\n",
        c.a_workers,
        c.a_work.as_secs_f64() * 1000.0,
        c.a_capacity(),
        c.b_workers,
        c.b_service.as_secs_f64() * 1000.0,
        c.b_capacity(),
        c.x_rate(),
        c.x_multiple_of_b,
        c.y_rate(),
        c.y_multiple_of_a,
        c.mix[0] * 100.0,
        c.mix[1] * 100.0,
        c.mix[2] * 100.0,
        r.ideal_rps,
        c.run.as_secs_f64(),
        c.warmup.as_secs_f64(),
    );
    let _ = writeln!(
        s,
        "| variant | goodput rps | of ideal | X ok rps (refused / timed out / failed) | Y ok rps (refused / timed out / failed) | \
         X success c/n/b | Y success c/n/b | A's limit min/med/max |\n|---|---:|---:|---:|---:|---|---|---:|"
    );
    let classes =
        |v: &[f64]| v.iter().map(|x| format!("{:.0}%", x * 100.0)).collect::<Vec<_>>().join(" / ");
    for v in &r.variants {
        let _ = writeln!(
            s,
            "| {} | {:.1} | {:.2} | {:.1} ({} / {} / {}) | {:.1} ({} / {} / {}) | {} | {} | {} |",
            v.label,
            v.goodput_rps,
            v.goodput_vs_ideal,
            v.x.goodput_rps,
            v.x.refused,
            v.x.timed_out,
            v.x.errors,
            v.y.goodput_rps,
            v.y.refused,
            v.y.timed_out,
            v.y.errors,
            classes(&v.x.success_by_class),
            classes(&v.y.success_by_class),
            v.a_limit.as_ref().map_or("-".into(), |l| format!("{}/{}/{}", l.min, l.median, l.max)),
        );
    }
    if let (Some(ratio), Some(failed)) = (r.defaults_vs_best_hand_set, r.defaults_failed_share) {
        let _ = writeln!(
            s,
            "\nDefaults with the egress role on: {ratio:.2}x the best hand-set goodput (target >= 0.9: {}); \
             {:.1}% of its requests timed out or failed, A's 504s (target: shed at A's door by priority, \
             at most 1%: {}).",
            if ratio >= 0.9 { "met" } else { "**missed**" },
            failed * 100.0,
            if failed <= 0.01 { "met" } else { "**missed**" },
        );
    }
    s
}
