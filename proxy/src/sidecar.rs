//! The sidecar as a value: start it (in-process for tests, or from `weir run`), learn its
//! bound addresses, change its in-flight limit, stop it.

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use admission_core::Clock;
use control_api::{SidecarStatus, SidecarView};
use tokio::sync::watch;

use crate::admin::AdminThread;
use crate::config::SidecarConfig;
pub use crate::error::StartError;
use crate::plane::HyperPlane;
pub use crate::shared::{ActiveRequest, Shared};
use crate::shutdown::StopKind;
use crate::telemetry::ProxyMetrics;

/// A running sidecar.
pub struct Sidecar {
    shared: Arc<Shared>,
    inbound_addr: SocketAddr,
    admin_addr: SocketAddr,
    grace: Duration,
    stop: watch::Sender<Option<StopKind>>,
    plane: HyperPlane,
    admin: Option<AdminThread>,
    egress: Option<crate::egress::Egress>,
}

/// How long `start` waits for the inbound listener to accept connections.
const LISTENER_READY_TIMEOUT: Duration = Duration::from_secs(10);

// === impl Sidecar ===

impl Sidecar {
    /// Starts the sidecar on its own threads. Port 0 in `inbound.listen` or `admin.listen`
    /// binds an ephemeral port; [`Sidecar::inbound_addr`] and [`Sidecar::admin_addr`] tell
    /// which. Returns once both listeners accept connections.
    pub fn start(config: SidecarConfig) -> Result<Sidecar, StartError> {
        Self::start_with(config, false)
    }

    /// As [`Sidecar::start`]; `os_signals` also stops it on SIGTERM (graceful) and SIGINT.
    pub fn start_with(config: SidecarConfig, os_signals: bool) -> Result<Sidecar, StartError> {
        config.validate()?;
        let metrics = ProxyMetrics::register();
        let table = crate::admin::initial_table(&config)?;
        let (drain, watch) = weir_net::drain::channel();
        let shared = Arc::new(Shared::new(&config, table, watch));
        let waits = shared.waits.clone();

        let admin = AdminThread::start(&config, shared.clone())?;
        let admin_addr = admin.addr();
        let (stop, stop_rx) = watch::channel(None);
        let (plane, inbound_addr) =
            HyperPlane::start(&config, shared.clone(), metrics, stop_rx, drain, os_signals)?;

        let egress = if config.egress.enabled {
            let own: Vec<SocketAddr> =
                [inbound_addr, admin_addr].into_iter().chain(admin.public_addr()).collect();
            let requests = shared.egress_audit.clone();
            Some(crate::egress::Egress::start(&config, &own, requests, waits)?)
        } else {
            None
        };
        let sidecar = Sidecar {
            shared,
            inbound_addr,
            admin_addr,
            grace: config.inbound.shutdown_grace,
            stop,
            plane,
            admin: Some(admin),
            egress,
        };
        sidecar.wait_listening()?;
        // Ready only once SIGTERM drains: before the handler is installed, a SIGTERM right
        // after the first successful probe would kill the process outright.
        if !sidecar.plane.wait_armed(LISTENER_READY_TIMEOUT) {
            return Err(StartError::Other("the stop watcher did not start".into()));
        }
        sidecar.shared.set_started();
        let public = sidecar.public_addr().map(|a| a.to_string()).unwrap_or_else(|| "off".into());
        tracing::info!(inbound = %inbound_addr, admin = %admin_addr, public, app = %config.inbound.app, "weir started");
        Ok(sidecar)
    }

    pub fn inbound_addr(&self) -> SocketAddr {
        self.inbound_addr
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// The public listener (`admin.public_listen`: /metrics, /live, /ready), when configured.
    pub fn public_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(AdminThread::public_addr)
    }

    /// The egress role, when enabled.
    pub fn egress(&self) -> Option<&crate::egress::Egress> {
        self.egress.as_ref()
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub fn status(&self) -> SidecarStatus {
        self.shared.status()
    }

    /// Changes the in-flight limit while running.
    pub fn set_max_inflight(&self, n: usize) {
        // A limit set by hand stays: the adaptive limit stops moving it.
        self.shared.control.set_fixed(n, self.shared.engine.clock().now());
        self.shared.limit.set_ceiling(n);
        self.shared.limit.set_limit(n);
    }

    /// Stops gracefully: stop accepting, let queued and in-flight requests finish within the
    /// shutdown grace. Returns whether everything finished in time.
    pub fn stop(mut self) -> bool {
        let _ = self.stop.send(Some(StopKind::Graceful));
        self.drain_after_stop()
    }

    /// Serves until SIGTERM (graceful drain, then returns `true` if nothing was cut off) or
    /// SIGINT (returns at once). For `weir run`.
    pub fn run_until_signal(mut self) -> bool {
        self.drain_after_stop()
    }

    /// Waits for the stop to reach the data plane, then for the drain's event that the
    /// active requests have finished (at most the shutdown grace).
    fn drain_after_stop(&mut self) -> bool {
        let graceful = self.plane.wait_stop() == StopKind::Graceful;
        if !graceful {
            self.finish_fast();
            return self.shared.active() == 0;
        }
        let deadline = Instant::now() + self.grace;
        let drained = self.plane.wait_drained(deadline);
        tracing::info!(drained, left = self.shared.active(), "drain finished");
        // The egress drains after the inbound role, within the same grace: the app's
        // in-flight requests may have been calling downstreams through it until now.
        let egress_drained = self.egress.take().is_none_or(|mut egress| {
            let drained = egress.drain(deadline);
            egress.shutdown();
            drained
        });
        if let Some(admin) = self.admin.take() {
            admin.stop();
        }
        self.plane.shutdown();
        drained && egress_drained
    }

    fn finish_fast(&mut self) {
        let _ = self.stop.send(Some(StopKind::Fast));
        if let Some(mut egress) = self.egress.take() {
            egress.shutdown();
        }
        self.plane.shutdown();
        if let Some(admin) = self.admin.take() {
            admin.stop();
        }
    }

    fn running(&self) -> bool {
        self.plane.is_running()
    }

    fn wait_listening(&self) -> Result<(), StartError> {
        let deadline = Instant::now() + LISTENER_READY_TIMEOUT;
        while Instant::now() < deadline {
            if TcpStream::connect_timeout(&self.inbound_addr, Duration::from_millis(100)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Err(StartError::Other(format!("inbound listener {} did not come up", self.inbound_addr)))
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        if self.running() || self.admin.is_some() {
            self.finish_fast();
        }
    }
}
