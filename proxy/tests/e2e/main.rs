//! weir's end-to-end tests: one binary (`cargo test -p proxy --test e2e`), one module per
//! concern, real processes and real peers on 127.0.0.1. The in-process sidecars and the
//! `weir` binary (`CARGO_BIN_EXE_weir`, built by cargo for this test) run with their shipped
//! defaults unless a test is about a setting; every port is bound as port 0 and read back
//! (in-process from the sidecar, from a child through `weir run --ready-file`).
//!
//! Tests that assert a figure measured under load (a latency, a throughput, a share of
//! refusals against a tight bound) are the **soak** group: named `..._soak` and
//! `#[ignore = "soak"]`, run by `scripts/soak` (one at a time, `--test-threads 1`). Each has
//! a default-run sibling asserting the same property with a bound that still fails when the
//! feature is broken. See the README, "Tests".
//!
//! The tests of this binary share one process: its metrics recorder is global (assert on a
//! sidecar's own counters, or on deltas that no other test can move), and nothing may
//! measure the process's CPU or memory (measure a `weir` child's, through `/proc/<pid>`).

mod support;

mod admin_hostile;
mod async_middle_hop;
mod config_check;
mod config_cli;
mod config_errors;
mod control_table_swap;
mod demo;
mod edge_grpc;
mod edge_h2;
mod edge_http1;
mod edge_isolation;
mod edge_request_head;
mod egress_chain;
mod egress_cli;
mod egress_drain;
mod egress_levels;
mod egress_loop;
mod egress_polite_client;
mod entry_fairness;
mod entry_paths;
mod inbound_adaptive;
mod inbound_cli;
mod inbound_grpc;
mod inbound_http10_app;
mod inbound_overload;
mod inbound_passthrough;
mod inbound_port_exclusive;
mod inbound_queue;
mod inbound_queue_order;
mod inbound_sigterm;
mod noharm;
mod route_levels;
mod run_probes;
mod size_grade_dial;
mod table_digest;
