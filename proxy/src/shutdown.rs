//! Stopping: what asks the sidecar to stop (SIGTERM, SIGINT, or [`crate::Sidecar::stop`]).
//! The data plane ([`crate::plane`]) stops accepting on a graceful stop; the sidecar then
//! waits for its own count of active requests and finishes as soon as they are done (or the
//! grace is over).

use tokio::sync::watch;

/// How to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopKind {
    /// Stop accepting, let queued and in-flight requests finish within the grace.
    Graceful,
    /// Drop everything now.
    Fast,
}

/// Waits for a stop request on `requested`; a dropped sender means stop now.
pub(crate) async fn requested(mut rx: watch::Receiver<Option<StopKind>>) -> StopKind {
    match rx.wait_for(Option::is_some).await {
        Ok(kind) => kind.unwrap_or(StopKind::Fast),
        Err(_) => StopKind::Fast,
    }
}

/// `requested`, or the process's SIGTERM (graceful) or SIGINT (fast), whichever comes first.
pub(crate) async fn os_or(requested: impl std::future::Future<Output = StopKind>) -> StopKind {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) =
        (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        tracing::warn!("cannot watch SIGTERM/SIGINT; stop requests only");
        return requested.await;
    };
    tokio::select! {
        kind = requested => kind,
        _ = term.recv() => StopKind::Graceful,
        _ = int.recv() => StopKind::Fast,
    }
}
