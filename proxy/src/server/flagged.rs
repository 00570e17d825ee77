//! A future polled again only when it has asked to be (its own wake-up), not on every wake-up
//! of the task around it.
//!
//! The connection driver's `select!` polls its idle/header-read timer and its drain watch
//! each time the connection's task runs, which is twice per HTTP/1.1 request (the caller's
//! request, the app's response): each poll of a `Sleep` re-registers the task's waker with
//! the time driver, each poll of the watch re-registers with its `Notify` (together ~600
//! instructions per request, for events that come once per connection). [`Flagged`] polls
//! the inner future with a waker of its own that records the wake-up and passes it on to the
//! task; until that waker fires (or the task's waker changes, or the inner future is
//! touched through [`Flagged::get_mut`]) another poll answers `Pending` from one atomic flag.
//! Nothing is missed: the inner future is polled after every wake-up it asked for.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

/// See the module's documentation. `F: Unpin` (pin a `Sleep` in a `Box`, or use a boxed
/// future).
pub(super) struct Flagged<F> {
    inner: F,
    flag: Arc<Flag>,
    /// The waker handed to `inner` (wakes `flag`).
    waker: Waker,
    /// The task's waker `flag` passes wake-ups on to, as of the last real poll.
    task: Option<Waker>,
}

struct Flag {
    /// `inner` asked to be polled since its last poll.
    woken: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(task) = task {
            task.wake();
        }
    }
}

impl<F: Future + Unpin> Flagged<F> {
    pub(super) fn new(inner: F) -> Self {
        let flag = Arc::new(Flag { woken: AtomicBool::new(true), task: Mutex::new(None) });
        let waker = Waker::from(flag.clone());
        Flagged { inner, flag, waker, task: None }
    }

    /// The inner future, to change it (a timer reset): it is polled on the next poll.
    pub(super) fn get_mut(&mut self) -> &mut F {
        self.flag.woken.store(true, Ordering::Relaxed);
        &mut self.inner
    }
}

impl<F: Future + Unpin> Future for Flagged<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let same_task = this.task.as_ref().is_some_and(|t| t.will_wake(cx.waker()));
        if !same_task {
            let task = cx.waker().clone();
            *this.flag.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task.clone());
            this.task = Some(task);
        } else if !this.flag.woken.swap(false, Ordering::Acquire) {
            return Poll::Pending;
        }
        this.flag.woken.store(false, Ordering::Relaxed);
        Pin::new(&mut this.inner).poll(&mut Context::from_waker(&this.waker))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;

    /// A flagged timer polled on every tick of something else still fires at its deadline,
    /// is polled only when it asked to be, and fires again at a deadline it was reset to.
    #[tokio::test(start_paused = true)]
    async fn polled_only_when_woken_and_never_late() {
        let start = Instant::now();
        let mut timer = Flagged::new(Box::pin(tokio::time::sleep(Duration::from_millis(30))));
        let mut ticks = tokio::time::interval(Duration::from_millis(7));
        let mut woken = 0;
        for deadline_ms in [30, 75] {
            loop {
                tokio::select! {
                    biased;
                    () = &mut timer => break,
                    _ = ticks.tick() => woken += 1,
                }
            }
            assert_eq!(Instant::now() - start, Duration::from_millis(deadline_ms));
            timer.get_mut().as_mut().reset(start + Duration::from_millis(75));
        }
        assert!(woken >= 8, "polled between ({woken})");
    }

    /// A watch-like event fired from another task wakes the flagged future's task.
    #[tokio::test]
    async fn an_event_from_elsewhere_is_not_missed() {
        let (tx, mut rx) = tokio::sync::watch::channel(false);
        let event = Box::pin(async move {
            let _ = rx.wait_for(|v| *v).await;
        });
        let mut event = Flagged::new(event);
        let mut ticks = tokio::time::interval(Duration::from_millis(1));
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let _ = tx.send(true);
            std::future::pending::<()>().await;
        });
        let waited = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                tokio::select! {
                    biased;
                    () = &mut event => break,
                    _ = ticks.tick() => {}
                }
            }
        })
        .await;
        assert!(waited.is_ok(), "the event was missed");
    }
}
