use super::*;

#[test]
fn embedded_default_parses_with_documented_defaults() {
    let c = SidecarConfig::load(None).expect("embedded default is valid");
    assert_eq!(c.inbound.listen, "127.0.0.1:15101".parse().unwrap());
    assert_eq!(c.inbound.app, "127.0.0.1:8080".parse().unwrap());
    assert_eq!(c.admin.listen, "127.0.0.1:15100".parse().unwrap());
    assert_eq!(c.inbound.task_timeout, Duration::from_millis(500));
    assert!(!c.inbound.entry);
    assert_eq!(c.inbound.headers.business, "x-business-priority");
}

#[test]
fn empty_document_means_defaults() {
    let c = SidecarConfig::from_yaml("{}").unwrap();
    assert_eq!(c.inbound.max_inflight, 256);
    assert!(c.inbound.adaptive_inflight);
    assert_eq!(c.inbound.max_queued, 1024);
}

#[test]
fn unknown_field_is_named() {
    let e = SidecarConfig::from_yaml("inbound:\n  max_inflihgt: 3\n").unwrap_err();
    assert_eq!(e.path, "inbound.max_inflihgt");
    assert!(e.message.contains("max_inflihgt"), "{e}");
}

#[test]
fn bad_value_is_named() {
    let e = SidecarConfig::from_yaml("inbound:\n  listen: nowhere\n").unwrap_err();
    assert_eq!(e.path, "inbound.listen", "{e}");
    let e = SidecarConfig::from_yaml("inbound:\n  task_timeout: soon\n").unwrap_err();
    assert_eq!(e.path, "inbound.task_timeout", "{e}");
}

#[test]
fn semantic_errors_are_named() {
    let e = SidecarConfig::from_yaml("inbound:\n  max_inflight: 0\n").unwrap_err();
    assert_eq!(e.path, "inbound.max_inflight");
    let e = SidecarConfig::from_yaml("inbound:\n  default_priority: 3\n").unwrap_err();
    assert_eq!(e.path, "inbound.default_priority");
    let e = SidecarConfig::from_yaml("inbound:\n  headers: { business: 'X Bad' }\n").unwrap_err();
    assert_eq!(e.path, "inbound.headers.business");
    let e = SidecarConfig::from_yaml("admission:\n  alpha: 2.0\n").unwrap_err();
    assert_eq!(e.path, "admission.alpha");
}

#[test]
fn flags_override_the_file() {
    let mut c = SidecarConfig::from_yaml(
        "inbound:\n  max_inflight: 5\nadmin:\n  allow_empty_user_secret: true\n",
    )
    .unwrap();
    let o = Overrides {
        inbound: Some("127.0.0.1:1".parse().unwrap()),
        max_inflight: Some(9),
        entry: true,
        ..Overrides::default()
    };
    c.apply(&o).unwrap();
    assert_eq!(c.inbound.listen.port(), 1);
    assert_eq!(c.inbound.max_inflight, 9);
    assert!(c.inbound.entry);
    let bad = Overrides { max_inflight: Some(0), ..Overrides::default() };
    assert_eq!(c.apply(&bad).unwrap_err().path, "inbound.max_inflight");
}

#[test]
fn default_priority_parses() {
    let c = SidecarConfig::from_yaml("inbound:\n  default_priority: '7.9'\n").unwrap();
    assert_eq!(c.inbound.default_priority(), Some(Priority { business: 7, user: 9 }));
}

#[test]
fn shipped_examples_parse() {
    for (name, text) in [
        ("inner-hop", include_str!("../../examples/inner-hop.yaml")),
        ("entry", include_str!("../../examples/entry.yaml")),
        ("shadow", include_str!("../../examples/shadow.yaml")),
        ("grpc", include_str!("../../examples/grpc.yaml")),
        ("json-logs", include_str!("../../examples/json-logs.yaml")),
    ] {
        if let Err(e) = SidecarConfig::from_yaml(text) {
            panic!("examples/{name}.yaml: {e}");
        }
    }
}

#[test]
fn connection_settings_have_documented_defaults_and_are_validated() {
    let c = SidecarConfig::load(None).unwrap();
    assert_eq!(c.inbound.max_connections, 10_000);
    assert_eq!(c.inbound.max_queued_per_connection, 64);
    assert_eq!(c.inbound.h2.max_concurrent_streams, 256);
    assert_eq!(c.inbound.timeouts.header_read, Duration::from_secs(10));
    assert_eq!(c.inbound.timeouts.app_connect, Duration::from_secs(1));
    for (yaml, field) in [
        ("inbound:\n  timeouts: { header_read: 0s }\n", "inbound.timeouts.header_read"),
        ("inbound:\n  timeouts: { idle: 0s }\n", "inbound.timeouts.idle"),
        ("inbound:\n  timeouts: { body_read: 0s }\n", "inbound.timeouts.body_read"),
        ("inbound:\n  timeouts: { write: 0s }\n", "inbound.timeouts.write"),
        ("inbound:\n  timeouts: { app_connect: 0ms }\n", "inbound.timeouts.app_connect"),
        ("inbound:\n  max_connections: 0\n", "inbound.max_connections"),
        ("inbound:\n  max_queued_per_connection: 0\n", "inbound.max_queued_per_connection"),
        ("inbound:\n  h2: { max_concurrent_streams: 0 }\n", "inbound.h2.max_concurrent_streams"),
    ] {
        assert_eq!(SidecarConfig::from_yaml(yaml).unwrap_err().path, field, "{yaml}");
    }
}

#[test]
fn hardening_settings_have_documented_defaults_and_are_validated() {
    let c = SidecarConfig::load(None).unwrap();
    assert_eq!(c.inbound.timeouts.app_idle, Duration::from_secs(1));
    assert_eq!(c.inbound.timeouts.graceful_close, Duration::from_secs(5));
    assert_eq!(c.inbound.max_budget, None);
    // Unset: the task timeout at the entry, an hour on an inner hop.
    assert_eq!(c.inbound.max_budget(), INNER_HOP_MAX_BUDGET);
    let entry = SidecarConfig::from_yaml(
        "inbound:\n  entry: true\n  task_timeout: 700ms\nadmin:\n  allow_empty_user_secret: true\n",
    )
    .unwrap();
    assert_eq!(entry.inbound.max_budget(), Duration::from_millis(700));
    let set = SidecarConfig::from_yaml("inbound:\n  max_budget: 2s\n").unwrap();
    assert_eq!(set.inbound.max_budget(), Duration::from_secs(2));
    for (yaml, field) in [
        ("inbound:\n  max_budget: 0s\n", "inbound.max_budget"),
        ("inbound:\n  max_budget: 2h\n", "inbound.max_budget"),
        ("inbound:\n  max_budget: soon\n", "inbound.max_budget"),
        ("inbound:\n  timeouts: { app_idle: 0s }\n", "inbound.timeouts.app_idle"),
        ("egress:\n  timeouts: { downstream_idle: 0s }\n", "egress.timeouts.downstream_idle"),
        ("inbound:\n  timeouts: { graceful_close: 0s }\n", "inbound.timeouts.graceful_close"),
        ("inbound:\n  timeouts: { graceful_close: 2h }\n", "inbound.timeouts.graceful_close"),
    ] {
        assert_eq!(SidecarConfig::from_yaml(yaml).unwrap_err().path, field, "{yaml}");
    }
}
