//! The `weir` command line: a bad flag or configuration exits 64 with one line naming it.

use crate::support;

use std::process::Command;

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(support::weir_binary()).args(args).output().expect("weir runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn assert_usage_error(args: &[&str], names: &str) {
    let (code, stderr) = run(args);
    assert_eq!(code, 64, "{args:?}: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains(names), "{args:?}: {stderr:?} should name {names}");
}

#[test]
fn bad_flags_and_configs_exit_64_naming_the_field() {
    assert_usage_error(&["run", "--bogus"], "--bogus");
    assert_usage_error(&["run", "--inbound", "nowhere"], "--inbound");
    assert_usage_error(&["run", "--max-inflight", "0"], "inbound.max_inflight");
    assert_usage_error(&["run", "--config", "/nonexistent/weir.yaml"], "--config");

    let dir = tempfile::tempdir().unwrap();
    for (yaml, field) in [
        ("inbound:\n  max_queued: lots\n", "inbound.max_queued"),
        ("inbound:\n  listen: 127.0.0.1:1\n  lisen: x\n", "lisen"),
        ("admission:\n  mode: maybe\n", "admission.mode"),
        ("inbound:\n  default_priority: '300.1'\n", "inbound.default_priority"),
        ("admin:\n  max_body_bytes: 0\n", "admin.max_body_bytes"),
        ("egress:\n  timeouts:\n    resolve: 0s\n", "egress.timeouts.resolve"),
    ] {
        let path = dir.path().join("weir.yaml");
        std::fs::write(&path, yaml).unwrap();
        assert_usage_error(&["run", "--config", path.to_str().unwrap()], field);
    }
}

#[test]
fn help_and_version_exit_0() {
    assert_eq!(run(&["--help"]).0, 0);
    assert_eq!(run(&["run", "--help"]).0, 0);
    assert_eq!(run(&["--version"]).0, 0);
}
