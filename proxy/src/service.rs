//! The inbound request path as a stack of layers, one concern each, outermost first:
//!
//! The inbound role: a [`Role`] on the server skeleton ([`crate::server`]), which owns the
//! connections; the request stack it shares with the egress role is [`crate::http`].
//!
//! 1. **level** ([`Inbound::serve`]): every response — the app's, a refusal, weir's own
//!    error — leaves with `x-admission-level`.
//! 2. **priority** ([`Inbound::priority`]): from the headers (inner hop) or the priority
//!    table (entry), before a byte of the body is read.
//! 3. **admission**: below the admission level is refused (enforce) or counted (shadow).
//! 4. **queue** ([`queue`]): a free in-flight slot, or a wait in the queue policy's service
//!    order (priority order; while the level does not bind, oldest first while the queue
//!    is short, else waiters about to give up first); the wait is the queuing time the
//!    detector averages. One connection may hold at most `max_queued_per_connection` of the
//!    waiters. A caller that leaves while queued (h2
//!    reset, HTTP/1.1 close) drops this future, which leaves the queue.
//!    Whether it may queue (the door), when its wait ends early (its timer) and whether
//!    it may leave for the app are the queue policy's ([`admission_core::queue_policy`],
//!    shared with the simulator); [`queue`] holds the glue.
//! 5. **gate**: at dequeue, a request whose budget is spent, that waited too long, or that
//!    cannot finish in time is refused and never forwarded.
//! 6. **app** ([`forward`]): the request goes to the app with the remaining budget; the
//!    response head is bounded by it; the in-flight slot is released when the app's
//!    exchange ends (see [`crate::body`]).
//!
//! The path takes any request body ([`CallerBody`]: hyper's, moved, or any other, boxed)
//! and reaches the app through [`AppClient`] (the pooled [`Endpoint`] in production), and
//! reads time from tokio's clock only, so its rules are tested in-process on a paused clock
//! (`service/tests.rs`).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use admission_core::audit::Outcome;
use admission_core::queue_policy::{Door, QueuePolicy, Verdict, Waiter};
use admission_core::{Decision, Priority};
use http::{HeaderName, Method, Request, Response};
use hyper::body::{Body, Incoming};
use tokio::time::Instant;

use crate::app_client::{AppClient, ClientSettings, Endpoint, Protocol};
use crate::app_protocol::{self, Choice, Upstream};
use crate::body::{
    CallerBody, EarlyBody, PumpEvent, RequestBodyFailure, ResponseBody, READ_AHEAD_LIMIT,
};
use crate::config::{AppProtocol, SidecarConfig};
use crate::forward_headers::{check_scanned_request_head, Carried};
use crate::http::{respond, Names};
use crate::priority::{PriorityHeaders, ReadPriority};
use crate::refusal::{Refusals, ShedReason, WeirError};
use crate::route_level::{self, Ages, RouteState};
use crate::server::budget_timer::{Budget, BudgetTimer};
use crate::server::{LevelStamp, Role};
use crate::shared::Shared;
use crate::telemetry::ProxyMetrics;
use admission_core::route::RouteDoor;

mod exchange;
mod forward;
mod queue;

use exchange::AppExchange;

/// A response of known length up to this size is read whole from the app before it is sent
/// on, so its in-flight slot is free before the caller reads a byte of it.
const BUFFER_LIMIT: u64 = 64 * 1024;

/// Shared h2c connections to the app.
const APP_H2_CONNECTIONS: usize = 2;

/// The inbound role's request path, shared by every connection; `A` reaches the app.
pub struct Inbound<A = Endpoint> {
    shared: Arc<Shared>,
    metrics: ProxyMetrics,
    refusals: Refusals,
    priority: PriorityHeaders,
    timeout_header: HeaderName,
    entry: bool,
    task_timeout: Duration,
    max_budget: Duration,
    /// The door, the waiter's timer and the dequeue check (shared with the simulator).
    queue_policy: QueuePolicy,
    app: A,
    app_protocol: AppProtocol,
    /// What the app speaks (`app_protocol: auto`), probed and remembered.
    app_speaks: Upstream,
    max_queued_per_connection: usize,
    /// The configured names the path reads, found present or absent in the same pass over
    /// a head's names as the forwarding rules' own (indexed by `ASKED_*`).
    asked: [HeaderName; 2],
    body_read: Duration,
    write: Duration,
    /// Per-route levels (with the egress role on).
    routes: Option<Arc<RouteState>>,
    /// How long the level has refused each class (the refusal's `retry-after` grows).
    ages: Ages,
}

/// What the inbound role keeps per caller connection (the skeleton keeps the rest).
#[derive(Debug, Default)]
pub struct ConnState {
    /// Requests of this connection waiting in the queue.
    queued: AtomicUsize,
    /// The timer bounding each request's wait for the app, reused from one to the next.
    budget: BudgetTimer,
}

/// What a layer answers instead of passing the request on.
type Early = Response<ResponseBody>;

/// Indices into [`Inbound::asked`].
const ASKED_TIMEOUT: usize = 0;
const ASKED_BUSINESS: usize = 1;

// === impl Inbound ===

impl Inbound<Endpoint> {
    /// The inbound role towards `inbound.app`, through the pooled client.
    pub fn new(
        config: &SidecarConfig,
        shared: Arc<Shared>,
        metrics: ProxyMetrics,
    ) -> Result<Self, String> {
        let inbound = &config.inbound;
        let settings = ClientSettings {
            connect_timeout: inbound.timeouts.app_connect,
            // More idle connections than requests ever at the app at once are never used.
            max_idle_http1: inbound.max_inflight.max(1),
            idle_timeout: inbound.timeouts.app_idle,
            h2_connections: APP_H2_CONNECTIONS,
        };
        Self::with_app(config, shared, metrics, Endpoint::new(inbound.app, settings))
    }
}

impl<A: AppClient> Inbound<A> {
    /// The inbound role reaching the app through `app` (the probe of `app_protocol: auto`
    /// goes to its address).
    pub fn with_app(
        config: &SidecarConfig,
        shared: Arc<Shared>,
        metrics: ProxyMetrics,
        app: A,
    ) -> Result<Self, String> {
        let inbound = &config.inbound;
        let names = Names::new(&inbound.headers)?;
        let shadow = shared.engine.mode() == admission_core::Mode::Shadow;
        let app_speaks = Upstream::new(app.addr(), inbound.timeouts.app_connect);
        let asked = [names.timeout.clone(), names.business.clone()];
        Ok(Inbound {
            routes: shared.waits.as_ref().and_then(|w| w.routes()).filter(|r| r.enabled).cloned(),
            ages: route_level::ages(inbound.retry_after),
            shared,
            metrics,
            refusals: Refusals::new(names.level, names.shed, inbound.retry_after),
            priority: PriorityHeaders {
                business: names.business,
                user: names.user,
                forward_user_id: inbound.forward_user_id,
                default: inbound.default_priority(),
            },
            asked,
            timeout_header: names.timeout,
            entry: inbound.entry,
            task_timeout: inbound.task_timeout,
            max_budget: inbound.max_budget(),
            queue_policy: QueuePolicy::new(inbound.task_timeout, inbound.overload_max_wait, shadow),
            app,
            app_protocol: inbound.app_protocol,
            app_speaks,
            max_queued_per_connection: inbound.max_queued_per_connection,
            body_read: inbound.timeouts.body_read,
            write: inbound.timeouts.write,
        })
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub fn app_addr(&self) -> SocketAddr {
        self.app.addr()
    }

    /// The level layer around everything else.
    pub async fn serve(self: Arc<Self>, conn: Arc<ConnState>, req: Request<CallerBody>) -> Early {
        let _active = self.shared.active_request();
        // The route (with per-route levels on): the normalised path, no query.
        let route: Option<Box<str>> = self
            .routes
            .as_ref()
            .and_then(|_| route_level::route_of(req.uri().path()))
            .map(|r| r.into());
        // Whether the own level spares the route: read once, for the door and the stamp.
        let spared = match (&self.routes, route.as_deref()) {
            (Some(routes), Some(route)) => routes.spared_now(route),
            _ => false,
        };
        let mut response = self.handle(&conn, req, route.as_deref(), spared).await;
        let own = self.shared.engine.level();
        let headers = response.headers_mut();
        headers.insert(self.refusals.level_name().clone(), self.refusals.level_value(own));
        match (&self.routes, route) {
            (Some(routes), Some(route)) => {
                let level = routes.aggregated(&route, own, spared);
                if let Ok(value) = http::HeaderValue::from_str(&route) {
                    headers.insert(route_level::ROUTE, value);
                    headers.insert(route_level::ROUTE_LEVEL, self.refusals.level_value(level));
                }
            }
            // Never passed on from the app: they speak for this sidecar only. (Looked for
            // by name first: a comparison per header, not two hashed lookups per response.)
            _ => {
                let is_route =
                    |k: &HeaderName| k == route_level::ROUTE || k == route_level::ROUTE_LEVEL;
                if headers.keys().any(is_route) {
                    headers.remove(route_level::ROUTE);
                    headers.remove(route_level::ROUTE_LEVEL);
                }
            }
        }
        response
    }

    async fn handle(
        self: &Arc<Self>,
        conn: &ConnState,
        req: Request<CallerBody>,
        route: Option<&str>,
        route_spared: bool,
    ) -> Early {
        let arrival = Instant::now();
        let (mut parts, body) = req.into_parts();
        let mut body = EarlyBody::new(body);
        let carried = Carried::scan(&parts.headers, &self.asked);
        let grpc = carried.may_carry_content_type() && crate::http::is_grpc(&parts.headers);
        if let Err(error) = crate::http::check_method(&parts.method) {
            return self.error(error, grpc);
        }
        // One authority, no transfer coding weir cannot pass on, no hop-by-hop headers:
        // before anything reads the head (see `forward_headers::check_request_head`).
        let carried = match check_scanned_request_head(&mut parts, carried) {
            Ok(carried) => carried,
            Err(error) => return self.error(error, grpc),
        };
        let priority = match self.priority(&mut parts, carried) {
            Ok(p) => p,
            Err(early) => return *early,
        };
        let deadline = arrival + self.budget(&parts.headers, carried);
        let engine = &self.shared.engine;

        // The route's door: a downstream this route calls would refuse it (per-route levels),
        // so the app does not spend work on it first.
        let (mut probe, mut spared) = (false, false);
        if let (Some(routes), Some(route)) = (&self.routes, route) {
            spared = routes.spares(route_spared, engine.level());
            match routes.door(route, priority) {
                RouteDoor::Pass => {}
                RouteDoor::Probe => probe = true,
                RouteDoor::Refuse if self.shadow() => {}
                RouteDoor::Refuse => return self.refuse(grpc, ShedReason::RouteLevel, priority),
            }
        }

        // Admission.
        // (Counted in the level's histogram either way; a route the own level spares is
        // not refused by it: see `RouteHolds`.)
        // A request the level refuses that finds a worker of the app idle (the queue empty)
        // takes it: refusing would protect no one (`InflightLimit::try_idle_slot`). Only
        // without a body (a slot is never held while a body is awaited), and only while the
        // level admits the top class whole: once the level cuts into it, the top class's
        // next arrival must not find that worker taken by a less important request.
        let mut idle_slot = None;
        let mut would_shed = match engine.admit(priority) {
            Decision::Admit => false,
            Decision::WouldShed => true,
            Decision::Shed if spared => false,
            Decision::Shed => {
                idle_slot = (body.is_end_stream() && engine.level().priority().business > 0)
                    .then(|| self.shared.limit.try_idle_slot())
                    .flatten();
                if idle_slot.is_none() {
                    return self.refuse(grpc, ShedReason::Overload, priority);
                }
                self.metrics.idle_slot_admitted.increment(1);
                false
            }
        };

        // Protocol to the app: under `auto`, the first HTTP/2 request may wait for the probe
        // (bounded by the connect timeout and the budget), before it takes a slot. `now`:
        // the arrival, unless it waited (the head was read microseconds ago: one clock read
        // fewer per request).
        let (version, headers) = (parts.version, &parts.headers);
        let (configured, by) = (self.app_protocol, deadline.into_std());
        let (choice, now) =
            self.app_speaks.choose(configured, version, headers, arrival.into_std(), by).await;
        let now = Instant::from_std(now);
        let protocol = match choice {
            Choice::Send(protocol) => protocol,
            Choice::GrpcNeedsH2 => {
                let (status, headers) = app_protocol::grpc_needs_h2_head();
                return respond(status, headers);
            }
        };

        // A budget spent before the body was even waited for (`grpc-timeout: 0m`, a deadline
        // the caller let pass): refused as past its deadline now. Waiting for the body first
        // would end it as a caller late with its body (504, gRPC status 4) whenever the body
        // had not come with the head, so the answer would depend on a race.
        if deadline <= now && !self.shadow() {
            return self.refuse(grpc, ShedReason::Deadline, priority);
        }

        // Body: one of declared length takes a slot only once it is here (see
        // `body_before_slot`); the wait for a slot starts then.
        let ready = match body.declared_len() {
            None => arrival,
            // Boxed: only a request with a body carries the wait for it.
            Some(declared) => {
                match Box::pin(self.body_before_slot(&mut body, declared, deadline)).await {
                    Ok(ready) => ready,
                    Err(failure) => return self.error(failure.error(), grpc),
                }
            }
        };

        // Queue. A route the own level spares waits ahead of the routes it refuses (their
        // requests hold the app waiting on slow downstreams: they take the cut, at the door
        // and in the queue; see `RouteHolds`). Only while the level admits the top class
        // whole: once it refuses some of it, nothing is spared and the class order holds.
        let queued_as = if spared { Priority::MOST_IMPORTANT } else { priority };
        let waiter = self.waiter(queued_as, ready, deadline);
        // (A refused request that took an idle worker is no sample of the admitted
        // stream's queuing: it never queued as one of it.)
        let free = idle_slot.or_else(|| {
            self.shared.limit.try_slot().inspect(|_| {
                engine.record_queuing(Duration::ZERO);
                self.metrics.queuing_time.record(0.0);
            })
        });
        let (slot, queued) = match free {
            Some(slot) => (slot, false),
            None => {
                // Boxed: only a request that queues carries the wait's state (its timers,
                // the queue's entry) in this future, which every request builds and moves.
                let watch = (parts.version < http::Version::HTTP_2).then_some(&mut body);
                let queued = Box::pin(self.queued(conn, &waiter, watch, grpc, priority)).await;
                match queued {
                    Ok((slot, over_bound)) => {
                        would_shed |= over_bound;
                        (slot, true)
                    }
                    Err(early) => return early,
                }
            }
        };

        // Gate. Without a wait, the request was ready "now" to within microseconds.
        let now = if queued { Instant::now() } else { ready };
        let verdict = self.queue_policy.at_dequeue(&waiter, &self.conditions(now), queued);
        if !verdict.is_forward() {
            if !self.shadow() {
                drop(slot);
                // The queuing sample counted it as dispatched; it never reached the app, so
                // the goodput law must not count it as capacity.
                engine.record_gate_drop();
                return self.refuse(grpc, ShedReason::Deadline, priority);
            }
            would_shed = true;
        }
        let outcome = if would_shed { Outcome::WouldShed } else { Outcome::Admitted };
        self.shared.audit.record(priority.business, outcome);

        // App. What shadow mode forwards although enforcing would not have may be past its
        // budget already; it gets the task timeout, as if weir were not there.
        let visit = self
            .shared
            .waits
            .as_ref()
            .and_then(|w| w.visit_route(&mut parts.headers, route, probe));
        let cost_route = crate::control_loop::route_key(parts.uri.path());
        let exchange = AppExchange::new(slot, now, self.shared.clone(), visit, cost_route);
        let deadline = if would_shed { deadline.max(now + self.task_timeout) } else { deadline };
        self.forward(conn, parts, carried, body, protocol, deadline, exchange, grpc).await
    }

    /// The queue layer's wait for a slot, once none was free: the door, then the wait (the
    /// slot, and whether it was granted over the class's bound), or the answer that ends it.
    /// `watch`: an HTTP/1.1 caller's body, read ahead while queued, or a caller who leaves is
    /// not seen leaving (h2 callers reset the stream, which drops this future).
    async fn queued(
        &self,
        conn: &ConnState,
        waiter: &Waiter,
        watch: Option<&mut EarlyBody>,
        grpc: bool,
        priority: Priority,
    ) -> Result<(crate::inflight::Slot, bool), Early> {
        // The door: a request that would wait longer than its budget allows is refused now,
        // with a fast 503, rather than after the wait.
        if let Door::Refuse(_) = self.door(waiter) {
            return Err(self.refuse(grpc, ShedReason::Overload, priority));
        }
        self.shared.control.on_queued();
        // Set by the waiter's timer when it ends the wait (the queue's accounting then does
        // not count it as a caller who left).
        let refused = AtomicBool::new(false);
        let timer = async {
            let verdict = self.refused_while_waiting(waiter).await;
            refused.store(true, Relaxed);
            match verdict {
                Verdict::WaitedOut => ShedReason::Overload,
                _ => ShedReason::Deadline,
            }
        };
        let waited = match watch.filter(|body| !body.is_end_stream()) {
            Some(body) => tokio::select! {
                biased;
                waited = self.wait_for_slot(conn, waiter, &refused) => waited,
                () = body.caller_gone() => return Err(self.error(WeirError::CallerGone, grpc)),
                reason = timer => return Err(self.refuse(grpc, reason, priority)),
            },
            None => tokio::select! {
                biased;
                waited = self.wait_for_slot(conn, waiter, &refused) => waited,
                reason = timer => return Err(self.refuse(grpc, reason, priority)),
            },
        };
        waited.map_err(|()| self.refuse(grpc, ShedReason::Overload, priority))
    }

    /// The body layer: a request body of declared length takes an in-flight slot only once
    /// all of it, or its first [`READ_AHEAD_LIMIT`] bytes, have arrived (each gap within
    /// `timeouts.body_read`, the whole within the budget: else 408 / 504, and the app never
    /// sees it). A caller that trickles its body is then the only one who waits for it: it
    /// holds no slot the app's other callers need. A body without a declared length (a
    /// chunked upload, a gRPC stream) may be an exchange in which the caller waits for the
    /// app before it sends more, so it goes on as it comes; once it keeps the app waiting,
    /// its slot is lent (see [`RequestBody::lending`]). When the request is ready for the
    /// queue (the caller calls it only for a body of `declared` length: any other request
    /// is ready on arrival).
    ///
    /// [`RequestBody::lending`]: crate::body::RequestBody::lending
    async fn body_before_slot(
        &self,
        body: &mut EarlyBody,
        declared: u64,
        deadline: Instant,
    ) -> Result<Instant, RequestBodyFailure> {
        body.arrive(declared.min(READ_AHEAD_LIMIT), self.body_read, deadline).await?;
        Ok(Instant::now())
    }

    /// The priority layer. Entry: the table's verdict replaces whatever the client claimed
    /// (the path the table saw is the one forwarded); inner hop: the caller's headers.
    fn priority(
        &self,
        parts: &mut http::request::Parts,
        carried: Carried,
    ) -> Result<Priority, Box<Early>> {
        let table = self.shared.table.load();
        if self.entry {
            let unix = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
            let stamped = self.priority.stamp_parts(
                &parts.method,
                &parts.uri,
                &mut parts.headers,
                &table,
                unix,
            );
            return match stamped {
                Ok(stamp) => {
                    if let Some(path) = stamp.rewrite {
                        forward::replace_path(&mut parts.uri, path);
                    }
                    Ok(stamp.priority)
                }
                // A path that cannot be normalised is not classified, and not forwarded.
                Err(bad) => {
                    let mut resp = self.error(WeirError::BadRequest, false);
                    resp.headers_mut().remove(http::header::CONTENT_LENGTH);
                    *resp.body_mut() = ResponseBody::full(bad.to_string().into(), None);
                    Err(Box::new(resp))
                }
            };
        }
        let default = self.priority.default_priority(&table);
        let read = if carried.may_carry(ASKED_BUSINESS) {
            self.priority.read(&parts.headers, default)
        } else {
            ReadPriority::business_missing(default)
        };
        if let Some(reason) = read.invalid {
            self.metrics.header_invalid(reason).increment(1);
        }
        Ok(read.priority)
    }

    /// The caller's remaining budget: `grpc-timeout`, else the timeout header, else the task
    /// timeout (an unparsable value counts as absent), at most `max_budget`.
    fn budget(&self, headers: &http::HeaderMap, carried: Carried) -> Duration {
        if !carried.may_carry_grpc_timeout() && !carried.may_carry(ASKED_TIMEOUT) {
            return self.task_timeout;
        }
        crate::http::budget(headers, &self.timeout_header, self.task_timeout, self.max_budget)
    }

    fn shadow(&self) -> bool {
        self.shared.engine.mode() == admission_core::Mode::Shadow
    }

    fn refuse(&self, grpc: bool, reason: ShedReason, priority: Priority) -> Early {
        let (outcome, wait) = match reason {
            // The longer the level refuses this class, the longer the caller is asked to wait.
            ShedReason::Overload | ShedReason::RouteLevel => {
                (Outcome::ShedOverload, Some(self.ages.refuse(priority.business)))
            }
            ShedReason::Deadline => (Outcome::ShedDeadline, None),
        };
        self.shared.audit.record(priority.business, outcome);
        let (status, headers) = self.refusals.refusal_head_after(grpc, reason, wait);
        respond(status, headers)
    }

    fn error(&self, error: WeirError, grpc: bool) -> Early {
        let (status, headers) = self.refusals.error_head(error, grpc);
        respond(status, headers)
    }

    /// The app layer: forward, bound the head by the budget, and settle the exchange when
    /// the app's body has ended.
    #[allow(clippy::too_many_arguments)]
    async fn forward(
        &self,
        conn: &ConnState,
        parts: http::request::Parts,
        checked: Carried,
        body: EarlyBody,
        protocol: Protocol,
        deadline: Instant,
        mut exchange: AppExchange,
        grpc: bool,
    ) -> Early {
        // From the dispatch, a few microseconds ago: one clock read fewer per request.
        let remaining = deadline.saturating_duration_since(exchange.dispatched());
        let head_request = parts.method == Method::HEAD;
        let body = body
            .into_request_body(self.body_read)
            .until(deadline)
            .lending(&self.shared.limit, exchange.stall_grace());
        let caller_body = body.probe();
        let caller_waited = body.caller_waited();
        let req = forward::app_request(
            parts,
            body,
            protocol,
            self.app.addr(),
            remaining,
            &self.timeout_header,
            Some(checked),
        );
        // One timer for the head and a small body alike: the connection's, moved to this
        // request's deadline (see `BudgetTimer`).
        let mut budget = conn.budget.lend(deadline);
        // Boxed: the client's future is the largest part of this one, which is built and
        // moved by every layer above it on each request; a pointer is cheaper to carry.
        let dispatched = exchange.dispatched().into_std();
        let sent = within(&mut budget, Box::pin(self.app.send(protocol, req, dispatched))).await;
        let crate::app_client::Exchange { response, lease } = match sent {
            Ok(Ok(exchange)) => exchange,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "app request failed");
                if matches!(e, crate::app_client::ClientError::Http(_)) {
                    // Perhaps the app no longer speaks what it was found to speak.
                    self.app_speaks.suspect();
                }
                exchange.failed();
                // The caller's own body is not the app's fault: 400 / 408 / 504, not 502.
                let error = caller_body.failure().map_or(e.app_error(), |f| f.error());
                return self.error(error, grpc);
            }
            Err(_) => {
                exchange.timed_out();
                return self.error(WeirError::AppTimeout, grpc);
            }
        };
        let (mut head, body) = response.into_parts();
        let waited = caller_waited.map_or(Duration::ZERO, |w| w.get());
        exchange.headers_received(waited, exchange::is_deadline_answer(&head));
        crate::forward_headers::clean_response(&mut head.headers);
        // The app's HTTP version is the app connection's business: an HTTP/1.0 app's
        // response, written as HTTP/1.0, would cost an HTTP/1.1 caller its keep-alive
        // (hyper's server closes after it). The caller gets weir's own version.
        head.version = http::Version::default();
        // A HEAD response has no body, whatever an app streams after it (an h2 app that does
        // would otherwise reset the stream on the way through).
        if head_request || body.is_end_stream() {
            exchange.done();
            lease.reusable();
            return Response::from_parts(head, ResponseBody::empty());
        }
        if body.size_hint().exact().is_some_and(|n| n <= BUFFER_LIMIT) {
            return match within(&mut budget, crate::body::read_whole(body)).await {
                Ok(Ok((data, trailers))) => {
                    exchange.done();
                    lease.reusable();
                    let body = ResponseBody::full(data, trailers).watched();
                    Response::from_parts(head, body)
                }
                Ok(Err(e)) => {
                    let e: crate::body::BoxError = e.into();
                    tracing::debug!(error = %e, "app response body failed");
                    exchange.failed();
                    self.error(WeirError::AppFailed, grpc)
                }
                Err(_) => {
                    exchange.failed();
                    self.error(WeirError::AppTimeout, grpc)
                }
            };
        }
        // The slot goes back when the app's body ends, or once the caller keeps the app
        // waiting (see `AppExchange::stall_grace`); the lease (the app connection, or the h2
        // stream's place) only when the body ends.
        let stall_grace = exchange.stall_grace();
        let place_wanted = lease.place_wanted();
        let (mut exchange, mut lease) = (Some(exchange), Some(lease));
        let body = ResponseBody::pumped_with_events(
            body,
            self.body_read,
            self.write,
            stall_grace,
            place_wanted,
            move |event| {
                if let Some(exchange) = exchange.take() {
                    match event {
                        PumpEvent::Ended { ok: false } => exchange.failed(),
                        PumpEvent::CallerStalled | PumpEvent::Ended { ok: true } => exchange.done(),
                    }
                }
                if event == (PumpEvent::Ended { ok: true }) {
                    if let Some(lease) = lease.take() {
                        lease.reusable();
                    }
                }
            },
        );
        Response::from_parts(head, body.watched())
    }
}

/// `work`'s output, or `Err` once `budget` has elapsed (`work` is polled first, as
/// `tokio::time::timeout` does, so what is ready at the deadline still counts).
async fn within<F: Future>(budget: &mut Budget<'_>, work: F) -> Result<F::Output, ()> {
    let mut work = std::pin::pin!(work);
    std::future::poll_fn(|cx| {
        if let std::task::Poll::Ready(output) = work.as_mut().poll(cx) {
            return std::task::Poll::Ready(Ok(output));
        }
        budget.poll_expired(cx).map(Err)
    })
    .await
}

// === impl Role for Inbound ===

impl<A: AppClient> LevelStamp for Inbound<A> {
    /// `x-admission-level` (as configured) and the current level.
    fn level_header(&self) -> (&HeaderName, http::HeaderValue) {
        let value = self.refusals.level_value(self.shared.engine.level());
        (self.refusals.level_name(), value)
    }
}

impl<A: AppClient> Role for Inbound<A> {
    type Conn = ConnState;

    fn serve(
        self: Arc<Self>,
        conn: Arc<ConnState>,
        req: Request<Incoming>,
    ) -> impl Future<Output = Early> + Send + 'static {
        Inbound::serve(self, conn, req.map(CallerBody::from))
    }
}

#[cfg(test)]
mod tests;
