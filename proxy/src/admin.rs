//! The admin side of the sidecar: the control API (`control_api::ControlPlane`: /metrics,
//! /live, /ready, /v1/...) on `admin.listen` and, when configured, the public listener
//! (`admin.public_listen`: /metrics, /live and /ready only, for the kubelet's probes and
//! Prometheus), both on one small runtime thread; and the engine's window timer on a thread
//! of its own.
//!
//! The timer does not share the admin runtime: whatever a request to the admin API costs
//! (table bodies are parsed on the blocking pool, but a scrape or a burst of connections
//! still runs there), windows close on time and the admission level keeps moving.
//!
//! Errors are [`AdminError`] so this module needs nothing from the sidecar that starts it.

use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use admission_core::table::CompiledTable;
use admission_core::FieldError;
use control_api::{ControlError, ControlPlane, SidecarView};
use tokio::sync::watch;

use crate::config::SidecarConfig;
use crate::shared::Shared;
use crate::telemetry;

/// Closes idle windows even when no request arrives to do it (docs/design.md, "Signal and
/// control laws": a window closes within ~50 ms of its end).
const TICK: Duration = Duration::from_millis(50);
/// Histogram upkeep for the Prometheus recorder (drains its buckets into the snapshot).
const UPKEEP: Duration = Duration::from_secs(5);

/// Why the admin side could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// A setting, named by its field (exit 64).
    #[error("{0}")]
    Config(FieldError),
    /// A listener could not be bound; `what` names its setting.
    #[error("{what} {addr}: {source}")]
    Bind { what: &'static str, addr: SocketAddr, source: std::io::Error },
    #[error("{0}")]
    Other(String),
}

/// The running admin thread and window timer.
pub struct AdminThread {
    addr: SocketAddr,
    public_addr: Option<SocketAddr>,
    stop: Option<watch::Sender<bool>>,
    thread: Option<JoinHandle<()>>,
    timer: Option<WindowTimer>,
}

// === impl AdminThread ===

impl AdminThread {
    pub fn start(config: &SidecarConfig, shared: Arc<Shared>) -> Result<Self, AdminError> {
        let (std_listener, addr) = bind("admin.listen", config.admin.listen)?;
        // Bound here, before anything reports started: a taken port fails the start (exit 1
        // naming `admin.public_listen`) instead of leaving every probe refused.
        let public = config
            .admin
            .public_listen
            .map(|listen| bind("admin.public_listen", listen))
            .transpose()?;
        let public_addr = public.as_ref().map(|(_, addr)| *addr);

        let admin_config = config.admin.clone();
        let (stop, stopped) = watch::channel(false);
        let (started, ready) = mpsc::channel::<Result<(), AdminError>>();
        let timer_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("weir-admin".into())
            .spawn(move || {
                let runtime =
                    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                        Ok(rt) => rt,
                        Err(e) => {
                            let _ =
                                started.send(Err(AdminError::Other(format!("admin runtime: {e}"))));
                            return;
                        }
                    };
                runtime.block_on(async move {
                    let tokio_listener = |what, (listener, addr): (StdTcpListener, SocketAddr)| {
                        tokio::net::TcpListener::from_std(listener)
                            .map_err(|source| AdminError::Bind { what, addr, source })
                    };
                    let listeners =
                        tokio_listener("admin.listen", (std_listener, addr)).and_then(|full| {
                            let public = public
                                .map(|p| tokio_listener("admin.public_listen", p))
                                .transpose()?;
                            Ok((full, public))
                        });
                    let (listener, public_listener) = match listeners {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = started.send(Err(e));
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
                            let _ = started.send(Err(match e {
                                ControlError::Config(field) => AdminError::Config(field),
                                other => {
                                    AdminError::Config(FieldError::new("admin", other.to_string()))
                                }
                            }));
                            return;
                        }
                    };
                    let _ = started.send(Ok(()));
                    let shutdown = |mut stopped: watch::Receiver<bool>| async move {
                        let _ = stopped.wait_for(|stop| *stop).await;
                    };
                    let public = async {
                        if let Some(listener) = public_listener {
                            let served =
                                plane.clone().serve_public(listener, shutdown(stopped.clone()));
                            if let Err(e) = served.await {
                                tracing::error!(error = %e, "public listener stopped");
                            }
                        }
                    };
                    let full = async {
                        if let Err(e) =
                            plane.clone().serve(listener, shutdown(stopped.clone())).await
                        {
                            tracing::error!(error = %e, "admin API stopped");
                        }
                    };
                    tokio::join!(full, public);
                });
            })
            .map_err(|e| AdminError::Other(format!("cannot spawn the admin thread: {e}")))?;
        match ready.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(AdminError::Other("admin thread died while starting".into())),
        }
        let timer = WindowTimer::start(timer_shared)?;
        Ok(AdminThread {
            addr,
            public_addr,
            stop: Some(stop),
            thread: Some(thread),
            timer: Some(timer),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where the public listener (`admin.public_listen`) is bound, when configured.
    pub fn public_addr(&self) -> Option<SocketAddr> {
        self.public_addr
    }

    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(timer) = self.timer.take() {
            timer.stop();
        }
    }
}

impl Drop for AdminThread {
    fn drop(&mut self) {
        self.shutdown();
    }
}

// === impl WindowTimer ===

/// The engine's clock hand: a plain thread that ticks every [`TICK`], so no task on any
/// runtime can delay a window's close.
struct WindowTimer {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

impl WindowTimer {
    fn start(shared: Arc<Shared>) -> Result<Self, AdminError> {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("weir-window-timer".into())
            .spawn(move || {
                let prometheus = telemetry::prometheus();
                let mut next_upkeep = Instant::now() + UPKEEP;
                // The wait on the stop channel is the tick: it returns on stop, on the
                // sender's drop, or after TICK.
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(TICK) {
                    shared.control_tick();
                    if Instant::now() >= next_upkeep {
                        prometheus.run_upkeep();
                        next_upkeep += UPKEEP;
                    }
                }
            })
            .map_err(|e| AdminError::Other(format!("cannot spawn the window timer: {e}")))?;
        Ok(WindowTimer { stop, thread })
    }

    fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}

/// A non-blocking std listener on `listen` and the address it got (port 0 resolved).
fn bind(
    what: &'static str,
    listen: SocketAddr,
) -> Result<(StdTcpListener, SocketAddr), AdminError> {
    let bind_err = |source| AdminError::Bind { what, addr: listen, source };
    let listener = StdTcpListener::bind(listen).map_err(bind_err)?;
    listener.set_nonblocking(true).map_err(bind_err)?;
    let addr = listener.local_addr().map_err(bind_err)?;
    Ok((listener, addr))
}

/// The priority table the sidecar starts with (state path, table file, or the built-in).
/// Errors name the setting at fault.
pub fn initial_table(config: &SidecarConfig) -> Result<CompiledTable, FieldError> {
    let secret = config.admin.read_user_secret().map_err(|e| e.at("admin"))?;
    if config.inbound.entry && secret.is_empty() {
        if !config.admin.allow_empty_user_secret {
            return Err(FieldError::new(
                "admin.user_secret_file",
                "the entry role needs a non-empty user-hash secret (set \
                 admin.allow_empty_user_secret: true for a demo)",
            ));
        }
        tracing::warn!(
            "entry role with an empty user-hash key (admin.allow_empty_user_secret): clients \
             can choose user ids with favourable levels"
        );
    }
    control_api::load_initial_table(&config.admin, &secret)
}
