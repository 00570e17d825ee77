use super::*;

#[test]
fn reads_the_status_document() {
    let body = br#"{"level":"2.64","level_compound":320,"overloaded":true,"mode":"enforce",
        "mean_queuing_ms":31.5,"window":{"duration_ms":1000.0,"arrivals":10,"admitted":5,
        "dispatched":5,"mean_queuing_ms":31.5},"queue_depth":7}"#;
    let s = StatusSample::parse(1.5, body).unwrap();
    assert_eq!(s.level, Some(320));
    assert_eq!(s.level_text.as_deref(), Some("2.64"));
    assert_eq!(s.overloaded, Some(true));
    assert_eq!(s.mean_queuing_ms, Some(31.5));
    assert_eq!(s.queue_depth, Some(7));
}

#[test]
fn reads_nested_engine_status_and_level_forms() {
    let body = br#"{"engine":{"level":{"business":1,"user":3},"overloaded":false,
        "last_window":{"mean_queuing_ns":2000000}}}"#;
    let s = StatusSample::parse(0.0, body).unwrap();
    assert_eq!(s.level, Some(131));
    assert_eq!(s.mean_queuing_ms, Some(2.0));
    assert_eq!(compound_level(&serde_json::json!("255.127")), Some(32767));
    assert!(StatusSample::parse(0.0, b"not json").is_none());
}
