//! The hyper data plane's lifecycle: its runtime, the listener bound before `start` returns
//! (port 0 resolved, no rebind race), and the stop: on a graceful stop (`Sidecar::stop` or
//! SIGTERM) accepting ends, `/ready` turns false and every connection is asked to finish;
//! the sidecar then waits for the last active request (at most `shutdown_grace`) and drops
//! the runtime. SIGINT (or a fast stop) drops it at once.

use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::sync::mpsc;
use std::sync::Arc;

use tokio::runtime::Runtime;
use tokio::sync::watch;

use crate::config::SidecarConfig;
use crate::listener::{accept_loop, ConnSettings};
use crate::service::Inbound;
use crate::shared::Shared;
use crate::shutdown::{self, StopKind};
use crate::sidecar::StartError;
use crate::telemetry::ProxyMetrics;

pub(crate) struct HyperPlane {
    runtime: Option<Runtime>,
    stopped: mpsc::Receiver<StopKind>,
}

impl HyperPlane {
    /// Binds `config.inbound.listen` and starts serving on a runtime of
    /// `inbound.worker_threads()` threads.
    pub(crate) fn start(
        config: &SidecarConfig,
        shared: Arc<Shared>,
        metrics: ProxyMetrics,
        stop: watch::Receiver<Option<StopKind>>,
        os_signals: bool,
    ) -> Result<(Self, SocketAddr), StartError> {
        let listen = config.inbound.listen;
        let bind_err = |source| StartError::Bind { what: "inbound.listen", addr: listen, source };
        let std_listener = StdTcpListener::bind(listen).map_err(bind_err)?;
        std_listener.set_nonblocking(true).map_err(bind_err)?;
        let addr = std_listener.local_addr().map_err(bind_err)?;

        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.inbound.worker_threads())
            .thread_name("weir-inbound")
            .enable_all()
            .build()
            .map_err(|e| StartError::Other(format!("inbound runtime: {e}")))?;
        let inbound =
            Arc::new(Inbound::new(config, shared.clone(), metrics).map_err(StartError::Other)?);
        let settings = Arc::new(ConnSettings::from_config(&config.inbound));
        let listener = {
            let _entered = runtime.enter();
            tokio::net::TcpListener::from_std(std_listener).map_err(bind_err)?
        };
        let (drain, draining) = watch::channel(false);
        runtime.spawn(accept_loop(listener, inbound, settings, draining));

        let (stopped_tx, stopped) = mpsc::channel();
        runtime.spawn(async move {
            let requested = shutdown::requested(stop);
            let kind = if os_signals { shutdown::os_or(requested).await } else { requested.await };
            if kind == StopKind::Graceful {
                tracing::info!(active = shared.active(), "draining: stopped accepting");
                shared.start_draining();
                let _ = drain.send(true);
            }
            let _ = stopped_tx.send(kind);
            // Keep the drain sender alive: dropping it would read as "never drain".
            std::future::pending::<()>().await;
        });
        Ok((HyperPlane { runtime: Some(runtime), stopped }, addr))
    }

    /// Blocks until a stop was asked for; a graceful one has already stopped accepting.
    pub(crate) fn wait_stop(&self) -> StopKind {
        self.stopped.recv().unwrap_or(StopKind::Fast)
    }

    /// Drops every connection and request still running (without blocking: the caller may
    /// be on another runtime).
    pub(crate) fn shutdown(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }

    pub(crate) fn is_running(&self) -> bool {
        self.runtime.is_some()
    }
}

impl Drop for HyperPlane {
    fn drop(&mut self) {
        self.shutdown();
    }
}
