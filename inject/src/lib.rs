//! `weir inject`: the Kubernetes mutating admission webhook that adds the weir sidecar to
//! pods which opt in.
//!
//! - [`template`]: what is added, as the chart renders it (the same sidecar partial charts use).
//! - [`patch`]: the decision as a pure function: pod + template + scope -> JSON Patch or why not.
//! - [`review`]: admission.k8s.io/v1 AdmissionReview in, AdmissionReview out.
//! - [`tls`]: the serving certificate, reloaded from its files without a restart.
//! - [`server`]: the HTTPS server (hyper 1 over tokio-rustls on ring), every wait bounded.
//! - [`metrics`]: one counter per outcome.
//! - [`cli`]: the `weir inject` flags.

pub mod cli;
pub mod metrics;
pub mod patch;
pub mod review;
pub mod server;
pub mod template;
pub mod tls;
