//! The admin listeners and the background tasks they start.

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

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
            tokio::spawn(crate::source::watch_table_file(self.clone(), path, every, stop));
        }
    }

    async fn serve_on(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
        public: bool,
    ) -> std::io::Result<()> {
        let graceful = GracefulShutdown::new();
        let builder = auto::Builder::new(TokioExecutor::new());
        tokio::pin!(shutdown);
        loop {
            let stream = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Usually EMFILE; back off instead of spinning on the error.
                        tracing::warn!(error = %e, "admin accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = &mut shutdown => break,
            };
            let plane = self.clone();
            let service = service_fn(move |req| {
                let plane = plane.clone();
                async move { Ok::<_, Infallible>(plane.handle(req, public).await) }
            });
            let conn = builder.serve_connection(TokioIo::new(stream), service).into_owned();
            let conn = graceful.watch(conn);
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "admin connection ended with an error");
                }
            });
        }
        drop(listener);
        if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await.is_err() {
            tracing::warn!("admin connections still open after the shutdown grace");
        }
        Ok(())
    }
}
