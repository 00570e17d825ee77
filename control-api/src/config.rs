//! Admin listener settings (the `admin:` section of the sidecar config).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use admission_core::audit::InflationPolicy;
use serde::{Deserialize, Serialize};

use crate::error::ControlError;

/// Default admin address: loopback only.
pub const DEFAULT_ADMIN_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 15000);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// The full API (mutations included). Loopback unless configured otherwise.
    pub listen: SocketAddr,
    /// Optional second listener serving only `/metrics`, `/live` and `/ready`.
    pub public_listen: Option<SocketAddr>,
    /// File holding the bearer token for mutations. Without it mutations are refused.
    pub token_file: Option<PathBuf>,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Where accepted tables are persisted (atomically) and reloaded from on start.
    pub state_path: Option<PathBuf>,
    /// A mounted table file (ConfigMap), watched and hot-reloaded.
    pub table_file: Option<PathBuf>,
    /// Secret keying the user-priority hash; shared by all entry sidecars.
    pub user_secret_file: Option<PathBuf>,
    pub inflation: InflationPolicy,
    /// How often the table file is re-read and compared.
    #[serde(with = "humantime_serde")]
    pub table_poll_interval: Duration,
    /// How often the audit counters are sampled for the 1 min / 10 min windows.
    #[serde(with = "humantime_serde")]
    pub audit_sample_interval: Duration,
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
            inflation: InflationPolicy::default(),
            table_poll_interval: Duration::from_millis(500),
            audit_sample_interval: Duration::from_secs(10),
        }
    }
}

// === impl AdminConfig ===

impl AdminConfig {
    /// Checks the settings that serde cannot; names the field.
    pub fn validate(&self) -> Result<(), ControlError> {
        let bad =
            |field: &str, msg: String| Err(ControlError::Config(format!("admin.{field}: {msg}")));
        if self.max_body_bytes == 0 {
            return bad("max_body_bytes", "must be greater than 0".into());
        }
        if self.table_poll_interval < Duration::from_millis(10) {
            return bad("table_poll_interval", "must be at least 10ms".into());
        }
        if self.audit_sample_interval < Duration::from_millis(100)
            || self.audit_sample_interval > Duration::from_secs(60)
        {
            return bad("audit_sample_interval", "must be within 100ms..=60s".into());
        }
        if let Err(e) = self.inflation.validate() {
            return bad("inflation", e);
        }
        Ok(())
    }

    /// The user-hash secret (whitespace trimmed); empty when no file is configured.
    pub fn read_user_secret(&self) -> Result<Vec<u8>, ControlError> {
        match &self.user_secret_file {
            None => Ok(Vec::new()),
            Some(path) => read_trimmed(path).map(String::into_bytes),
        }
    }
}

/// A secret file's content without surrounding whitespace (editors and `kubectl create
/// secret --from-file` leave a trailing newline).
pub(crate) fn read_trimmed(path: &Path) -> Result<String, ControlError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|source| ControlError::Io { path: path.to_owned(), source })
}
