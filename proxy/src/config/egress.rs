//! The `egress:` section of the sidecar configuration, and the syntax of a downstream
//! authority (`host:port`), which a route's `target` and a request's target share.

use std::net::SocketAddr;
use std::time::Duration;

use admission_core::downstream::{DEFAULT_EXPIRY, DEFAULT_MAX_AUTHORITIES};
use admission_core::route::{
    DEFAULT_DEPENDENCY_EXPIRY, DEFAULT_MAX_DEPENDENCIES, DEFAULT_MAX_ROUTES,
};
use admission_core::schema::{HumanDuration, SocketAddrString};
use admission_core::FieldError;
use http::uri::Authority;
use schemars::JsonSchema;
use serde::Deserialize;

use super::{AppProtocol, H2Config};

/// The egress role: the listener the app sends its outbound calls to.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct EgressConfig {
    /// Off unless enabled here or by `--egress ADDR`.
    pub enabled: bool,
    /// The forward-proxy listener: absolute-form requests (`HTTP_PROXY`), else routed by
    /// `Host` / `:authority`.
    #[schemars(with = "SocketAddrString")]
    pub listen: SocketAddr,
    /// Fixed per-downstream listeners: everything arriving on `listen` goes to `target`.
    #[schemars(length(max = MAX_ROUTES))]
    pub routes: Vec<EgressRoute>,
    /// How long a downstream's level is trusted without news (then it is probed again).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "HumanDuration")]
    pub level_expiry: Duration,
    /// Downstream authorities whose level is cached (and exported as a metric label); the
    /// responses of any further ones are counted, not cached.
    #[schemars(range(min = 0, max = MAX_AUTHORITIES))]
    pub max_authorities: usize,
    /// Budget of an outbound request that carries no deadline.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "HumanDuration")]
    pub default_budget: Duration,
    /// Taken off the budget passed on (never below 1 ms), so a downstream's own deadline
    /// refusal reaches the app before the egress gives up on it (a refusal, not a timeout).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "HumanDuration")]
    pub deadline_margin: Duration,
    /// Protocol towards downstreams: `auto` (HTTP/2 callers over h2c if the downstream speaks
    /// it, probed per address: see [`crate::app_protocol`]), `http1` or `h2c`.
    pub protocol: AppProtocol,
    /// Accepted connections at once; beyond that, new ones are closed at once.
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_connections: usize,
    /// Idle HTTP/1.1 connections kept per downstream address.
    #[schemars(range(min = 0, max = 100_000))]
    pub max_idle_per_downstream: usize,
    /// Worker threads of the egress runtime.
    #[schemars(range(min = 1, max = 1024))]
    pub threads: usize,
    pub h2: H2Config,
    pub timeouts: EgressTimeouts,
    /// Per-route levels (docs/design.md, "Per-route levels").
    pub per_route: PerRouteConfig,
}

/// Per-route levels: which of the app's routes call which downstream routes, learnt from
/// the calls the app makes while serving a request; a route's door and the level it
/// advertises follow its own downstreams only.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct PerRouteConfig {
    /// On with the egress role unless turned off here (then one level per sidecar, as
    /// without it).
    pub enabled: bool,
    /// Inbound routes with learnt dependencies; further routes keep the sidecar's own
    /// level (counted).
    #[schemars(range(min = 0, max = MAX_ROUTE_SLOTS))]
    pub max_routes: usize,
    /// Downstream routes one inbound route may depend on; further ones are not tracked
    /// (counted).
    #[schemars(range(min = 0, max = 256))]
    pub max_dependencies: usize,
    /// A dependency not confirmed by a call for this long is forgotten.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "HumanDuration")]
    pub dependency_expiry: Duration,
    /// Routes per downstream authority whose `x-weir-route-level` is cached.
    #[schemars(range(min = 0, max = MAX_ROUTE_SLOTS))]
    pub max_routes_per_authority: usize,
    /// Refused calls remembered so that their retries wait for the level to change.
    #[schemars(range(min = 0, max = 1_000_000))]
    pub retry_memory: usize,
}

/// One fixed per-downstream listener.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressRoute {
    #[schemars(with = "SocketAddrString")]
    pub listen: SocketAddr,
    /// `host:port` of the downstream (its sidecar's inbound listener).
    pub target: String,
}

/// Every wait of the egress role, named. The downstream's response is bounded by the
/// request's remaining budget, not by a setting.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct EgressTimeouts {
    /// From accept (or the previous response) to a complete request head.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "HumanDuration")]
    pub header_read: Duration,
    /// An app connection with no request in flight is closed after this.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "HumanDuration")]
    pub idle: Duration,
    /// Longest gap while reading a body (the app's request, the downstream's response).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "HumanDuration")]
    pub body_read: Duration,
    /// Longest time without progress writing a response to the app.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "HumanDuration")]
    pub write: Duration,
    /// An app connection asked to close (idle for `idle`, or the egress draining) is
    /// dropped once it has had no request inside for this long: an h2 peer that never
    /// acknowledges the shutdown PING would otherwise keep it open for ever.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "HumanDuration")]
    pub graceful_close: Duration,
    /// A pooled HTTP/1.1 connection to a downstream unused for this long is closed: below
    /// the keep-alive timeout of common servers (uvicorn and node 5 s, gunicorn 2 s), so
    /// the egress closes first instead of sending on a connection the server is closing
    /// (and an idempotent request that meets such a close is retried once).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "HumanDuration")]
    pub downstream_idle: Duration,
    /// TCP connect to a downstream.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "HumanDuration")]
    pub connect: Duration,
    /// Name resolution of a downstream authority.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "HumanDuration")]
    pub resolve: Duration,
    /// A resolved address is used for this long, then the name is resolved again.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "HumanDuration")]
    pub resolve_ttl: Duration,
}

impl Default for EgressConfig {
    fn default() -> Self {
        EgressConfig {
            enabled: false,
            listen: ([127, 0, 0, 1], 15102).into(),
            routes: Vec::new(),
            level_expiry: DEFAULT_EXPIRY,
            max_authorities: DEFAULT_MAX_AUTHORITIES,
            default_budget: Duration::from_millis(500),
            deadline_margin: Duration::from_millis(10),
            protocol: AppProtocol::Auto,
            max_connections: 10_000,
            max_idle_per_downstream: 64,
            threads: 2,
            h2: H2Config::default(),
            timeouts: EgressTimeouts::default(),
            per_route: PerRouteConfig::default(),
        }
    }
}

impl Default for PerRouteConfig {
    fn default() -> Self {
        PerRouteConfig {
            enabled: true,
            max_routes: DEFAULT_MAX_ROUTES,
            max_dependencies: DEFAULT_MAX_DEPENDENCIES,
            dependency_expiry: DEFAULT_DEPENDENCY_EXPIRY,
            max_routes_per_authority: DEFAULT_MAX_ROUTES,
            retry_memory: 4096,
        }
    }
}

impl Default for EgressTimeouts {
    fn default() -> Self {
        EgressTimeouts {
            header_read: Duration::from_secs(10),
            idle: Duration::from_secs(60),
            body_read: Duration::from_secs(10),
            write: Duration::from_secs(10),
            graceful_close: Duration::from_secs(5),
            downstream_idle: Duration::from_secs(1),
            connect: Duration::from_secs(1),
            resolve: Duration::from_secs(1),
            resolve_ttl: Duration::from_secs(10),
        }
    }
}

/// Largest bound on per-route slots.
const MAX_ROUTE_SLOTS: usize = 4096;
/// Largest number of fixed routes.
const MAX_ROUTES: usize = 256;
/// Largest bound on cached authorities (each one a metric label value).
const MAX_AUTHORITIES: usize = 4096;
/// Longest duration accepted for any egress timeout or expiry.
const MAX_DURATION: Duration = Duration::from_secs(3600);

impl EgressConfig {
    /// Checks what serde cannot; the first problem wins, named by its field.
    pub fn validate(&self) -> Result<(), FieldError> {
        let bad = |field: &str, message: String| Err(FieldError::new(field, message));
        for (field, n, min, max) in [
            ("egress.max_authorities", self.max_authorities, 0, MAX_AUTHORITIES),
            ("egress.max_connections", self.max_connections, 1, 1_000_000),
            ("egress.max_idle_per_downstream", self.max_idle_per_downstream, 0, 100_000),
            ("egress.threads", self.threads, 1, 1024),
            (
                "egress.h2.max_concurrent_streams",
                self.h2.max_concurrent_streams as usize,
                1,
                65_536,
            ),
            ("egress.routes", self.routes.len(), 0, MAX_ROUTES),
            ("egress.per_route.max_routes", self.per_route.max_routes, 0, MAX_ROUTE_SLOTS),
            ("egress.per_route.max_dependencies", self.per_route.max_dependencies, 0, 256),
            (
                "egress.per_route.max_routes_per_authority",
                self.per_route.max_routes_per_authority,
                0,
                MAX_ROUTE_SLOTS,
            ),
            ("egress.per_route.retry_memory", self.per_route.retry_memory, 0, 1_000_000),
        ] {
            if !(min..=max).contains(&n) {
                return bad(field, format!("{n} is out of range {min}..={max}"));
            }
        }
        let t = &self.timeouts;
        for (field, value) in [
            ("egress.level_expiry", self.level_expiry),
            ("egress.per_route.dependency_expiry", self.per_route.dependency_expiry),
            ("egress.default_budget", self.default_budget),
            ("egress.timeouts.header_read", t.header_read),
            ("egress.timeouts.idle", t.idle),
            ("egress.timeouts.body_read", t.body_read),
            ("egress.timeouts.write", t.write),
            ("egress.timeouts.graceful_close", t.graceful_close),
            ("egress.timeouts.downstream_idle", t.downstream_idle),
            ("egress.timeouts.connect", t.connect),
            ("egress.timeouts.resolve", t.resolve),
            ("egress.timeouts.resolve_ttl", t.resolve_ttl),
        ] {
            if value.is_zero() || value > MAX_DURATION {
                return bad(field, format!("{value:?} must be more than 0 and at most 1h"));
            }
        }
        // Zero would pass every budget on whole: a request that comes round a loop the
        // egress cannot see would then circle until the app's own budget ran out.
        if self.deadline_margin.is_zero() {
            return bad(
                "egress.deadline_margin",
                "0s must be more than 0 (each hop takes it off the budget)".into(),
            );
        }
        if self.deadline_margin >= self.default_budget {
            return bad(
                "egress.deadline_margin",
                format!("{:?} must be less than egress.default_budget", self.deadline_margin),
            );
        }
        for (i, route) in self.routes.iter().enumerate() {
            if let Err(e) = parse_target(&route.target) {
                return bad(&format!("egress.routes[{i}].target"), e);
            }
        }
        Ok(())
    }
}

// === route targets and authorities ===

/// Checks a route target (`host:port`, no scheme, no path).
pub fn parse_target(target: &str) -> Result<Authority, String> {
    let authority: Authority =
        target.parse().map_err(|_| format!("`{target}` is not a host:port authority"))?;
    if authority.host().is_empty() {
        return Err(format!("`{target}` has no host"));
    }
    if authority.port_u16().is_none() {
        return Err(format!("`{target}` has no port"));
    }
    if authority.as_str().contains('@') {
        return Err(format!("`{target}` carries user info"));
    }
    with_port(authority).ok_or_else(|| format!("`{target}` is not a host:port authority"))
}

/// `host:port` as it is, `host` or `host:` with port 80; `None` for what else http's parser
/// lets through, rather than guessing: user info, no host, a port that is no port
/// (`host:99999`, `host:+80`), bytes after a bracketed host (`[::1]x:80`).
pub(crate) fn with_port(authority: Authority) -> Option<Authority> {
    let host = authority.host();
    if authority.as_str().contains('@') || host.is_empty() {
        return None;
    }
    // Without user info, the host comes first; after it only `:port`, `:` or nothing.
    match &authority.as_str()[host.len()..] {
        "" | ":" => Authority::try_from(format!("{host}:80")).ok(),
        port => {
            let digits = port.strip_prefix(':')?;
            let ok = digits.bytes().all(|b| b.is_ascii_digit()) && authority.port_u16().is_some();
            ok.then_some(authority)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_name_their_field() {
        EgressConfig::default().validate().unwrap();
        let mut c = EgressConfig::default();
        c.timeouts.resolve = Duration::ZERO;
        assert_eq!(c.validate().unwrap_err().path, "egress.timeouts.resolve");
        let c = EgressConfig { deadline_margin: Duration::ZERO, ..EgressConfig::default() };
        assert_eq!(c.validate().unwrap_err().path, "egress.deadline_margin");
        let mut c = EgressConfig::default();
        c.routes.push(EgressRoute { listen: ([127, 0, 0, 1], 0).into(), target: "b:80".into() });
        c.routes.push(EgressRoute { listen: ([127, 0, 0, 1], 0).into(), target: "no port".into() });
        assert_eq!(c.validate().unwrap_err().path, "egress.routes[1].target");
    }
}
