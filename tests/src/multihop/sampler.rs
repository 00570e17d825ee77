//! Sampling a running graph every [`SAMPLE_EVERY`]: each weir sidecar's `/metrics`
//! (refusals per role and reason, its own level, the levels its egress caches per
//! downstream authority), and the apps' and backends' counters.

use serde::Serialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use super::app::{AppSnapshot, HopApp};
use crate::backend::{BackendSnapshot, CapacityBackend};
use crate::egress_bench::fetch_metrics;
use crate::prom::Metrics;

/// Often enough to time a level change to ~0.1 s (weir refreshes its cached-level gauge
/// every 250 ms, which bounds what a scrape can see).
pub const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// One sidecar's counters at one moment (cumulative), from its `/metrics`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HopMetrics {
    pub inbound_admitted: f64,
    pub inbound_shed_overload: f64,
    pub inbound_shed_deadline: f64,
    pub egress_sent: f64,
    pub egress_shed_downstream: f64,
    pub egress_shed_deadline: f64,
    /// `weir_admission_level` (B*128+U; 32767 fully open).
    pub level: Option<f64>,
    /// The in-flight limit in front of the app, what is at the app, and what waits in weir.
    pub inflight_limit: Option<f64>,
    pub inflight: Option<f64>,
    pub queue_depth: Option<f64>,
    /// The lowest level the egress caches per downstream authority (series that carry more
    /// labels than the authority, a route say, are folded in by their minimum).
    pub cached: BTreeMap<String, f64>,
    /// Routes the sidecar's own level spares now (per-route levels).
    pub spared_routes: Option<f64>,
}

impl HopMetrics {
    fn read(m: &Metrics) -> Self {
        let mut cached: BTreeMap<String, f64> = BTreeMap::new();
        for (labels, value) in m.series("weir_downstream_level") {
            if let Some(authority) = labels.get("authority") {
                let slot = cached.entry(authority.clone()).or_insert(value);
                *slot = slot.min(value);
            }
        }
        // `+ 0.0`: an empty sum is -0.0, which would print as "-0".
        let requests =
            |role: &str, outcome: &str| m.sum("weir_requests_total", role, outcome) + 0.0;
        HopMetrics {
            inbound_admitted: requests("inbound", "admitted"),
            inbound_shed_overload: requests("inbound", "shed_overload"),
            inbound_shed_deadline: requests("inbound", "shed_deadline"),
            egress_sent: requests("egress", "admitted"),
            egress_shed_downstream: requests("egress", "shed_downstream"),
            egress_shed_deadline: requests("egress", "shed_deadline"),
            level: m.first("weir_admission_level"),
            inflight_limit: m.first("weir_inflight_limit"),
            inflight: m.first("weir_inflight"),
            queue_depth: m.first("weir_queue_depth"),
            cached,
            spared_routes: m
                .series("weir_route_slots")
                .find(|(labels, _)| labels.get("kind").map(String::as_str) == Some("spared_routes"))
                .map(|(_, v)| v),
        }
    }

    pub fn inbound_shed(&self) -> f64 {
        self.inbound_shed_overload + self.inbound_shed_deadline
    }

    pub fn inbound_received(&self) -> f64 {
        self.inbound_admitted + self.inbound_shed()
    }

    pub fn egress_shed(&self) -> f64 {
        self.egress_shed_downstream + self.egress_shed_deadline
    }
}

/// Everything sampled at one moment.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Sample {
    pub at_secs: f64,
    /// Per weir hop (`e`, `a`, `b`, `c`); empty for the topologies without weir, and a hop
    /// whose scrape failed this time is absent.
    pub hops: BTreeMap<String, HopMetrics>,
    pub app_e: AppSnapshot,
    pub app_a: AppSnapshot,
    pub b: BackendSnapshot,
    pub c: BackendSnapshot,
}

impl Sample {
    pub fn hop(&self, name: &str) -> Option<&HopMetrics> {
        self.hops.get(name)
    }
}

pub struct Sampler {
    samples: Arc<Mutex<Vec<Sample>>>,
    task: tokio::task::JoinHandle<()>,
}

/// What the sampler reads.
pub struct Targets {
    pub admins: BTreeMap<&'static str, SocketAddr>,
    pub app_e: Arc<HopApp>,
    pub app_a: Arc<HopApp>,
    pub b: Arc<CapacityBackend>,
    pub c: Arc<CapacityBackend>,
}

impl Sampler {
    pub fn start(targets: Targets) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let sink = samples.clone();
        let task = tokio::spawn(async move {
            let client = crate::status::admin_client();
            let start = Instant::now();
            let mut ticks = tokio::time::interval(SAMPLE_EVERY);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                ticks.tick().await;
                let at_secs = start.elapsed().as_secs_f64();
                // One scrape after another: each is bounded (1 s) and takes about a
                // millisecond on loopback, so the four land within the same tick.
                let mut hops = BTreeMap::new();
                for (name, admin) in &targets.admins {
                    if let Some(m) = fetch_metrics(&client, *admin).await {
                        hops.insert(name.to_string(), HopMetrics::read(&m));
                    }
                }
                let sample = Sample {
                    at_secs,
                    hops,
                    app_e: targets.app_e.snapshot(),
                    app_a: targets.app_a.snapshot(),
                    b: targets.b.snapshot(),
                    c: targets.c.snapshot(),
                };
                sink.lock().unwrap_or_else(|e| e.into_inner()).push(sample);
            }
        });
        Sampler { samples, task }
    }

    pub fn stop(self) -> Vec<Sample> {
        self.task.abort();
        std::mem::take(&mut *self.samples.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}
