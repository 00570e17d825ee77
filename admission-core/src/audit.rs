//! Audit of the priority distribution and the inflation findings (docs/design.md,
//! "Control API").
//!
//! Priority inflation is DAGOR's silent failure: when most traffic claims the top class,
//! the admission level has nothing to cut and shedding "does nothing". The request path
//! counts every outcome per business class in [`AuditCounters`] (one relaxed atomic add,
//! no allocation); the control plane snapshots them on its own schedule, takes deltas
//! between snapshots and asks [`inflation_findings`] what looks wrong.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::{Deserialize, Serialize};

mod findings;

pub use findings::{inflation_findings, Finding, InflationPolicy, MIN_SEEN_FOR_SHARE};

/// Number of business classes.
const CLASSES: usize = 256;

/// What became of one request. Record exactly one outcome per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Sent to the app.
    Admitted,
    /// Refused because the admission level does not admit it.
    ShedOverload,
    /// Dropped by the residence-time gate (deadline passed or waited too long).
    ShedDeadline,
    /// Refused locally because the downstream's cached level would shed it (egress).
    ShedDownstream,
    /// Shadow mode: below the level, forwarded anyway.
    WouldShed,
}

// === impl Outcome ===

impl Outcome {
    pub const ALL: [Outcome; 5] = [
        Outcome::Admitted,
        Outcome::ShedOverload,
        Outcome::ShedDeadline,
        Outcome::ShedDownstream,
        Outcome::WouldShed,
    ];

    /// The `outcome` label of `weir_requests_total`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Admitted => "admitted",
            Outcome::ShedOverload => "shed_overload",
            Outcome::ShedDeadline => "shed_deadline",
            Outcome::ShedDownstream => "shed_downstream",
            Outcome::WouldShed => "would_shed",
        }
    }

    #[inline]
    const fn index(self) -> usize {
        self as usize
    }
}

// === impl AuditCounters ===

/// Per business class, per outcome request counts. Lock-free; `record` never allocates.
pub struct AuditCounters {
    /// `counts[business * 5 + outcome]`.
    counts: Box<[AtomicU64]>,
}

impl AuditCounters {
    pub fn new() -> Self {
        let counts = (0..CLASSES * Outcome::ALL.len()).map(|_| AtomicU64::new(0)).collect();
        AuditCounters { counts }
    }

    #[inline]
    pub fn record(&self, business: u8, outcome: Outcome) {
        self.counts[business as usize * Outcome::ALL.len() + outcome.index()].fetch_add(1, Relaxed);
    }

    /// Cumulative counts since start. Not atomic across classes (each counter is read
    /// once), which is fine for monitoring.
    pub fn snapshot(&self) -> AuditSnapshot {
        let mut snap = AuditSnapshot::default();
        for (class, chunk) in snap.classes.iter_mut().zip(self.counts.chunks(Outcome::ALL.len())) {
            let get = |o: Outcome| chunk[o.index()].load(Relaxed);
            class.admitted = get(Outcome::Admitted);
            class.shed_overload = get(Outcome::ShedOverload);
            class.shed_deadline = get(Outcome::ShedDeadline);
            class.shed_downstream = get(Outcome::ShedDownstream);
            class.would_shed = get(Outcome::WouldShed);
            class.seen = class.admitted
                + class.shed_overload
                + class.shed_deadline
                + class.shed_downstream
                + class.would_shed;
        }
        snap
    }
}

impl Default for AuditCounters {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for AuditCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditCounters").field("total_seen", &self.snapshot().total_seen()).finish()
    }
}

// === impl ClassCounts ===

/// One business class's counts. `seen` is the sum of the outcomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassCounts {
    pub seen: u64,
    pub admitted: u64,
    pub shed_overload: u64,
    pub shed_deadline: u64,
    pub shed_downstream: u64,
    pub would_shed: u64,
}

impl ClassCounts {
    /// The count of one outcome.
    pub fn get(&self, outcome: Outcome) -> u64 {
        match outcome {
            Outcome::Admitted => self.admitted,
            Outcome::ShedOverload => self.shed_overload,
            Outcome::ShedDeadline => self.shed_deadline,
            Outcome::ShedDownstream => self.shed_downstream,
            Outcome::WouldShed => self.would_shed,
        }
    }

    fn saturating_sub(&self, earlier: &ClassCounts) -> ClassCounts {
        ClassCounts {
            seen: self.seen.saturating_sub(earlier.seen),
            admitted: self.admitted.saturating_sub(earlier.admitted),
            shed_overload: self.shed_overload.saturating_sub(earlier.shed_overload),
            shed_deadline: self.shed_deadline.saturating_sub(earlier.shed_deadline),
            shed_downstream: self.shed_downstream.saturating_sub(earlier.shed_downstream),
            would_shed: self.would_shed.saturating_sub(earlier.would_shed),
        }
    }
}

// === impl AuditSnapshot ===

/// Counts of all 256 business classes, indexed by business priority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditSnapshot {
    pub classes: Box<[ClassCounts; CLASSES]>,
}

impl Default for AuditSnapshot {
    fn default() -> Self {
        AuditSnapshot { classes: Box::new([ClassCounts::default(); CLASSES]) }
    }
}

impl AuditSnapshot {
    /// What happened between `earlier` and `self` (both cumulative). Saturates at zero.
    pub fn delta(&self, earlier: &AuditSnapshot) -> AuditSnapshot {
        let mut out = AuditSnapshot::default();
        for ((o, now), then) in
            out.classes.iter_mut().zip(self.classes.iter()).zip(earlier.classes.iter())
        {
            *o = now.saturating_sub(then);
        }
        out
    }

    pub fn total_seen(&self) -> u64 {
        self.classes.iter().map(|c| c.seen).sum()
    }

    /// The most important business class that carried any traffic.
    pub fn top_class(&self) -> Option<u8> {
        self.classes.iter().position(|c| c.seen > 0).map(|b| b as u8)
    }

    /// `(business, counts)` of every class that carried traffic, most important first.
    pub fn active_classes(&self) -> impl Iterator<Item = (u8, &ClassCounts)> + '_ {
        self.classes.iter().enumerate().filter(|(_, c)| c.seen > 0).map(|(b, c)| (b as u8, c))
    }
}

#[cfg(test)]
mod tests;
