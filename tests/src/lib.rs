//! weir's load/benchmark harness (`weir_harness`).
//!
//! - [`backend`], [`load`], [`status`]: the capacity-model app, the open-loop load
//!   generator and the `/v1/status` poller, re-exported from the `weir-workload` crate
//!   (which `weir demo` shares without pulling in this harness).
//! - [`contender`]: the things we put between load and backend (direct, HAProxy, nginx,
//!   the `weir` binary) started as bounded child processes on 127.0.0.1.
//! - [`scenario`], [`report`], [`plot`]: the overload benchmark and its outputs.
//! - [`egress_bench`]: the chain, fan-out and expiry benchmark through two sidecars;
//!   [`bench_cli`]: the runners' shared command-line pieces.
//! - [`support`]: the end-to-end tests' apps, clients and misbehaving peers
//!   (`proxy/tests/e2e`); [`weir_process`]: `weir run` as a child that reports the ports it
//!   bound; [`prom`]: the one reader of weir's Prometheus text.
//! - [`noharm`]: weir's shipped defaults against direct in front of healthy apps.
//! - [`hardening`]: issue 17's attacks, each beside a well-behaved caller, on a release weir.
//! - [`multihop`]: entry -> costly middle hop -> bottleneck / healthy service, five
//!   contenders, steady, M^k, step and retrying clients.
//!
//! Everything here targets 127.0.0.1 only, and every run has a fixed duration.

pub mod bench_cli;
pub mod contender;
pub mod egress_bench;
pub mod fairness;
pub mod hardening;
pub mod multihop;
pub mod noharm;
pub mod overhead;
pub mod plot;
pub mod procfs;
pub mod prom;
pub mod report;
pub mod scenario;
pub mod support;
pub mod weir_process;

pub use weir_workload::{backend, load, status, unix_micros, DEADLINE_HEADER};
