//! [`ServerConfig`]: what the server skeleton (`crate::server`) needs of a role, one shape
//! for both. The file keeps a section per role (`inbound:` and `egress:`, each with its own
//! `max_connections`, `h2` and `timeouts`, as before), so every existing file still reads
//! the same; [`InboundConfig::server`] and [`EgressConfig::server`] take the shared part
//! out of each.

use std::time::Duration;

use super::{EgressConfig, H2Config, InboundConfig};

/// One role's listener, connections and their waits.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Accepted connections at once; beyond that, new ones are closed at once.
    pub max_connections: usize,
    pub h2: H2Config,
    pub timeouts: ServerTimeouts,
}

/// The waits of a connection to the role (the role's `timeouts.*` of the same names).
#[derive(Debug, Clone, Copy)]
pub struct ServerTimeouts {
    /// From accept (or the end of the previous request) to a complete request head,
    /// the h2c preface detection included.
    pub header_read: Duration,
    /// A connection with no request inside is asked to close after this.
    pub idle: Duration,
    /// Longest time without progress writing to the caller.
    pub write: Duration,
    /// A connection asked to close is dropped once it has had nothing inside for this long.
    pub graceful_close: Duration,
}

impl InboundConfig {
    /// The inbound listener's share of the skeleton.
    pub fn server(&self) -> ServerConfig {
        let t = &self.timeouts;
        ServerConfig {
            max_connections: self.max_connections,
            h2: self.h2.clone(),
            timeouts: ServerTimeouts {
                header_read: t.header_read,
                idle: t.idle,
                write: t.write,
                graceful_close: t.graceful_close,
            },
        }
    }
}

impl EgressConfig {
    /// The egress listeners' share of the skeleton (every route's listener too).
    pub fn server(&self) -> ServerConfig {
        let t = &self.timeouts;
        ServerConfig {
            max_connections: self.max_connections,
            h2: self.h2.clone(),
            timeouts: ServerTimeouts {
                header_read: t.header_read,
                idle: t.idle,
                write: t.write,
                graceful_close: t.graceful_close,
            },
        }
    }
}
