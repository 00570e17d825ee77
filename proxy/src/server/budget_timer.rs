//! One timer per connection for the requests' budgets, lent to each request in turn.
//!
//! A request's wait for the app (its response head, and a small body read whole) is bounded
//! by its deadline. A fresh `Sleep` per request is inserted into tokio's timer wheel on its
//! first poll and removed again when dropped: two passes through the time driver's lock and
//! wheel on every request, though almost every request ends long before its deadline. An
//! HTTP/1.1 connection serves one request at a time, so the connection keeps one `Sleep`
//! and lends it to each request, which moves its deadline to its own. A later deadline than
//! the one registered only moves the entry's expiry (tokio re-files it when the wheel
//! reaches the old slot), so under steady traffic a request costs no wheel operation at all;
//! an earlier one, or one after the previous deadline passed, registers it again, as a fresh
//! `Sleep` would. The bound is the same: the timer fires at the borrowing request's
//! deadline.
//!
//! While the timer is lent (h2: another stream of the connection has it), a request gets
//! a `Sleep` of its own, as before.
//!
//! Polled again by the same task, the timer is not polled again (that re-registers the
//! task's waker with the time driver each time, ~120 instructions): once registered with a
//! waker that wakes the same task, the timer wakes that task when it fires, and asking
//! whether it has fired is enough ([`Budget::poll_expired`]).

use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

use std::future::Future;

use tokio::time::{Instant, Sleep};

/// A connection's budget timer (see the module's documentation).
#[derive(Debug, Default)]
pub struct BudgetTimer {
    slot: Mutex<Slot>,
}

#[derive(Debug, Default)]
enum Slot {
    /// No request has used it yet.
    #[default]
    Vacant,
    /// A request has it.
    Lent,
    /// Here, for the next request (its deadline is a past request's).
    Here(Pin<Box<Sleep>>),
}

/// A timer for one request's deadline: the connection's, given back when dropped, or one
/// of the request's own.
pub struct Budget<'a> {
    timer: Timer<'a>,
    /// The waker the timer was last polled with, while it has not fired.
    registered: Option<Waker>,
}

enum Timer<'a> {
    Lent { timer: Option<Pin<Box<Sleep>>>, home: &'a BudgetTimer },
    Own(Pin<Box<Sleep>>),
}

impl BudgetTimer {
    /// A timer that fires at `deadline`.
    pub fn lend(&self, deadline: Instant) -> Budget<'_> {
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *slot, Slot::Lent) {
            Slot::Here(mut timer) => {
                drop(slot);
                timer.as_mut().reset(deadline);
                Budget::new(Timer::Lent { timer: Some(timer), home: self })
            }
            Slot::Vacant => {
                drop(slot);
                let timer = Box::pin(tokio::time::sleep_until(deadline));
                Budget::new(Timer::Lent { timer: Some(timer), home: self })
            }
            Slot::Lent => {
                *slot = Slot::Lent;
                drop(slot);
                Budget::new(Timer::Own(Box::pin(tokio::time::sleep_until(deadline))))
            }
        }
    }
}

impl Budget<'_> {
    fn new(timer: Timer<'_>) -> Budget<'_> {
        Budget { timer, registered: None }
    }

    fn sleep(&mut self) -> Pin<&mut Sleep> {
        match &mut self.timer {
            Timer::Lent { timer, .. } => timer.as_mut().expect("held until dropped").as_mut(),
            Timer::Own(timer) => timer.as_mut(),
        }
    }

    /// `Ready` once the deadline has passed; until then the task polling is woken then.
    pub fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.registered.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            // Registered with this task's waker: it is woken when the timer fires.
            return if self.sleep().is_elapsed() { Poll::Ready(()) } else { Poll::Pending };
        }
        // Outside tokio's cooperative budget: a `Sleep` polled with the task's budget spent
        // answers `Pending` without registering, and the wait would then have no timer.
        let polled = std::pin::pin!(tokio::task::unconstrained(self.sleep())).poll(cx);
        self.registered = polled.is_pending().then(|| cx.waker().clone());
        polled
    }
}

impl Drop for Budget<'_> {
    fn drop(&mut self) {
        if let Timer::Lent { timer, home } = &mut self.timer {
            if let Some(timer) = timer.take() {
                let mut slot = home.slot.lock().unwrap_or_else(|p| p.into_inner());
                *slot = Slot::Here(timer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Each borrower's deadline is the one that fires, whether the timer was reused with a
    /// later deadline, an earlier one, or after the previous one had passed; a second
    /// borrower while it is lent gets its own.
    #[tokio::test(start_paused = true)]
    async fn fires_at_each_borrowers_deadline() {
        let timers = BudgetTimer::default();
        let start = Instant::now();
        for (i, after_ms) in [50u64, 80, 20, 20, 300].into_iter().enumerate() {
            let at = Instant::now() + Duration::from_millis(after_ms);
            let mut budget = timers.lend(at);
            if i == 3 {
                // Lent: a concurrent request's timer is its own, with its own deadline.
                let mut other = timers.lend(at + Duration::from_millis(5));
                assert!(matches!(other.timer, Timer::Own(_)));
                expired(&mut budget).await;
                assert_eq!(Instant::now(), at);
                expired(&mut other).await;
                assert_eq!(Instant::now(), at + Duration::from_millis(5));
                continue;
            }
            expired(&mut budget).await;
            assert_eq!(Instant::now(), at, "borrower {i}");
        }
        assert!(Instant::now() > start);
        assert!(matches!(*timers.slot.lock().unwrap(), Slot::Here(_)));
    }

    /// A request that ends before its deadline leaves no wake-up for the next: the next
    /// borrower with a later deadline waits for its own.
    #[tokio::test(start_paused = true)]
    async fn an_early_end_leaves_no_early_wakeup() {
        let timers = BudgetTimer::default();
        let first = Instant::now() + Duration::from_millis(10);
        {
            let mut budget = timers.lend(first);
            let done = tokio::time::timeout(Duration::from_millis(1), expired(&mut budget)).await;
            assert!(done.is_err(), "not yet");
        }
        let second = Instant::now() + Duration::from_millis(100);
        let mut budget = timers.lend(second);
        expired(&mut budget).await;
        assert_eq!(Instant::now(), second);
    }

    /// Polled many times by one task (woken by something else meanwhile), the timer still
    /// ends the wait at its deadline, not before.
    #[tokio::test(start_paused = true)]
    async fn repeated_polls_keep_the_deadline() {
        let timers = BudgetTimer::default();
        let at = Instant::now() + Duration::from_millis(30);
        let mut budget = timers.lend(at);
        let mut ticks = tokio::time::interval(Duration::from_millis(7));
        let mut woken = 0;
        loop {
            tokio::select! {
                biased;
                () = expired(&mut budget) => break,
                _ = ticks.tick() => woken += 1,
            }
        }
        assert_eq!(Instant::now(), at);
        assert!(woken >= 4, "polled again between ({woken})");
    }

    async fn expired(budget: &mut Budget<'_>) {
        std::future::poll_fn(|cx| budget.poll_expired(cx)).await
    }
}
