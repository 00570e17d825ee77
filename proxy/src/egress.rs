//! The egress role (docs/design.md, "Roles"): the listener the app sends its outbound calls
//! to, which learns each downstream's admission level from its responses and refuses
//! locally, in microseconds, what the downstream would shed anyway.
//!
//! How a request finds its downstream (first match):
//! 1. it arrived on a fixed route's listener (`egress.routes[i].listen`): that route's
//!    `target`;
//! 2. its URI is absolute (`GET http://b.svc:8080/x HTTP/1.1`, what `HTTP_PROXY` clients
//!    send; HTTP/2's `:authority`, what a gRPC client pointed at the egress address sends):
//!    that authority;
//! 3. its `Host` header.
//!
//! Then, in order:
//! - a scheme other than `http` (`https://`, `ftp://` absolute-form, `:scheme: https`) is
//!   refused with 400: it would go out as cleartext HTTP;
//! - a request whose `Via` names this egress, or whose downstream address is one of this
//!   sidecar's own listeners, is refused with 508 (a forwarding loop; see [`loops`]);
//! - a spent budget (`grpc-timeout: 0m`, `x-request-timeout-ms: 0`) is refused with
//!   `x-weir-shed: deadline` and never sent;
//! - a priority the downstream's fresh cached level does not admit is refused with
//!   `x-weir-shed: downstream-level`, exactly as the downstream would have refused it
//!   (HTTP 503 + `retry-after`, or gRPC trailers-only status 8 + pushback), carrying the
//!   cached level;
//! - otherwise the request goes out with its priority headers unchanged and the remaining
//!   budget in both deadline forms; name resolution is bounded by `timeouts.resolve`, the
//!   connect by `timeouts.connect`, the response head by the remaining budget. The
//!   response's `x-admission-level` updates the cache (bad values are counted, never
//!   cached) and is passed on to the app unchanged.
//!
//! A downstream that never answers, resets or answers garbage gets the inbound role's
//! errors (504 / 502, gRPC 4 / 14), with the downstream's cached level (`255.127` when
//! nothing is known) in `x-admission-level`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use admission_core::audit::AuditCounters;
use admission_core::{AdmissionLevel, FieldError};
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use weir_net::drain::{self, Drain, Watch};

use crate::config::SidecarConfig;
use crate::error::StartError;
use crate::own_time::DownstreamWaits;
use crate::route_level::RouteState;

pub mod forward;
pub mod loops;
mod respond;
mod service;
mod stats;

pub use crate::config::{EgressConfig, EgressRoute};
pub use service::EgressService;
pub use stats::{
    EgressOutcome, EgressStats, Rejection, DOWNSTREAM_LEVEL_METRIC, ERRORS_TOTAL,
    LEVEL_HEADERS_TOTAL, REJECTED_TOTAL,
};

use loops::OwnListeners;
use service::EgressListener;

/// Per-route slots held, by `kind` (`routes`, `dependencies`, `cached_route_levels`).
pub const ROUTE_SLOTS_METRIC: &str = "weir_route_slots";
/// What learning a dependency did, by `result`.
pub const ROUTE_LEARN_TOTAL: &str = "weir_route_dependencies_learnt_total";
/// `x-weir-route-level` headers on downstream responses, by `result`.
pub const ROUTE_LEVEL_HEADERS_TOTAL: &str = "weir_route_level_headers_total";
/// Retries of calls a downstream refused, refused locally while its level held.
pub const RETRIES_REFUSED_TOTAL: &str = "weir_egress_retries_refused_total";

/// How often `weir_downstream_level` is brought up to date (expired levels read open).
const LEVEL_GAUGE_PERIOD: Duration = Duration::from_millis(250);

/// A running egress role: its runtime and bound listeners.
pub struct Egress {
    runtime: Option<Runtime>,
    addr: SocketAddr,
    route_addrs: Vec<SocketAddr>,
    service: Arc<EgressService>,
    drain: Drain,
}

// === impl Egress ===

impl Egress {
    /// Binds `egress.listen` and every route's listener (port 0: an ephemeral port, see
    /// [`Egress::addr`]) and starts serving on `egress.threads` threads, each listener on
    /// the server skeleton ([`crate::server`]) with the egress role. `others` are the
    /// process's other listeners as bound (inbound, admin, public): with the egress's own,
    /// requests addressed to any of them are refused (see [`loops`]). `requests`: the
    /// per-class counters the control API renders as `weir_requests_total{role="egress"}`;
    /// `waits`: the inbound role's pairing of the app's calls ([`crate::own_time`]).
    pub fn start(
        config: &SidecarConfig,
        others: &[SocketAddr],
        requests: Arc<AuditCounters>,
        waits: Option<Arc<DownstreamWaits>>,
    ) -> Result<Egress, StartError> {
        let egress = &config.egress;
        let bind = |what: &'static str, addr: SocketAddr| {
            let listener = std::net::TcpListener::bind(addr)
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .map_err(|source| StartError::Bind { what, addr, source })?;
            let local =
                listener.local_addr().map_err(|source| StartError::Bind { what, addr, source })?;
            Ok::<_, StartError>((listener, local))
        };
        let (main, addr) = bind("egress.listen", egress.listen)?;
        let mut routes = Vec::with_capacity(egress.routes.len());
        for route in &egress.routes {
            let target = forward::parse_target(&route.target).map_err(|message| {
                StartError::Config(FieldError::new("egress.routes.target", message))
            })?;
            let (listener, local) = bind("egress.routes.listen", route.listen)?;
            routes.push((listener, local, target));
        }
        let own = OwnListeners::new(
            others.iter().copied().chain([addr]).chain(routes.iter().map(|(_, local, _)| *local)),
        );
        let (drain, watch) = drain::channel();
        let service = EgressService::new(config, own, watch.clone(), requests, waits);
        let service = Arc::new(service.map_err(StartError::Other)?);
        let server = Arc::new(egress.server());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(egress.threads)
            .thread_name("weir-egress")
            .enable_all()
            .build()
            .map_err(|e| StartError::Other(format!("egress runtime: {e}")))?;
        let route_addrs = routes.iter().map(|(_, a, _)| *a).collect();
        {
            let _entered = runtime.enter();
            let listeners = std::iter::once(("egress.listen", main, addr, None))
                .chain(routes.into_iter().map(|(l, a, t)| ("egress.routes.listen", l, a, Some(t))));
            for (what, listener, local, route) in listeners {
                let listener = TcpListener::from_std(listener)
                    .map_err(|source| StartError::Bind { what, addr: local, source })?;
                let role = Arc::new(EgressListener { service: service.clone(), route });
                let (server, watch) = (server.clone(), watch.clone());
                runtime.spawn(crate::server::serve(listener, "egress", role, server, watch));
            }
            runtime.spawn(export_levels(service.clone(), watch));
        }
        tracing::info!(
            egress = %addr,
            routes = ?route_addrs,
            via = service.via.pseudonym(),
            "egress started"
        );
        Ok(Egress { runtime: Some(runtime), addr, route_addrs, service, drain })
    }

    /// The forward-proxy listener's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The fixed routes' addresses, in `egress.routes` order.
    pub fn route_addrs(&self) -> &[SocketAddr] {
        &self.route_addrs
    }

    pub fn service(&self) -> &Arc<EgressService> {
        &self.service
    }

    /// Graceful stop: stops accepting, asks every app connection to close once its
    /// requests are answered (HTTP/1.1 after the current response, h2 with GOAWAY), and
    /// waits until the outbound requests in flight (their response bodies included) are
    /// done (the drain's event) or `deadline` passes. Returns whether they all finished;
    /// [`Egress::shutdown`] then drops whatever is left. The sidecar drains the egress
    /// after its inbound role: the app's in-flight requests may still be calling
    /// downstreams through it.
    pub fn drain(&mut self, deadline: Instant) -> bool {
        self.drain.signal();
        let (finished_tx, finished) = std::sync::mpsc::channel();
        if let Some(runtime) = &self.runtime {
            let drained = self.drain.finished();
            runtime.spawn(async move {
                drained.await;
                let _ = finished_tx.send(());
            });
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let drained = self.drain.in_flight() == 0 || finished.recv_timeout(left).is_ok();
        tracing::info!(drained, left = self.drain.in_flight(), "egress drain finished");
        drained
    }

    /// Stops accepting, then drops every connection still open (without blocking).
    pub fn shutdown(&mut self) {
        self.drain.signal();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Egress {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Keeps `weir_downstream_level{authority}` current: one series per cached authority (at
/// most `egress.max_authorities`), fully open (32767) once a level has expired; and one
/// `weir_downstream_level{authority,route}` per cached route level.
async fn export_levels(service: Arc<EgressService>, drain: Watch) {
    let mut tick = tokio::time::interval(LEVEL_GAUGE_PERIOD);
    let stopped = drain.signaled();
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            () = &mut stopped => return,
            _ = tick.tick() => {}
        }
        service.levels.for_each(|authority, level| {
            let v = level.unwrap_or(AdmissionLevel::FULLY_OPEN).compound();
            metrics::gauge!(DOWNSTREAM_LEVEL_METRIC, "authority" => authority.to_string())
                .set(f64::from(v));
        });
        // Per-route levels under the same name, with a `route` label (at most
        // `max_authorities` x `per_route.max_routes_per_authority` series).
        service.routes.route_levels.for_each(|authority, route, level| {
            let v = level.unwrap_or(AdmissionLevel::FULLY_OPEN).compound();
            metrics::gauge!(
                DOWNSTREAM_LEVEL_METRIC,
                "authority" => authority.to_string(),
                "route" => route.to_string()
            )
            .set(f64::from(v));
        });
        export_routes(&service.routes);
    }
}

/// Per-route state for `/metrics`: slots held (bounded), what learning and the route
/// headers did (overflow and bad values counted), retries refused.
fn export_routes(routes: &RouteState) {
    let deps = &routes.deps;
    metrics::gauge!(ROUTE_SLOTS_METRIC, "kind" => "routes").set(deps.routes() as f64);
    metrics::gauge!(ROUTE_SLOTS_METRIC, "kind" => "dependencies")
        .set(deps.dependency_slots() as f64);
    metrics::gauge!(ROUTE_SLOTS_METRIC, "kind" => "cached_route_levels")
        .set(routes.route_levels.len() as f64);
    metrics::gauge!(ROUTE_SLOTS_METRIC, "kind" => "hold_routes").set(routes.holds.routes() as f64);
    metrics::gauge!(ROUTE_SLOTS_METRIC, "kind" => "spared_routes")
        .set(routes.holds.spared_count() as f64);
    let c = deps.counters();
    for (result, n) in [
        ("new", c.new),
        ("renewed", c.renewed),
        ("route_overflow", c.route_overflow),
        ("dependency_overflow", c.dependency_overflow),
        ("bad_route", c.bad_route),
    ] {
        metrics::counter!(ROUTE_LEARN_TOTAL, "result" => result).absolute(n);
    }
    let r = routes.route_levels.counters();
    let l = routes.route_levels.level_counters();
    for (result, n) in [
        ("cached", l.cached),
        ("uncached_over_max_routes", l.uncached),
        ("level_absent", l.absent),
        ("malformed", l.malformed),
        ("repeated", l.repeated),
        ("absent", r.absent),
        ("route_mismatch", r.route_mismatch),
        ("uncached_over_max_authorities", r.authority_overflow),
    ] {
        metrics::counter!(ROUTE_LEVEL_HEADERS_TOTAL, "result" => result).absolute(n);
    }
    metrics::counter!(RETRIES_REFUSED_TOTAL).absolute(routes.retries.refused_retries());
}
