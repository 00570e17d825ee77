use super::*;

fn doc() -> StatusDoc {
    serde_json::from_str(
        r#"{"level":"2.64","level_compound":320,"overloaded":true,"mode":"enforce",
        "mean_queuing_ms":31.5,"window":{"duration_ms":1000.0,"arrivals":10,"admitted":5,
        "dispatched":5,"mean_queuing_ms":31.5},"windows_closed":3,"capacity_per_sec":400.0,
        "inflight":4,"max_inflight":64,"queue_depth":7,"max_queued":1024,"draining":false,
        "table_version":1}"#,
    )
    .unwrap()
}

#[test]
fn reads_the_status_document() {
    let body = serde_json::to_vec(&doc()).unwrap();
    let s = StatusSample::parse(1.5, &body).unwrap();
    assert_eq!(s.level(), 320);
    assert_eq!(s.doc.level, "2.64");
    assert!(s.doc.overloaded);
    assert_eq!(s.doc.mean_queuing_ms, Some(31.5));
    assert_eq!(s.doc.queue_depth, 7);
    assert_eq!(s.inflight_limit(), 64);
}

#[test]
fn refuses_what_is_not_a_status_document() {
    assert!(StatusSample::parse(0.0, b"not json").is_none());
    assert!(StatusSample::parse(0.0, br#"{"engine":{"level":"1.3"}}"#).is_none());
}
