//! The audit history: periodic snapshots of the request path's `AuditCounters`, kept
//! long enough to answer "what happened in the last 1 and 10 minutes".
//!
//! The request path only bumps atomics; all windowing happens here, off the hot path.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use admission_core::audit::{
    inflation_findings, AuditSnapshot, ClassCounts, Finding, InflationPolicy,
};
use admission_core::table::CompiledTable;
use admission_core::AdmissionLevel;
use serde::{Deserialize, Serialize};

/// The two windows of `GET /v1/audit`.
pub const WINDOWS: [(&str, Duration); 2] =
    [("last_1m", Duration::from_secs(60)), ("last_10m", Duration::from_secs(600))];

pub struct AuditHistory {
    samples: Mutex<VecDeque<(Instant, AuditSnapshot)>>,
    keep: Duration,
}

/// One window of `GET /v1/audit`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowReport {
    /// How much time the window actually covers (less than nominal after a start).
    pub covered_seconds: f64,
    pub total_seen: u64,
    /// Most important business class that carried traffic.
    pub top_class: Option<u8>,
    pub top_class_share: Option<f64>,
    pub classes: Vec<ClassReport>,
    /// Classes that arrived although no rule of the current table produces them.
    pub unknown_classes: Vec<u8>,
    pub findings: Vec<FindingReport>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassReport {
    pub business: u8,
    pub seen: u64,
    pub admitted: u64,
    /// All refusals: overload + deadline + downstream.
    pub shed: u64,
    pub shed_overload: u64,
    pub shed_deadline: u64,
    pub shed_downstream: u64,
    /// Shadow mode: would have been refused.
    pub would_shed: u64,
    pub share: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FindingReport {
    pub finding: String,
    pub message: String,
}

// === impl AuditHistory ===

impl AuditHistory {
    /// Starts from zero counts at `now`, so the first windows cover everything counted
    /// since the counters were created.
    pub fn new(sample_every: Duration, now: Instant) -> Self {
        let keep = WINDOWS[1].1 + sample_every;
        let mut samples = VecDeque::new();
        samples.push_back((now, AuditSnapshot::default()));
        AuditHistory { samples: Mutex::new(samples), keep }
    }

    pub fn record(&self, at: Instant, snapshot: AuditSnapshot) {
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        samples.push_back((at, snapshot));
        // Keep the newest sample older than the longest window as its baseline.
        while samples.len() > 2 && samples[1].0 + self.keep <= at {
            samples.pop_front();
        }
    }

    /// Counts between the newest sample at least `span` old (or the oldest) and `current`.
    pub fn window(
        &self,
        current: &AuditSnapshot,
        now: Instant,
        span: Duration,
    ) -> (AuditSnapshot, Duration) {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let base = samples
            .iter()
            .rev()
            .find(|(t, _)| now.saturating_duration_since(*t) >= span)
            .or_else(|| samples.front());
        match base {
            Some((t, snap)) => (current.delta(snap), now.saturating_duration_since(*t)),
            None => (current.clone(), Duration::ZERO),
        }
    }
}

// === impl WindowReport ===

impl WindowReport {
    pub fn new(
        window: &AuditSnapshot,
        covered: Duration,
        table: &CompiledTable,
        level: AdmissionLevel,
        overloaded: bool,
        policy: &InflationPolicy,
    ) -> Self {
        let total = window.total_seen();
        let share = |c: &ClassCounts| if total == 0 { 0.0 } else { c.seen as f64 / total as f64 };
        let top_class = window.top_class();
        let findings = inflation_findings(window, |b| table.produces(b), level, overloaded, policy);
        WindowReport {
            covered_seconds: covered.as_secs_f64(),
            total_seen: total,
            top_class,
            top_class_share: top_class.map(|b| share(&window.classes[b as usize])),
            classes: window
                .active_classes()
                .map(|(business, c)| ClassReport {
                    business,
                    seen: c.seen,
                    admitted: c.admitted,
                    shed: c.shed_overload + c.shed_deadline + c.shed_downstream,
                    shed_overload: c.shed_overload,
                    shed_deadline: c.shed_deadline,
                    shed_downstream: c.shed_downstream,
                    would_shed: c.would_shed,
                    share: share(c),
                })
                .collect(),
            unknown_classes: window
                .active_classes()
                .map(|(b, _)| b)
                .filter(|&b| !table.produces(b))
                .collect(),
            findings: findings.iter().map(FindingReport::new).collect(),
        }
    }

    pub fn has_finding(&self, name: &str) -> bool {
        self.findings.iter().any(|f| f.finding == name)
    }
}

// === impl FindingReport ===

impl FindingReport {
    fn new(f: &Finding) -> Self {
        let message = match f {
            Finding::TopClassShare { business, share } => format!(
                "business class {business} carries {:.1}% of traffic; when most traffic is \
                 top priority, shedding has little to choose from",
                share * 100.0
            ),
            Finding::NothingLeftToCut { level } => format!(
                "overloaded while the admission level ({}) already sits inside the most \
                 important class that arrives: there is nothing left to cut",
                level.encode().as_str()
            ),
            Finding::UnknownClasses { classes } => format!(
                "classes {classes:?} arrive but no table rule produces them (self-promoted \
                 callers or a stale table)"
            ),
        };
        FindingReport { finding: f.name().to_owned(), message }
    }
}

#[cfg(test)]
mod tests;
