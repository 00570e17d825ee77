//! weir: a sidecar proxy bringing DAGOR overload control (Zhou et al., SoCC 2018) to any mesh.
//! The module map, from the top down (no module imports one above it: no import circle):
//!
//! - [`cli`], [`demo`]: the `weir` command line.
//! - [`sidecar`]: start/stop a sidecar (in-process for tests, or from `weir run`); its
//!   parts: [`plane`] (the inbound runtimes and the stop), [`egress`], [`admin`] (the
//!   control API thread and the engine's timer). Why one could not start: [`error`].
//! - The two roles, each a policy on the one server skeleton:
//!   - [`service`]: the inbound role's request path (priority, admission, queue, gates,
//!     the app); with [`inflight`] (the in-flight limit and the pending queue),
//!     [`control_loop`] (the adaptive limit), [`app_time`];
//!   - [`egress`]: the egress role (outbound calls; refuses what a downstream would shed).
//! - [`server`]: the skeleton: the accept loop (`weir_net`), the connection driver
//!   (detection, the caller's socket, idle, graceful close, drain).
//! - [`http`]: the request stack both roles share (names, gRPC, budget, protocol,
//!   responses), with [`forward_headers`], [`deadline`], [`priority`], [`refusal`],
//!   [`app_client`] (the pooled client to the app or a downstream) and [`body`] (bodies
//!   with bounded waits).
//! - [`shared`]: state shared by the request path, the admin API and the drain.
//! - [`app_protocol`]: `app_protocol: auto`: what the app (or a downstream) speaks, probed
//!   and remembered (both roles).
//! - [`own_time`]: the app's own time, less its waits on downstreams (with the egress role),
//!   for the adaptive limit; the same pairing feeds [`route_level`] (per-route levels: the
//!   inbound door and the egress cache per route).
//! - [`telemetry`]: metrics and logs.
//! - [`config`]: the one YAML configuration and its validation; a leaf (it imports nothing
//!   of this crate).

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
pub mod error;
mod forward_headers;
pub mod http;
pub mod inflight;
pub mod own_time;
mod plane;
pub mod priority;
pub mod refusal;
pub mod route_level;
pub mod server;
pub mod service;
pub mod shared;
pub mod shutdown;
pub mod sidecar;
pub mod telemetry;

/// The parsers of caller bytes that are not public API, re-exported for the fuzz targets in
/// `fuzz/` (fuzz/README.md). Not a stable interface: nothing outside `fuzz/` should use it.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::server::caller_io::collapse_content_length;
    pub use crate::server::detect::{decide as detect_protocol, Detected, H2_PREFACE};
}

pub use config::SidecarConfig;
pub use error::StartError;
pub use sidecar::{Shared, Sidecar};
