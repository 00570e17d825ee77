//! The app's pending queue: at most `max_inflight` requests go to the app at once, at most
//! `max_queued` wait for a slot. A freed slot goes to the most important waiting request
//! (FIFO within one compound priority), and a full queue makes room for a newcomer by
//! evicting its least important waiter if that one is less important than the newcomer.
//! During a load step, before the admission level has cut, this keeps the most important
//! class from waiting (and timing out) behind the backlog of everyone else. While the level
//! does not bind, a short queue (one the app drains well within the budget) is served
//! oldest first, as the app's own queue would, and in a longer one a waiter whose budget is
//! about to run out is urgent and served first (the queue policy's service order,
//! [`serve_next`](admission_core::queue_policy::serve_next)): a burst on a healthy app
//! neither stretches its least important waiters' tail nor starves them into giving up. The
//! sidecar sets the urgency horizon ([`InflightLimit::set_urgency_horizon`]) and the FIFO
//! depth ([`InflightLimit::set_fifo_depth`]) from the policy as it goes.
//!
//! The order does not change the mean wait: the queue is work-conserving (a slot never
//! idles while someone waits), so the mean queuing time the detector averages is the same
//! as FIFO's; only who waits changes. The limit can change at run time (the adaptive limit
//! drives it).
//!
//! A request whose app is waiting on a downstream call (seen by the egress role) lends its
//! slot: the limit bounds the requests the app is working on, not those it waits for, so a
//! slow downstream does not hold the app's own work back. Lent or not, no more than the
//! ceiling (`max_inflight`) are ever at the app.
//!
//! The common case costs no lock: while nobody waits, taking a slot is a compare-exchange
//! below the limit and giving it back is one decrement. The queue sits behind one short
//! mutex, taken only when somebody waits: a release then hands the slot to the most
//! important waiter under it. A release that races with a newcomer entering the queue
//! cannot strand it: the releaser decrements `inflight` and then reads `waiters`, the
//! newcomer publishes itself in `waiters` and then reads `inflight` (both sequentially
//! consistent), so at least one of them sees the other and grants the slot.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use admission_core::queue_policy::Service;
use admission_core::Priority;

use waiting::{Outcome, Ticket, Waiting};

mod waiting;

/// The in-flight limit and the bounded queue in front of it.
#[derive(Debug)]
pub struct InflightLimit {
    /// Slots held, including any beyond a lowered limit until they are released. Only ever
    /// raised by [`InflightLimit::try_take`] (so it passes `limit` only when the limit drops).
    inflight: AtomicUsize,
    limit: AtomicUsize,
    /// Slots lent by requests waiting on a downstream: they do not count against `limit`...
    lent: AtomicUsize,
    /// ...but everything held does against this.
    ceiling: AtomicUsize,
    /// `state.waiting.len()`, written under the lock, read without it by the fast paths.
    waiters: AtomicUsize,
    /// The urgency horizon in nanoseconds plus one; zero: none (the level binds, or nobody
    /// set one), priority order only.
    urgency: AtomicU64,
    /// While at most this many wait, the oldest is served first (zero: never; the queue
    /// policy's [`fifo_depth`](admission_core::queue_policy::QueuePolicy::fifo_depth)).
    fifo_up_to: AtomicUsize,
    /// A request the level refuses may still take a free slot while fewer than this are
    /// at the app (zero: never); see [`InflightLimit::try_idle_slot`].
    idle_below: AtomicUsize,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    max_queued: usize,
    waiting: Waiting,
}

/// A slot to the app; released on drop (to the next waiter, if any).
#[derive(Debug)]
pub struct Slot {
    owner: Arc<InflightLimit>,
}

/// Why no slot was granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoSlot {
    /// The queue was full of requests at least as important.
    QueueFull,
    /// A more important request took this one's place in the full queue.
    Evicted,
}

// === impl InflightLimit ===

impl InflightLimit {
    pub fn new(max_inflight: usize, max_queued: usize) -> Arc<Self> {
        Arc::new(InflightLimit {
            inflight: AtomicUsize::new(0),
            limit: AtomicUsize::new(max_inflight.max(1)),
            lent: AtomicUsize::new(0),
            ceiling: AtomicUsize::new(max_inflight.max(1)),
            waiters: AtomicUsize::new(0),
            urgency: AtomicU64::new(0),
            fifo_up_to: AtomicUsize::new(0),
            idle_below: AtomicUsize::new(0),
            state: Mutex::new(State { max_queued, waiting: Waiting::default() }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing under the lock can panic midway; a poisoned lock still holds consistent state.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn limit(&self) -> usize {
        self.limit.load(SeqCst)
    }

    /// How close to its expiry a waiter is served ahead of the rest (the queue policy's
    /// [`urgency_horizon`](admission_core::queue_policy::QueuePolicy::urgency_horizon));
    /// `None`: priority order only.
    pub fn set_urgency_horizon(&self, horizon: Option<Duration>) {
        let encoded = horizon
            .map_or(0, |h| u64::try_from(h.as_nanos()).unwrap_or(u64::MAX - 1).saturating_add(1));
        self.urgency.store(encoded, SeqCst);
    }

    /// While at most `n` wait, the oldest is served first (the queue policy's
    /// [`fifo_depth`](admission_core::queue_policy::QueuePolicy::fifo_depth)); zero: never.
    pub fn set_fifo_depth(&self, n: usize) {
        self.fifo_up_to.store(n, SeqCst);
    }

    /// The service order's inputs now: the urgency bound (a waiter whose expiry is before it
    /// is urgent) and the FIFO depth.
    fn service(&self) -> Service<Instant> {
        let urgent_until = match self.urgency.load(SeqCst) {
            0 => None,
            encoded => {
                let now = tokio::time::Instant::now().into_std();
                now.checked_add(Duration::from_nanos(encoded - 1))
            }
        };
        Service { urgent_until, fifo_up_to: self.fifo_up_to.load(SeqCst) }
    }

    pub fn max_queued(&self) -> usize {
        self.state().max_queued
    }

    /// When the request that has waited longest joined the queue; `None` when empty.
    pub fn oldest_waiting_since(&self) -> Option<std::time::Instant> {
        self.state().waiting.oldest_since()
    }

    /// Requests waiting that would be served before a newcomer at `p` (as or more important).
    pub fn waiting_ahead_of(&self, p: Priority) -> usize {
        self.state().waiting.ahead_of(p)
    }

    /// Whether a request less important than `p` is waiting.
    pub fn less_important_waiting(&self, p: Priority) -> bool {
        self.state().waiting.any_less_important_than(p)
    }

    /// Evicts every waiter less important than `p` (their waits end in
    /// [`NoSlot::Evicted`]); how many. A waiter at `p` that has waited out the max wait
    /// calls it: everything behind it would wait longer still, and it may not be dropped
    /// while they wait.
    pub fn evict_less_important_than(&self, p: Priority) -> usize {
        let (mut wake, mut evicted) = (Vec::new(), 0);
        {
            let mut state = self.state();
            while let Some(waker) = state.waiting.evict_less_important_than(p) {
                wake.extend(waker);
                evicted += 1;
            }
            self.waiters.store(state.waiting.len(), SeqCst);
        }
        wake.into_iter().for_each(Waker::wake);
        evicted
    }

    /// Requests waiting for a slot now.
    pub fn queued(&self) -> usize {
        self.waiters.load(SeqCst)
    }

    /// Requests holding a slot now.
    pub fn inflight(&self) -> usize {
        self.inflight.load(SeqCst)
    }

    /// Requests holding a slot that the app is working on (not lent).
    pub fn held(&self) -> usize {
        self.inflight.load(SeqCst).saturating_sub(self.lent.load(SeqCst))
    }

    /// Slots lent now.
    pub fn lent(&self) -> usize {
        self.lent.load(SeqCst)
    }

    /// A request at the app now waits on a downstream: its slot counts against the ceiling
    /// only, and may go to a waiter.
    pub fn lend(&self) {
        self.lent.fetch_add(1, SeqCst);
        if self.waiters.load(SeqCst) > 0 {
            let mut wake = Vec::new();
            self.grant_locked(&mut self.state(), &mut wake);
            wake.into_iter().for_each(Waker::wake);
        }
    }

    /// The downstream answered: the slot counts against the limit again (slots beyond it
    /// are retired as their requests finish).
    pub fn unlend(&self) {
        let _ = self.lent.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1));
    }

    /// The hard cap on slots held, lent ones included.
    pub fn ceiling(&self) -> usize {
        self.ceiling.load(SeqCst)
    }

    pub fn set_ceiling(&self, n: usize) {
        let before = self.ceiling.swap(n.max(1), SeqCst);
        if n > before {
            let mut wake = Vec::new();
            self.grant_locked(&mut self.state(), &mut wake);
            wake.into_iter().for_each(Waker::wake);
        }
    }

    /// Takes a slot if one is free under the limit (plus what is lent, within the ceiling).
    fn try_take(&self) -> bool {
        let mut held = self.inflight.load(SeqCst);
        loop {
            let cap =
                (self.limit.load(SeqCst) + self.lent.load(SeqCst)).min(self.ceiling.load(SeqCst));
            if held >= cap {
                return false;
            }
            match self.inflight.compare_exchange_weak(held, held + 1, SeqCst, SeqCst) {
                Ok(_) => return true,
                Err(now) => held = now,
            }
        }
    }

    /// Under the lock: grants free slots to the next waiters in the service order; their
    /// wakers.
    fn grant_locked(&self, state: &mut State, wake: &mut impl Extend<Waker>) {
        let service = self.service();
        while !state.waiting.is_empty() && self.try_take() {
            if let Some(waker) = state.waiting.grant_next(service) {
                wake.extend(waker);
            }
        }
        self.waiters.store(state.waiting.len(), SeqCst);
    }

    /// Under the lock: publishes the queue length and then grants what the releases that
    /// could not see the newest waiter left free; the one waker to wake, if any (a newcomer
    /// arriving to a free slot is at most one grant).
    fn publish_and_grant(&self, state: &mut State) -> Option<Waker> {
        let mut wake: Option<Waker> = None;
        self.waiters.store(state.waiting.len(), SeqCst);
        let mut service = None;
        while !state.waiting.is_empty() && self.try_take() {
            // (Read once, and only when a slot is free: most calls grant nothing.)
            let service = *service.get_or_insert_with(|| self.service());
            if let Some(Some(waker)) = state.waiting.grant_next(service) {
                if let Some(previous) = wake.replace(waker) {
                    previous.wake();
                }
            }
        }
        self.waiters.store(state.waiting.len(), SeqCst);
        wake
    }

    /// Changes the in-flight limit; effective at once. Slots in use beyond a lowered limit
    /// are retired as their requests finish.
    pub fn set_limit(&self, new: usize) {
        self.limit.store(new.max(1), SeqCst);
        // A limit set above the ceiling (by hand) is the ceiling from now on.
        self.ceiling.fetch_max(new.max(1), SeqCst);
        let mut wake = Vec::new();
        self.grant_locked(&mut self.state(), &mut wake);
        wake.into_iter().for_each(Waker::wake);
    }

    pub fn set_max_queued(&self, n: usize) {
        self.state().max_queued = n;
    }

    /// A slot right away, without queuing, if one is free and nobody waits for it.
    pub fn try_slot(self: &Arc<Self>) -> Option<Slot> {
        if self.waiters.load(SeqCst) == 0 && self.try_take() {
            return Some(Slot { owner: self.clone() });
        }
        None
    }

    /// How many the app serves at once without a queue, as far as the adaptive limit has
    /// measured it (zero: not known, or not to be used): the bound of
    /// [`InflightLimit::try_idle_slot`].
    pub fn set_idle_below(&self, n: usize) {
        self.idle_below.store(n, SeqCst);
    }

    /// A slot for a request the level refused, if the app has a worker idle: nobody waits
    /// and fewer than the [`set_idle_below`](InflightLimit::set_idle_below) bound are at
    /// the app. Refusing it would leave that worker idle and protect no one; the queue is
    /// empty, so no more important request waits behind it.
    pub fn try_idle_slot(self: &Arc<Self>) -> Option<Slot> {
        let below = self.idle_below.load(SeqCst);
        if below == 0 || self.waiters.load(SeqCst) != 0 {
            return None;
        }
        let mut held = self.inflight.load(SeqCst);
        loop {
            let cap = (self.limit.load(SeqCst) + self.lent.load(SeqCst))
                .min(self.ceiling.load(SeqCst))
                .min(below);
            if held >= cap {
                return None;
            }
            match self.inflight.compare_exchange_weak(held, held + 1, SeqCst, SeqCst) {
                Ok(_) => return Some(Slot { owner: self.clone() }),
                Err(now) => held = now,
            }
        }
    }

    /// Waits for a slot in priority order, never urgent (see [`InflightLimit::slot_until`]).
    pub async fn slot(self: &Arc<Self>, priority: Priority) -> Result<Slot, NoSlot> {
        self.slot_until(priority, None).await
    }

    /// Waits for a slot in the service order, urgent once `expiry` (the end of its budget)
    /// is within the urgency horizon. A full queue evicts its least important waiter for a
    /// more important newcomer, and refuses the newcomer otherwise. Dropping the future
    /// (client gone, shutdown) leaves the queue.
    pub async fn slot_until(
        self: &Arc<Self>,
        priority: Priority,
        expiry: Option<Instant>,
    ) -> Result<Slot, NoSlot> {
        if let Some(slot) = self.try_slot() {
            return Ok(slot);
        }
        let (ticket, evicted, granted) = {
            let mut state = self.state();
            if state.waiting.is_empty() && self.try_take() {
                return Ok(Slot { owner: self.clone() });
            }
            let mut evicted = None;
            if state.waiting.len() >= state.max_queued {
                match state.waiting.evict_less_important_than(priority) {
                    Some(waker) => evicted = waker,
                    None => return Err(NoSlot::QueueFull),
                }
            }
            let ticket = state.waiting.push(priority, expiry);
            (ticket, evicted, self.publish_and_grant(&mut state))
        };
        evicted.into_iter().chain(granted).for_each(Waker::wake);
        match (Wait { owner: self, ticket: Some(ticket) }).await {
            Outcome::Granted => Ok(Slot { owner: self.clone() }),
            Outcome::Evicted => Err(NoSlot::Evicted),
        }
    }

    /// Shadow mode: waits for a slot even past `max_queued`; says whether the bound was
    /// exceeded (the request would have been refused, or would have evicted someone).
    pub async fn slot_past_bound(
        self: &Arc<Self>,
        priority: Priority,
        expiry: Option<Instant>,
    ) -> (Slot, bool) {
        let mut over = false;
        loop {
            if let Some(slot) = self.try_slot() {
                return (slot, over);
            }
            let (ticket, granted) = {
                let mut state = self.state();
                if state.waiting.is_empty() && self.try_take() {
                    return (Slot { owner: self.clone() }, over);
                }
                over |= state.waiting.len() >= state.max_queued;
                let ticket = state.waiting.push(priority, expiry);
                (ticket, self.publish_and_grant(&mut state))
            };
            if let Some(waker) = granted {
                waker.wake();
            }
            // Only an enforcing waiter evicts; should the mode change meanwhile, queue again.
            if (Wait { owner: self, ticket: Some(ticket) }).await == Outcome::Granted {
                return (Slot { owner: self.clone() }, over);
            }
        }
    }

    /// Gives a slot back: to the next waiter in the service order if the limit allows, else
    /// free.
    fn release(&self) {
        self.inflight.fetch_sub(1, SeqCst);
        if self.waiters.load(SeqCst) == 0 {
            return;
        }
        let granted = self.publish_and_grant(&mut self.state());
        if let Some(waker) = granted {
            waker.wake();
        }
    }
}

// === impl Slot ===

impl Drop for Slot {
    fn drop(&mut self) {
        self.owner.release();
    }
}

/// One waiter's turn; leaving early (drop) removes it from the queue.
struct Wait<'a> {
    owner: &'a Arc<InflightLimit>,
    ticket: Option<Ticket>,
}

impl Future for Wait<'_> {
    type Output = Outcome;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        let Some(ticket) = self.ticket else { return Poll::Ready(Outcome::Evicted) };
        let polled = self.owner.state().waiting.poll(ticket, cx);
        if polled.is_ready() {
            self.ticket = None;
        }
        polled
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket.take() else { return };
        let left = {
            let mut state = self.owner.state();
            let left = state.waiting.leave(ticket);
            self.owner.waiters.store(state.waiting.len(), SeqCst);
            left
        };
        if left == Some(Outcome::Granted) {
            // Granted but never taken: pass the slot on.
            self.owner.release();
        }
    }
}

#[cfg(test)]
mod tests;
