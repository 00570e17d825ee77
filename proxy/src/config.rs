//! The sidecar's configuration: one YAML document, parsed and validated here and nowhere else.
//!
//! Precedence: the embedded default (`config/default.yaml`) or `--config FILE`, then command-line
//! flags. Every error names the field it is about, so `weir run` can exit 64 with one line.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use admission_core::schema::{HumanDuration, SocketAddrString};
use admission_core::{AdmissionLevel, EngineConfig, Priority};
use schemars::JsonSchema;
use serde::Deserialize;

/// An inner hop's largest budget when `inbound.max_budget` is unset.
pub const INNER_HOP_MAX_BUDGET: Duration = Duration::from_secs(3600);

/// The configuration `weir run` serves with when no `--config` is given.
pub const EMBEDDED_DEFAULT: &str = include_str!("../config/default.yaml");

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SidecarConfig {
    pub inbound: InboundConfig,
    pub admission: EngineConfig,
    pub admin: control_api::AdminConfig,
    pub log: LogConfig,
    /// The egress role (off unless enabled or `--egress ADDR`).
    pub egress: EgressConfig,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct InboundConfig {
    /// Where callers connect (HTTP/1.1 and h2c prior knowledge on the same port).
    #[schemars(with = "SocketAddrString")]
    pub listen: SocketAddr,
    /// The app container, on localhost.
    #[schemars(with = "SocketAddrString")]
    pub app: SocketAddr,
    /// How to speak to the app.
    pub app_protocol: AppProtocol,
    /// Requests forwarded to the app at once; the rest wait in the pending queue. With
    /// `adaptive_inflight` (the default) this is the ceiling of the adaptive limit.
    #[schemars(range(min = 1, max = validate::MAX_COUNT))]
    pub max_inflight: usize,
    /// Find the app's concurrency from its own response times and limit the requests in
    /// flight to it (plus a margin), so the queue forms in the sidecar, where the queuing
    /// time sees it, rather than inside the app. `false`: exactly `max_inflight`. Off
    /// whenever the egress role is on: the app then calls downstreams, its response time
    /// includes theirs, and a limit inferred from it would shed here for their overload.
    pub adaptive_inflight: bool,
    /// Requests allowed to wait for a slot; beyond that, refused with `x-weir-shed: overload`.
    #[schemars(range(min = 0, max = validate::MAX_COUNT))]
    pub max_queued: usize,
    /// Budget of a request that carries no deadline, and the longest a request may wait.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "HumanDuration")]
    pub task_timeout: Duration,
    /// The largest budget a caller's `grpc-timeout` or timeout header may grant; a larger
    /// one is cut to it (and forwarded cut). A request that declares none gets
    /// `task_timeout`, uncapped. Unset: the task timeout on the entry role (a client outside
    /// the mesh gets no more time than a request without a deadline), 1 h on an inner hop
    /// (the mesh's budgets come from an entry that capped them; the hour only keeps a
    /// runaway value finite). See [`InboundConfig::max_budget`].
    #[serde(with = "humantime_serde")]
    #[schemars(with = "Option<admission_core::schema::HumanDuration>")]
    pub max_budget: Option<Duration>,
    /// While the level refuses a real share of arrivals, the longest a request of the class
    /// the level cuts in (or a less important one) waits for a slot: the door refuses a
    /// longer expected wait, and a waiter past it evicts the less important waiters behind
    /// it and is then refused (`x-weir-shed: overload`). It bounds the admitted tail
    /// (docs/design.md, "Queue and gates"). 0 = off.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "HumanDuration")]
    pub overload_max_wait: Duration,
    /// What refusals ask callers to wait (`retry-after`, `grpc-retry-pushback-ms`).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "HumanDuration")]
    pub retry_after: Duration,
    /// On SIGTERM, how long in-flight and queued requests may take to finish.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "HumanDuration")]
    pub shutdown_grace: Duration,
    /// On SIGTERM, how long to keep accepting and serving (with `/ready` failing) before the
    /// drain starts: for regular sidecars on Kubernetes < 1.30 (no native sidecars, no
    /// preStop `sleep`), which get SIGTERM while callers still route to the pod. 0 = drain at
    /// once. The shutdown grace starts after it.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "admission_core::schema::HumanDuration")]
    pub drain_delay: Duration,
    /// Entry role: replace client-sent priority headers with ones from the priority table.
    pub entry: bool,
    /// Entry role: keep the user-id header on the forwarded request.
    pub forward_user_id: bool,
    /// Priority assumed when an inner hop's headers are missing or malformed, as `B.U`.
    /// Unset: the priority table's least important business level, user 127.
    #[schemars(regex(
        pattern = r"^([0-9]|[1-9][0-9]|1[0-9]{2}|2[0-4][0-9]|25[0-5])\.([0-9]|[1-9][0-9]|1[01][0-9]|12[0-7])$"
    ))]
    pub default_priority: Option<String>,
    /// Worker threads; 0 = one per core.
    #[schemars(range(min = 0, max = validate::MAX_THREADS))]
    pub threads: usize,
    /// One work-stealing runtime with one listener, instead of one current-thread runtime
    /// per worker thread, each with its own `SO_REUSEPORT` listener and app connection pool
    /// (the default: a request never leaves its thread). Work stealing evens out a few
    /// long-lived connections across threads; the tests use it.
    pub work_stealing: bool,
    pub headers: HeaderNames,
    /// Accepted connections at once; beyond that, new ones are closed at once.
    #[schemars(range(min = 1, max = validate::MAX_COUNT))]
    pub max_connections: usize,
    /// One connection's share of the pending queue (so one h2 connection cannot fill it).
    #[schemars(range(min = 1, max = validate::MAX_COUNT))]
    pub max_queued_per_connection: usize,
    pub h2: H2Config,
    pub timeouts: InboundTimeouts,
}

/// HTTP/2 settings towards callers (the inbound role's callers, the egress role's app).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct H2Config {
    /// Streams one caller connection may have open at once.
    #[schemars(range(min = 1, max = 65_536))]
    pub max_concurrent_streams: u32,
}

/// Every wait on a caller's connection or on the app, named (all must be greater than zero).
/// The app's response itself is bounded by the request's remaining budget, not by a setting.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct InboundTimeouts {
    /// From accept (or the end of the previous request) to a complete request head,
    /// including the h2c preface detection.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "HumanDuration")]
    pub header_read: Duration,
    /// A connection with no request in flight is closed after this.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "HumanDuration")]
    pub idle: Duration,
    /// Longest gap while reading a request body. The whole body must also arrive within
    /// the request's budget.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "HumanDuration")]
    pub body_read: Duration,
    /// Longest time without progress writing a response to the caller.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "HumanDuration")]
    pub write: Duration,
    /// TCP connect to the app.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "HumanDuration")]
    pub app_connect: Duration,
    /// A pooled keep-alive connection to the app idle for longer than this is closed
    /// instead of reused: below the idle timeouts of common app servers (gunicorn 2 s,
    /// node and uvicorn 5 s), so weir rarely sends a request on a connection the app is
    /// closing (and an idempotent one that meets such a close is retried once).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "admission_core::schema::HumanDuration")]
    pub app_idle: Duration,
    /// A connection asked to close (idle for `idle`, or the sidecar draining) is dropped
    /// once it has had no request inside for this long: an h2 peer that never acknowledges
    /// the shutdown PING would otherwise keep it open for ever.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "admission_core::schema::HumanDuration")]
    pub graceful_close: Duration,
}

/// Protocol towards the app.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AppProtocol {
    /// HTTP/1.1 for HTTP/1.1 callers; for HTTP/2 and gRPC callers h2c if the app speaks it
    /// (probed and remembered: [`crate::app_protocol`]), else HTTP/1.1.
    #[default]
    Auto,
    /// Always HTTP/1.1.
    Http1,
    /// Always h2c (prior knowledge).
    H2c,
}

/// Wire names (docs/design.md, "Wire contract"). The user-id header is the priority
/// table's `user.header`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct HeaderNames {
    pub business: String,
    pub user: String,
    pub timeout: String,
    pub level: String,
    pub shed: String,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    pub format: LogFormat,
    /// An env-filter directive; `RUST_LOG` wins when set.
    pub filter: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// A configuration problem, naming the field: the one field error type of every crate.
pub use admission_core::FieldError as ConfigError;

/// Command-line values that override the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub inbound: Option<SocketAddr>,
    pub app: Option<SocketAddr>,
    pub admin: Option<SocketAddr>,
    /// `--public ADDR`: `admin.public_listen`.
    pub public: Option<SocketAddr>,
    pub max_inflight: Option<usize>,
    pub entry: bool,
    pub table: Option<PathBuf>,
    /// `--egress ADDR`: enables the egress role on ADDR.
    pub egress: Option<SocketAddr>,
    /// `--drain-delay DURATION`: `inbound.drain_delay`.
    pub drain_delay: Option<Duration>,
}

mod defaults;
pub mod egress;
pub mod schema;
mod server;
mod validate;

pub use self::egress::{EgressConfig, EgressRoute, EgressTimeouts, PerRouteConfig};
pub use self::server::{ServerConfig, ServerTimeouts};
pub use self::validate::check_header_name;

// === impl SidecarConfig ===

impl SidecarConfig {
    /// Parses a YAML document; a malformed one names the field path it fails at.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let config: SidecarConfig = admission_core::table::from_yaml_str(text)?;
        config.validate()?;
        Ok(config)
    }

    /// The file at `path` (`-`: standard input), or the embedded default.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        match path {
            None => Self::from_yaml(EMBEDDED_DEFAULT),
            Some(path) => {
                // `-` is standard input (control_api::input).
                let text = control_api::input::read_to_string(path).map_err(|e| {
                    let name = control_api::input::display(path);
                    ConfigError::new("--config", format!("cannot read {name}: {e}"))
                })?;
                Self::from_yaml(&text)
            }
        }
    }

    pub fn apply(&mut self, o: &Overrides) -> Result<(), ConfigError> {
        if let Some(a) = o.inbound {
            self.inbound.listen = a;
        }
        if let Some(a) = o.app {
            self.inbound.app = a;
        }
        if let Some(a) = o.admin {
            self.admin.listen = a;
        }
        if let Some(a) = o.public {
            self.admin.public_listen = Some(a);
        }
        if let Some(n) = o.max_inflight {
            self.inbound.max_inflight = n;
        }
        if o.entry {
            self.inbound.entry = true;
        }
        if let Some(t) = &o.table {
            self.admin.table_file = Some(t.clone());
        }
        if let Some(a) = o.egress {
            self.egress.enabled = true;
            self.egress.listen = a;
        }
        if let Some(d) = o.drain_delay {
            self.inbound.drain_delay = d;
        }
        self.validate()
    }
}

// === impl InboundConfig ===

impl InboundConfig {
    /// The configured default for malformed inner-hop headers, if any.
    pub fn default_priority(&self) -> Option<Priority> {
        let p = self.default_priority.as_ref()?;
        AdmissionLevel::parse(p.as_bytes()).ok().map(AdmissionLevel::priority)
    }

    /// The largest budget a caller's deadline header may grant (see the field).
    pub fn max_budget(&self) -> Duration {
        match self.max_budget {
            Some(max) => max,
            None if self.entry => self.task_timeout,
            None => INNER_HOP_MAX_BUDGET,
        }
    }

    /// Worker threads to run: the configured count, or one per core.
    pub fn worker_threads(&self) -> usize {
        if self.threads > 0 {
            return self.threads;
        }
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    }
}

#[cfg(test)]
mod tests;
