//! Metrics and logs. The Prometheus recorder is process-global (the `metrics` facade has
//! one recorder), so it is installed once and shared by every sidecar in the process; the
//! request path only touches handles registered here, never the registry by name.

use std::sync::OnceLock;

use admission_core::HeaderValueError;
use metrics::{Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::config::{LogConfig, LogFormat};

pub const QUEUING_TIME: &str = "weir_queuing_time_seconds";
pub const HEADER_INVALID: &str = "weir_priority_header_invalid_total";
pub const QUEUE_ABANDONED: &str = "weir_queue_abandoned_total";
pub const IDLE_SLOT_ADMITTED: &str = "weir_idle_slot_admitted_total";

/// Queuing-time buckets around the 20 ms overload threshold and the 500 ms task timeout.
const QUEUING_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

static PROMETHEUS: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process's Prometheus handle, installing the recorder on first use.
pub fn prometheus() -> PrometheusHandle {
    PROMETHEUS
        .get_or_init(|| {
            let builder = || {
                PrometheusBuilder::new()
                    .set_buckets_for_metric(Matcher::Full(QUEUING_TIME.into()), QUEUING_BUCKETS)
                    .unwrap_or_else(|_| PrometheusBuilder::new())
            };
            builder().install_recorder().unwrap_or_else(|e| {
                // Someone else owns the global recorder: keep a private one so /metrics still
                // renders, and say so.
                tracing::warn!(error = %e, "metrics recorder already installed; weir metrics use a private registry");
                builder().build_recorder().handle()
            })
        })
        .clone()
}

/// Why a priority header fell back to the default (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvalidReason {
    Missing,
    Empty,
    Padded,
    Negative,
    NotNumeric,
    OutOfRange,
    Repeated,
}

impl InvalidReason {
    const ALL: [InvalidReason; 7] = [
        InvalidReason::Missing,
        InvalidReason::Empty,
        InvalidReason::Padded,
        InvalidReason::Negative,
        InvalidReason::NotNumeric,
        InvalidReason::OutOfRange,
        InvalidReason::Repeated,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            InvalidReason::Missing => "missing",
            InvalidReason::Empty => "empty",
            InvalidReason::Padded => "padded",
            InvalidReason::Negative => "negative",
            InvalidReason::NotNumeric => "not_numeric",
            InvalidReason::OutOfRange => "out_of_range",
            InvalidReason::Repeated => "repeated",
        }
    }
}

impl From<HeaderValueError> for InvalidReason {
    fn from(e: HeaderValueError) -> Self {
        match e {
            HeaderValueError::Empty => InvalidReason::Empty,
            HeaderValueError::Padded => InvalidReason::Padded,
            HeaderValueError::Negative => InvalidReason::Negative,
            HeaderValueError::NotNumeric | HeaderValueError::MissingSeparator => {
                InvalidReason::NotNumeric
            }
            HeaderValueError::OutOfRange { .. } => InvalidReason::OutOfRange,
            HeaderValueError::Repeated => InvalidReason::Repeated,
        }
    }
}

/// Handles the request path records through, registered once.
#[derive(Debug, Clone)]
pub struct ProxyMetrics {
    pub queuing_time: Histogram,
    pub queue_abandoned: Counter,
    pub idle_slot_admitted: Counter,
    header_invalid: [Counter; InvalidReason::ALL.len()],
}

impl ProxyMetrics {
    /// Installs the recorder if needed and registers the handles.
    pub fn register() -> Self {
        let _ = prometheus();
        metrics::describe_histogram!(
            QUEUING_TIME,
            metrics::Unit::Seconds,
            "Time requests waited for an in-flight slot to the app"
        );
        metrics::describe_counter!(
            HEADER_INVALID,
            "Requests whose priority headers were missing or malformed and got the default"
        );
        metrics::describe_counter!(QUEUE_ABANDONED, "Requests whose caller left while queued");
        metrics::describe_counter!(
            IDLE_SLOT_ADMITTED,
            "Requests below the admission level forwarded because a worker of the app was idle"
        );
        ProxyMetrics {
            queuing_time: metrics::histogram!(QUEUING_TIME, "role" => "inbound"),
            queue_abandoned: metrics::counter!(QUEUE_ABANDONED, "role" => "inbound"),
            idle_slot_admitted: metrics::counter!(IDLE_SLOT_ADMITTED, "role" => "inbound"),
            header_invalid: InvalidReason::ALL
                .map(|r| metrics::counter!(HEADER_INVALID, "reason" => r.as_str())),
        }
    }

    #[inline]
    pub fn header_invalid(&self, reason: InvalidReason) -> &Counter {
        &self.header_invalid[reason as usize]
    }
}

/// Installs the tracing subscriber. Idempotent.
pub fn init_logging(config: &LogConfig) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&config.filter))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = colour(
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let _ = match config.format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Colour (ANSI escapes) only for a person at a terminal: a container's log file, `kubectl
/// logs`, a pipe or a file get plain text, and a non-empty `NO_COLOR` (no-color.org) turns
/// it off at a terminal too.
pub fn colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::colour;
    use std::ffi::OsStr;

    #[test]
    fn colour_only_at_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some(OsStr::new(""))));
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None));
    }
}
