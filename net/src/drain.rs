//! Drain as an event. [`channel`] makes the two sides:
//!
//! - [`Drain`], the owner's (the sidecar's stop, the egress's drain): [`Drain::signal`]
//!   starts the drain, [`Drain::finished`] resolves when nothing tracked is left;
//! - [`Watch`], every listener's, connection's and request's: [`Watch::signaled`] resolves
//!   when the drain starts (accept loops stop, connections are asked to close), and
//!   [`Watch::track`] counts a piece of work (a request, a response body) the drain waits for.
//!
//! Both are events (a `tokio::sync::watch` channel and a `tokio_util` task tracker): no
//! one polls a flag or a counter. Tracking costs an atomic add and an `Arc` clone, its end
//! an atomic subtract; the waiter is woken only by the last one once the drain has started.
//!
//! A [`Drain`] dropped without a signal counts as signalled: whoever could have ended the
//! drain is gone, so whatever waits for it must not wait for ever.

use std::future::Future;

use tokio::sync::watch;
use tokio_util::task::task_tracker::{TaskTracker, TaskTrackerToken};

/// The owner's side of a drain (see the module's documentation).
#[derive(Debug)]
pub struct Drain {
    signal: watch::Sender<bool>,
    tracker: TaskTracker,
}

/// The side that hears the drain and keeps it open while its work is inside.
#[derive(Debug, Clone)]
pub struct Watch {
    signaled: watch::Receiver<bool>,
    tracker: TaskTracker,
}

/// One piece of work the drain waits for, until it is dropped.
#[derive(Debug)]
pub struct Tracked(#[allow(dead_code)] TaskTrackerToken);

/// A drain not yet signalled, and its first watch.
pub fn channel() -> (Drain, Watch) {
    let (signal, signaled) = watch::channel(false);
    let tracker = TaskTracker::new();
    let watch = Watch { signaled, tracker: tracker.clone() };
    (Drain { signal, tracker }, watch)
}

// === impl Drain ===

impl Drain {
    /// Starts the drain: every [`Watch::signaled`] resolves. Idempotent.
    pub fn signal(&self) {
        self.signal.send_replace(true);
        self.tracker.close();
    }

    pub fn is_signaled(&self) -> bool {
        *self.signal.borrow()
    }

    pub fn watch(&self) -> Watch {
        Watch { signaled: self.signal.subscribe(), tracker: self.tracker.clone() }
    }

    /// Work tracked now.
    pub fn in_flight(&self) -> usize {
        self.tracker.len()
    }

    /// Resolves once the drain has been signalled and nothing tracked is left (at once if
    /// both hold already). Not bounded: the owner bounds it by its grace.
    pub fn finished(&self) -> impl Future<Output = ()> + Send + 'static {
        let tracker = self.tracker.clone();
        async move { tracker.wait().await }
    }
}

impl Drop for Drain {
    fn drop(&mut self) {
        // The watchers' `signaled` resolve on the sender's drop; `finished` futures still
        // held resolve once the work is done.
        self.tracker.close();
    }
}

// === impl Watch ===

impl Watch {
    /// Counts a piece of work until the returned value is dropped.
    #[inline]
    pub fn track(&self) -> Tracked {
        Tracked(self.tracker.token())
    }

    /// Whether the drain has started.
    pub fn is_signaled(&self) -> bool {
        *self.signaled.borrow()
    }

    /// Resolves when the drain starts (or its [`Drain`] is dropped), at once if it has.
    pub fn signaled(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut signaled = self.signaled.clone();
        async move {
            // An error is the `Drain` dropped: signalled too.
            let _ = signaled.wait_for(|s| *s).await;
        }
    }

    /// Work tracked now.
    pub fn in_flight(&self) -> usize {
        self.tracker.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const SOON: Duration = Duration::from_millis(50);
    const BOUND: Duration = Duration::from_secs(10);

    async fn resolves(f: impl Future<Output = ()>, within: Duration) -> bool {
        tokio::time::timeout(within, f).await.is_ok()
    }

    #[tokio::test]
    async fn finished_waits_for_the_signal_and_the_last_tracked_work() {
        let (drain, watch) = channel();
        let first = watch.track();
        let second = watch.clone().track();
        assert_eq!(drain.in_flight(), 2);
        assert!(!resolves(drain.finished(), SOON).await, "not signalled yet");
        drain.signal();
        assert!(drain.is_signaled() && watch.is_signaled());
        drop(first);
        assert!(!resolves(drain.finished(), SOON).await, "one left");
        let finished = tokio::spawn(drain.finished());
        drop(second);
        assert!(resolves(async { finished.await.unwrap() }, BOUND).await, "woken by the last");
        assert!(resolves(drain.finished(), SOON).await, "and stays finished");
    }

    #[tokio::test]
    async fn signaled_resolves_on_the_signal_or_when_the_drain_is_dropped() {
        let (drain, watch) = channel();
        let signaled = tokio::spawn(watch.signaled());
        assert!(!resolves(watch.signaled(), SOON).await);
        drain.signal();
        assert!(resolves(async { signaled.await.unwrap() }, BOUND).await);
        assert!(resolves(watch.signaled(), SOON).await, "at once once signalled");

        let (drain, watch) = channel();
        let later = drain.watch();
        drop(drain);
        assert!(resolves(watch.signaled(), BOUND).await);
        assert!(resolves(later.signaled(), BOUND).await);
    }
}
