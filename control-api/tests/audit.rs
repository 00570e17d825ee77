//! The inflation audit and the metrics rendered from it, fed through real AuditCounters.

mod common;

use admission_core::audit::Outcome;
use admission_core::{AdmissionLevel, Priority};
use common::start;
use http::StatusCode;

fn findings(doc: &serde_json::Value) -> Vec<String> {
    doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["finding"].as_str().unwrap().to_owned())
        .collect()
}

fn metric_line<'a>(metrics: &'a str, prefix: &str) -> Option<&'a str> {
    metrics.lines().find(|l| l.starts_with(prefix))
}

#[tokio::test]
async fn seventy_percent_in_the_top_class_is_a_finding_and_a_metric() {
    let s = start().await;
    // The embedded table produces 0, 1, 40 and 200.
    for _ in 0..700 {
        s.audit.record(0, Outcome::Admitted);
    }
    for _ in 0..250 {
        s.audit.record(200, Outcome::Admitted);
    }
    for _ in 0..50 {
        s.audit.record(200, Outcome::ShedOverload);
    }
    let r = s.get("/v1/audit").await;
    assert_eq!(r.status, StatusCode::OK);
    let doc = r.json();
    let minute = &doc["last_1m"];
    assert_eq!(minute["total_seen"], 1000);
    assert_eq!(minute["top_class"], 0);
    assert!((minute["top_class_share"].as_f64().unwrap() - 0.7).abs() < 1e-9);
    assert_eq!(findings(minute), ["top_class_share"]);
    assert_eq!(doc["last_10m"]["total_seen"], 1000);
    let low = &minute["classes"][1];
    assert_eq!(
        (low["business"].as_u64(), low["seen"].as_u64(), low["shed"].as_u64()),
        (Some(200), Some(300), Some(50))
    );

    let metrics = s.get("/metrics").await.body;
    assert_eq!(
        metric_line(&metrics, "weir_priority_inflation{finding=\"top_class_share\"}"),
        Some("weir_priority_inflation{finding=\"top_class_share\"} 1")
    );
    assert_eq!(
        metric_line(&metrics, "weir_priority_inflation{finding=\"unknown_classes\"}"),
        Some("weir_priority_inflation{finding=\"unknown_classes\"} 0")
    );
    assert_eq!(
        metric_line(
            &metrics,
            "weir_requests_total{role=\"inbound\",business=\"200\",outcome=\"shed_overload\"}"
        ),
        Some("weir_requests_total{role=\"inbound\",business=\"200\",outcome=\"shed_overload\"} 50")
    );
    assert!(
        metric_line(&metrics, "weir_requests_total{role=\"inbound\",business=\"1\"").is_none(),
        "zero series are omitted"
    );
    assert_eq!(metric_line(&metrics, "weir_admission_level "), Some("weir_admission_level 32767"));
    assert_eq!(
        metric_line(&metrics, "weir_priority_table_version "),
        Some("weir_priority_table_version 1")
    );
    assert_eq!(metric_line(&metrics, "weir_inflight "), Some("weir_inflight 3"));
    s.stop().await;
}

#[tokio::test]
async fn overload_with_the_level_inside_the_top_class_is_nothing_left_to_cut() {
    let s = start().await;
    for b in [1u8, 40, 200] {
        for _ in 0..100 {
            s.audit.record(b, Outcome::Admitted);
        }
    }
    // Overloaded, level already at 1.64: the most important class present is 1.
    s.view.set_level(AdmissionLevel::new(Priority::new(1, 64).unwrap()), true);
    let doc = s.get("/v1/audit").await.json();
    assert_eq!(findings(&doc["last_1m"]), ["nothing_left_to_cut"]);
    assert_eq!(doc["overloaded"], true);
    assert_eq!(doc["level"], "1.64");
    let metrics = s.get("/metrics").await.body;
    assert!(
        metrics.contains("weir_priority_inflation{finding=\"nothing_left_to_cut\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("weir_overloaded 1"));

    // Level still above the top class: there is something left to cut.
    s.view.set_level(AdmissionLevel::new(Priority::new(40, 0).unwrap()), true);
    assert!(findings(&s.get("/v1/audit").await.json()["last_1m"]).is_empty());
    s.stop().await;
}

#[tokio::test]
async fn classes_no_rule_produces_are_unknown() {
    let s = start().await;
    for b in [0u8, 1, 40, 200, 7, 250] {
        for _ in 0..10 {
            s.audit.record(b, Outcome::Admitted);
        }
    }
    let doc = s.get("/v1/audit").await.json();
    assert_eq!(findings(&doc["last_1m"]), ["unknown_classes"]);
    assert_eq!(doc["last_1m"]["unknown_classes"], serde_json::json!([7, 250]));
    let metrics = s.get("/metrics").await.body;
    assert!(
        metrics.contains("weir_priority_inflation{finding=\"unknown_classes\"} 1"),
        "{metrics}"
    );
    s.stop().await;
}

#[tokio::test]
async fn windows_are_deltas_between_samples() {
    let s = start().await;
    for _ in 0..30 {
        s.audit.record(200, Outcome::Admitted);
    }
    // A sample marks "now"; only later traffic counts in a window that starts after it.
    s.plane.sample_audit();
    let doc = s.plane.audit_report();
    assert_eq!(doc.last_1m.total_seen, 30, "window reaches back to the start");
    assert!(doc.last_1m.covered_seconds < 60.0);
    s.stop().await;
}
