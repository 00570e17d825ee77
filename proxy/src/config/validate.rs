//! What serde cannot check: ranges, header names, the entry role's secret. The first
//! problem wins, named by its exact field, so `weir run` exits 64 with one line.
//!
//! Every number has an upper bound as well as a lower one: a setting that parses must
//! never panic later (`inbound.threads: 100000` used to abort while spawning threads) or
//! silently overflow a duration.

use std::time::Duration;

use admission_core::{AdmissionLevel, FieldError};
use http::HeaderName;

use super::SidecarConfig;

/// Largest worker thread count; far above any sidecar's share of a node.
pub const MAX_THREADS: usize = 1024;
/// Largest in-flight limit, queue length and connection count.
pub const MAX_COUNT: usize = 1_000_000;
/// Longest duration accepted for any timeout or grace.
pub const MAX_DURATION: Duration = Duration::from_secs(3600);

/// Why `name` cannot be a configurable header, if it cannot.
pub fn check_header_name(name: &str) -> Result<(), String> {
    if name.starts_with(':') {
        return Err(format!("`{name}` is an HTTP/2 pseudo-header"));
    }
    if HeaderName::from_bytes(name.as_bytes()).is_err()
        || name.bytes().any(|b| b.is_ascii_uppercase())
    {
        return Err(format!("`{name}` is not a valid lowercase header name"));
    }
    admission_core::table::check_reserved_header(name)
}

// === impl SidecarConfig (validation) ===

impl SidecarConfig {
    /// Checks what serde cannot; the first problem wins (one line on exit).
    pub fn validate(&self) -> Result<(), FieldError> {
        let bad = |field: &str, message: &str| Err(FieldError::new(field, message));
        let i = &self.inbound;
        for (field, n, min, max) in [
            ("inbound.max_inflight", i.max_inflight, 1, MAX_COUNT),
            ("inbound.max_queued", i.max_queued, 0, MAX_COUNT),
            ("inbound.threads", i.threads, 0, MAX_THREADS),
            ("inbound.max_connections", i.max_connections, 1, MAX_COUNT),
            ("inbound.max_queued_per_connection", i.max_queued_per_connection, 1, MAX_COUNT),
            ("inbound.h2.max_concurrent_streams", i.h2.max_concurrent_streams as usize, 1, 65_536),
        ] {
            if !(min..=max).contains(&n) {
                return bad(field, &format!("{n} is out of range {min}..={max}"));
            }
        }
        for (field, value, may_be_zero) in [
            ("inbound.task_timeout", i.task_timeout, false),
            ("inbound.overload_max_wait", i.overload_max_wait, true),
            ("inbound.retry_after", i.retry_after, true),
            ("inbound.shutdown_grace", i.shutdown_grace, true),
            ("inbound.drain_delay", i.drain_delay, true),
            ("inbound.timeouts.header_read", i.timeouts.header_read, false),
            ("inbound.timeouts.idle", i.timeouts.idle, false),
            ("inbound.timeouts.body_read", i.timeouts.body_read, false),
            ("inbound.timeouts.write", i.timeouts.write, false),
            ("inbound.timeouts.app_connect", i.timeouts.app_connect, false),
            ("inbound.timeouts.app_idle", i.timeouts.app_idle, false),
            ("inbound.timeouts.graceful_close", i.timeouts.graceful_close, false),
            ("inbound.max_budget", i.max_budget.unwrap_or(i.task_timeout), false),
            ("admission.window", self.admission.window, false),
            ("admission.queuing_threshold", self.admission.queuing_threshold, false),
        ] {
            if value.is_zero() && !may_be_zero {
                return bad(field, "must be greater than zero");
            }
            if value > MAX_DURATION {
                return bad(field, "must be at most 1h");
            }
        }
        if i.listen == i.app {
            return bad("inbound.app", "must differ from inbound.listen");
        }
        self.check_listeners_distinct()?;
        if let Some(p) = &i.default_priority {
            if AdmissionLevel::parse(p.as_bytes()).is_err() {
                return bad("inbound.default_priority", "expected `B.U` with B <= 255, U <= 127");
            }
        }
        let names = [
            ("inbound.headers.business", &i.headers.business),
            ("inbound.headers.user", &i.headers.user),
            ("inbound.headers.timeout", &i.headers.timeout),
            ("inbound.headers.level", &i.headers.level),
            ("inbound.headers.shed", &i.headers.shed),
        ];
        for (k, (field, name)) in names.iter().enumerate() {
            if let Err(why) = check_header_name(name) {
                return bad(field, &why);
            }
            if let Some((other, _)) = names[..k].iter().find(|(_, n)| n == name) {
                return bad(field, &format!("`{name}` is already used by {other}"));
            }
        }
        if let Err(errs) = self.admission.validate() {
            if let Some(e) = errs.into_iter().next() {
                return Err(e.at("admission"));
            }
        }
        self.admin.validate().map_err(|e| e.at("admin"))?;
        self.egress.validate()?;
        if i.entry && self.admin.user_secret_file.is_none() && !self.admin.allow_empty_user_secret {
            return bad(
                "admin.user_secret_file",
                "the entry role needs the user-hash secret (the same file on every entry \
                 sidecar); without it anyone can compute which user ids get a favourable \
                 level. For a demo, set admin.allow_empty_user_secret: true",
            );
        }
        for (field, path) in [
            ("admin.table_file", &self.admin.table_file),
            ("admin.token_file", &self.admin.token_file),
            ("admin.user_secret_file", &self.admin.user_secret_file),
            ("admin.state_path", &self.admin.state_path),
        ] {
            if path.as_deref().is_some_and(control_api::input::is_stdin) {
                return bad(
                    field,
                    "`-` (standard input) cannot be watched or re-read; name a file",
                );
            }
        }
        if tracing_subscriber::EnvFilter::try_new(&self.log.filter).is_err() {
            return bad("log.filter", "not a valid filter directive");
        }
        Ok(())
    }
}

/// Whether two listen addresses would claim the same socket (same port, and the same address
/// or either one the wildcard). Port 0 never clashes: the kernel picks a free port.
fn overlaps(a: std::net::SocketAddr, b: std::net::SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

impl SidecarConfig {
    /// weir's own listeners must not claim each other's ports: the second bind would fail at
    /// start (or, with `SO_REUSEPORT` on the inbound listener, share its port).
    fn check_listeners_distinct(&self) -> Result<(), FieldError> {
        let mut listeners =
            vec![("inbound.listen", self.inbound.listen), ("admin.listen", self.admin.listen)];
        if let Some(public) = self.admin.public_listen {
            listeners.push(("admin.public_listen", public));
        }
        if self.egress.enabled {
            listeners.push(("egress.listen", self.egress.listen));
        }
        for (k, (field, addr)) in listeners.iter().enumerate() {
            if let Some((other, _)) = listeners[..k].iter().find(|(_, a)| overlaps(*a, *addr)) {
                return Err(FieldError::new(
                    *field,
                    format!("{addr} takes the port of {other}; give each listener its own port"),
                ));
            }
        }
        Ok(())
    }
}

// === impl SidecarConfig (preflight) ===

impl SidecarConfig {
    /// The files the settings name, checked before the sidecar starts, so `weir run` exits
    /// 64 with one line naming the setting instead of failing half-started: the token and
    /// secret files must be readable (and not empty), the table file readable, the state
    /// path's directory writable.
    pub fn preflight(&self) -> Result<(), FieldError> {
        let a = &self.admin;
        let readable = |field: &str, path: &std::path::Path, need_content: bool| {
            match std::fs::read_to_string(path) {
                Ok(text) if need_content && text.trim().is_empty() => {
                    Err(FieldError::new(field, format!("{} is empty", path.display())))
                }
                Ok(_) => Ok(()),
                Err(e) => {
                    Err(FieldError::new(field, format!("cannot read {}: {e}", path.display())))
                }
            }
        };
        if let Some(p) = &a.token_file {
            readable("admin.token_file", p, true)?;
        }
        if let Some(p) = &a.user_secret_file {
            readable("admin.user_secret_file", p, self.inbound.entry)?;
        }
        if let Some(p) = &a.table_file {
            readable("admin.table_file", p, false)?;
        }
        if let Some(p) = &a.state_path {
            if p.is_dir() {
                return Err(FieldError::new(
                    "admin.state_path",
                    format!("{} is a directory; name a file in it", p.display()),
                ));
            }
            if p.exists() {
                readable("admin.state_path", p, false)?;
            }
            // The state is written as `<path>.tmp` and renamed: try exactly that.
            let mut probe = p.clone().into_os_string();
            probe.push(".preflight");
            let probe = std::path::PathBuf::from(probe);
            std::fs::write(&probe, b"").map_err(|e| {
                FieldError::new(
                    "admin.state_path",
                    format!("cannot write next to {}: {e}", p.display()),
                )
            })?;
            let _ = std::fs::remove_file(&probe);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EMBEDDED_DEFAULT;

    /// One place for defaults: the `Default` impls. The embedded YAML, an empty document
    /// (serde's per-field defaults) and `Default::default()` must all be the same value.
    #[test]
    fn the_embedded_default_equals_the_default_impls() {
        let from_impls = format!("{:#?}", SidecarConfig::default());
        let embedded = SidecarConfig::from_yaml(EMBEDDED_DEFAULT).unwrap();
        assert_eq!(format!("{embedded:#?}"), from_impls);
        let empty = SidecarConfig::from_yaml("{}").unwrap();
        assert_eq!(format!("{empty:#?}"), from_impls);
        SidecarConfig::default().validate().unwrap();
    }

    #[test]
    fn reserved_header_names_are_refused_for_every_header() {
        for field in ["business", "user", "timeout", "level", "shed"] {
            for name in [
                "content-length",
                "transfer-encoding",
                "host",
                "connection",
                "te",
                "keep-alive",
                "trailer",
                "upgrade",
                "proxy-foo",
                ":path",
                "Content-Length",
            ] {
                let yaml = format!("inbound:\n  headers:\n    {field}: '{name}'\n");
                let e = SidecarConfig::from_yaml(&yaml).unwrap_err();
                assert_eq!(e.path, format!("inbound.headers.{field}"), "{name}: {e}");
            }
        }
        let e = SidecarConfig::from_yaml("inbound:\n  headers:\n    level: x-business-priority\n")
            .unwrap_err();
        assert_eq!(e.path, "inbound.headers.level");
        assert!(e.message.contains("inbound.headers.business"), "{e}");
    }

    #[test]
    fn every_number_is_bounded() {
        for (yaml, field) in [
            ("inbound:\n  threads: 100000\n", "inbound.threads"),
            ("inbound:\n  max_inflight: 100000000\n", "inbound.max_inflight"),
            ("inbound:\n  max_queued: 100000000\n", "inbound.max_queued"),
            ("inbound:\n  max_connections: 0\n", "inbound.max_connections"),
            (
                "inbound:\n  h2:\n    max_concurrent_streams: 4000000\n",
                "inbound.h2.max_concurrent_streams",
            ),
            ("inbound:\n  task_timeout: 100days\n", "inbound.task_timeout"),
            ("inbound:\n  shutdown_grace: 2h\n", "inbound.shutdown_grace"),
            ("inbound:\n  drain_delay: 2h\n", "inbound.drain_delay"),
            ("inbound:\n  timeouts:\n    idle: 0s\n", "inbound.timeouts.idle"),
            ("admission:\n  window: 2h\n", "admission.window"),
            ("admin:\n  max_body_bytes: 0\n", "admin.max_body_bytes"),
            ("admin:\n  max_body_bytes: 100000000\n", "admin.max_body_bytes"),
            ("admin:\n  timeouts:\n    body_read: 1h\n", "admin.timeouts.body_read"),
            ("admin:\n  max_concurrent_table_checks: 0\n", "admin.max_concurrent_table_checks"),
        ] {
            let e = SidecarConfig::from_yaml(yaml).unwrap_err();
            assert_eq!(e.path, field, "{yaml}: {e}");
        }
    }

    #[test]
    fn listeners_need_their_own_ports() {
        for (yaml, field) in [
            ("admin:\n  public_listen: 0.0.0.0:15100\n", "admin.public_listen"),
            (
                "inbound:\n  listen: 0.0.0.0:7000\nadmin:\n  listen: 127.0.0.1:7000\n",
                "admin.listen",
            ),
            ("egress:\n  enabled: true\n  listen: 127.0.0.1:15101\n", "egress.listen"),
        ] {
            let e = SidecarConfig::from_yaml(yaml).unwrap_err();
            assert_eq!(e.path, field, "{yaml}: {e}");
        }
        // Different addresses on one port, and port 0 anywhere, are fine.
        SidecarConfig::from_yaml("inbound:\n  listen: 127.0.0.2:15100\n").unwrap();
        SidecarConfig::from_yaml(
            "inbound:\n  listen: 127.0.0.1:0\nadmin:\n  listen: 127.0.0.1:0\n  public_listen: 0.0.0.0:0\n",
        )
        .unwrap();
    }

    #[test]
    fn the_entry_needs_a_user_secret_unless_allowed() {
        let e = SidecarConfig::from_yaml("inbound:\n  entry: true\n").unwrap_err();
        assert_eq!(e.path, "admin.user_secret_file");
        SidecarConfig::from_yaml(
            "inbound:\n  entry: true\nadmin:\n  allow_empty_user_secret: true\n",
        )
        .unwrap();
        SidecarConfig::from_yaml("inbound:\n  entry: true\nadmin:\n  user_secret_file: /s\n")
            .unwrap();
    }
}
