//! Polling weir's admin `GET /v1/status` during a run (level, overloaded, queuing time).
//!
//! The document is read through control-api's typed [`StatusDoc`], the one reader of
//! status in the workspace: a change of its shape breaks this crate's build, not a
//! benchmark's numbers.

use bytes::Bytes;
use control_api::StatusDoc;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

#[cfg(test)]
mod tests;

/// One poll of `/v1/status`, stamped with when it was taken.
#[derive(Clone, Debug, Serialize)]
pub struct StatusSample {
    /// Seconds since the poller started.
    pub at_secs: f64,
    pub doc: StatusDoc,
}

impl StatusSample {
    pub fn parse(at_secs: f64, body: &[u8]) -> Option<Self> {
        let doc = serde_json::from_slice::<StatusDoc>(body).ok()?;
        Some(StatusSample { at_secs, doc })
    }

    /// Compound level B*128+U (32767 = fully open).
    pub fn level(&self) -> u32 {
        u32::from(self.doc.level_compound)
    }

    /// The in-flight limit in front of the app (the adaptive limit when it is on, the
    /// fixed `max_inflight` otherwise).
    pub fn inflight_limit(&self) -> u64 {
        self.doc.max_inflight
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
