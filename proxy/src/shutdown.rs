//! Stopping: what asks the sidecar to stop (SIGTERM, SIGINT, or [`crate::Sidecar::stop`]) and
//! how pingora learns about it.
//!
//! Pingora's graceful path stops accepting and then sleeps its grace period unconditionally
//! before it drops the runtimes (and any request still running). weir instead watches its own
//! count of active requests and finishes as soon as they are done (or the grace is over),
//! leaving pingora's sleep as the upper bound.

use std::sync::Arc;

use async_trait::async_trait;
use pingora::server::{ShutdownSignal, ShutdownSignalWatch};
use tokio::sync::watch;

use crate::sidecar::Shared;

/// How to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopKind {
    /// Stop accepting, let queued and in-flight requests finish within the grace.
    Graceful,
    /// Drop everything now.
    Fast,
}

/// The pingora shutdown watcher: a stop request from the handle, or (for the binary) the
/// process's SIGTERM (graceful) and SIGINT (fast).
pub struct StopSignal {
    requested: watch::Receiver<Option<StopKind>>,
    shared: Arc<Shared>,
    os_signals: bool,
}

impl StopSignal {
    pub fn new(
        requested: watch::Receiver<Option<StopKind>>,
        shared: Arc<Shared>,
        os_signals: bool,
    ) -> Self {
        StopSignal { requested, shared, os_signals }
    }

    async fn requested(&self) -> StopKind {
        let mut rx = self.requested.clone();
        let kind = match rx.wait_for(Option::is_some).await {
            Ok(kind) => kind.unwrap_or(StopKind::Fast),
            // The handle is gone without asking: nobody can stop us gracefully any more.
            Err(_) => StopKind::Fast,
        };
        kind
    }
}

/// Waits for a stop request on `requested`; a dropped sender means stop now.
pub(crate) async fn requested(mut rx: watch::Receiver<Option<StopKind>>) -> StopKind {
    match rx.wait_for(Option::is_some).await {
        Ok(kind) => kind.unwrap_or(StopKind::Fast),
        Err(_) => StopKind::Fast,
    }
}

#[async_trait]
impl ShutdownSignalWatch for StopSignal {
    async fn recv(&self) -> ShutdownSignal {
        let kind =
            if self.os_signals { os_or(self.requested()).await } else { self.requested().await };
        match kind {
            StopKind::Graceful => {
                tracing::info!(active = self.shared.active(), "draining: stopped accepting");
                self.shared.start_draining();
                ShutdownSignal::GracefulTerminate
            }
            StopKind::Fast => ShutdownSignal::FastShutdown,
        }
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
