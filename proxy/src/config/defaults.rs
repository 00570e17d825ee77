//! Defaults of the fields serde fills in when a document leaves them out.

use std::time::Duration;

use super::{
    AppProtocol, H2Config, HeaderNames, InboundConfig, InboundTimeouts, LogConfig, LogFormat,
};

impl Default for InboundConfig {
    fn default() -> Self {
        InboundConfig {
            listen: ([127, 0, 0, 1], 15101).into(),
            app: ([127, 0, 0, 1], 8080).into(),
            app_protocol: AppProtocol::Auto,
            max_inflight: 256,
            adaptive_inflight: true,
            max_queued: 1024,
            task_timeout: Duration::from_millis(500),
            max_budget: None,
            overload_max_wait: Duration::from_millis(30),
            retry_after: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(10),
            drain_delay: Duration::ZERO,
            entry: false,
            forward_user_id: false,
            default_priority: None,
            threads: 0,
            work_stealing: false,
            headers: HeaderNames::default(),
            max_connections: 10_000,
            max_queued_per_connection: 64,
            h2: H2Config::default(),
            timeouts: InboundTimeouts::default(),
        }
    }
}

impl Default for H2Config {
    fn default() -> Self {
        H2Config { max_concurrent_streams: 256 }
    }
}

impl Default for InboundTimeouts {
    fn default() -> Self {
        InboundTimeouts {
            header_read: Duration::from_secs(10),
            idle: Duration::from_secs(60),
            body_read: Duration::from_secs(10),
            write: Duration::from_secs(10),
            app_connect: Duration::from_secs(1),
            app_idle: Duration::from_secs(1),
            graceful_close: Duration::from_secs(5),
        }
    }
}

impl Default for HeaderNames {
    fn default() -> Self {
        HeaderNames {
            business: "x-business-priority".into(),
            user: "x-user-priority".into(),
            timeout: "x-request-timeout-ms".into(),
            level: "x-admission-level".into(),
            shed: "x-weir-shed".into(),
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { format: LogFormat::Text, filter: "info".into() }
    }
}
