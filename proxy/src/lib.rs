//! weir: a sidecar proxy bringing DAGOR overload control (Zhou et al., SoCC 2018) to any mesh.
//!
//! - [`config`]: the one YAML configuration and its validation.
//! - [`sidecar`]: start/stop a sidecar (in-process for tests, or from `weir run`).
//! - [`shared`]: state shared by the request path, the admin API and the drain.
//! - [`plane`], [`listener`], [`service`], [`app_client`], [`body`]: the inbound data plane
//!   (hyper 1 + h2): lifecycle, connections, the per-request layers, the pooled client to the
//!   app, and bodies with bounded waits.
//! - [`app_protocol`]: `app_protocol: auto`: what the app (or a downstream) speaks, probed
//!   and remembered.
//! - [`egress`]: the egress role (outbound calls; refuses what a downstream would shed).
//! - [`inflight`]: the in-flight limit and the bounded pending queue.
//! - [`control_loop`]: the adaptive in-flight limit and the queue state the engine sees.
//! - [`own_time`]: the app's own time, less its waits on downstreams (with the egress role).
//! - [`priority`]: priority from headers (inner hop) or the priority table (entry).
//! - [`refusal`]: refusal responses per the wire contract.
//! - [`route_level`]: per-route levels (the inbound door and the egress cache per route).
//! - [`admin`]: the control API thread and the engine's timer.
//! - [`cli`]: the `weir` command line.

pub mod admin;
pub mod app_client;
pub mod app_protocol;
pub mod app_time;
pub mod body;
pub mod cli;
pub mod config;
pub mod control_loop;
pub mod deadline;
pub mod demo;
pub mod egress;
mod forward_headers;
pub mod inflight;
pub mod listener;
pub mod own_time;
mod plane;
pub mod priority;
pub mod refusal;
pub mod route_level;
pub mod service;
pub mod shared;
pub mod shutdown;
pub mod sidecar;
pub mod telemetry;

/// The parsers of caller bytes that are not public API, re-exported for the fuzz targets in
/// `fuzz/` (fuzz/README.md). Not a stable interface: nothing outside `fuzz/` should use it.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::listener::caller_io::collapse_content_length;
    pub use crate::listener::detect::{decide as detect_protocol, Detected, H2_PREFACE};
}

pub use config::SidecarConfig;
pub use sidecar::{Shared, Sidecar, StartError};
