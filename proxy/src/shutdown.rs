//! Stopping: what asks the sidecar to stop (SIGTERM, SIGINT, or [`crate::Sidecar::stop`]).
//!
//! A graceful stop first turns `/ready` off. With `inbound.drain_delay` the sidecar then keeps
//! accepting and serving for that long (Kubernetes < 1.30 has neither native sidecars nor a
//! preStop `sleep` action, so a regular sidecar gets SIGTERM while endpoint removal is still
//! reaching kube-proxy and the callers' meshes). Then the data plane ([`crate::plane`]) stops
//! accepting, and the sidecar waits for its own count of active requests and finishes as soon
//! as they are done (or `inbound.shutdown_grace` is over). A fast stop (SIGINT, or the
//! sidecar dropped) during the delay cuts it short.

use std::time::Duration;

use tokio::sync::watch;

/// How to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopKind {
    /// Stop accepting, let queued and in-flight requests finish within the grace.
    Graceful,
    /// Drop everything now.
    Fast,
}

/// Waits for a stop request on `rx`; a dropped sender means stop now.
pub(crate) async fn requested(rx: &mut watch::Receiver<Option<StopKind>>) -> StopKind {
    match rx.wait_for(Option::is_some).await {
        Ok(kind) => kind.unwrap_or(StopKind::Fast),
        Err(_) => StopKind::Fast,
    }
}

/// `requested`, or the process's SIGTERM (graceful) or SIGINT (fast), whichever comes first.
/// `armed` runs once the handlers are installed (or could not be).
pub(crate) async fn os_or(
    requested: impl std::future::Future<Output = StopKind>,
    armed: impl FnOnce(),
) -> StopKind {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) =
        (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        tracing::warn!("cannot watch SIGTERM/SIGINT; stop requests only");
        armed();
        return requested.await;
    };
    armed();
    tokio::select! {
        kind = requested => kind,
        _ = term.recv() => StopKind::Graceful,
        _ = int.recv() => StopKind::Fast,
    }
}

/// After a graceful stop was asked for: `delay` of serving on (with `/ready` failing).
/// Returns [`StopKind::Graceful`] when the delay ran out, [`StopKind::Fast`] when a fast stop
/// (a request on `rx`, its sender dropped, or SIGINT with `os_signals`) came first.
pub(crate) async fn drain_delay(
    delay: Duration,
    rx: &mut watch::Receiver<Option<StopKind>>,
    os_signals: bool,
) -> StopKind {
    if delay.is_zero() {
        return StopKind::Graceful;
    }
    let fast = async {
        // An error is the sender dropped: the sidecar is gone, stop now.
        let _ = rx.wait_for(|kind| *kind == Some(StopKind::Fast)).await;
    };
    let interrupt = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::interrupt()) {
            Ok(mut int) if os_signals => {
                int.recv().await;
            }
            _ => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::time::sleep(delay) => StopKind::Graceful,
        _ = fast => StopKind::Fast,
        _ = interrupt => StopKind::Fast,
    }
}
