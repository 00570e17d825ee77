//! Per-route levels in the proxy (docs/design.md, "Per-route levels"): what the inbound
//! and egress roles share when the egress role is on.
//!
//! - The inbound role names each request's **route** (its normalised path, no query),
//!   registers it with the request's correlation key ([`crate::own_time`]), refuses at its
//!   door a request whose route depends on a downstream whose cached level would refuse it
//!   (`x-weir-shed: route-level`, before the app spends work), and stamps the route's
//!   responses with `x-weir-route` and `x-weir-route-level` = min(own level, the route's
//!   downstreams' fresh cached levels).
//! - The egress role learns, for each call, that the inbound route the call serves depends
//!   on `(downstream authority, outbound route)`; caches `x-weir-route-level` per
//!   `(authority, route)` (falling back to the authority's `x-admission-level`); refuses
//!   below it; and refuses a retry of a call the downstream refused until the downstream's
//!   level changes.
//!
//! The pure parts (bounds, expiry, aggregation, the caches) are
//! [`admission_core::route`]; this module holds them together and names the headers.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use admission_core::downstream::DownstreamLevels;
use admission_core::route::{
    RefusalAges, RetryMemory, RouteDependencies, RouteDoor, RouteHolds, RouteLevels, PROBE_DIVISOR,
};
use admission_core::table::normalize_path;
use admission_core::{AdmissionLevel, MonotonicClock, Priority};
use http::HeaderName;

use crate::config::PerRouteConfig;

/// The route a response answers (the normalised path, no query). Fixed name.
pub const ROUTE: HeaderName = HeaderName::from_static("x-weir-route");
/// The route's aggregated level `B.U`: min(the sidecar's level, the route's downstreams').
pub const ROUTE_LEVEL: HeaderName = HeaderName::from_static("x-weir-route-level");

/// What the inbound and egress roles share about routes.
pub struct RouteState {
    pub enabled: bool,
    /// Inbound routes -> downstream `(authority, route)`s.
    pub deps: RouteDependencies<MonotonicClock>,
    /// The egress's per-authority levels (`x-admission-level`).
    pub authority_levels: Arc<DownstreamLevels<MonotonicClock>>,
    /// The egress's per-`(authority, route)` levels (`x-weir-route-level`).
    pub route_levels: RouteLevels<MonotonicClock>,
    /// Calls a downstream refused, whose retries wait for its level to change.
    pub retries: RetryMemory<MonotonicClock>,
    /// How long each route's requests hold the app waiting on downstreams: which routes
    /// the own level spares.
    pub holds: RouteHolds<MonotonicClock>,
    /// How often a route the door refuses wholly on stale news lets a probe through.
    probe_every: Duration,
}

impl RouteState {
    pub fn new(config: &PerRouteConfig, level_expiry: Duration, max_authorities: usize) -> Self {
        let clock = MonotonicClock::new();
        RouteState {
            enabled: config.enabled,
            deps: RouteDependencies::new(
                config.dependency_expiry,
                config.max_routes,
                config.max_dependencies,
                clock,
            ),
            authority_levels: Arc::new(DownstreamLevels::new(level_expiry, max_authorities, clock)),
            route_levels: RouteLevels::new(
                level_expiry,
                max_authorities,
                config.max_routes_per_authority,
                clock,
            ),
            retries: RetryMemory::new(level_expiry, config.retry_memory, clock),
            holds: RouteHolds::new(config.max_routes, clock),
            probe_every: level_expiry / PROBE_DIVISOR,
        }
    }

    /// The cached level of `route` at `authority`, else of `authority`.
    #[inline]
    pub fn cached(&self, authority: &str, route: &str) -> Option<AdmissionLevel> {
        self.route_levels.level(authority, route, &self.authority_levels)
    }

    /// The inbound door: does a downstream `route` depends on refuse `priority` now (or is
    /// this request the probe that brings news of a stale refusing level)?
    pub fn door(&self, route: &str, priority: Priority) -> RouteDoor {
        if !self.enabled {
            return RouteDoor::Pass;
        }
        self.deps.door(route, priority, self.probe_every, |a, r| {
            self.route_levels.level_news(a, r, &self.authority_levels)
        })
    }

    /// Whether the own level spares `route` now ([`RouteHolds`]: the app's workers are held
    /// mostly by other routes' requests waiting on slow downstreams, so those routes take
    /// the cut). Read once per request, at its door: the door and the response's stamp use
    /// the same answer ([`Self::spares`], [`Self::aggregated`]).
    pub fn spared_now(&self, route: &str) -> bool {
        self.enabled && self.holds.spares(route)
    }

    /// Whether the own level (`own`) spares a route that [`Self::spared_now`] answered
    /// `spared` for: only while `own` admits the top business class whole. Once the heavy
    /// routes' top class is refused too, the level applies to every route again (business
    /// priority is global; a spared route's lower classes must not pass while another
    /// route's top class is refused).
    pub fn spares(&self, spared: bool, own: AdmissionLevel) -> bool {
        spared && own.priority().business > 0
    }

    /// The level to stamp on `route`'s responses: min(own, its downstreams'), without the
    /// own level while it spares the route (`spared`: [`Self::spared_now`] at its door).
    pub fn aggregated(&self, route: &str, own: AdmissionLevel, spared: bool) -> AdmissionLevel {
        if !self.enabled {
            return own;
        }
        let own = if self.spares(spared, own) { AdmissionLevel::FULLY_OPEN } else { own };
        self.deps.aggregated(route, own, |a, r| self.cached(a, r))
    }
}

/// A request's route: its normalised path without the query; `None` if it cannot be
/// normalised (the entry refuses those; an inner hop then tracks no route for it).
pub fn route_of(path: &str) -> Option<Cow<'_, str>> {
    normalize_path(path).ok()
}

/// Refusal waits that grow with the time the level has refused a class.
pub type Ages = RefusalAges<MonotonicClock>;

pub fn ages(base: Duration) -> Ages {
    RefusalAges::new(base, MonotonicClock::new())
}
