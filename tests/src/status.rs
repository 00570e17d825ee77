//! Polling weir's admin `GET /v1/status` during a run (level, overloaded, queuing time).
//!
//! The JSON is read leniently (`engine.level` as "B.U", a compound number or
//! `{business, user}`), so the harness keeps working while the API's shape settles.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

#[cfg(test)]
mod tests;

#[derive(Clone, Debug, Default, Serialize)]
pub struct StatusSample {
    /// Seconds since the poller started.
    pub at_secs: f64,
    /// Compound level B*128+U (32767 = fully open).
    pub level: Option<u32>,
    pub level_text: Option<String>,
    pub overloaded: Option<bool>,
    pub mean_queuing_ms: Option<f64>,
    pub queue_depth: Option<u64>,
    pub inflight: Option<u64>,
}

impl StatusSample {
    /// Reads control-api's flat `StatusDoc` (`level`, `level_compound`, `overloaded`,
    /// `mean_queuing_ms`, `queue_depth`) and, leniently, an `engine: {..}` nesting.
    pub fn parse(at_secs: f64, body: &[u8]) -> Option<Self> {
        let json: Value = serde_json::from_slice(body).ok()?;
        let doc = json.get("engine").unwrap_or(&json);
        let level = doc.get("level");
        let window = doc.get("last_window").or_else(|| doc.get("window")).filter(|w| !w.is_null());
        let nanos_in_window = window.and_then(|w| w.get("mean_queuing_ns")).and_then(Value::as_f64);
        Some(StatusSample {
            at_secs,
            level: doc
                .get("level_compound")
                .and_then(compound_level)
                .or_else(|| level.and_then(compound_level)),
            level_text: level.map(|l| match l {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            }),
            overloaded: doc.get("overloaded").and_then(Value::as_bool),
            mean_queuing_ms: doc
                .get("mean_queuing_ms")
                .and_then(Value::as_f64)
                .or_else(|| nanos_in_window.map(|ns| ns / 1e6)),
            queue_depth: json.get("queue_depth").and_then(Value::as_u64),
            inflight: json.get("inflight").and_then(Value::as_u64),
        })
    }
}

/// "3.64", 448, or {"business":3,"user":64}.
pub fn compound_level(v: &Value) -> Option<u32> {
    match v {
        Value::Number(n) => n.as_u64().map(|n| n as u32),
        Value::String(s) => {
            let (b, u) = s.split_once('.')?;
            Some(b.trim().parse::<u32>().ok()? * 128 + u.trim().parse::<u32>().ok()?)
        }
        Value::Object(o) => {
            let b = o.get("business")?.as_u64()? as u32;
            let u = o.get("user")?.as_u64()? as u32;
            Some(b * 128 + u)
        }
        _ => None,
    }
}

/// Samples `/v1/status` every `every` until dropped or stopped.
pub struct StatusPoller {
    samples: Arc<Mutex<Vec<StatusSample>>>,
    task: tokio::task::JoinHandle<()>,
}

impl StatusPoller {
    pub fn start(admin: SocketAddr, every: Duration) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let sink = samples.clone();
        let task = tokio::spawn(async move {
            let client = admin_client();
            let start = Instant::now();
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                ticks.tick().await;
                let at = start.elapsed().as_secs_f64();
                if let Some(sample) = fetch(&client, admin, at).await {
                    sink.lock().unwrap_or_else(|e| e.into_inner()).push(sample);
                }
            }
        });
        StatusPoller { samples, task }
    }

    pub fn latest(&self) -> Option<StatusSample> {
        self.samples.lock().unwrap_or_else(|e| e.into_inner()).last().cloned()
    }

    pub fn stop(self) -> Vec<StatusSample> {
        self.task.abort();
        std::mem::take(&mut *self.samples.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for StatusPoller {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The HTTP client [`fetch`] expects.
pub fn admin_client() -> Client<HttpConnector, Empty<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// One `GET /v1/status`, bounded to a second.
pub async fn fetch(
    client: &Client<HttpConnector, Empty<Bytes>>,
    admin: SocketAddr,
    at_secs: f64,
) -> Option<StatusSample> {
    let uri = format!("http://{admin}/v1/status").parse::<http::Uri>().ok()?;
    let exchange = async {
        let response = client.get(uri).await.ok()?;
        if !response.status().is_success() {
            return None;
        }
        response.into_body().collect().await.ok().map(|b| b.to_bytes())
    };
    let body = tokio::time::timeout(Duration::from_secs(1), exchange).await.ok()??;
    StatusSample::parse(at_secs, &body)
}
