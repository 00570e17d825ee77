//! A real control plane on 127.0.0.1:0 and a real hyper client.
#![allow(dead_code)] // each test binary uses a different part

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use admission_core::audit::AuditCounters;
use admission_core::table::PriorityTable;
use admission_core::{AdmissionLevel, EngineStatus, Mode};
use bytes::Bytes;
use control_api::{AdminConfig, ControlPlane, SidecarStatus, SidecarView, TableStore};
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::sync::oneshot;

pub const TOKEN: &str = "s3cret-token";

/// A sidecar whose engine state the test sets.
pub struct FakeView {
    pub status: Mutex<SidecarStatus>,
}

impl FakeView {
    pub fn new() -> Arc<Self> {
        Arc::new(FakeView {
            status: Mutex::new(SidecarStatus {
                engine: EngineStatus {
                    level: AdmissionLevel::FULLY_OPEN,
                    overloaded: false,
                    mode: Mode::Enforce,
                    last_window: None,
                    windows_closed: 0,
                    capacity_per_sec: None,
                },
                inflight: 3,
                max_inflight: 64,
                queue_depth: 1,
                max_queued: 1024,
                draining: false,
            }),
        })
    }

    pub fn set_level(&self, level: AdmissionLevel, overloaded: bool) {
        let mut s = self.status.lock().unwrap();
        s.engine.level = level;
        s.engine.overloaded = overloaded;
    }
}

impl SidecarView for FakeView {
    fn status(&self) -> SidecarStatus {
        self.status.lock().unwrap().clone()
    }
    fn ready(&self) -> bool {
        !self.status.lock().unwrap().draining
    }
}

pub struct Server {
    pub addr: SocketAddr,
    pub plane: Arc<ControlPlane>,
    pub store: Arc<TableStore>,
    pub audit: Arc<AuditCounters>,
    pub view: Arc<FakeView>,
    pub dir: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

/// A config with a token file in a fresh temp dir.
pub fn config() -> (AdminConfig, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, format!("  {TOKEN}\n")).unwrap();
    let cfg = AdminConfig { token_file: Some(token), ..AdminConfig::default() };
    (cfg, dir)
}

pub async fn start() -> Server {
    let (cfg, dir) = config();
    start_with(cfg, dir).await
}

pub async fn start_with(cfg: AdminConfig, dir: tempfile::TempDir) -> Server {
    let initial = control_api::load_initial_table(&cfg, b"secret").unwrap();
    let store = TableStore::new(initial);
    let audit = Arc::new(AuditCounters::new());
    let view = FakeView::new();
    let metrics = PrometheusBuilder::new().build_recorder().handle();
    let plane =
        ControlPlane::new(cfg, store.clone(), audit.clone(), view.clone(), metrics).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(plane.clone().serve(listener, async move {
        let _ = stopped.await;
    }));
    Server { addr, plane, store, audit, view, dir, stop: Some(stop), task: Some(task) }
}

impl Server {
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap().unwrap();
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send(Method::GET, path, &[], "").await
    }

    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Reply {
        send(&self.url(path), method, headers, Bytes::copy_from_slice(body.as_bytes())).await
    }

    /// PUT with the right token and content type.
    pub async fn put_table(&self, yaml: &str, if_match: &str) -> Reply {
        let auth = format!("Bearer {TOKEN}");
        let headers = [
            ("authorization", auth.as_str()),
            ("content-type", "application/yaml"),
            ("if-match", if_match),
        ];
        self.send(Method::PUT, "/v1/priority-table", &headers, yaml).await
    }

    pub async fn current_table(&self) -> (u64, PriorityTable) {
        let r = self.get("/v1/priority-table").await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        let etag = r.headers["etag"].to_str().unwrap().trim_matches('"').parse().unwrap();
        (etag, PriorityTable::from_yaml(&r.body).unwrap())
    }
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

pub async fn send(url: &str, method: Method, headers: &[(&str, &str)], body: Bytes) -> Reply {
    try_send(url, method, headers, body).await.unwrap()
}

/// [`send`], or the client's error (e.g. the server answered and closed the connection
/// before it read the whole body, as a busy validation does).
pub async fn try_send(
    url: &str,
    method: Method,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Result<Reply, String> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut req = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let response =
        client.request(req.body(Full::new(body)).unwrap()).await.map_err(|e| e.to_string())?;
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok(Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    })
}

/// A table whose every rule and default map to `business`.
pub fn table_yaml(business: u8) -> String {
    format!(
        "default_business: {business}\nrules:\n  - name: a\n    match: {{ path: /a }}\n    business: {business}\n  - name: b\n    match: {{ path_prefix: /b/ }}\n    business: {business}\n"
    )
}
