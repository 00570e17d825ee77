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

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use admission_core::downstream::{DownstreamLevels, Observation};
use admission_core::{AdmissionLevel, MonotonicClock, Priority};
use http::header::CONTENT_TYPE;
use http::uri::Authority;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::{Body, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use metrics::Counter;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::watch;

use crate::app_client::{ClientSettings, Endpoint};
use crate::app_protocol::{self, Choice, Upstreams};
use crate::body::{RequestBody, ResponseBody};
use crate::config::{AppProtocol, SidecarConfig};
use crate::deadline;
use crate::listener::accept_bounded;
use crate::own_time::DownstreamWaits;
use crate::priority::PriorityHeaders;
use crate::refusal::{Refusals, ShedReason, WeirError};
use crate::route_level::{self, Ages, RouteState};
use crate::sidecar::StartError;

pub mod config;
pub mod forward;
pub mod loops;

pub use config::{EgressConfig, EgressRoute};
use loops::{OwnListeners, ViaTag};

/// Shared h2c connections per downstream address.
const H2_CONNECTIONS: usize = 2;
/// Downstream addresses with a connection pool; beyond that, a request gets a fresh,
/// unpooled connection (bounded memory whatever the app calls).
const MAX_POOLS: usize = 1024;
/// Idle pooled HTTP/1.1 connections to a downstream older than this are closed.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a drain checks for the last outbound request.
const DRAIN_POLL: Duration = Duration::from_millis(5);

const DOWNSTREAM_LEVEL: &str = "downstream-level";
const DOWNSTREAM_GRPC_MESSAGE: &str =
    "weir: the downstream sheds this priority now, retry after the pushback";

/// A running egress role: its runtime and bound listeners.
pub struct Egress {
    runtime: Option<Runtime>,
    addr: SocketAddr,
    route_addrs: Vec<SocketAddr>,
    service: Arc<EgressService>,
    stop: watch::Sender<bool>,
}

/// What every egress connection shares.
pub struct EgressService {
    levels: Arc<DownstreamLevels<MonotonicClock>>,
    /// Per-route levels (shared with the inbound role when the sidecar runs both).
    routes: Arc<RouteState>,
    /// How long the downstream's level has refused each class (`retry-after` grows).
    ages: Ages,
    stats: EgressStats,
    refusals: Refusals,
    level_name: HeaderName,
    shed_name: HeaderName,
    priority: PriorityHeaders,
    default_priority: Priority,
    timeout_header: HeaderName,
    default_budget: Duration,
    deadline_margin: Duration,
    protocol: AppProtocol,
    /// What each downstream speaks (`protocol: auto`), probed and remembered.
    speaks: Upstreams,
    resolver: forward::Resolver,
    client: ClientSettings,
    pools: Mutex<HashMap<SocketAddr, Arc<Endpoint>>>,
    body_read: Duration,
    write: Duration,
    conn: ConnLimits,
    /// Outbound requests being handled, response bodies included: what a drain waits for.
    active: Arc<AtomicUsize>,
    /// Every listener of this process: never a downstream.
    own: OwnListeners,
    /// This egress's `Via` entry.
    via: ViaTag,
    /// The app's waits on its downstreams, for the inbound role's adaptive limit.
    waits: Option<Arc<DownstreamWaits>>,
}

#[derive(Debug, Clone)]
struct ConnLimits {
    max_connections: usize,
    header_read: Duration,
    idle: Duration,
    h2_max_concurrent_streams: u32,
}

/// What the egress role did, per business class: kept here (for tests and status) and
/// exported as `weir_requests_total{role="egress",business,outcome}` through the process's
/// metrics recorder. A class's series is registered at its first request (so only classes
/// seen are exported), then counted through its handle.
pub struct EgressStats {
    /// `[business][outcome]`.
    requests: Box<[[AtomicU64; EgressOutcome::ALL.len()]]>,
    handles: Box<[[OnceLock<Counter>; EgressOutcome::ALL.len()]]>,
    /// Requests answered with weir's own error (downstream unreachable, silent, garbage).
    errors: AtomicU64,
    errors_metric: Counter,
    /// What the responses' level headers did to the cache (`result` label).
    level_headers: [Counter; 5],
    /// Requests refused before anything was sent, by [`Rejection`].
    rejected: [(AtomicU64, Counter); Rejection::ALL.len()],
}

/// Metric names of the egress role.
pub const REQUESTS_TOTAL: &str = "weir_requests_total";
pub const DOWNSTREAM_LEVEL_METRIC: &str = "weir_downstream_level";
pub const LEVEL_HEADERS_TOTAL: &str = "weir_downstream_level_headers_total";
pub const ERRORS_TOTAL: &str = "weir_egress_errors_total";
pub const REJECTED_TOTAL: &str = "weir_egress_rejected_total";
/// Per-route slots held, by `kind` (`routes`, `dependencies`, `cached_route_levels`).
pub const ROUTE_SLOTS_METRIC: &str = "weir_route_slots";
/// What learning a dependency did, by `result`.
pub const ROUTE_LEARN_TOTAL: &str = "weir_route_dependencies_learnt_total";
/// `x-weir-route-level` headers on downstream responses, by `result`.
pub const ROUTE_LEVEL_HEADERS_TOTAL: &str = "weir_route_level_headers_total";
/// Retries of calls a downstream refused, refused locally while its level held.
pub const RETRIES_REFUSED_TOTAL: &str = "weir_egress_retries_refused_total";
const LEVEL_HEADER_RESULTS: [&str; 5] =
    ["cached", "uncached_over_max_authorities", "absent", "malformed", "repeated"];

/// How often `weir_downstream_level` is brought up to date (expired levels read open).
const LEVEL_GAUGE_PERIOD: Duration = Duration::from_millis(250);

/// The egress outcomes (the `outcome` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EgressOutcome {
    /// Sent to the downstream.
    Admitted,
    /// Refused locally: the downstream's cached level would shed it.
    ShedDownstream,
    /// Refused locally: its budget was spent before it was sent.
    ShedDeadline,
}

impl EgressOutcome {
    pub const ALL: [EgressOutcome; 3] =
        [EgressOutcome::Admitted, EgressOutcome::ShedDownstream, EgressOutcome::ShedDeadline];

    pub const fn as_str(self) -> &'static str {
        match self {
            EgressOutcome::Admitted => "admitted",
            EgressOutcome::ShedDownstream => "shed_downstream",
            EgressOutcome::ShedDeadline => "shed_deadline",
        }
    }
}

/// Requests the egress refuses to send at all: the app (or whoever reached the egress)
/// asked for something it must not do. Not downstream errors, not shedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// A scheme other than `http`: it would go out as cleartext HTTP.
    Scheme,
    /// Its `Via` names this egress: it has come round a loop.
    ViaLoop,
    /// Its downstream address is one of this sidecar's own listeners.
    OwnListener,
}

impl Rejection {
    pub const ALL: [Rejection; 3] = [Rejection::Scheme, Rejection::ViaLoop, Rejection::OwnListener];

    /// The `reason` label of `weir_egress_rejected_total`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Rejection::Scheme => "scheme",
            Rejection::ViaLoop => "via_loop",
            Rejection::OwnListener => "own_listener",
        }
    }

    /// The error weir answers with (`x-weir-error` and the status).
    fn error(self) -> WeirError {
        match self {
            Rejection::Scheme => WeirError::UnsupportedScheme,
            Rejection::ViaLoop | Rejection::OwnListener => WeirError::LoopDetected,
        }
    }

    /// INVALID_ARGUMENT for the scheme, FAILED_PRECONDITION for a loop: retrying the same
    /// call cannot help either way.
    fn grpc_status(self) -> &'static str {
        match self {
            Rejection::Scheme => "3",
            Rejection::ViaLoop | Rejection::OwnListener => "9",
        }
    }

    /// The response body (and `grpc-message`): what was refused and why.
    fn message(self) -> &'static str {
        match self {
            Rejection::Scheme => {
                "weir egress: only http:// requests are forwarded (https:// and other schemes \
                 would go out as cleartext HTTP)"
            }
            Rejection::ViaLoop => {
                "weir egress: this request has already passed through this egress (its Via \
                 names it): a forwarding loop"
            }
            Rejection::OwnListener => {
                "weir egress: the downstream address is one of this sidecar's own listeners: \
                 a forwarding loop"
            }
        }
    }
}

// === impl Egress ===

impl Egress {
    /// Binds `egress.listen` and every route's listener (port 0: an ephemeral port, see
    /// [`Egress::addr`]) and starts serving on `egress.threads` threads. `others` are the
    /// process's other listeners as bound (inbound, admin, public): with the egress's own, requests
    /// addressed to any of them are refused (see [`loops`]).
    pub fn start(config: &SidecarConfig, others: &[SocketAddr]) -> Result<Egress, StartError> {
        Self::start_with(config, others, None)
    }

    /// As [`Egress::start`]; every outbound call is reported to `waits` (the inbound role's
    /// pairing of the app's calls with the requests they serve, [`crate::own_time`]).
    pub fn start_with(
        config: &SidecarConfig,
        others: &[SocketAddr],
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
                StartError::Config { field: "egress.routes.target".into(), message }
            })?;
            let (listener, local) = bind("egress.routes.listen", route.listen)?;
            routes.push((listener, local, target));
        }
        let own = OwnListeners::new(
            others.iter().copied().chain([addr]).chain(routes.iter().map(|(_, local, _)| *local)),
        );
        let mut service = EgressService::new(config, own).map_err(StartError::Other)?;
        if let Some(routes) = waits.as_ref().and_then(|w| w.routes()) {
            service.levels = routes.authority_levels.clone();
            service.routes = routes.clone();
        }
        service.waits = waits;
        let service = Arc::new(service);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(egress.threads)
            .thread_name("weir-egress")
            .enable_all()
            .build()
            .map_err(|e| StartError::Other(format!("egress runtime: {e}")))?;
        let (stop, stopped) = watch::channel(false);
        let route_addrs = routes.iter().map(|(_, a, _)| *a).collect();
        {
            let _entered = runtime.enter();
            let listener = TcpListener::from_std(main).map_err(|source| StartError::Bind {
                what: "egress.listen",
                addr,
                source,
            })?;
            runtime.spawn(accept_loop(listener, service.clone(), None, stopped.clone()));
            runtime.spawn(export_levels(service.clone(), stopped.clone()));
            for (listener, local, target) in routes {
                let listener = TcpListener::from_std(listener).map_err(|source| {
                    StartError::Bind { what: "egress.routes.listen", addr: local, source }
                })?;
                runtime.spawn(accept_loop(
                    listener,
                    service.clone(),
                    Some(target),
                    stopped.clone(),
                ));
            }
        }
        tracing::info!(
            egress = %addr,
            routes = ?route_addrs,
            via = service.via.pseudonym(),
            "egress started"
        );
        Ok(Egress { runtime: Some(runtime), addr, route_addrs, service, stop })
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
    /// done or `deadline` passes. Returns whether they all finished; [`Egress::shutdown`]
    /// then drops whatever is left. The sidecar drains the egress after its inbound role:
    /// the app's in-flight requests may still be calling downstreams through it.
    pub fn drain(&mut self, deadline: Instant) -> bool {
        let _ = self.stop.send(true);
        // A bounded poll: there is no event for "the last request finished".
        while self.service.active() > 0 && Instant::now() < deadline {
            std::thread::sleep(DRAIN_POLL);
        }
        let left = self.service.active();
        tracing::info!(drained = left == 0, left, "egress drain finished");
        left == 0
    }

    /// Stops accepting, then drops every connection still open (without blocking).
    pub fn shutdown(&mut self) {
        let _ = self.stop.send(true);
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

// === impl EgressService ===

impl EgressService {
    /// `own`: every listener of this process, never a downstream.
    pub fn new(config: &SidecarConfig, own: OwnListeners) -> Result<Self, String> {
        let egress = &config.egress;
        let names = &config.inbound.headers;
        let header = |s: &str| HeaderName::from_bytes(s.as_bytes()).map_err(|e| e.to_string());
        let level_name = header(&names.level)?;
        let shed_name = header(&names.shed)?;
        let routes = Arc::new(RouteState::new(
            &egress.per_route,
            egress.level_expiry,
            egress.max_authorities,
        ));
        Ok(EgressService {
            levels: routes.authority_levels.clone(),
            routes,
            ages: route_level::ages(config.inbound.retry_after),
            stats: EgressStats::new(),
            refusals: Refusals::new(
                level_name.clone(),
                shed_name.clone(),
                config.inbound.retry_after,
            ),
            level_name,
            shed_name,
            priority: PriorityHeaders {
                business: header(&names.business)?,
                user: header(&names.user)?,
                forward_user_id: true,
                default: None,
            },
            // Unmarked traffic is what a downstream treats as its least important.
            default_priority: config
                .inbound
                .default_priority()
                .unwrap_or(Priority::LEAST_IMPORTANT),
            timeout_header: header(&names.timeout)?,
            default_budget: egress.default_budget,
            deadline_margin: egress.deadline_margin,
            protocol: egress.protocol,
            speaks: Upstreams::new(egress.timeouts.connect, MAX_POOLS),
            resolver: forward::Resolver::new(
                egress.timeouts.resolve,
                egress.timeouts.resolve_ttl,
                MAX_POOLS,
            ),
            client: ClientSettings {
                connect_timeout: egress.timeouts.connect,
                max_idle_http1: egress.max_idle_per_downstream,
                idle_timeout: POOL_IDLE_TIMEOUT.min(egress.timeouts.idle),
                h2_connections: H2_CONNECTIONS,
            },
            pools: Mutex::new(HashMap::new()),
            body_read: egress.timeouts.body_read,
            write: egress.timeouts.write,
            active: Arc::new(AtomicUsize::new(0)),
            waits: None,
            conn: ConnLimits {
                max_connections: egress.max_connections,
                header_read: egress.timeouts.header_read,
                idle: egress.timeouts.idle,
                h2_max_concurrent_streams: egress.h2.max_concurrent_streams,
            },
            own,
            via: ViaTag::random(),
        })
    }

    /// The per-downstream level cache.
    pub fn levels(&self) -> &DownstreamLevels<MonotonicClock> {
        &self.levels
    }

    /// Per-route levels.
    pub fn routes(&self) -> &Arc<RouteState> {
        &self.routes
    }

    pub fn stats(&self) -> &EgressStats {
        &self.stats
    }

    /// Outbound requests being handled now, response bodies included.
    pub fn active(&self) -> usize {
        self.active.load(Acquire)
    }

    /// Handles one request from the app (never fails: every problem is a response).
    pub async fn handle(
        &self,
        route: Option<&Authority>,
        req: Request<Incoming>,
    ) -> Response<ResponseBody> {
        let arrival = Instant::now();
        let in_flight = InFlight::enter(&self.active);
        let (mut parts, body) = req.into_parts();
        let grpc = parts
            .headers
            .get(CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
        if parts.method == Method::CONNECT {
            // A tunnel hides the downstream's responses, so its level could not be learnt.
            return self.error(None, WeirError::MethodNotAllowed, grpc);
        }
        if parts.uri.scheme().is_some_and(|s| *s != http::uri::Scheme::HTTP) {
            return self.reject(Rejection::Scheme, None, grpc);
        }
        if self.via.seen_in(&parts.headers) {
            return self.reject(Rejection::ViaLoop, None, grpc);
        }
        // The same one authority the inbound role enforces (and no hop-by-hop headers).
        if let Err(status) = crate::forward_headers::check_request_head(&mut parts) {
            return self.error(None, status, grpc);
        }
        let Some(authority) = forward::target_authority(route, &parts.uri, &parts.headers) else {
            return self.error(None, WeirError::BadRequest, grpc);
        };
        let priority = self.priority.read(&parts.headers, self.default_priority).priority;
        let budget = self.budget(&parts.headers);
        if budget.is_zero() {
            self.stats.record(priority.business, EgressOutcome::ShedDeadline);
            return self.refuse(&authority, grpc, EgressOutcome::ShedDeadline, priority);
        }
        // Per-route levels: the downstream route called, the inbound route it serves (a
        // dependency learnt even if refused below), and the call's identity for retries.
        let per_route = self.routes.enabled;
        let out_route: Option<Box<str>> =
            per_route.then(|| route_level::route_of(parts.uri.path()).map(|r| r.into())).flatten();
        let call_id = match (&out_route, &self.waits) {
            (Some(out_route), Some(waits)) => {
                if let Some(route) = waits.route_of(&parts.headers) {
                    self.routes.deps.learn(&route, authority.as_str(), out_route);
                }
                waits.key(&parts.headers).map(|key| call_id(key, authority.as_str(), out_route))
            }
            _ => None,
        };
        let refused = match &out_route {
            Some(r) => {
                let levels = &self.routes.route_levels;
                levels.should_refuse(authority.as_str(), r, priority, &self.levels)
                    || call_id.is_some_and(|id| {
                        let current = self.routes.cached(authority.as_str(), r);
                        self.routes.retries.is_refused_retry(id, current)
                    })
            }
            None => self.levels.should_refuse(authority.as_str(), priority),
        };
        if refused {
            self.stats.record(priority.business, EgressOutcome::ShedDownstream);
            return self.refuse(&authority, grpc, EgressOutcome::ShedDownstream, priority);
        }
        let deadline = arrival + budget;

        let addr = match tokio::time::timeout_at(deadline.into(), self.resolver.resolve(&authority))
            .await
        {
            Ok(Ok(addr)) => addr,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "egress: downstream has no address");
                return self.error(Some(&authority), WeirError::DownstreamUnresolved, grpc);
            }
            Err(_) => return self.error(Some(&authority), WeirError::DownstreamTimeout, grpc),
        };
        if let Some(listener) = self.own.reached_by(addr) {
            tracing::debug!(downstream = %authority, %addr, %listener, "egress: addressed to itself");
            return self.reject(Rejection::OwnListener, Some(&authority), grpc);
        }
        let endpoint = self.endpoint(addr);
        let speaks = self.speaks.get(addr);
        let protocol =
            match speaks.choose(self.protocol, parts.version, &parts.headers, deadline).await {
                Choice::Send(protocol) => protocol,
                Choice::GrpcNeedsH2 => {
                    let (status, mut headers) = app_protocol::grpc_needs_h2_head();
                    headers.insert(self.level_name.clone(), self.level_value(Some(&authority)));
                    return respond(status, headers);
                }
            };
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            self.stats.record(priority.business, EgressOutcome::ShedDeadline);
            return self.refuse(&authority, grpc, EgressOutcome::ShedDeadline, priority);
        }
        let head_request = parts.method == Method::HEAD;
        let received = parts.version;
        // The app waits on this call until its response head is back.
        let waiting = self.waits.as_ref().map(|w| w.call(&parts.headers));
        let mut req = forward::downstream_request(
            parts,
            RequestBody::new(body, self.body_read),
            protocol,
            &authority,
            remaining.saturating_sub(self.deadline_margin),
            &self.timeout_header,
        );
        // After the hop-by-hop strip: `Connection: via` from the app cannot remove it.
        self.via.stamp(req.headers_mut(), received);
        self.stats.record(priority.business, EgressOutcome::Admitted);
        let sent = tokio::time::timeout_at(deadline.into(), endpoint.send(protocol, req)).await;
        drop(waiting);
        let crate::app_client::Exchange { response, lease } = match sent {
            Ok(Ok(exchange)) => exchange,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, downstream = %authority, "egress request failed");
                if matches!(e, crate::app_client::ClientError::Http(_)) {
                    speaks.suspect();
                }
                return self.error(Some(&authority), WeirError::of_downstream(&e), grpc);
            }
            Err(_) => return self.error(Some(&authority), WeirError::DownstreamTimeout, grpc),
        };
        let (mut head, body) = response.into_parts();
        let values = head.headers.get_all(&self.level_name).iter().map(HeaderValue::as_bytes);
        let observation = self.levels.observe(authority.as_str(), values);
        self.stats.level_header(observation);
        if let Observation::Malformed(e) = observation {
            tracing::debug!(error = %e, downstream = %authority, "egress: bad level header ignored");
        }
        if let Some(out_route) = &out_route {
            let routes = head.headers.get_all(route_level::ROUTE).iter().map(HeaderValue::as_bytes);
            let levels =
                head.headers.get_all(route_level::ROUTE_LEVEL).iter().map(HeaderValue::as_bytes);
            self.routes.route_levels.observe(authority.as_str(), out_route, routes, levels);
            // A refusal by the downstream: its retry waits until the level changes.
            if let Some(id) = call_id.filter(|_| is_refusal(&head)) {
                if let Some(level) = self.routes.cached(authority.as_str(), out_route) {
                    self.routes.retries.refused(id, level);
                }
            }
        }
        crate::forward_headers::clean_response(&mut head.headers);
        // As inbound (service.rs): a downstream's HTTP/1.0 must not close the app's
        // keep-alive connection to the egress listener.
        head.version = http::Version::default();
        if head_request || body.is_end_stream() {
            lease.reusable();
            return Response::from_parts(head, ResponseBody::empty());
        }
        let body = ResponseBody::pumped(body, self.body_read, self.write, move |ok| {
            // Until the body is done (or abandoned: the closure is dropped with it).
            let _in_flight = in_flight;
            if ok {
                lease.reusable();
            }
        });
        Response::from_parts(head, body)
    }

    /// The caller's remaining budget: `grpc-timeout`, else the timeout header, else
    /// `egress.default_budget`. An unparsable value counts as absent.
    fn budget(&self, headers: &http::HeaderMap) -> Duration {
        let grpc = headers
            .get(crate::deadline::GRPC_TIMEOUT)
            .and_then(|v| deadline::parse_grpc_timeout(v.as_bytes()));
        grpc.or_else(|| {
            headers.get(&self.timeout_header).and_then(|v| deadline::parse_timeout_ms(v.as_bytes()))
        })
        .unwrap_or(self.default_budget)
    }

    fn endpoint(&self, addr: SocketAddr) -> Arc<Endpoint> {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = pools.get(&addr) {
            return e.clone();
        }
        let endpoint = Arc::new(Endpoint::new(addr, self.client.clone()));
        if pools.len() < MAX_POOLS {
            pools.insert(addr, endpoint.clone());
        }
        endpoint
    }

    /// The downstream's fresh cached level, or fully open when nothing is known.
    fn level_value(&self, authority: Option<&Authority>) -> HeaderValue {
        let level = authority
            .and_then(|a| self.levels.level(a.as_str()))
            .unwrap_or(AdmissionLevel::FULLY_OPEN);
        self.refusals.level_value(level)
    }

    fn refuse(
        &self,
        authority: &Authority,
        grpc: bool,
        outcome: EgressOutcome,
        priority: Priority,
    ) -> Response<ResponseBody> {
        let (reason, wait) = match outcome {
            EgressOutcome::ShedDeadline => (ShedReason::Deadline, None),
            // The longer the downstream's level refuses this class, the longer the wait.
            _ => (ShedReason::Overload, Some(self.ages.refuse(priority.business))),
        };
        let (status, mut headers) = self.refusals.refusal_head_after(grpc, reason, wait);
        if outcome == EgressOutcome::ShedDownstream {
            headers.insert(self.shed_name.clone(), HeaderValue::from_static(DOWNSTREAM_LEVEL));
            if grpc {
                headers.insert(
                    HeaderName::from_static("grpc-message"),
                    HeaderValue::from_static(DOWNSTREAM_GRPC_MESSAGE),
                );
            }
        }
        headers.insert(self.level_name.clone(), self.level_value(Some(authority)));
        respond(status, headers)
    }

    /// Refuses to send the request at all (see [`Rejection`]), with a one-line reason.
    fn reject(
        &self,
        rejection: Rejection,
        authority: Option<&Authority>,
        grpc: bool,
    ) -> Response<ResponseBody> {
        self.stats.reject(rejection);
        let (status, mut headers) = self.refusals.error_head(rejection.error(), grpc);
        headers.insert(self.level_name.clone(), self.level_value(authority));
        let message = rejection.message();
        let body = if grpc {
            headers.insert(
                HeaderName::from_static("grpc-status"),
                HeaderValue::from_static(rejection.grpc_status()),
            );
            headers
                .insert(HeaderName::from_static("grpc-message"), HeaderValue::from_static(message));
            ResponseBody::empty()
        } else {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
            headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from(message.len() + 1));
            ResponseBody::full(format!("{message}\n").into(), None)
        };
        let mut resp = Response::new(body);
        *resp.status_mut() = status;
        *resp.headers_mut() = headers;
        resp
    }

    fn error(
        &self,
        authority: Option<&Authority>,
        error: WeirError,
        grpc: bool,
    ) -> Response<ResponseBody> {
        self.stats.errors.fetch_add(1, Relaxed);
        self.stats.errors_metric.increment(1);
        let (status, mut headers) = self.refusals.error_head(error, grpc);
        headers.insert(self.level_name.clone(), self.level_value(authority));
        respond(status, headers)
    }
}

/// A call's identity for the retry memory: its correlation key, downstream and route.
fn call_id(key: u64, authority: &str, route: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (key, authority, route).hash(&mut h);
    h.finish()
}

/// A weir refusal (or one like it): `503` with `x-envoy-overloaded`, or gRPC status 8.
fn is_refusal(head: &http::response::Parts) -> bool {
    let overloaded = head.headers.contains_key(crate::refusal::ENVOY_OVERLOADED);
    (head.status == StatusCode::SERVICE_UNAVAILABLE && overloaded)
        || head.headers.get("grpc-status").is_some_and(|s| s.as_bytes() == b"8")
}

/// One outbound request in [`EgressService::active`], until dropped.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn enter(active: &Arc<AtomicUsize>) -> Self {
        active.fetch_add(1, AcqRel);
        InFlight(active.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, AcqRel);
    }
}

fn respond(status: StatusCode, headers: http::HeaderMap) -> Response<ResponseBody> {
    let mut resp = Response::new(ResponseBody::empty());
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    resp
}

// === impl EgressStats ===

impl EgressStats {
    fn new() -> Self {
        let _ = crate::telemetry::prometheus();
        metrics::describe_gauge!(
            DOWNSTREAM_LEVEL_METRIC,
            "A downstream's cached admission level (business * 128 + user); 32767 when expired"
        );
        metrics::describe_counter!(
            LEVEL_HEADERS_TOTAL,
            "Level headers on downstream responses, by what the egress cache did with them"
        );
        metrics::describe_counter!(
            ERRORS_TOTAL,
            "Outbound requests answered with weir's own error (downstream down, silent, garbage)"
        );
        metrics::describe_counter!(
            REJECTED_TOTAL,
            "Outbound requests refused before sending: a forwarding loop or a scheme other than http"
        );
        EgressStats {
            requests: (0..256).map(|_| Default::default()).collect(),
            handles: (0..256).map(|_| Default::default()).collect(),
            errors: AtomicU64::new(0),
            errors_metric: metrics::counter!(ERRORS_TOTAL),
            level_headers: LEVEL_HEADER_RESULTS
                .map(|r| metrics::counter!(LEVEL_HEADERS_TOTAL, "result" => r)),
            rejected: Rejection::ALL.map(|r| {
                (AtomicU64::new(0), metrics::counter!(REJECTED_TOTAL, "reason" => r.as_str()))
            }),
        }
    }

    fn reject(&self, rejection: Rejection) {
        let (count, metric) = &self.rejected[rejection as usize];
        count.fetch_add(1, Relaxed);
        metric.increment(1);
    }

    /// Requests refused for `rejection` so far.
    pub fn rejected(&self, rejection: Rejection) -> u64 {
        self.rejected[rejection as usize].0.load(Relaxed)
    }

    #[inline]
    fn record(&self, business: u8, outcome: EgressOutcome) {
        self.requests[business as usize][outcome as usize].fetch_add(1, Relaxed);
        self.handles[business as usize][outcome as usize]
            .get_or_init(|| {
                metrics::counter!(
                    REQUESTS_TOTAL,
                    "role" => "egress",
                    "business" => business.to_string(),
                    "outcome" => outcome.as_str()
                )
            })
            .increment(1);
    }

    fn level_header(&self, observation: Observation) {
        let i = match observation {
            Observation::Cached(_) => 0,
            Observation::Uncached(_) => 1,
            Observation::Absent => 2,
            Observation::Malformed(_) => 3,
            Observation::Repeated => 4,
        };
        self.level_headers[i].increment(1);
    }

    /// Requests of `business` with `outcome` so far.
    pub fn count(&self, business: u8, outcome: EgressOutcome) -> u64 {
        self.requests[business as usize][outcome as usize].load(Relaxed)
    }

    /// Requests with `outcome` so far, all classes.
    pub fn total(&self, outcome: EgressOutcome) -> u64 {
        self.requests.iter().map(|c| c[outcome as usize].load(Relaxed)).sum()
    }

    pub fn errors(&self) -> u64 {
        self.errors.load(Relaxed)
    }
}

/// Keeps `weir_downstream_level{authority}` current: one series per cached authority (at
/// most `egress.max_authorities`), fully open (32767) once a level has expired; and one
/// `weir_downstream_level{authority,route}` per cached route level.
async fn export_levels(service: Arc<EgressService>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(LEVEL_GAUGE_PERIOD);
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
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

// === the listener ===

/// Accepts until `stop` turns true (at most `max_connections` at once; beyond that a new
/// connection is closed at once).
async fn accept_loop(
    listener: TcpListener,
    service: Arc<EgressService>,
    route: Option<Authority>,
    stop: watch::Receiver<bool>,
) {
    let max_connections = service.conn.max_connections;
    let route = route.map(Arc::new);
    let stopping = stop.clone();
    accept_bounded(listener, max_connections, stop, "egress", |stream, permit| {
        let (service, route, stop) = (service.clone(), route.clone(), stopping.clone());
        tokio::spawn(async move {
            serve_connection(stream, service, route, stop).await;
            drop(permit);
        });
    })
    .await
}

/// Requests of one app connection inside the egress, and when the last one left.
struct ConnIdle {
    origin: Instant,
    busy: AtomicUsize,
    idle_since_nanos: AtomicU64,
}

struct Busy<'a>(&'a ConnIdle);

impl ConnIdle {
    fn busy(&self) -> Busy<'_> {
        self.busy.fetch_add(1, AcqRel);
        Busy(self)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let since = self.0.origin.elapsed().as_nanos() as u64;
        self.0.idle_since_nanos.store(since, Release);
        self.0.busy.fetch_sub(1, AcqRel);
    }
}

/// HTTP/1.1 or h2c (prior knowledge), by hyper's own detection; the first byte must come
/// within `timeouts.header_read`, a complete HTTP/1.1 head within it too, and a connection
/// with nothing inside for `timeouts.idle`, or any connection once `stop` turns true (a
/// drain), is asked to close after the requests it carries.
async fn serve_connection(
    stream: TcpStream,
    service: Arc<EgressService>,
    route: Option<Arc<Authority>>,
    mut stop: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let limits = service.conn.clone();
    let mut first = [0u8; 1];
    match tokio::time::timeout(limits.header_read, stream.peek(&mut first)).await {
        Ok(Ok(n)) if n > 0 => {}
        _ => return,
    }
    let idle = Arc::new(ConnIdle {
        origin: Instant::now(),
        busy: AtomicUsize::new(0),
        idle_since_nanos: AtomicU64::new(0),
    });
    let handler = {
        let idle = idle.clone();
        service_fn(move |req| {
            let (service, route, idle) = (service.clone(), route.clone(), idle.clone());
            async move {
                let _busy = idle.busy();
                Ok::<_, Infallible>(service.handle(route.as_deref(), req).await)
            }
        })
    };
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.h2_max_concurrent_streams);
    let conn = builder.serve_connection(TokioIo::new(stream), handler);
    let mut conn = pin!(conn);
    let timer = tokio::time::sleep(limits.idle);
    let mut timer = pin!(timer);
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    let mut stopped = pin!(stopped);
    let mut closing = false;
    loop {
        tokio::select! {
            () = stopped.as_mut(), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "egress: app connection ended");
                }
                return;
            }
            () = timer.as_mut(), if !closing => {
                let now = Instant::now();
                if idle.busy.load(Acquire) > 0 {
                    timer.as_mut().reset((now + limits.idle).into());
                    continue;
                }
                let since = idle.origin + Duration::from_nanos(idle.idle_since_nanos.load(Acquire));
                let at = since + limits.idle;
                if at <= now {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                } else {
                    timer.as_mut().reset(at.into());
                }
            }
        }
    }
}
