//! The configuration as a user meets it on day one: `weir config print-default` (the whole
//! reference, accepted as it is), `weir config schema`, `-` for standard input wherever a
//! command takes a file, and logs without colour escapes when nobody reads them at a
//! terminal.

use crate::support;

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::weir_binary;

/// Runs weir with `stdin` as standard input; (exit code, stdout, stderr).
fn weir_with_stdin(args: &[&str], stdin: &str) -> (i32, String, String) {
    let mut child = Command::new(weir_binary())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (out.status.code().unwrap_or(-1), text(out.stdout), text(out.stderr))
}

fn weir(args: &[&str]) -> (i32, String, String) {
    weir_with_stdin(args, "")
}

#[test]
fn print_default_is_a_config_weir_accepts_and_names_every_field() {
    let (code, default, err) = weir(&["config", "print-default"]);
    assert_eq!(code, 0, "{err}");
    for field in ["app_protocol:", "overload_max_wait:", "headers:", "threads:", "log:", "egress:"]
    {
        assert!(default.contains(field), "print-default lacks {field}");
    }
    // Piped straight into the checker: `-` is standard input.
    let (code, out, err) = weir_with_stdin(&["config", "check", "-"], &default);
    assert_eq!((code, out.trim()), (0, "<stdin>: ok"), "{err}");
}

#[test]
fn config_schema_lists_every_field_and_the_chart_variant_leaves_out_the_mounted_paths() {
    let (code, schema, err) = weir(&["config", "schema"]);
    assert_eq!(code, 0, "{err}");
    let schema: serde_json::Value = serde_json::from_str(&schema).unwrap();
    assert_eq!(schema["$schema"], "http://json-schema.org/draft-07/schema#");
    let inbound = &schema["properties"]["inbound"]["properties"];
    assert_eq!(inbound["app_protocol"]["enum"], serde_json::json!(["auto", "http1", "h2c"]));
    assert_eq!(inbound["task_timeout"]["type"], "string");
    assert!(schema["properties"]["admin"]["properties"]["token_file"].is_object());
    let (code, chart, _) = weir(&["config", "schema", "--chart"]);
    assert_eq!(code, 0);
    let chart: serde_json::Value = serde_json::from_str(&chart).unwrap();
    assert!(chart["properties"]["admin"]["properties"]["token_file"].is_null());
    assert_eq!(chart["properties"]["inbound"]["required"], serde_json::json!(["listen", "app"]));
}

#[test]
fn a_dash_reads_standard_input_wherever_a_file_is_taken() {
    // config check: a bad document from stdin is refused naming the field, like a file.
    let (code, _, err) =
        weir_with_stdin(&["config", "check", "-"], "inbound:\n  max_inflight: 0\n");
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("inbound.max_inflight"), "{err}");

    // table validate --offline.
    let table = "version: 3\ndefault_business: 100\nrules: []\n";
    let (code, out, err) = weir_with_stdin(&["table", "validate", "--offline", "-"], table);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "<stdin>: ok (version 3)");
    let (code, _, err) =
        weir_with_stdin(&["table", "validate", "--offline", "-"], "default_business: 300\n");
    assert_eq!(code, 64);
    assert!(err.contains("<stdin>") && err.contains("default_business"), "{err}");

    // weir run --config -: starts with the piped config (the check is the same path;
    // here only that a bad one from stdin exits 64 before serving).
    let (code, _, err) =
        weir_with_stdin(&["run", "--config", "-"], "inbound:\n  threads: 100000\n");
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("inbound.threads"), "{err}");

    // A file that is watched or re-read cannot be standard input: said at once.
    let (code, _, err) = weir(&["run", "--table", "-", "--inbound", "127.0.0.1:0"]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("admin.table_file") && err.contains("standard input"), "{err}");
}

/// Also: `weir run --config -` serves with the configuration piped in.
#[test]
fn logs_carry_no_colour_escapes_when_stderr_is_not_a_terminal() {
    let (_, default, _) = weir(&["config", "print-default"]);
    let mut child = Command::new(weir_binary())
        .args(["run", "--config", "-"])
        .args(["--inbound", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--app", "127.0.0.1:9"])
        .env_remove("NO_COLOR")
        .env("RUST_LOG", "info")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(default.as_bytes()).unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = String::new();
    while Instant::now() < deadline && !seen.contains("weir started") {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        seen.push_str(&line);
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(seen.contains("weir started"), "no start line in:\n{seen}");
    assert!(seen.contains("INFO"), "{seen}");
    assert!(!seen.contains('\u{1b}'), "ANSI escapes in a piped log:\n{seen:?}");
}
