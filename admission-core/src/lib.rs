//! The DAGOR admission engine (Zhou et al., SoCC 2018), without I/O or an async runtime.
//!
//! - [`priority`]: compound priorities `(business, user)`, admission levels, header codecs.
//! - [`user_hash`]: the keyed, periodically re-keyed user-priority hash.
//! - [`engine`]: the hot path (`admit`, `record_queuing`) and window rollover.
//! - [`controller`]: the overload detector and the control laws.
//! - [`gate`]: the deadline gate (door, wait, dequeue).
//! - [`queue_policy`]: the pending queue's door, waiter timer and completion rate, shared
//!   by the proxy and the simulator.
//! - [`adaptive_limit`]: the in-flight limit found from the app's own response times.
//! - [`audit`]: per-class outcome counters and the priority-inflation findings.
//! - [`size_grade`]: content-length grade with fine sub-steps for requests with no action.
//! - [`table`]: the priority table (rules -> business priority).
//! - [`downstream`]: the egress role's per-downstream level cache.
//! - [`route`]: per-route dependencies and levels across a call graph (issue 19).
//! - [`clock`]: injectable clocks.
//! - [`schema`]: JSON Schema pieces for the config file's string-typed values.

pub mod adaptive_limit;
pub mod audit;
pub mod clock;
pub mod config;
pub mod controller;
pub mod downstream;
pub mod engine;
pub mod gate;
pub mod priority;
pub mod queue_policy;
pub mod route;
pub mod schema;
pub mod size_grade;
pub mod table;
pub mod user_hash;

pub use adaptive_limit::{AdaptiveLimit, AdaptiveLimitConfig, LimitStatus};
pub use clock::{Clock, ManualClock, MonotonicClock, Nanos};
pub use config::{EngineConfig, Law, Mode};
pub use controller::{Controller, OverloadDetector, WindowSummary, Zone};
pub use engine::{AdmissionEngine, Decision, EngineStatus};
pub use gate::{deadline_gate, expected_wait, give_up_at, DeadlineCheck, Stage, Verdict};
pub use priority::{AdmissionLevel, HeaderValueError, Priority};
pub use table::FieldError;
pub use user_hash::UserPriorityHasher;
