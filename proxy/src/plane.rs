//! The inbound data plane's lifecycle: its runtimes, the listeners bound before `start`
//! returns (port 0 resolved, no rebind race), each served by the server skeleton
//! ([`crate::server`]) with the inbound role, and the stop: on a graceful stop
//! (`Sidecar::stop` or SIGTERM) `/ready` turns false at once; after `drain_delay` (0 by
//! default) the drain is signalled (accepting ends and every connection is asked to
//! finish); the sidecar then waits for the drain's event that the last active request is
//! done (at most `shutdown_grace`) and drops the runtimes. SIGINT (or a fast stop) drops
//! them at once, during the delay too.
//!
//! Two runtime flavours (`inbound.work_stealing`):
//! - one runtime per worker thread (the default): each thread has its own current-thread
//!   runtime, its own listener on the shared port (`SO_REUSEPORT`; the kernel spreads
//!   connections) and its own app connection pool, so a request never leaves its thread;
//! - one work-stealing runtime with one listener (for processes that start several
//!   sidecars, such as the tests, and for few long-lived connections).

use std::net::SocketAddr;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use socket2::{Domain, Socket, Type};
use tokio::runtime::Runtime;
use tokio::sync::{oneshot, watch};
use weir_net::drain::Drain;

use crate::config::SidecarConfig;
use crate::error::StartError;
use crate::service::Inbound;
use crate::shared::Shared;
use crate::shutdown::{self, StopKind};
use crate::telemetry::ProxyMetrics;

/// Pending connections per listener.
const BACKLOG: i32 = 1024;

pub(crate) struct HyperPlane {
    runtimes: Runtimes,
    stopped: mpsc::Receiver<StopKind>,
    /// Signalled once the stop watcher listens for SIGTERM/SIGINT (at once without them).
    armed: mpsc::Receiver<()>,
    /// Signalled once a graceful drain has finished: no request is left inside.
    drained: mpsc::Receiver<()>,
}

enum Runtimes {
    WorkStealing(Option<Runtime>),
    /// Each thread runs its runtime until told to stop.
    PerThread(Vec<oneshot::Sender<()>>),
}

impl HyperPlane {
    /// Binds `config.inbound.listen` and starts serving on `inbound.worker_threads()`
    /// threads. `drain` is the one whose watch `shared` holds.
    pub(crate) fn start(
        config: &SidecarConfig,
        shared: Arc<Shared>,
        metrics: ProxyMetrics,
        stop: watch::Receiver<Option<StopKind>>,
        drain: Drain,
        os_signals: bool,
    ) -> Result<(Self, SocketAddr), StartError> {
        let inbound_config = &config.inbound;
        let threads = inbound_config.worker_threads();
        let per_thread = !inbound_config.work_stealing;
        let listeners = bind(inbound_config.listen, if per_thread { threads } else { 1 })?;
        let addr = listeners[0]
            .local_addr()
            .map_err(|source| bind_error(inbound_config.listen, source))?;
        let server = Arc::new(inbound_config.server());
        let draining = shared.drain.clone();
        let (stopped_tx, stopped) = mpsc::channel();
        let (armed_tx, armed) = mpsc::channel();
        let (drained_tx, drained) = mpsc::channel();
        let stop_watch = stop_watcher(
            stop,
            os_signals,
            inbound_config.drain_delay,
            shared.clone(),
            drain,
            Reports { stopped: stopped_tx, armed: armed_tx, drained: drained_tx },
        );
        let inbound = || {
            Inbound::new(config, shared.clone(), metrics.clone())
                .map(Arc::new)
                .map_err(StartError::Other)
        };

        if !per_thread {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads)
                .thread_name("weir-inbound")
                .enable_all()
                .build()
                .map_err(|e| StartError::Other(format!("inbound runtime: {e}")))?;
            let listener = listeners.into_iter().next().expect("one listener");
            let listener = {
                let _entered = runtime.enter();
                tokio::net::TcpListener::from_std(listener).map_err(|e| bind_error(addr, e))?
            };
            runtime.spawn(serve(listener, inbound()?, server, draining));
            runtime.spawn(stop_watch);
            let runtimes = Runtimes::WorkStealing(Some(runtime));
            return Ok((HyperPlane { runtimes, stopped, armed, drained }, addr));
        }

        let mut stops = Vec::with_capacity(threads);
        let mut stop_watch = Some(stop_watch);
        for (i, listener) in listeners.into_iter().enumerate() {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| StartError::Other(format!("inbound runtime: {e}")))?;
            let listener = {
                let _entered = runtime.enter();
                tokio::net::TcpListener::from_std(listener).map_err(|e| bind_error(addr, e))?
            };
            let (inbound, server, draining) = (inbound()?, server.clone(), draining.clone());
            let watcher = stop_watch.take();
            let (stop_thread, stopped_thread) = oneshot::channel::<()>();
            std::thread::Builder::new()
                .name(format!("weir-inbound-{i}"))
                .spawn(move || {
                    runtime.block_on(async move {
                        tokio::spawn(serve(listener, inbound, server, draining));
                        if let Some(watcher) = watcher {
                            tokio::spawn(watcher);
                        }
                        let _ = stopped_thread.await;
                    });
                    runtime.shutdown_background();
                })
                .map_err(|e| StartError::Other(format!("cannot spawn an inbound thread: {e}")))?;
            stops.push(stop_thread);
        }
        Ok((HyperPlane { runtimes: Runtimes::PerThread(stops), stopped, armed, drained }, addr))
    }

    /// Waits (at most `within`) until SIGTERM and SIGINT are handled, so a signal that
    /// follows the start is a graceful (or fast) stop, never the default action (death).
    pub(crate) fn wait_armed(&self, within: std::time::Duration) -> bool {
        self.armed.recv_timeout(within).is_ok()
    }

    /// Blocks until a stop was asked for; a graceful one has already stopped accepting.
    pub(crate) fn wait_stop(&self) -> StopKind {
        self.stopped.recv().unwrap_or(StopKind::Fast)
    }

    /// After a graceful stop: blocks until the drain has finished (no request left inside)
    /// or `deadline` passes; whether it finished.
    pub(crate) fn wait_drained(&self, deadline: std::time::Instant) -> bool {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        self.drained.recv_timeout(left).is_ok()
    }

    /// Drops every connection and request still running (without blocking: the caller may
    /// be on another runtime).
    pub(crate) fn shutdown(&mut self) {
        match &mut self.runtimes {
            Runtimes::WorkStealing(runtime) => {
                if let Some(runtime) = runtime.take() {
                    runtime.shutdown_background();
                }
            }
            Runtimes::PerThread(stops) => {
                for stop in stops.drain(..) {
                    let _ = stop.send(());
                }
            }
        }
    }

    pub(crate) fn is_running(&self) -> bool {
        match &self.runtimes {
            Runtimes::WorkStealing(runtime) => runtime.is_some(),
            Runtimes::PerThread(stops) => !stops.is_empty(),
        }
    }
}

impl Drop for HyperPlane {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The inbound listener's server: the skeleton with the inbound role.
async fn serve(
    listener: tokio::net::TcpListener,
    inbound: Arc<Inbound>,
    server: Arc<crate::config::ServerConfig>,
    drain: weir_net::drain::Watch,
) {
    crate::server::serve(listener, "inbound", inbound, server, drain).await
}

/// What the stop watcher tells [`HyperPlane`]'s blocking side.
struct Reports {
    /// The kind of stop, once accepting has stopped (graceful) or at once (fast).
    stopped: mpsc::Sender<StopKind>,
    /// The signal handlers are installed.
    armed: mpsc::Sender<()>,
    /// A graceful drain finished: no request is left inside.
    drained: mpsc::Sender<()>,
}

/// Waits for a stop request (and, for `weir run`, SIGTERM/SIGINT); a graceful one fails
/// `/ready`, serves on for `drain_delay`, then signals the drain. Reports the kind to
/// [`HyperPlane::wait_stop`] once accepting has stopped, and the drain's end to
/// [`HyperPlane::wait_drained`] (an event: the last request inside ends it).
async fn stop_watcher(
    mut stop: watch::Receiver<Option<StopKind>>,
    os_signals: bool,
    drain_delay: Duration,
    shared: Arc<Shared>,
    drain: Drain,
    reports: Reports,
) {
    let requested = shutdown::requested(&mut stop);
    let mut kind = if os_signals {
        shutdown::os_or(requested, || {
            let _ = reports.armed.send(());
        })
        .await
    } else {
        let _ = reports.armed.send(());
        requested.await
    };
    if kind == StopKind::Graceful {
        shared.stop_ready();
        if !drain_delay.is_zero() {
            tracing::info!(
                delay = ?drain_delay,
                active = shared.active(),
                "stopping: /ready fails; still serving for inbound.drain_delay"
            );
            kind = shutdown::drain_delay(drain_delay, &mut stop, os_signals).await;
        }
    }
    if kind != StopKind::Graceful {
        let _ = reports.stopped.send(kind);
        // The drain stays unsignalled (and alive): a fast stop drops the runtimes instead.
        std::future::pending::<()>().await;
    }
    tracing::info!(active = shared.active(), "draining: stopped accepting");
    drain.signal();
    let _ = reports.stopped.send(kind);
    drain.finished().await;
    let _ = reports.drained.send(());
}

/// `n` listeners on `addr` (port 0: the port the first one got); with `SO_REUSEPORT` when
/// there are several.
fn bind(addr: SocketAddr, n: usize) -> Result<Vec<std::net::TcpListener>, StartError> {
    if n > 1 && addr.port() != 0 {
        ensure_port_free(addr)?;
    }
    let mut listeners: Vec<std::net::TcpListener> = Vec::with_capacity(n);
    let mut at = addr;
    for _ in 0..n.max(1) {
        let socket = Socket::new(Domain::for_address(at), Type::STREAM, None)
            .map_err(|e| bind_error(addr, e))?;
        let setup = || -> std::io::Result<()> {
            socket.set_reuse_address(true)?;
            if n > 1 {
                socket.set_reuse_port(true)?;
            }
            socket.bind(&at.into())?;
            socket.listen(BACKLOG)?;
            socket.set_nonblocking(true)
        };
        setup().map_err(|e| bind_error(addr, e))?;
        let listener: std::net::TcpListener = socket.into();
        if let Some(first) = listeners.first() {
            debug_assert_eq!(first.local_addr().ok(), Some(at));
        } else {
            at = listener.local_addr().map_err(|e| bind_error(addr, e))?;
        }
        listeners.push(listener);
    }
    Ok(listeners)
}

/// `SO_REUSEPORT` lets any process of the same user bind a port that is already listening,
/// and the kernel then splits new connections between the two: a second weir (or an old
/// one that never exited) would silently take half the traffic. So before the per-thread
/// group binds, one socket without `SO_REUSEPORT` tries the address: it fails if anything
/// listens there, with or without the option. (A process that binds between this probe and
/// the group, or joins the group later with `SO_REUSEPORT` itself, is not caught: the
/// kernel offers no exclusive reuseport group.)
fn ensure_port_free(addr: SocketAddr) -> Result<(), StartError> {
    let probe = Socket::new(Domain::for_address(addr), Type::STREAM, None)
        .map_err(|e| bind_error(addr, e))?;
    // SO_REUSEADDR as the listeners set it: a TIME_WAIT leftover of a previous run is no
    // owner, a listening socket is.
    probe.set_reuse_address(true).map_err(|e| bind_error(addr, e))?;
    match probe.bind(&addr.into()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(bind_error(
            addr,
            std::io::Error::new(
                e.kind(),
                "address in use by another process; weir does not share its inbound port \
                 (its per-thread listeners use SO_REUSEPORT, which would split connections \
                 with that process)",
            ),
        )),
        Err(e) => Err(bind_error(addr, e)),
    }
}

fn bind_error(addr: SocketAddr, source: std::io::Error) -> StartError {
    StartError::Bind { what: "inbound.listen", addr, source }
}
