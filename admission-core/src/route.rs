//! Per-route levels across a call graph (docs/design.md, "Per-route levels").
//!
//! One level per sidecar sheds a healthy API with an overloaded one when both pass through
//! the same middle hop. So a sidecar with the egress role on keeps, per **route** of its
//! app, the downstream routes that route calls, and:
//!
//! - [`RouteDependencies`]: which inbound routes depend on which downstream `(authority,
//!   route)`s, learnt from the app's outbound calls paired with the inbound request they
//!   serve; a dependency not seen again for `expiry` is forgotten. The route's
//!   **aggregated level** is `min(own level, the fresh cached levels of its dependencies)`:
//!   what the inbound role refuses at its door (before the app spends work) and stamps on
//!   the route's responses (`x-route-level`).
//! - [`RouteLevels`]: the egress side, the last valid `x-route-level` per `(authority,
//!   route)`, with the expiry, the top-class dip and the bounds of the per-authority cache
//!   ([`crate::downstream`]); a route with nothing fresh falls back to the authority's level.
//! - [`RetryMemory`]: a retry of a call a downstream refused is refused locally until the
//!   downstream's level changes.
//! - [`RefusalAges`]: how long the level has refused each business class, so the
//!   `retry-after` a refusal carries grows with it.
//!
//! **A route is the normalised path without its query** ([`crate::table::path`]), at every
//! hop: the entry forwards the normalised path it classified, so the next hop's route is
//! the same string the entry's egress keyed its cache by; an inner hop normalises what it
//! receives the same way. Not the table's action: only the entry has a table verdict, and
//! the egress must look the level up from the outbound request alone. A path with an id in
//! it (`/users/123`) makes one route per id: the bounds below cap that, and the overflow is
//! counted.
//!
//! **Bounded.** At most `max_routes` routes with `max_dependencies` dependencies each; a
//! full table reclaims a route whose dependencies have all expired, else the new one is not
//! tracked (counted): its requests keep the sidecar's own level, as without this module.
//! Routes longer than [`MAX_ROUTE_LEN`] are never tracked (counted).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use crate::clock::{Clock, Nanos};
use crate::downstream::{DownstreamLevels, Observation};
use crate::engine::shard::Padded;
use crate::priority::{AdmissionLevel, Priority};

/// Default bound on the routes with dependencies.
pub const DEFAULT_MAX_ROUTES: usize = 64;
/// Default bound on one route's dependencies.
pub const DEFAULT_MAX_DEPENDENCIES: usize = 8;
/// Default time a dependency is kept without a call that confirms it. Longer than a
/// level's expiry: while the door refuses a route, its app makes no calls, and the
/// dependency must outlive that (the downstream's level itself still expires in 2 s).
pub const DEFAULT_DEPENDENCY_EXPIRY: Duration = Duration::from_secs(30);
/// A stale refusing level lets a probe through every `level expiry / PROBE_DIVISOR`.
pub const PROBE_DIVISOR: u32 = 8;
/// Routes longer than this are not tracked.
pub const MAX_ROUTE_LEN: usize = 256;

/// What [`RouteDependencies::learn`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Learned {
    /// A new dependency (and perhaps a new route).
    New,
    /// A known dependency, its expiry renewed.
    Renewed,
    /// The route table is full of routes with live dependencies: not tracked.
    RouteOverflow,
    /// The route has `max_dependencies` live ones: not tracked.
    DependencyOverflow,
    /// The route or the downstream route is empty or longer than [`MAX_ROUTE_LEN`].
    BadRoute,
}

/// Counts of [`Learned`] outcomes since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DependencyCounters {
    pub new: u64,
    pub renewed: u64,
    pub route_overflow: u64,
    pub dependency_overflow: u64,
    pub bad_route: u64,
}

/// Inbound routes -> the downstream `(authority, route)`s they call, with an expiry.
pub struct RouteDependencies<C: Clock> {
    clock: C,
    expiry_micros: u64,
    max_routes: usize,
    max_dependencies: usize,
    routes: RwLock<HashMap<Box<str>, RouteSlot>>,
    counters: [AtomicU64; 5],
}

#[derive(Debug, Default)]
struct RouteSlot {
    deps: RwLock<Vec<Dependency>>,
    /// When the door last let a request of this route through as a probe (micros + 1).
    last_probe: AtomicU64,
}

/// What the door does with a request ([`RouteDependencies::door`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteDoor {
    /// No fresh dependency refuses it.
    Pass,
    /// A dependency's level refuses it, but that level's news is stale and no probe of this
    /// route went through for `probe_every`: this one goes, to bring news (its calls must
    /// go out too).
    Probe,
    /// A dependency's fresh level refuses it.
    Refuse,
}

#[derive(Debug)]
struct Dependency {
    authority: Box<str>,
    route: Box<str>,
    expires_at_micros: AtomicU64,
}

/// One route's fresh dependencies, as `(authority, downstream route)`.
pub type DependencyList = Vec<(String, String)>;

fn valid_route(route: &str) -> bool {
    !route.is_empty() && route.len() <= MAX_ROUTE_LEN
}

fn now_micros(clock: &impl Clock) -> u64 {
    let now: Nanos = clock.now();
    now / 1_000
}

// === impl RouteDependencies ===

impl<C: Clock> RouteDependencies<C> {
    pub fn new(expiry: Duration, max_routes: usize, max_dependencies: usize, clock: C) -> Self {
        RouteDependencies {
            clock,
            expiry_micros: (expiry.as_micros() as u64).max(1),
            max_routes,
            max_dependencies,
            routes: RwLock::new(HashMap::with_capacity(max_routes.min(1024))),
            counters: Default::default(),
        }
    }

    /// The app, serving a request of `route`, called `downstream_route` at `authority`.
    pub fn learn(&self, route: &str, authority: &str, downstream_route: &str) -> Learned {
        let learned = self.learn_inner(route, authority, downstream_route);
        let i = match learned {
            Learned::New => 0,
            Learned::Renewed => 1,
            Learned::RouteOverflow => 2,
            Learned::DependencyOverflow => 3,
            Learned::BadRoute => 4,
        };
        self.counters[i].fetch_add(1, Relaxed);
        learned
    }

    fn learn_inner(&self, route: &str, authority: &str, downstream_route: &str) -> Learned {
        if !valid_route(route) || !valid_route(downstream_route) || authority.is_empty() {
            return Learned::BadRoute;
        }
        let now = now_micros(&self.clock);
        let expires_at = now.saturating_add(self.expiry_micros);
        {
            let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
            if let Some(slot) = routes.get(route) {
                let deps = slot.deps.read().unwrap_or_else(|p| p.into_inner());
                if let Some(dep) = deps.iter().find(|d| d.is(authority, downstream_route)) {
                    dep.expires_at_micros.store(expires_at, Relaxed);
                    return Learned::Renewed;
                }
            }
        }
        let mut routes = self.routes.write().unwrap_or_else(|p| p.into_inner());
        if !routes.contains_key(route) {
            if routes.len() >= self.max_routes {
                // Reclaim a route whose dependencies have all expired.
                let dead = routes
                    .iter()
                    .find(|(_, slot)| slot.live(now) == 0)
                    .map(|(name, _)| name.clone());
                match dead {
                    Some(name) => {
                        routes.remove(&name);
                    }
                    None => return Learned::RouteOverflow,
                }
            }
            routes.insert(route.into(), RouteSlot::default());
        }
        let slot = routes.get(route).expect("inserted above");
        let mut deps = slot.deps.write().unwrap_or_else(|p| p.into_inner());
        if let Some(dep) = deps.iter().find(|d| d.is(authority, downstream_route)) {
            dep.expires_at_micros.store(expires_at, Relaxed);
            return Learned::Renewed;
        }
        let dep = Dependency {
            authority: authority.into(),
            route: downstream_route.into(),
            expires_at_micros: AtomicU64::new(expires_at),
        };
        if deps.len() < self.max_dependencies {
            deps.push(dep);
            return Learned::New;
        }
        match deps.iter().position(|d| d.expires_at_micros.load(Relaxed) <= now) {
            Some(i) => {
                deps[i] = dep;
                Learned::New
            }
            None => Learned::DependencyOverflow,
        }
    }

    /// The fresh dependency of `route` with the lowest cached level (`cached(authority,
    /// downstream route)`), and that level; `None` when no dependency has one.
    pub fn lowest(
        &self,
        route: &str,
        cached: impl Fn(&str, &str) -> Option<AdmissionLevel>,
    ) -> Option<AdmissionLevel> {
        let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
        let slot = routes.get(route)?;
        let now = now_micros(&self.clock);
        let deps = slot.deps.read().unwrap_or_else(|p| p.into_inner());
        deps.iter()
            .filter(|d| d.expires_at_micros.load(Relaxed) > now)
            .filter_map(|d| cached(&d.authority, &d.route))
            .min()
    }

    /// The door's verdict for `priority` on `route`: `news(authority, downstream route)` is
    /// the fresh cached level and whether its news is stale. A route whose requests are all
    /// refused hears nothing from its downstreams, so a stale refusing level lets one
    /// request through every `probe_every` (then its calls must not be refused locally
    /// either): a downstream that recovered is seen within about `probe_every`, not at the
    /// level's expiry.
    pub fn door(
        &self,
        route: &str,
        priority: Priority,
        probe_every: Duration,
        news: impl Fn(&str, &str) -> Option<(AdmissionLevel, bool)>,
    ) -> RouteDoor {
        let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
        let Some(slot) = routes.get(route) else { return RouteDoor::Pass };
        let now = now_micros(&self.clock);
        let (mut refused, mut all_stale) = (false, true);
        {
            let deps = slot.deps.read().unwrap_or_else(|p| p.into_inner());
            for d in deps.iter().filter(|d| d.expires_at_micros.load(Relaxed) > now) {
                if let Some((level, stale)) = news(&d.authority, &d.route) {
                    if !level.admits(priority) {
                        refused = true;
                        all_stale &= stale;
                    }
                }
            }
        }
        if !refused {
            return RouteDoor::Pass;
        }
        if all_stale {
            let every = (probe_every.as_micros() as u64).max(1);
            let last = slot.last_probe.load(Relaxed);
            let now1 = now + 1;
            if (last == 0 || now1.saturating_sub(last) >= every)
                && slot.last_probe.compare_exchange(last, now1, Relaxed, Relaxed).is_ok()
            {
                return RouteDoor::Probe;
            }
        }
        RouteDoor::Refuse
    }

    /// `min(own, the route's dependencies' fresh cached levels)`.
    pub fn aggregated(
        &self,
        route: &str,
        own: AdmissionLevel,
        cached: impl Fn(&str, &str) -> Option<AdmissionLevel>,
    ) -> AdmissionLevel {
        self.lowest(route, cached).map_or(own, |l| l.min(own))
    }

    /// `true` iff a fresh dependency of `route` has a cached level that does not admit
    /// `priority`: the downstream would refuse the call the app is about to make.
    pub fn should_refuse(
        &self,
        route: &str,
        priority: Priority,
        cached: impl Fn(&str, &str) -> Option<AdmissionLevel>,
    ) -> bool {
        self.lowest(route, cached).is_some_and(|l| !l.admits(priority))
    }

    /// The fresh dependencies of `route`.
    pub fn dependencies(&self, route: &str) -> DependencyList {
        let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
        let Some(slot) = routes.get(route) else { return Vec::new() };
        let now = now_micros(&self.clock);
        let deps = slot.deps.read().unwrap_or_else(|p| p.into_inner());
        deps.iter()
            .filter(|d| d.expires_at_micros.load(Relaxed) > now)
            .map(|d| (d.authority.to_string(), d.route.to_string()))
            .collect()
    }

    /// Routes holding a slot (live or not yet reclaimed).
    pub fn routes(&self) -> usize {
        self.routes.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Dependencies held, all routes (live or not yet replaced).
    pub fn dependency_slots(&self) -> usize {
        let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
        routes.values().map(|s| s.deps.read().unwrap_or_else(|p| p.into_inner()).len()).sum()
    }

    pub fn counters(&self) -> DependencyCounters {
        let c = |i: usize| self.counters[i].load(Relaxed);
        DependencyCounters {
            new: c(0),
            renewed: c(1),
            route_overflow: c(2),
            dependency_overflow: c(3),
            bad_route: c(4),
        }
    }

    pub fn max_routes(&self) -> usize {
        self.max_routes
    }

    pub fn max_dependencies(&self) -> usize {
        self.max_dependencies
    }
}

impl RouteSlot {
    fn live(&self, now: u64) -> usize {
        let deps = self.deps.read().unwrap_or_else(|p| p.into_inner());
        deps.iter().filter(|d| d.expires_at_micros.load(Relaxed) > now).count()
    }
}

impl Dependency {
    fn is(&self, authority: &str, route: &str) -> bool {
        &*self.authority == authority && &*self.route == route
    }
}

impl<C: Clock> std::fmt::Debug for RouteDependencies<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteDependencies")
            .field("routes", &self.routes())
            .field("counters", &self.counters())
            .finish()
    }
}

/// What one response's route headers did to the per-route cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteObservation {
    /// The level went to the `(authority, route)` cache (or was counted there as bad).
    Level(Observation),
    /// No route headers: nothing changes (a downstream without the egress role).
    Absent,
    /// The route header names another route than the one called, is repeated or too long:
    /// ignored.
    RouteMismatch,
    /// A new authority beyond `max_authorities`: not cached.
    AuthorityOverflow,
}

/// Counts of [`RouteObservation`]s since start (the per-`(authority, route)` caches count
/// their own level values: [`RouteLevels::level_counters`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouteCounters {
    pub absent: u64,
    pub route_mismatch: u64,
    pub authority_overflow: u64,
}

/// The egress role's per-`(authority, route)` levels: per authority, a
/// [`DownstreamLevels`] keyed by route (same expiry, top-class dip and bounds).
pub struct RouteLevels<C: Clock + Clone> {
    clock: C,
    expiry: Duration,
    max_authorities: usize,
    max_routes: usize,
    by_authority: RwLock<HashMap<Box<str>, DownstreamLevels<C>>>,
    absent: AtomicU64,
    route_mismatch: AtomicU64,
    authority_overflow: AtomicU64,
}

// === impl RouteLevels ===

impl<C: Clock + Clone> RouteLevels<C> {
    /// `max_routes`: per authority.
    pub fn new(expiry: Duration, max_authorities: usize, max_routes: usize, clock: C) -> Self {
        RouteLevels {
            clock,
            expiry,
            max_authorities,
            max_routes,
            by_authority: RwLock::new(HashMap::new()),
            absent: AtomicU64::new(0),
            route_mismatch: AtomicU64::new(0),
            authority_overflow: AtomicU64::new(0),
        }
    }

    /// Records the route headers of one response from `authority` to a call of `route`:
    /// `routes` are the values of the route header, `levels` of the route-level header.
    /// Both absent is no news; a level without exactly one route header equal to `route` is
    /// a mismatch; otherwise the level goes to the `(authority, route)` cache, which caches
    /// exactly one valid value and counts anything else.
    pub fn observe<'v>(
        &self,
        authority: &str,
        route: &str,
        routes: impl IntoIterator<Item = &'v [u8]>,
        levels: impl IntoIterator<Item = &'v [u8]>,
    ) -> RouteObservation {
        let mut routes = routes.into_iter();
        let mut levels = levels.into_iter().peekable();
        let observation = match (routes.next(), routes.next()) {
            (None, _) if levels.peek().is_none() => RouteObservation::Absent,
            (Some(named), None) if named == route.as_bytes() && valid_route(route) => {
                self.observe_level(authority, route, levels)
            }
            _ => RouteObservation::RouteMismatch,
        };
        match observation {
            RouteObservation::Absent => self.absent.fetch_add(1, Relaxed),
            RouteObservation::RouteMismatch => self.route_mismatch.fetch_add(1, Relaxed),
            RouteObservation::AuthorityOverflow => self.authority_overflow.fetch_add(1, Relaxed),
            RouteObservation::Level(_) => 0,
        };
        observation
    }

    fn observe_level<'v>(
        &self,
        authority: &str,
        route: &str,
        levels: impl IntoIterator<Item = &'v [u8]>,
    ) -> RouteObservation {
        {
            let map = self.by_authority.read().unwrap_or_else(|p| p.into_inner());
            if let Some(cache) = map.get(authority) {
                return RouteObservation::Level(cache.observe(route, levels));
            }
        }
        let mut map = self.by_authority.write().unwrap_or_else(|p| p.into_inner());
        if !map.contains_key(authority) {
            if map.len() >= self.max_authorities {
                return RouteObservation::AuthorityOverflow;
            }
            let cache = DownstreamLevels::new(self.expiry, self.max_routes, self.clock.clone());
            map.insert(authority.into(), cache);
        }
        RouteObservation::Level(map[authority].observe(route, levels))
    }

    /// The fresh cached level of `route` at `authority`, if any (no fallback).
    #[inline]
    pub fn route_level(&self, authority: &str, route: &str) -> Option<AdmissionLevel> {
        let map = self.by_authority.read().unwrap_or_else(|p| p.into_inner());
        map.get(authority)?.level(route)
    }

    /// As [`RouteLevels::level`], with whether the news is stale
    /// ([`DownstreamLevels::level_news`]).
    pub fn level_news(
        &self,
        authority: &str,
        route: &str,
        fallback: &DownstreamLevels<C>,
    ) -> Option<(AdmissionLevel, bool)> {
        let by_route = {
            let map = self.by_authority.read().unwrap_or_else(|p| p.into_inner());
            map.get(authority).and_then(|c| c.level_news(route))
        };
        by_route.or_else(|| fallback.level_news(authority))
    }

    /// The route's fresh level, else the authority's (`fallback`).
    #[inline]
    pub fn level(
        &self,
        authority: &str,
        route: &str,
        fallback: &DownstreamLevels<C>,
    ) -> Option<AdmissionLevel> {
        self.route_level(authority, route).or_else(|| fallback.level(authority))
    }

    /// `true` iff the level [`RouteLevels::level`] finds does not admit `priority`. Asks
    /// the route cache with the priority too, so its top-class dip tracks the route's calls.
    #[inline]
    pub fn should_refuse(
        &self,
        authority: &str,
        route: &str,
        priority: Priority,
        fallback: &DownstreamLevels<C>,
    ) -> bool {
        let by_route = {
            let map = self.by_authority.read().unwrap_or_else(|p| p.into_inner());
            map.get(authority).map(|c| (c.should_refuse(route, priority), c.level(route)))
        };
        match by_route {
            Some((refuse, Some(_))) => refuse,
            _ => fallback.should_refuse(authority, priority),
        }
    }

    /// Authorities with a route cache.
    pub fn authorities(&self) -> usize {
        self.by_authority.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// `(authority, route)` slots held.
    pub fn len(&self) -> usize {
        let map = self.by_authority.read().unwrap_or_else(|p| p.into_inner());
        map.values().map(DownstreamLevels::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls `f` for every `(authority, route)` slot with its fresh level.
    pub fn for_each(&self, mut f: impl FnMut(&str, &str, Option<AdmissionLevel>)) {
        let map = self.by_authority.read().unwrap_or_else(|p| p.into_inner());
        for (authority, cache) in map.iter() {
            cache.for_each(|route, level| f(authority, route, level));
        }
    }

    pub fn counters(&self) -> RouteCounters {
        RouteCounters {
            absent: self.absent.load(Relaxed),
            route_mismatch: self.route_mismatch.load(Relaxed),
            authority_overflow: self.authority_overflow.load(Relaxed),
        }
    }

    /// What the route-level values did, summed over every authority.
    pub fn level_counters(&self) -> crate::downstream::LevelCounters {
        let map = self.by_authority.read().unwrap_or_else(|p| p.into_inner());
        map.values().map(DownstreamLevels::counters).fold(Default::default(), |a, c| {
            crate::downstream::LevelCounters {
                cached: a.cached + c.cached,
                uncached: a.uncached + c.uncached,
                absent: a.absent + c.absent,
                malformed: a.malformed + c.malformed,
                repeated: a.repeated + c.repeated,
            }
        })
    }
}

impl<C: Clock + Clone> std::fmt::Debug for RouteLevels<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteLevels")
            .field("authorities", &self.authorities())
            .field("slots", &self.len())
            .field("counters", &self.counters())
            .finish()
    }
}

/// Calls a downstream refused, remembered with the level it refused them at, so that a
/// retry (the same correlation key to the same `(authority, route)`) is refused locally
/// until that level changes. Bounded: at most `capacity` calls; a full memory drops the
/// entries that expired, then the oldest.
pub struct RetryMemory<C: Clock> {
    clock: C,
    expiry_micros: u64,
    capacity: usize,
    inner: Mutex<RetryInner>,
    refused: AtomicU64,
}

#[derive(Default)]
struct RetryInner {
    /// call id -> (level compound at the refusal, expires at, insertion sequence).
    calls: HashMap<u64, (u16, u64, u64)>,
    seq: u64,
}

impl<C: Clock> RetryMemory<C> {
    pub fn new(expiry: Duration, capacity: usize, clock: C) -> Self {
        RetryMemory {
            clock,
            expiry_micros: (expiry.as_micros() as u64).max(1),
            capacity,
            inner: Mutex::new(RetryInner::default()),
            refused: AtomicU64::new(0),
        }
    }

    /// The downstream refused call `id` at `level` (its answer's level).
    pub fn refused(&self, id: u64, level: AdmissionLevel) {
        if self.capacity == 0 {
            return;
        }
        let now = now_micros(&self.clock);
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if inner.calls.len() >= self.capacity && !inner.calls.contains_key(&id) {
            inner.calls.retain(|_, (_, expires, _)| *expires > now);
            if inner.calls.len() >= self.capacity {
                let oldest =
                    inner.calls.iter().min_by_key(|(_, (_, _, seq))| *seq).map(|(k, _)| *k);
                if let Some(oldest) = oldest {
                    inner.calls.remove(&oldest);
                }
            }
        }
        inner.seq += 1;
        let seq = inner.seq;
        inner.calls.insert(id, (level.compound(), now.saturating_add(self.expiry_micros), seq));
    }

    /// Is call `id` a retry of a refused call while the level it was refused at still
    /// holds (`current`: the downstream's fresh cached level)? A changed or expired level
    /// forgets it: the retry goes out.
    pub fn is_refused_retry(&self, id: u64, current: Option<AdmissionLevel>) -> bool {
        let now = now_micros(&self.clock);
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let Some(&(level, expires, _)) = inner.calls.get(&id) else { return false };
        let holds = expires > now && current.is_some_and(|c| c.compound() == level);
        if holds {
            self.refused.fetch_add(1, Relaxed);
        } else {
            inner.calls.remove(&id);
        }
        holds
    }

    /// Retries refused so far.
    pub fn refused_retries(&self) -> u64 {
        self.refused.load(Relaxed)
    }

    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).calls.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How long the level has been refusing each business class: a refusal's `retry-after` is
/// `base + age / 2`, at most `RETRY_AFTER_GROWTH_CAP x base`. A class not refused for
/// `base` starts again from `base`.
pub struct RefusalAges<C: Clock> {
    clock: C,
    base_micros: u64,
    /// Per class: since when it has been refused, and when last (microseconds plus one;
    /// 0: never).
    since: Box<[AtomicU64]>,
    last: Box<[AtomicU64]>,
}

/// The longest `retry-after`, in multiples of the base.
pub const RETRY_AFTER_GROWTH_CAP: u32 = 8;

impl<C: Clock> RefusalAges<C> {
    pub fn new(base: Duration, clock: C) -> Self {
        RefusalAges {
            clock,
            base_micros: (base.as_micros() as u64).max(1),
            since: (0..256).map(|_| AtomicU64::new(0)).collect(),
            last: (0..256).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// A request of `business` is refused now: the wait to ask the caller for.
    pub fn refuse(&self, business: u8) -> Duration {
        // Stored plus one: 0 means never.
        let now = now_micros(&self.clock) + 1;
        let i = business as usize;
        let last = self.last[i].swap(now, Relaxed);
        let since = self.since[i].load(Relaxed);
        let since = if last == 0 || since == 0 || now.saturating_sub(last) > self.base_micros {
            self.since[i].store(now, Relaxed);
            now
        } else {
            since
        };
        let age = now.saturating_sub(since);
        let wait =
            (self.base_micros + age / 2).min(self.base_micros * RETRY_AFTER_GROWTH_CAP as u64);
        Duration::from_micros(wait)
    }
}

/// How often [`RouteHolds`] closes its window and decides again.
pub const HOLD_WINDOW: Duration = Duration::from_millis(200);
/// A decision older than this (no answers since) spares nothing.
const HOLD_STALE: Nanos = 2_000_000_000;
/// Weight of the newest window in the smoothed figures (a route of a few tens a second
/// has a handful of answers in one window).
const HOLD_SMOOTHING: f64 = 0.3;
/// A route is light when its requests wait on downstreams at most this share of the
/// slowest route's wait.
const LIGHT_WAIT: f64 = 0.5;
/// The heavy routes' downstream waits must hold at least this share of everything the app
/// holds before the light ones are spared...
const HEAVY_SHARE: f64 = 1.0 / 3.0;
/// ...and they stay spared until it falls below this (hysteresis: refused at the door, the
/// heavy routes hold less of the app, which is what sparing the others is for).
const HEAVY_SHARE_KEEP: f64 = 0.2;
/// Waits shorter than this are no downstream's overload (a call's own round trip).
const HOLD_MIN_WAIT: f64 = 2_000_000.0;

/// Which routes the sidecar's own level spares (docs/design.md, "Per-route levels"): a
/// middle hop whose app holds a worker while it waits on its calls is saturated by the
/// route whose downstream answers slowly, not by the routes that call healthy ones. While
/// the app's workers are held mostly by requests waiting on slow downstreams, its own level
/// refuses only those routes (TopFull's per-API share): the light routes keep their
/// downstreams' levels and nothing of the own level, and the level's feedback (the queue
/// stays until enough of the heavy routes is refused) cuts the heavy ones deeper instead.
///
/// Per route, over windows of [`HOLD_WINDOW`] (smoothed): answers per second, the mean time
/// a request held the app (dispatch to response headers) and the mean of that spent waiting
/// on downstreams. A route is **heavy** when its mean wait is above half the slowest
/// route's (and above [`HOLD_MIN_WAIT`]), **light** otherwise. The light routes are spared
/// while the heavy routes' waits (rate x mean wait: the slots they hold waiting) are at
/// least a third of everything the app holds (rate x mean hold, all routes): refusing the
/// heavy routes alone frees that much (and until it falls below a fifth). Once they are
/// refused enough (or their downstream recovers), the share falls and the own level applies
/// to every route again, so an app overloaded by its light routes' own work is never left
/// without its level. At most `max_routes` routes are followed (others are never spared).
///
/// **Hot path.** [`Self::record`] (every app response) locks only its thread's shard of the
/// open window, uncontended but for the one close per window; a sample's answer, hold and
/// wait go in under that lock together, and the close drains each shard under it, so a
/// window never holds half a sample. [`Self::spares`] (once per request) is one atomic load
/// while nothing is spared.
pub struct RouteHolds<C: Clock> {
    clock: C,
    max_routes: usize,
    /// The open window's answers, per thread shard (each holds at most `max_routes` routes).
    shards: Box<[Padded<Mutex<ShardSums>>]>,
    shard_mask: usize,
    /// When the open window started; the answer that finds it [`HOLD_WINDOW`] old swaps it
    /// and closes the window (only that one: a compare-exchange).
    window_start: AtomicU64,
    /// The smoothed figures per route (at most `max_routes`), touched once per window.
    smoothed: Mutex<HashMap<Box<str>, RouteHold>>,
    /// When the spared set goes stale ([`HOLD_STALE`] after it was decided), plus one;
    /// 0 while nothing is spared. Written under `spared`'s write lock, after the set.
    spared_until: AtomicU64,
    /// The routes spared now.
    spared: RwLock<Vec<Box<str>>>,
}

/// One shard's open window: per route, its answers so far.
type ShardSums = HashMap<Box<str>, WindowSums>;

/// One route's answers in the open window of one shard.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct WindowSums {
    answers: u32,
    hold_ns: u64,
    wait_ns: u64,
}

/// One route's smoothed figures.
#[derive(Debug, Default, Clone, Copy)]
struct RouteHold {
    /// The window just closed (all shards).
    window: WindowSums,
    /// Smoothed: answers per second, mean hold and mean wait (nanoseconds).
    rate: f64,
    hold: f64,
    wait: f64,
    /// Windows in a row without an answer.
    idle: u32,
}

/// A route not answered for this many windows is forgotten.
const HOLD_FORGET: u32 = 50;

// === impl RouteHolds ===

impl<C: Clock> RouteHolds<C> {
    pub fn new(max_routes: usize, clock: C) -> Self {
        let now = clock.now();
        let shards = crate::engine::shard::shard_count();
        RouteHolds {
            clock,
            max_routes,
            shards: (0..shards).map(|_| Padded(Mutex::new(HashMap::new()))).collect(),
            shard_mask: shards - 1,
            window_start: AtomicU64::new(now),
            smoothed: Mutex::new(HashMap::new()),
            spared_until: AtomicU64::new(0),
            spared: RwLock::new(Vec::new()),
        }
    }

    /// A request of `route` held the app for `hold`, of which `wait` waiting on downstreams.
    pub fn record(&self, route: &str, hold: Duration, wait: Duration) {
        if !valid_route(route) {
            return;
        }
        let shard = &self.shards[crate::engine::shard::thread_ordinal() & self.shard_mask].0;
        {
            let mut sums = shard.lock().unwrap_or_else(|p| p.into_inner());
            let full = sums.len() >= self.max_routes;
            match sums.get_mut(route) {
                Some(s) => s.add(hold, wait),
                None if full => {}
                None => sums.entry(route.into()).or_default().add(hold, wait),
            }
        }
        let now = self.clock.now();
        let start = self.window_start.load(Relaxed);
        let elapsed = now.saturating_sub(start);
        if elapsed >= HOLD_WINDOW.as_nanos() as u64
            && self.window_start.compare_exchange(start, now, Relaxed, Relaxed).is_ok()
        {
            self.close(now, elapsed);
        }
    }

    /// Takes the open window's sums of every shard, summed per route. A route new to the
    /// followed ones only while fewer than `max_routes` are followed.
    fn take_window(&self, smoothed: &mut HashMap<Box<str>, RouteHold>) {
        for shard in self.shards.iter() {
            let mut sums = shard.0.lock().unwrap_or_else(|p| p.into_inner());
            // Routes quiet for a window leave the shard (it re-learns them on their next
            // answer); the others keep their key, zeroed, so a steady route never
            // allocates.
            sums.retain(|route, s| {
                if s.answers == 0 {
                    return false;
                }
                let full = smoothed.len() >= self.max_routes;
                match smoothed.get_mut(route) {
                    Some(r) => r.window.merge(*s),
                    None if full => {}
                    None => {
                        smoothed
                            .insert(route.clone(), RouteHold { window: *s, ..Default::default() });
                    }
                }
                *s = WindowSums::default();
                true
            });
        }
    }

    /// Closes the window that ran `elapsed` up to `now`: the smoothed figures and the
    /// spared set.
    fn close(&self, now: Nanos, elapsed: Nanos) {
        let mut smoothed = self.smoothed.lock().unwrap_or_else(|p| p.into_inner());
        self.take_window(&mut smoothed);
        let sparing = self.spared_until.load(Relaxed) != 0;
        let share = if sparing { HEAVY_SHARE_KEEP } else { HEAVY_SHARE };
        let spared = close_window(&mut smoothed, elapsed as f64 / 1e9, share);
        drop(smoothed);
        let mut set = self.spared.write().unwrap_or_else(|p| p.into_inner());
        let until = if spared.is_empty() { 0 } else { now.saturating_add(HOLD_STALE) + 1 };
        *set = spared;
        self.spared_until.store(until, Relaxed);
    }

    /// Whether the own level spares `route` now. One atomic load while nothing is spared;
    /// else a clock read and a read lock: call it once per request.
    pub fn spares(&self, route: &str) -> bool {
        if !self.fresh() {
            return false;
        }
        let spared = self.spared.read().unwrap_or_else(|p| p.into_inner());
        spared.iter().any(|r| &**r == route)
    }

    /// Whether a fresh decision spares some route.
    fn fresh(&self) -> bool {
        let until = self.spared_until.load(Relaxed);
        until != 0 && self.clock.now() < until
    }

    /// Whether any route is spared now: the app's slots are held mostly by requests
    /// waiting on slow downstreams.
    pub fn sparing(&self) -> bool {
        self.fresh()
    }

    /// How many routes are spared now (for metrics: no allocation).
    pub fn spared_count(&self) -> usize {
        if !self.fresh() {
            return 0;
        }
        self.spared.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The routes spared now (for status and tests).
    pub fn spared(&self) -> Vec<String> {
        if !self.fresh() {
            return Vec::new();
        }
        let spared = self.spared.read().unwrap_or_else(|p| p.into_inner());
        spared.iter().map(|r| r.to_string()).collect()
    }

    /// Routes followed (those with smoothed figures: each closed window adds the new ones,
    /// at most `max_routes`).
    pub fn routes(&self) -> usize {
        self.smoothed.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl WindowSums {
    fn add(&mut self, hold: Duration, wait: Duration) {
        let hold = hold.as_nanos().min(u64::MAX as u128) as u64;
        let wait = (wait.as_nanos().min(u64::MAX as u128) as u64).min(hold);
        self.answers = self.answers.saturating_add(1);
        self.hold_ns = self.hold_ns.saturating_add(hold);
        self.wait_ns = self.wait_ns.saturating_add(wait);
    }

    fn merge(&mut self, other: WindowSums) {
        self.answers = self.answers.saturating_add(other.answers);
        self.hold_ns = self.hold_ns.saturating_add(other.hold_ns);
        self.wait_ns = self.wait_ns.saturating_add(other.wait_ns);
    }
}

/// Folds the window into the smoothed figures and decides which routes are spared.
fn close_window(routes: &mut HashMap<Box<str>, RouteHold>, secs: f64, share: f64) -> Vec<Box<str>> {
    let a = HOLD_SMOOTHING;
    routes.retain(|_, r| {
        let WindowSums { answers, hold_ns, wait_ns } = std::mem::take(&mut r.window);
        let rate = f64::from(answers) / secs.max(1e-9);
        let first = r.rate == 0.0 && r.hold == 0.0;
        r.rate = if first { rate } else { r.rate + a * (rate - r.rate) };
        if answers > 0 {
            let n = f64::from(answers);
            let (hold, wait) = (hold_ns as f64 / n, wait_ns as f64 / n);
            if first {
                (r.hold, r.wait) = (hold, wait);
            } else {
                r.hold += a * (hold - r.hold);
                r.wait += a * (wait - r.wait);
            }
            r.idle = 0;
        } else {
            r.idle += 1;
        }
        r.idle < HOLD_FORGET
    });
    let slowest = routes.values().map(|r| r.wait).fold(0.0, f64::max);
    if slowest < HOLD_MIN_WAIT {
        return Vec::new();
    }
    let heavy = |r: &RouteHold| r.wait > LIGHT_WAIT * slowest;
    let held: f64 = routes.values().map(|r| r.rate * r.hold).sum();
    let waiting: f64 = routes.values().filter(|r| heavy(r)).map(|r| r.rate * r.wait).sum();
    if held <= 0.0 || waiting < share * held {
        return Vec::new();
    }
    routes.iter().filter(|(_, r)| !heavy(r)).map(|(name, _)| name.clone()).collect()
}

impl<C: Clock> std::fmt::Debug for RouteHolds<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteHolds").field("spared", &self.spared()).finish()
    }
}

#[cfg(test)]
mod tests;
