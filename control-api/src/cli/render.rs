//! Human-readable output of the CLI.

use std::fmt::Write;

use http::StatusCode;
use serde_json::Value;

use super::CliError;
use crate::status::StatusDoc;

pub(super) fn status(s: &StatusDoc) -> Result<String, CliError> {
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    let mut out = String::new();
    let mode = serde_json::to_value(s.mode).ok();
    let _ = writeln!(
        out,
        "level       {} (compound {})   overloaded: {}   mode: {}",
        s.level,
        s.level_compound,
        yes_no(s.overloaded),
        mode.as_ref().map_or("?", text)
    );
    match &s.window {
        Some(w) => {
            let _ = writeln!(
                out,
                "last window {:.0} ms: {} arrivals, {} admitted, {} dispatched, mean queuing {:.2} ms",
                w.duration_ms, w.arrivals, w.admitted, w.dispatched, w.mean_queuing_ms
            );
        }
        None => out.push_str("last window none closed yet\n"),
    }
    if let Some(c) = s.capacity_per_sec {
        let _ = writeln!(out, "capacity    {c:.0} req/s (estimated)");
    }
    let _ = writeln!(
        out,
        "in flight   {}/{}   queued {}/{}   draining: {}",
        s.inflight,
        s.max_inflight,
        s.queue_depth,
        s.max_queued,
        yes_no(s.draining)
    );
    let _ = writeln!(out, "table       version {}", s.table_version);
    Ok(out)
}

pub(super) fn audit(v: &Value) -> Result<String, CliError> {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "table version {}   level {}   overloaded: {}",
        v["table_version"],
        text(&v["level"]),
        yes_no(&v["overloaded"])
    );
    for (key, title) in [("last_1m", "last 1 min"), ("last_10m", "last 10 min")] {
        let w = &v[key];
        let _ = writeln!(
            out,
            "\n{title} (covers {:.0} s): {} requests",
            w["covered_seconds"].as_f64().unwrap_or(0.0),
            w["total_seen"]
        );
        let classes = w["classes"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        if classes.is_empty() {
            continue;
        }
        let _ = writeln!(
            out,
            "  {:>8} {:>10} {:>10} {:>10} {:>10} {:>7}",
            "business", "seen", "admitted", "shed", "would_shed", "share"
        );
        for c in classes {
            let _ = writeln!(
                out,
                "  {:>8} {:>10} {:>10} {:>10} {:>10} {:>6.1}%",
                num(&c["business"]),
                num(&c["seen"]),
                num(&c["admitted"]),
                num(&c["shed"]),
                num(&c["would_shed"]),
                c["share"].as_f64().unwrap_or(0.0) * 100.0
            );
        }
        let unknown = w["unknown_classes"].as_array().map(Vec::len).unwrap_or(0);
        if unknown > 0 {
            let _ = writeln!(out, "  unknown classes: {}", w["unknown_classes"]);
        }
        let findings = w["findings"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        if findings.is_empty() {
            out.push_str("  no inflation findings\n");
        }
        for f in findings {
            let _ = writeln!(out, "  ! {}: {}", text(&f["finding"]), text(&f["message"]));
        }
    }
    Ok(out)
}

/// `{"error": ..., "fields": [...]}` as lines.
pub(super) fn api_error(status: StatusCode, body: &str) -> String {
    let Ok(v) = serde_json::from_str::<Value>(body) else {
        return format!("admin API answered {status}: {}", body.trim());
    };
    let fields = v["fields"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    field_errors(
        &format!("{} ({})", text(&v["error"]), status.as_u16()),
        fields
            .iter()
            .map(|f| (f["path"].as_str().unwrap_or(""), f["message"].as_str().unwrap_or(""))),
    )
}

pub(super) fn field_errors<'a>(
    headline: &str,
    fields: impl Iterator<Item = (&'a str, &'a str)>,
) -> String {
    let mut out = headline.to_owned();
    for (path, message) in fields {
        let at = if path.is_empty() { "(document)" } else { path };
        let _ = write!(out, "\n  {at}: {message}");
    }
    out
}

fn yes_no(v: &Value) -> &'static str {
    if v.as_bool() == Some(true) {
        "yes"
    } else {
        "no"
    }
}

fn num(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("?")
}
