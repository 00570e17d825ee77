//! `weir config check` and `weir table validate --offline` give the verdict `weir run` gives:
//! the same exit code and the same one line, for valid and invalid files alike (they call
//! the same parsing and validation; this keeps it so as that code changes).

use crate::support;

use std::path::Path;
use std::time::Duration;

use support::run_weir as weir;

fn run(config: &Path) -> (Option<i32>, String) {
    let config = config.to_str().unwrap();
    let args = ["run", "--config", config, "--inbound", "127.0.0.1:0", "--admin", "127.0.0.1:0"];
    weir(&args, Duration::from_secs(3))
}

fn check(config: &Path, files: bool) -> (Option<i32>, String) {
    let mut args = vec!["config", "check", config.to_str().unwrap()];
    if files {
        args.push("--files");
    }
    weir(&args, Duration::from_secs(20))
}

#[test]
fn config_check_agrees_with_weir_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    std::fs::write(dir.path().join("token"), "t0ken-for-tests\n").unwrap();
    let bad = [
        "inbound:\n  max_inflight: 0\n",
        "inbound:\n  max_inflihgt: 3\n",
        "inbound:\n  task_timeout: soon\n",
        "inbound:\n  headers:\n    level: 'content-length'\n",
        "admission:\n  window_requests: 0\n",
        "admission:\n  law: pid\n",
        "admin:\n  listen: localhost:15100\n",
        "log:\n  filter: '[='\n",
        "- not\n- a mapping\n",
    ];
    for yaml in bad {
        let path = dir.path().join("bad.yaml");
        std::fs::write(&path, yaml).unwrap();
        let (run_code, run_err) = run(&path);
        let (check_code, check_err) = check(&path, false);
        assert_eq!(run_code, Some(64), "weir run on\n{yaml}: {run_err}");
        assert_eq!(check_code, Some(64), "weir config check on\n{yaml}: {check_err}");
        assert_eq!(check_err, run_err, "same one line for\n{yaml}");
        assert_eq!(check_err.lines().count(), 1, "{check_err}");
    }

    // Files the settings name: checked only with --files (they exist in the pod, not here).
    let missing = format!("admin:\n  token_file: {d}/missing-token\n");
    let path = dir.path().join("files.yaml");
    std::fs::write(&path, &missing).unwrap();
    let (run_code, run_err) = run(&path);
    assert_eq!(run_code, Some(64), "{run_err}");
    assert_eq!(check(&path, false).0, Some(0), "without --files the file is not read");
    let (code, err) = check(&path, true);
    assert_eq!((code, err), (Some(64), run_err), "--files says what weir run says");

    // A valid file: check passes, and weir run starts with it (killed after 3 s).
    let good = format!("admin:\n  token_file: {d}/token\n");
    std::fs::write(&path, good).unwrap();
    assert_eq!(check(&path, true).0, Some(0));
    let (code, err) = run(&path);
    assert_eq!(code, None, "weir run should be serving: {err}");
}

#[test]
fn table_validate_offline_agrees_with_weir_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, format!("admin:\n  table_file: {d}/table.yaml\n")).unwrap();
    let table = dir.path().join("table.yaml");
    for bad in [
        "version: 1\ndefault_business: 300\n",
        "rules: [{ name: x }]\n",
        "rules:\n  - name: a\n    match: { path: /a }\n    business: 1\n    extra: 2\n",
    ] {
        std::fs::write(&table, bad).unwrap();
        let (code, err) = weir(
            &["table", "validate", "--offline", table.to_str().unwrap()],
            Duration::from_secs(20),
        );
        assert_eq!(code, Some(64), "{bad}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        let (run_code, run_err) = run(&config);
        assert_eq!(run_code, Some(64), "weir run refuses the table too: {run_err}");
    }
    std::fs::write(&table, "version: 3\ndefault_business: 200\nrules:\n  - name: a\n    match: { path: /a }\n    business: 1\n")
        .unwrap();
    let (code, err) =
        weir(&["table", "validate", "--offline", table.to_str().unwrap()], Duration::from_secs(20));
    assert_eq!(code, Some(0), "{err}");
}
