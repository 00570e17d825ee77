//! Engine settings (docs/design.md, "Signal and control laws"). Deserialised from the
//! sidecar's config file (`admission:` section); every field has the documented default.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Refuse what the level does not admit.
    #[default]
    Enforce,
    /// Decide and count everything, refuse nothing.
    Shadow,
}

/// Which control law moves the admission level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Law {
    /// The paper's law, exactly as published: target `(1 - alpha) * admitted` when
    /// overloaded, `(1 + beta) * admitted` otherwise. Kept for comparison: it cuts a 3x
    /// spike over ~20 windows and re-opens one bucket per window after it.
    Dagor,
    /// Measures the rate the app completes while saturated (gate drops excluded) and aims
    /// straight at it, minus what drains the backlog; inside the hysteresis band it sits
    /// at that capacity, and when relaxed it probes upwards by `beta`. In the simulator it
    /// settles in ~3 windows where dagor takes ~20-30 (see `examples/simulate`), but behind
    /// the real sidecar it lost 5-9% goodput against dagor. Kept for comparison.
    Goodput,
    /// Admits what the app completes: aims the level straight at the app's completion
    /// rate measured while weir's queue was busy (minus what drains the excess backlog
    /// within about a window), closes a window early when the queue grows fast so a spike
    /// is cut within `early_close_after` or two, sits at that rate inside the hysteresis
    /// band, and re-opens to the completion rate as soon as the queue is short again.
    /// The default (README: the laws side by side in the simulator).
    #[default]
    Capacity,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// A window closes after this long...
    #[serde(with = "humantime_serde")]
    #[schemars(with = "crate::schema::HumanDuration")]
    pub window: Duration,
    /// ...or after this many queuing samples, whichever comes first.
    #[schemars(range(min = 1, max = crate::engine::shard::MAX_WINDOW_REQUESTS))]
    pub window_requests: u32,
    /// Overloaded when the window's mean queuing time exceeds this.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "crate::schema::HumanDuration")]
    pub queuing_threshold: Duration,
    /// Leave the overloaded state only once the mean falls to this; between the two
    /// the level holds (hysteresis).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "crate::schema::HumanDuration")]
    pub queuing_exit_threshold: Duration,
    pub law: Law,
    /// Cut, as a fraction of what was admitted (dagor; goodput until it has measured
    /// the app's capacity).
    #[schemars(extend("exclusiveMinimum" = 0, "exclusiveMaximum" = 1))]
    pub alpha: f64,
    /// Relax step, as a fraction of what was admitted (goodput: of arrivals until it has
    /// measured the capacity).
    #[schemars(extend("exclusiveMinimum" = 0, "exclusiveMaximum" = 1))]
    pub beta: f64,
    /// Goodput law: how far below the measured capacity to aim. 0 by default: queuing
    /// above the threshold already makes it aim below capacity until the backlog drains.
    #[schemars(range(min = 0), extend("exclusiveMaximum" = 0.5))]
    pub trim: f64,
    pub mode: Mode,
    /// A window may close this early (not before) when the queue grows fast: the
    /// queuing signal (mean wait so far, or the oldest waiter's age) is above the
    /// threshold while not yet overloaded, or above eight times it while overloaded.
    /// Zero turns early closes off.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "crate::schema::HumanDuration")]
    pub early_close_after: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            window: Duration::from_secs(1),
            window_requests: 2000,
            queuing_threshold: Duration::from_millis(20),
            queuing_exit_threshold: Duration::from_millis(10),
            law: Law::default(),
            alpha: 0.05,
            beta: 0.01,
            trim: 0.0,
            mode: Mode::Enforce,
            early_close_after: Duration::from_millis(100),
        }
    }
}

/// One invalid setting, named by its field path (relative to `admission`): the one field
/// error type of every crate.
pub type ConfigError = crate::table::FieldError;

impl EngineConfig {
    /// Checks ranges; returns every bad field, not just the first.
    pub fn validate(&self) -> Result<(), Vec<ConfigError>> {
        let mut errs = Vec::new();
        let mut bad = |field: &str, message: &str| errs.push(ConfigError::new(field, message));
        if self.window.is_zero() {
            bad("window", "must be greater than zero");
        }
        if self.window_requests == 0
            || self.window_requests > crate::engine::shard::MAX_WINDOW_REQUESTS
        {
            bad("window_requests", "must be in 1..=1000000");
        }
        if self.queuing_threshold.is_zero() {
            bad("queuing_threshold", "must be greater than zero");
        }
        if self.queuing_exit_threshold > self.queuing_threshold {
            bad("queuing_exit_threshold", "must not exceed queuing_threshold");
        }
        if !(self.alpha > 0.0 && self.alpha < 1.0) {
            bad("alpha", "must be in (0, 1)");
        }
        if !(self.beta > 0.0 && self.beta < 1.0) {
            bad("beta", "must be in (0, 1)");
        }
        if self.early_close_after >= self.window && !self.early_close_after.is_zero() {
            bad("early_close_after", "must be shorter than window (or 0 for off)");
        }
        if !(self.trim >= 0.0 && self.trim < 0.5) {
            bad("trim", "must be in [0, 0.5)");
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs)
        }
    }
}
