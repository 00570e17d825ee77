//! The inflation findings (docs/design.md, "Control API"), computed from one window of
//! audit counts.

use serde::{Deserialize, Serialize};

use super::AuditSnapshot;
use crate::priority::AdmissionLevel;

/// Below this many requests in a window the top-class share is noise, not a finding.
pub const MIN_SEEN_FOR_SHARE: u64 = 20;

/// Thresholds of the inflation audit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct InflationPolicy {
    /// Flag when the most important class carries more than this share of traffic.
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 1))]
    pub top_class_share_max: f64,
}

impl Default for InflationPolicy {
    fn default() -> Self {
        InflationPolicy { top_class_share_max: 0.5 }
    }
}

impl InflationPolicy {
    pub fn validate(&self) -> Result<(), String> {
        if self.top_class_share_max > 0.0 && self.top_class_share_max <= 1.0 {
            Ok(())
        } else {
            Err(format!("top_class_share_max: must be in (0, 1], got {}", self.top_class_share_max))
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Finding {
    /// The most important class carries more than the allowed share of the window.
    TopClassShare { business: u8, share: f64 },
    /// Overloaded while the level already sits inside (or above) the most important class
    /// that arrives: shedding has nothing left to cut.
    NothingLeftToCut { level: AdmissionLevel },
    /// Classes arrived that no table rule produces (self-promoted or stale callers).
    UnknownClasses { classes: Vec<u8> },
}

impl Finding {
    /// The `finding` label of `weir_priority_inflation`.
    pub fn name(&self) -> &'static str {
        match self {
            Finding::TopClassShare { .. } => "top_class_share",
            Finding::NothingLeftToCut { .. } => "nothing_left_to_cut",
            Finding::UnknownClasses { .. } => "unknown_classes",
        }
    }
}

/// Findings for one window of traffic (a [`AuditSnapshot::delta`]). `produced(b)` says
/// whether the priority table can stamp business class `b`.
pub fn inflation_findings(
    window: &AuditSnapshot,
    produced: impl Fn(u8) -> bool,
    level: AdmissionLevel,
    overloaded: bool,
    policy: &InflationPolicy,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    let Some(top) = window.top_class() else { return findings };
    let total = window.total_seen();
    let share = window.classes[top as usize].seen as f64 / total as f64;
    if total >= MIN_SEEN_FOR_SHARE && share > policy.top_class_share_max {
        findings.push(Finding::TopClassShare { business: top, share });
    }
    if overloaded && level.priority().business <= top {
        findings.push(Finding::NothingLeftToCut { level });
    }
    let unknown: Vec<u8> =
        window.active_classes().map(|(b, _)| b).filter(|&b| !produced(b)).collect();
    if !unknown.is_empty() {
        findings.push(Finding::UnknownClasses { classes: unknown });
    }
    findings
}
