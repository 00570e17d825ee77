//! weir's load/benchmark harness (`weir_harness`).
//!
//! - [`backend`]: a capacity-model app (W workers x S ms, FIFO) that counts the work
//!   it spends on requests whose client already gave up.
//! - [`load`]: an open-loop generator (Poisson arrivals, business classes, a user
//!   population, per-request deadlines) with per-class counts, latency histograms and
//!   per-second series.
//! - [`contender`]: the things we put between load and backend (direct, HAProxy, nginx,
//!   the `weir` binary) started as bounded child processes on 127.0.0.1.
//! - [`scenario`], [`report`], [`plot`]: the overload benchmark and its outputs.
//! - [`status`]: polling weir's admin `/v1/status`.
//!
//! Everything here targets 127.0.0.1 only, and every run has a fixed duration.

pub mod backend;
pub mod contender;
pub mod load;
pub mod overhead;
pub mod plot;
pub mod procfs;
pub mod report;
pub mod scenario;
pub mod status;

/// Request header carrying the absolute deadline (microseconds since the Unix epoch)
/// from the load generator to the capacity backend, so the backend can tell work done
/// for a client that already gave up. Same host, same clock.
pub const DEADLINE_HEADER: &str = "x-harness-deadline-us";

/// Microseconds since the Unix epoch, the clock [`DEADLINE_HEADER`] is written in.
pub fn unix_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}
