//! The injector's Prometheus counters. A fixed set of outcomes, so plain atomics rendered
//! in the text exposition format (as the control API does) rather than a global recorder:
//! several servers can run in one test process without sharing counts.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::patch::Outcome;

#[derive(Debug, Default)]
pub struct Metrics {
    reviews: [AtomicU64; Outcome::ALL.len()],
    tls_reloads: AtomicU64,
    tls_reload_errors: AtomicU64,
    connections_refused: [AtomicU64; 2],
}

/// Why a connection was closed on accept (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// `--max-connections` open already.
    MaxConnections,
    /// `--max-connections-per-peer` open from that address already.
    PerPeer,
}

impl Refused {
    pub const ALL: [Refused; 2] = [Refused::MaxConnections, Refused::PerPeer];

    pub fn label(self) -> &'static str {
        match self {
            Refused::MaxConnections => "max_connections",
            Refused::PerPeer => "max_connections_per_peer",
        }
    }
}

impl Metrics {
    pub fn review(&self, outcome: Outcome) {
        self.reviews[index(outcome)].fetch_add(1, Ordering::Relaxed);
    }

    pub fn reviews(&self, outcome: Outcome) -> u64 {
        self.reviews[index(outcome)].load(Ordering::Relaxed)
    }

    pub fn tls_reloaded(&self, ok: bool) {
        let c = if ok { &self.tls_reloads } else { &self.tls_reload_errors };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn tls_reloads(&self) -> (u64, u64) {
        (self.tls_reloads.load(Ordering::Relaxed), self.tls_reload_errors.load(Ordering::Relaxed))
    }

    pub fn connection_refused(&self, why: Refused) {
        self.connections_refused[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn connections_refused(&self, why: Refused) -> u64 {
        self.connections_refused[why as usize].load(Ordering::Relaxed)
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP weir_inject_reviews_total AdmissionReviews answered, by outcome.\n");
        out.push_str("# TYPE weir_inject_reviews_total counter\n");
        for o in Outcome::ALL {
            let _ = writeln!(
                out,
                "weir_inject_reviews_total{{outcome=\"{}\"}} {}",
                o.label(),
                self.reviews(o)
            );
        }
        let (ok, failed) = self.tls_reloads();
        out.push_str(
            "# HELP weir_inject_tls_reloads_total Certificate reloads from the mounted files.\n",
        );
        out.push_str("# TYPE weir_inject_tls_reloads_total counter\n");
        let _ = writeln!(out, "weir_inject_tls_reloads_total{{result=\"ok\"}} {ok}");
        let _ = writeln!(out, "weir_inject_tls_reloads_total{{result=\"error\"}} {failed}");
        out.push_str(
            "# HELP weir_inject_connections_refused_total Connections closed on accept: at max connections, or at the per-peer limit.\n",
        );
        out.push_str("# TYPE weir_inject_connections_refused_total counter\n");
        for why in Refused::ALL {
            let _ = writeln!(
                out,
                "weir_inject_connections_refused_total{{reason=\"{}\"}} {}",
                why.label(),
                self.connections_refused(why)
            );
        }
        out
    }
}

fn index(outcome: Outcome) -> usize {
    Outcome::ALL.iter().position(|o| *o == outcome).unwrap_or(0)
}
