//! `GET /metrics`: the recorder's output plus series rendered from state at scrape time.
//!
//! Per-class request counts live in `AuditCounters` (one atomic add on the request path),
//! one set per role; turning them into the one `weir_requests_total{role,business,outcome}`
//! family here keeps the metrics registry off that path.

use std::fmt::Write;

use admission_core::audit::{AuditSnapshot, Outcome};
use admission_core::table::PriorityTable;

use crate::audit::WindowReport;
use crate::status::SidecarStatus;

/// The inflation findings, always exported (0 or 1) so alerts see the series exist.
pub const FINDINGS: [&str; 3] = ["top_class_share", "nothing_left_to_cut", "unknown_classes"];

pub struct Scrape<'a> {
    pub recorder: String,
    pub status: &'a SidecarStatus,
    pub table_version: u64,
    /// [`table_digest`] of the table in use.
    pub table_digest: String,
    /// The inbound role's per-class counts.
    pub counters: &'a AuditSnapshot,
    /// The egress role's, when there is one.
    pub egress: Option<&'a AuditSnapshot>,
    pub last_minute: &'a WindowReport,
    pub table_file_rejections: u64,
    pub table_file_unreadable: u64,
}

/// Prometheus text exposition format.
pub fn render(s: &Scrape<'_>) -> String {
    let mut out = s.recorder.clone();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    let engine = &s.status.engine;
    let gauges: [(&str, &str, f64); 6] = [
        (
            "weir_admission_level",
            "Current admission level as business * 128 + user; 32767 admits everything.",
            f64::from(engine.level.compound()),
        ),
        (
            "weir_overloaded",
            "1 while the sidecar considers the app overloaded.",
            bool_f(engine.overloaded),
        ),
        ("weir_inflight", "Requests currently at the app.", s.status.inflight as f64),
        (
            "weir_inflight_limit",
            "The in-flight limit in force (adaptive by default; max_inflight is its ceiling).",
            s.status.max_inflight as f64,
        ),
        (
            "weir_queue_depth",
            "Requests waiting for an in-flight slot.",
            s.status.queue_depth as f64,
        ),
        (
            "weir_priority_table_version",
            "Version of the priority table in use.",
            s.table_version as f64,
        ),
    ];
    for (name, help, value) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
    }
    let _ = writeln!(
        out,
        "# HELP weir_table_info The priority table in use: its content digest (every field but \
         the version) and version. Equal digests across a fleet mean the same rules.\n\
         # TYPE weir_table_info gauge\n\
         weir_table_info{{digest=\"{}\",version=\"{}\"}} 1",
        s.table_digest, s.table_version
    );
    let _ = writeln!(
        out,
        "# HELP weir_priority_inflation 1 while an inflation finding holds over the last minute.\n\
         # TYPE weir_priority_inflation gauge"
    );
    for finding in FINDINGS {
        let v = bool_f(s.last_minute.has_finding(finding));
        let _ = writeln!(out, "weir_priority_inflation{{finding=\"{finding}\"}} {v}");
    }
    let _ = writeln!(
        out,
        "# HELP weir_priority_table_file_rejected_total Table-file contents ignored as invalid.\n\
         # TYPE weir_priority_table_file_rejected_total counter\n\
         weir_priority_table_file_rejected_total {}",
        s.table_file_rejections
    );
    let _ = writeln!(
        out,
        "# HELP weir_priority_table_file_unreadable_total Table-file polls that could not read it \
         as a document (missing, not a regular file, over 1 MiB, I/O error).\n\
         # TYPE weir_priority_table_file_unreadable_total counter\n\
         weir_priority_table_file_unreadable_total {}",
        s.table_file_unreadable
    );
    let _ = writeln!(
        out,
        "# HELP weir_requests_total Requests by role, business class and outcome.\n\
         # TYPE weir_requests_total counter"
    );
    let roles = [("inbound", Some(s.counters)), ("egress", s.egress)];
    for (role, counters) in roles {
        for (business, counts) in counters.into_iter().flat_map(AuditSnapshot::active_classes) {
            for outcome in Outcome::ALL {
                let n = counts.get(outcome);
                if n > 0 {
                    let _ = writeln!(
                        out,
                        "weir_requests_total{{role=\"{role}\",business=\"{business}\",outcome=\"{}\"}} {n}",
                        outcome.as_str()
                    );
                }
            }
        }
    }
    out
}

fn bool_f(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// `sha256:<hex>` of the table's content: its canonical JSON (struct fields in declaration
/// order, header maps sorted) with the version zeroed. The version is left out because the
/// control API bumps it on every accepted change, so two sidecars serving the same rules
/// can carry different versions; the version is its own label beside the digest.
pub fn table_digest(table: &PriorityTable) -> String {
    let canonical = PriorityTable { version: 0, ..table.clone() };
    // Serialising plain strings, numbers and maps cannot fail.
    let json = serde_json::to_vec(&canonical).unwrap_or_default();
    let digest = ring::digest::digest(&ring::digest::SHA256, &json);
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in digest.as_ref() {
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::table_digest;
    use crate::parse_table;

    #[test]
    fn the_digest_covers_the_rules_and_not_the_version() {
        let t = "version: 1\ndefault_business: 200\nrules:\n  - name: a\n    match: { path: /a, header: { x-b: '1', x-a: '2' } }\n    business: 5\n";
        let a = table_digest(&parse_table(t).unwrap());
        assert_eq!(a, table_digest(&parse_table(&t.replace("version: 1", "version: 40")).unwrap()));
        assert_ne!(
            a,
            table_digest(&parse_table(&t.replace("business: 5", "business: 6")).unwrap())
        );
        assert_ne!(a, table_digest(&parse_table(&t.replace("/a", "/b")).unwrap()));
        // Same header conditions written in another order: the same table, the same digest.
        let reordered = t.replace("x-b: '1', x-a: '2'", "x-a: '2', x-b: '1'");
        assert_eq!(a, table_digest(&parse_table(&reordered).unwrap()));
        assert!(a.starts_with("sha256:") && a.len() == 71, "{a}");
    }
}
