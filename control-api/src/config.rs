//! Admin listener settings (the `admin:` section of the sidecar config).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use admission_core::audit::InflationPolicy;
use admission_core::FieldError;
use serde::{Deserialize, Serialize};

/// Default admin address: loopback only.
pub const DEFAULT_ADMIN_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 15100);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// The full API (mutations included). Loopback unless configured otherwise.
    #[schemars(with = "admission_core::schema::SocketAddrString")]
    pub listen: SocketAddr,
    /// Optional second listener serving only `/metrics`, `/live` and `/ready`.
    #[schemars(with = "Option<admission_core::schema::SocketAddrString>")]
    pub public_listen: Option<SocketAddr>,
    /// File holding the bearer token for mutations. Without it mutations are refused.
    pub token_file: Option<PathBuf>,
    /// Largest accepted request body.
    #[schemars(range(min = 1, max = MAX_BODY_BYTES))]
    pub max_body_bytes: usize,
    /// Where accepted tables are persisted (atomically) and reloaded from on start.
    pub state_path: Option<PathBuf>,
    /// A mounted table file (ConfigMap), watched and hot-reloaded.
    pub table_file: Option<PathBuf>,
    /// Secret keying the user-priority hash; shared by all entry sidecars. The entry role
    /// refuses to start without it: with an empty key anyone can compute which user ids
    /// land on a favourable level.
    pub user_secret_file: Option<PathBuf>,
    /// Lets the entry role start without `user_secret_file` (demos and tests only).
    pub allow_empty_user_secret: bool,
    pub inflation: InflationPolicy,
    /// How often the table file is re-read and compared.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "admission_core::schema::HumanDuration")]
    pub table_poll_interval: Duration,
    /// How often the audit counters are sampled for the 1 min / 10 min windows.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "admission_core::schema::HumanDuration")]
    pub audit_sample_interval: Duration,
    pub timeouts: AdminTimeouts,
    /// Unauthenticated table validations running at once (each on a thread of its own, off
    /// the thread that answers probes); more wait in line, eight per permit, at most
    /// `timeouts.write_wait`, and are answered 503 past either. Authenticated writes do not
    /// share these: they have a permit of their own (see `timeouts.write_wait`).
    #[schemars(range(min = 1, max = 64))]
    pub max_concurrent_table_checks: usize,
    /// Connections each admin listener serves at once; beyond that a new one is closed at
    /// once (a scraper, the probes and an operator need a handful).
    #[schemars(range(min = 1, max = MAX_CONNECTIONS))]
    pub max_connections: usize,
}

/// Bounds on what one admin connection may hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AdminTimeouts {
    /// From accept (or the end of the previous request) to a complete request head.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "admission_core::schema::HumanDuration")]
    pub header_read: Duration,
    /// Longest a request body may take to arrive in full.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "admission_core::schema::HumanDuration")]
    pub body_read: Duration,
    /// Longest an authenticated table write waits for the one before it to finish, and an
    /// unauthenticated validation for a check permit. Writes run one at a time on a permit
    /// of their own, which validations never take; past this either is answered 503.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "admission_core::schema::HumanDuration")]
    pub write_wait: Duration,
}

impl Default for AdminTimeouts {
    fn default() -> Self {
        AdminTimeouts {
            header_read: Duration::from_secs(10),
            body_read: Duration::from_secs(10),
            write_wait: Duration::from_secs(5),
        }
    }
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: DEFAULT_ADMIN_ADDR,
            public_listen: None,
            token_file: None,
            max_body_bytes: 1 << 20,
            state_path: None,
            table_file: None,
            user_secret_file: None,
            allow_empty_user_secret: false,
            inflation: InflationPolicy::default(),
            table_poll_interval: Duration::from_millis(500),
            audit_sample_interval: Duration::from_secs(10),
            timeouts: AdminTimeouts::default(),
            max_concurrent_table_checks: 2,
            max_connections: 1024,
        }
    }
}

// === impl AdminConfig ===

impl AdminConfig {
    /// Checks the settings that serde cannot. The path is relative to this section
    /// (`max_body_bytes`); the sidecar config prefixes `admin.`.
    pub fn validate(&self) -> Result<(), FieldError> {
        let bad = |field: &str, message: &str| Err(FieldError::new(field, message));
        if self.max_body_bytes == 0 || self.max_body_bytes > MAX_BODY_BYTES {
            return bad("max_body_bytes", "must be within 1..=1048576 (1 MiB)");
        }
        if self.table_poll_interval < Duration::from_millis(10)
            || self.table_poll_interval > Duration::from_secs(3600)
        {
            return bad("table_poll_interval", "must be within 10ms..=1h");
        }
        if self.audit_sample_interval < Duration::from_millis(100)
            || self.audit_sample_interval > Duration::from_secs(60)
        {
            return bad("audit_sample_interval", "must be within 100ms..=60s");
        }
        for (field, d) in [
            ("timeouts.header_read", self.timeouts.header_read),
            ("timeouts.body_read", self.timeouts.body_read),
            ("timeouts.write_wait", self.timeouts.write_wait),
        ] {
            if d < Duration::from_millis(10) || d > Duration::from_secs(300) {
                return bad(field, "must be within 10ms..=5m");
            }
        }
        if !(1..=64).contains(&self.max_concurrent_table_checks) {
            return bad("max_concurrent_table_checks", "must be within 1..=64");
        }
        if !(1..=MAX_CONNECTIONS).contains(&self.max_connections) {
            return bad("max_connections", "must be within 1..=100000");
        }
        if let Err(e) = self.inflation.validate() {
            return Err(FieldError::new("inflation.top_class_share_max", e));
        }
        Ok(())
    }

    /// The user-hash secret (whitespace trimmed); empty when no file is configured. The
    /// error names `user_secret_file`.
    pub fn read_user_secret(&self) -> Result<Vec<u8>, FieldError> {
        match &self.user_secret_file {
            None => Ok(Vec::new()),
            Some(path) => read_trimmed(path)
                .map(String::into_bytes)
                .map_err(|e| FieldError::new("user_secret_file", e.to_string())),
        }
    }
}

/// Largest `max_body_bytes`: the table parser's own document limit.
pub const MAX_BODY_BYTES: usize = admission_core::table::MAX_DOCUMENT_BYTES;

/// Largest `max_connections`.
pub const MAX_CONNECTIONS: usize = 100_000;

/// A secret file's content without surrounding whitespace (editors and `kubectl create
/// secret --from-file` leave a trailing newline).
pub(crate) fn read_trimmed(path: &Path) -> std::io::Result<String> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot read {}: {e}", path.display())))
}
