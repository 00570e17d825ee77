//! The admin side of the sidecar on its own small runtime thread: the control API
//! (`control_api::ControlPlane`: /metrics, /live, /ready, /v1/...), the engine's window timer
//! and the Prometheus upkeep.

use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use admission_core::table::CompiledTable;
use control_api::{ControlPlane, SidecarView};
use tokio::sync::oneshot;

use crate::config::SidecarConfig;
use crate::sidecar::{Shared, StartError};
use crate::telemetry;

/// Closes idle windows even when no request arrives to do it (DESIGN §3: ~50 ms).
const TICK: Duration = Duration::from_millis(50);
/// Histogram upkeep for the Prometheus recorder (drains its buckets into the snapshot).
const UPKEEP: Duration = Duration::from_secs(5);

/// The running admin thread.
pub struct AdminThread {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

// === impl AdminThread ===

impl AdminThread {
    pub fn start(config: &SidecarConfig, shared: Arc<Shared>) -> Result<Self, StartError> {
        let listen = config.admin.listen;
        let bind_err = |source| StartError::Bind { what: "admin.listen", addr: listen, source };
        let std_listener = StdTcpListener::bind(listen).map_err(bind_err)?;
        std_listener.set_nonblocking(true).map_err(bind_err)?;
        let addr = std_listener.local_addr().map_err(bind_err)?;

        let admin_config = config.admin.clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let (started, ready) = std::sync::mpsc::channel::<Result<(), StartError>>();
        let thread = std::thread::Builder::new()
            .name("weir-admin".into())
            .spawn(move || {
                let runtime =
                    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                        Ok(rt) => rt,
                        Err(e) => {
                            let _ =
                                started.send(Err(StartError::Other(format!("admin runtime: {e}"))));
                            return;
                        }
                    };
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(std_listener) {
                        Ok(l) => l,
                        Err(source) => {
                            let _ = started.send(Err(StartError::Bind {
                                what: "admin.listen",
                                addr,
                                source,
                            }));
                            return;
                        }
                    };
                    let view: Arc<dyn SidecarView> = shared.clone();
                    let plane = match ControlPlane::new(
                        admin_config,
                        shared.table.clone(),
                        shared.audit.clone(),
                        view,
                        telemetry::prometheus(),
                    ) {
                        Ok(plane) => plane,
                        Err(e) => {
                            let _ = started.send(Err(StartError::Config {
                                field: "admin".into(),
                                message: e.to_string(),
                            }));
                            return;
                        }
                    };
                    let _ = started.send(Ok(()));
                    tokio::spawn(timers(shared));
                    let shutdown = async move {
                        let _ = stopped.await;
                    };
                    if let Err(e) = plane.serve(listener, shutdown).await {
                        tracing::error!(error = %e, "admin API stopped");
                    }
                });
            })
            .map_err(|e| StartError::Other(format!("cannot spawn the admin thread: {e}")))?;
        match ready.recv() {
            Ok(Ok(())) => Ok(AdminThread { addr, stop: Some(stop), thread: Some(thread) }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StartError::Other("admin thread died while starting".into())),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for AdminThread {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn timers(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let upkeep_every = (UPKEEP.as_millis() / TICK.as_millis()).max(1) as u64;
    let prometheus = telemetry::prometheus();
    let mut n = 0u64;
    loop {
        tick.tick().await;
        shared.engine.tick();
        n += 1;
        if n % upkeep_every == 0 {
            prometheus.run_upkeep();
        }
    }
}

/// The priority table the sidecar starts with (state path, table file, or the built-in).
pub fn initial_table(config: &SidecarConfig) -> Result<CompiledTable, StartError> {
    let secret = config.admin.read_user_secret().map_err(|e| StartError::Config {
        field: "admin.user_secret_file".into(),
        message: e.to_string(),
    })?;
    if config.inbound.entry && secret.is_empty() {
        tracing::warn!(
            "entry role without admin.user_secret_file: user priorities use an empty hash key"
        );
    }
    control_api::load_initial_table(&config.admin, None, &secret).map_err(|e| StartError::Config {
        field: "admin.table_file".into(),
        message: e.to_string(),
    })
}
