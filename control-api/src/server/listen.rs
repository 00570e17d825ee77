//! The admin listeners (on weir-net's bounded accept loop: at most
//! `admin.max_connections` each) and the background tasks they start.

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use weir_net::Accepted;

use super::ControlPlane;

/// How long open admin connections may finish after shutdown is requested.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

// === impl ControlPlane (listeners) ===

impl ControlPlane {
    /// Serves the full API on `listener` until `shutdown` resolves, then lets open
    /// connections finish (bounded). Starts the table-file watcher and the audit sampler
    /// the first time it is called; they stop when this returns.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        self.start_background();
        let result = self.clone().serve_on(listener, shutdown, false).await;
        let _ = self.stop_background.send(true);
        result
    }

    /// Serves only `/metrics`, `/live` and `/ready` (for `public_listen`).
    pub async fn serve_public(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        self.serve_on(listener, shutdown, true).await
    }

    fn start_background(self: &Arc<Self>) {
        if self.background_started.swap(true, Ordering::SeqCst) {
            return;
        }
        let every = self.cfg.audit_sample_interval;
        let (plane, mut stop) = (self.clone(), self.stop_background.subscribe());
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(every);
            ticker.tick().await; // the first tick is immediate; the history starts at zero
            loop {
                tokio::select! {
                    _ = ticker.tick() => plane.sample_audit(),
                    _ = stop.changed() => return,
                }
            }
        });
        if let Some(path) = self.cfg.table_file.clone() {
            let stop = self.stop_background.subscribe();
            let every = self.cfg.table_poll_interval;
            tokio::spawn(super::table_file::watch_table_file(self.clone(), path, every, stop));
        }
    }

    async fn serve_on(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
        public: bool,
    ) -> std::io::Result<()> {
        let graceful = GracefulShutdown::new();
        let header_read = self.cfg.timeouts.header_read;
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // A request head must be complete within `timeouts.header_read` of the connection
        // (or the previous response); h2 peers that stop answering pings are dropped.
        builder.http1().timer(TokioTimer::new()).header_read_timeout(header_read);
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(header_read)
            .keep_alive_timeout(header_read);
        let name = if public { "admin.public_listen" } else { "admin.listen" };
        let max_connections = self.cfg.max_connections;
        weir_net::accept_loop(listener, name, max_connections, shutdown, |conn: Accepted| {
            let plane = self.clone();
            let service = service_fn(move |req| {
                let plane = plane.clone();
                async move { Ok::<_, Infallible>(plane.handle(req, public).await) }
            });
            let (builder, watcher) = (builder.clone(), graceful.watcher());
            tokio::spawn(async move {
                let Accepted { stream, permit, .. } = conn;
                let _permit = permit;
                // Protocol detection reads the first bytes before hyper's own header timer
                // starts; a peer that sends nothing is bounded here.
                let mut first = [0u8; 1];
                if tokio::time::timeout(header_read, stream.peek(&mut first)).await.is_err() {
                    tracing::debug!("admin connection sent nothing within header_read");
                    return;
                }
                let conn = builder.serve_connection(TokioIo::new(stream), service);
                if let Err(e) = watcher.watch(conn.into_owned()).await {
                    tracing::debug!(error = %e, "admin connection ended with an error");
                }
            });
        })
        .await;
        if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await.is_err() {
            tracing::warn!("admin connections still open after the shutdown grace");
        }
        Ok(())
    }
}
