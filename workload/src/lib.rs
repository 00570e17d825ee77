//! weir's workload (`weir_workload`): what `weir demo` and the benchmark harness
//! (`weir_harness`) both put around a sidecar. Kept small on purpose: the `weir` binary
//! depends on it, so no plotting, benchmarking or test-only crates belong here.
//!
//! - [`backend`]: a capacity-model app (W workers x S ms, FIFO) that counts the work
//!   it spends on requests whose client already gave up, and the HTTP/1.1 + h2c server it
//!   serves through ([`backend::HttpServer`]), which the test harness's apps share.
//! - [`load`]: an open-loop generator (Poisson arrivals, business classes, a user
//!   population, per-request deadlines) with per-class counts, latency histograms and
//!   per-second series.
//! - [`analysis`]: settle and recovery times, timeout shares and latency quantiles read
//!   from a run's per-request log.
//! - [`status`]: polling weir's admin `/v1/status`, read through control-api's
//!   [`control_api::StatusDoc`].
//!
//! Everything here targets 127.0.0.1 only, and every run has a fixed duration.

pub mod analysis;
pub mod backend;
pub mod load;
pub mod status;

use serde::Serializer;
use std::time::Duration;

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

/// Serialises a duration as fractional milliseconds (reports and JSON).
pub fn ser_millis<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

/// Serialises a duration as fractional seconds (reports and JSON).
pub fn ser_secs<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}
