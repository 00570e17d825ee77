//! weir control API (docs/design.md, "Control API"): the priority table's hot swap, the
//! inflation audit, status, metrics and probes, served on hyper 1; plus the CLI client
//! functions.
//!
//! - [`TableStore`]: the live table, lock-free for readers, atomic swaps.
//! - [`ControlPlane`]: the admin HTTP API and its background tasks (table-file watcher,
//!   audit sampler).
//! - [`load_initial_table`]: which table serves at start (see `source.rs` and the README).
//! - [`cli`]: `weir status`, `weir table get|put|validate`, `weir audit`.

mod api;
pub mod audit;
pub mod cli;
mod config;
mod error;
pub mod input;
pub mod metrics;
pub mod persist;
mod response;
mod server;
mod source;
mod status;
mod store;

pub use config::{AdminConfig, AdminTimeouts, DEFAULT_ADMIN_ADDR};
pub use error::ControlError;
pub use persist::StateFile;
pub use server::{AuditDoc, ControlPlane};
pub use source::{load_initial_table, parse_table, read_table_arg, read_table_file};
pub use status::{SidecarStatus, SidecarView, StatusDoc, WindowDoc};
pub use store::{SwapError, TableStore};
