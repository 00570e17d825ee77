//! A bad setting makes the real `weir run` exit 64 with exactly one line on stderr, and
//! that line names the field at fault. One case per setting the hardening review found
//! accepted, misnamed or panicking.

use crate::support;

use std::path::Path;
use std::time::Duration;

/// Runs `weir run --config <yaml>` on ephemeral ports; returns (exit code, stderr).
fn weir_run(dir: &Path, yaml: &str, extra: &[&str]) -> (Option<i32>, String) {
    weir_run_for(dir, yaml, extra, Duration::from_secs(20))
}

/// As [`weir_run`]; a process still running after `wait` is killed (`None`).
fn weir_run_for(dir: &Path, yaml: &str, extra: &[&str], wait: Duration) -> (Option<i32>, String) {
    let config = dir.join("config.yaml");
    std::fs::write(&config, yaml).unwrap();
    let config = config.to_str().unwrap();
    let mut args = vec!["run", "--config", config];
    args.extend(["--inbound", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--app", "127.0.0.1:9"]);
    args.extend_from_slice(extra);
    // A configuration error exits at once; a sidecar that starts would serve forever.
    support::run_weir(&args, wait)
}

#[track_caller]
fn assert_refused(dir: &Path, yaml: &str, field: &str) {
    let (code, stderr) = weir_run(dir, yaml, &[]);
    assert_eq!(code, Some(64), "exit 64 for\n{yaml}\nstderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line for\n{yaml}\nstderr: {stderr}");
    let expected = format!("weir: {field}: ");
    assert!(lines[0].starts_with(&expected), "`{}` names {field} for\n{yaml}", lines[0]);
}

#[test]
fn framing_and_hop_by_hop_header_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (field, name) in [
        ("level", "content-length"),
        ("business", "host"),
        ("user", "transfer-encoding"),
        ("shed", "connection"),
        ("timeout", "keep-alive"),
        ("level", "te"),
        ("level", "trailer"),
        ("level", "upgrade"),
        ("business", "proxy-authorization"),
        ("user", ":authority"),
    ] {
        let yaml = format!("inbound:\n  headers:\n    {field}: '{name}'\n");
        assert_refused(dir.path(), &yaml, &format!("inbound.headers.{field}"));
    }
}

#[test]
fn numbers_out_of_range_exit_64_not_panic() {
    let dir = tempfile::tempdir().unwrap();
    for (yaml, field) in [
        ("inbound:\n  threads: 100000\n", "inbound.threads"),
        ("inbound:\n  max_inflight: 0\n", "inbound.max_inflight"),
        ("inbound:\n  max_queued: 1000000000\n", "inbound.max_queued"),
        ("inbound:\n  task_timeout: 1000h\n", "inbound.task_timeout"),
        ("inbound:\n  h2:\n    max_concurrent_streams: 0\n", "inbound.h2.max_concurrent_streams"),
        ("admission:\n  window_requests: 0\n", "admission.window_requests"),
        ("admin:\n  max_body_bytes: 1000000000\n", "admin.max_body_bytes"),
        ("inbound:\n  max_inflihgt: 3\n", "inbound.max_inflihgt"),
        ("inbound:\n  threads: -1\n", "inbound.threads"),
    ] {
        assert_refused(dir.path(), yaml, field);
    }
}

#[test]
fn files_are_named_by_their_setting() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    // A state path whose directory does not exist (a file sits where the directory should).
    std::fs::write(dir.path().join("file"), "x").unwrap();
    assert_refused(
        dir.path(),
        &format!("admin:\n  state_path: {d}/file/state.yaml\n"),
        "admin.state_path",
    );
    assert_refused(
        dir.path(),
        &format!("admin:\n  token_file: {d}/missing-token\n"),
        "admin.token_file",
    );
    std::fs::write(dir.path().join("empty-token"), "\n").unwrap();
    assert_refused(
        dir.path(),
        &format!("admin:\n  token_file: {d}/empty-token\n"),
        "admin.token_file",
    );
    assert_refused(
        dir.path(),
        &format!("inbound:\n  entry: true\nadmin:\n  user_secret_file: {d}/missing-secret\n"),
        "admin.user_secret_file",
    );
    assert_refused(
        dir.path(),
        &format!("admin:\n  table_file: {d}/missing-table\n"),
        "admin.table_file",
    );
    std::fs::write(dir.path().join("bad-table.yaml"), "rules: [{ name: x }]\n").unwrap();
    assert_refused(
        dir.path(),
        &format!("admin:\n  table_file: {d}/bad-table.yaml\n"),
        "admin.table_file",
    );
}

#[test]
fn the_entry_role_needs_a_user_secret_unless_a_demo_allows_it() {
    let dir = tempfile::tempdir().unwrap();
    assert_refused(dir.path(), "inbound:\n  entry: true\n", "admin.user_secret_file");
    let (code, stderr) = weir_run(dir.path(), "log:\n  filter: error\n", &["--entry"]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.starts_with("weir: admin.user_secret_file: "), "{stderr}");
    // Allowed for a demo: it starts (and serves until killed).
    let (code, stderr) = weir_run_for(
        dir.path(),
        "inbound:\n  entry: true\nadmin:\n  allow_empty_user_secret: true\n",
        &[],
        Duration::from_secs(3),
    );
    assert_eq!(code, None, "still serving: {stderr}");
}
