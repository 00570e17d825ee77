//! The egress role's policy for one outbound request (the order of its checks is in
//! [`super`]'s documentation), and the [`Role`] the server skeleton runs it as.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use admission_core::audit::AuditCounters;
use admission_core::downstream::{DownstreamLevels, Observation};
use admission_core::{MonotonicClock, Priority};
use http::uri::Authority;
use http::{HeaderName, HeaderValue, Method, Request, Response};
use hyper::body::{Body, Incoming};
use weir_net::drain::Watch;

use super::forward;
use super::loops::{OwnListeners, ViaTag};
use super::stats::{EgressOutcome, EgressStats, Rejection};
use crate::app_client::{ClientSettings, Endpoint};
use crate::app_protocol::{self, Choice, Upstreams};
use crate::body::{RequestBody, ResponseBody};
use crate::config::{AppProtocol, SidecarConfig};
use crate::deadline::MAX_BUDGET;
use crate::http::Names;
use crate::own_time::DownstreamWaits;
use crate::priority::PriorityHeaders;
use crate::refusal::{Refusals, WeirError};
use crate::route_level::{self, Ages, RouteState};
use crate::server::{LevelStamp, Role};

/// Shared h2c connections per downstream address.
const H2_CONNECTIONS: usize = 2;
/// Downstream addresses with a connection pool; beyond that, a request gets a fresh,
/// unpooled connection (bounded memory whatever the app calls).
pub(super) const MAX_POOLS: usize = 1024;

/// What every egress connection shares.
pub struct EgressService {
    pub(super) levels: Arc<DownstreamLevels<MonotonicClock>>,
    /// Per-route levels (shared with the inbound role when the sidecar runs both).
    pub(super) routes: Arc<RouteState>,
    /// How long the downstream's level has refused each class (`retry-after` grows).
    pub(super) ages: Ages,
    pub(super) stats: EgressStats,
    pub(super) refusals: Refusals,
    pub(super) names: Names,
    priority: PriorityHeaders,
    /// Unmarked traffic is what a downstream treats as its least important.
    default_priority: Priority,
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
    /// Tracks the outbound requests being handled, response bodies included: what a drain
    /// waits for.
    drain: Watch,
    /// Every listener of this process: never a downstream.
    own: OwnListeners,
    /// This egress's `Via` entry.
    pub(super) via: ViaTag,
    /// The app's waits on its downstreams, for the inbound role's adaptive limit.
    waits: Option<Arc<DownstreamWaits>>,
}

/// One egress listener as the server skeleton runs it: the service, and the fixed route of
/// its listener (`egress.routes[i]`), if it is one.
pub(super) struct EgressListener {
    pub(super) service: Arc<EgressService>,
    pub(super) route: Option<Authority>,
}

// === impl EgressService ===

impl EgressService {
    /// `own`: every listener of this process, never a downstream; `drain`: the egress's
    /// drain, which waits for the requests this service tracks; `requests`: the per-class
    /// counters the control API renders as `weir_requests_total{role="egress"}`; `waits`:
    /// where every outbound call is reported (the inbound role's pairing of the app's calls
    /// with the requests they serve, [`crate::own_time`]).
    pub fn new(
        config: &SidecarConfig,
        own: OwnListeners,
        drain: Watch,
        requests: Arc<AuditCounters>,
        waits: Option<Arc<DownstreamWaits>>,
    ) -> Result<Self, String> {
        let egress = &config.egress;
        let names = Names::new(&config.inbound.headers)?;
        // The inbound role's per-route state when the sidecar runs both roles.
        let routes = match waits.as_ref().and_then(|w| w.routes()) {
            Some(routes) => routes.clone(),
            None => Arc::new(RouteState::new(
                &egress.per_route,
                egress.level_expiry,
                egress.max_authorities,
            )),
        };
        Ok(EgressService {
            levels: routes.authority_levels.clone(),
            routes,
            ages: route_level::ages(config.inbound.retry_after),
            stats: EgressStats::new(requests),
            refusals: Refusals::new(
                names.level.clone(),
                names.shed.clone(),
                config.inbound.retry_after,
            ),
            priority: PriorityHeaders {
                business: names.business.clone(),
                user: names.user.clone(),
                forward_user_id: true,
                default: None,
            },
            names,
            default_priority: config
                .inbound
                .default_priority()
                .unwrap_or(Priority::LEAST_IMPORTANT),
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
                idle_timeout: egress.timeouts.downstream_idle,
                h2_connections: H2_CONNECTIONS,
            },
            pools: Mutex::new(HashMap::new()),
            body_read: egress.timeouts.body_read,
            write: egress.timeouts.write,
            drain,
            own,
            via: ViaTag::random(),
            waits,
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
        self.drain.in_flight()
    }

    /// Handles one request from the app (never fails: every problem is a response).
    pub async fn handle(
        &self,
        route: Option<&Authority>,
        req: Request<Incoming>,
    ) -> Response<ResponseBody> {
        let arrival = Instant::now();
        let in_flight = self.drain.track();
        let (mut parts, body) = req.into_parts();
        let grpc = crate::http::is_grpc(&parts.headers);
        if let Err(error) = crate::http::check_method(&parts.method) {
            return self.error(None, error, grpc);
        }
        if parts.uri.scheme().is_some_and(|s| *s != http::uri::Scheme::HTTP) {
            return self.reject(Rejection::Scheme, None, grpc);
        }
        if self.via.seen_in(&parts.headers) {
            return self.reject(Rejection::ViaLoop, None, grpc);
        }
        // The same one authority the inbound role enforces (and no hop-by-hop headers).
        if let Err(error) = crate::forward_headers::check_request_head(&mut parts) {
            return self.error(None, error, grpc);
        }
        let Some(authority) = forward::target_authority(route, &parts.uri, &parts.headers) else {
            return self.error(None, WeirError::BadRequest, grpc);
        };
        let priority = self.priority.read(&parts.headers, self.default_priority).priority;
        let budget = crate::http::budget(
            &parts.headers,
            &self.names.timeout,
            self.default_budget,
            MAX_BUDGET,
        );
        if budget.is_zero() {
            return self.refuse(&authority, grpc, priority, EgressOutcome::ShedDeadline);
        }
        // Per-route levels: the downstream route called, the inbound route it serves (a
        // dependency learnt even if refused below), and the call's identity for retries.
        let out_route: Option<Box<str>> = self
            .routes
            .enabled
            .then(|| route_level::route_of(parts.uri.path()).map(|r| r.into()))
            .flatten();
        let mut probe = false;
        let call_id = match (&out_route, &self.waits) {
            (Some(out_route), Some(waits)) => {
                if let Some((route, is_probe)) = waits.route_of(&parts.headers) {
                    self.routes.deps.learn(&route, authority.as_str(), out_route);
                    probe = is_probe;
                }
                waits.key(&parts.headers).map(|key| call_id(key, authority.as_str(), out_route))
            }
            _ => None,
        };
        let refused = match &out_route {
            // The inbound door's probe: it goes out to bring news of a stale level.
            Some(_) if probe => false,
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
            return self.refuse(&authority, grpc, priority, EgressOutcome::ShedDownstream);
        }
        let deadline = arrival + budget;

        let resolved =
            tokio::time::timeout_at(deadline.into(), self.resolver.resolve(&authority)).await;
        let addr = match resolved {
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
        let now = Instant::now();
        let protocol = match speaks
            .choose(self.protocol, parts.version, &parts.headers, now, deadline)
            .await
            .0
        {
            Choice::Send(protocol) => protocol,
            Choice::GrpcNeedsH2 => {
                let (status, mut headers) = app_protocol::grpc_needs_h2_head();
                headers.insert(self.names.level.clone(), self.level_value(Some(&authority)));
                return crate::http::respond(status, headers);
            }
        };
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return self.refuse(&authority, grpc, priority, EgressOutcome::ShedDeadline);
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
            &self.names.timeout,
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
                return self.error(Some(&authority), e.downstream_error(), grpc);
            }
            Err(_) => return self.error(Some(&authority), WeirError::DownstreamTimeout, grpc),
        };
        let (mut head, body) = response.into_parts();
        let values = head.headers.get_all(&self.names.level).iter().map(HeaderValue::as_bytes);
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
        Response::from_parts(head, body.watched())
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
    (head.status == http::StatusCode::SERVICE_UNAVAILABLE && overloaded)
        || head.headers.get("grpc-status").is_some_and(|s| s.as_bytes() == b"8")
}

// === impl Role for EgressListener ===

impl LevelStamp for EgressListener {
    /// What weir's own egress errors carry when no downstream is known: fully open.
    fn level_header(&self) -> (&HeaderName, HeaderValue) {
        (&self.service.names.level, self.service.level_value(None))
    }
}

impl Role for EgressListener {
    type Conn = ();

    async fn serve(
        self: Arc<Self>,
        _conn: Arc<()>,
        req: Request<Incoming>,
    ) -> Response<ResponseBody> {
        self.service.handle(self.route.as_ref(), req).await
    }
}
