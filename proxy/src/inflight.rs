//! The app's pending queue: at most `max_inflight` requests go to the app at once, at most
//! `max_queued` wait for a slot. A freed slot goes to the most important waiting request
//! (FIFO within one compound priority), and a full queue makes room for a newcomer by
//! evicting its least important waiter if that one is less important than the newcomer.
//! During a load step, before the admission level has cut, this keeps the most important
//! class from waiting (and timing out) behind the backlog of everyone else.
//!
//! The order does not change the mean wait: the queue is work-conserving (a slot never
//! idles while someone waits), so the mean queuing time the detector averages is the same
//! as FIFO's; only who waits changes. The limit can change at run time (the adaptive limit
//! that follows will drive it).
//!
//! Everything sits behind one short mutex: a free slot costs a lock and a counter, and a
//! release hands the slot to the next waiter under the same lock, so no newcomer can slip
//! past the queue.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use admission_core::Priority;

use waiting::{Outcome, Ticket, Waiting};

mod waiting;

/// The in-flight limit and the bounded queue in front of it.
#[derive(Debug)]
pub struct InflightLimit {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    limit: usize,
    /// Slots held, including any beyond a lowered limit until they are released.
    inflight: usize,
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
            state: Mutex::new(State {
                limit: max_inflight.max(1),
                inflight: 0,
                max_queued,
                waiting: Waiting::default(),
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing under the lock can panic midway; a poisoned lock still holds consistent state.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn limit(&self) -> usize {
        self.state().limit
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

    /// Requests waiting for a slot now.
    pub fn queued(&self) -> usize {
        self.state().waiting.len()
    }

    /// Requests holding a slot now.
    pub fn inflight(&self) -> usize {
        self.state().inflight
    }

    /// Changes the in-flight limit; effective at once. Slots in use beyond a lowered limit
    /// are retired as their requests finish.
    pub fn set_limit(&self, new: usize) {
        let mut state = self.state();
        state.limit = new.max(1);
        let mut wake = Vec::new();
        while state.inflight < state.limit {
            match state.waiting.grant_most_important() {
                Some(waker) => {
                    state.inflight += 1;
                    wake.extend(waker);
                }
                None => break,
            }
        }
        drop(state);
        wake.into_iter().for_each(|w| w.wake());
    }

    pub fn set_max_queued(&self, n: usize) {
        self.state().max_queued = n;
    }

    /// A slot right away, without queuing, if one is free and nobody waits for it.
    pub fn try_slot(self: &Arc<Self>) -> Option<Slot> {
        let mut state = self.state();
        if state.inflight < state.limit && state.waiting.is_empty() {
            state.inflight += 1;
            return Some(Slot { owner: self.clone() });
        }
        None
    }

    /// Waits for a slot in priority order. A full queue evicts its least important waiter
    /// for a more important newcomer, and refuses the newcomer otherwise. Dropping the
    /// future (client gone, shutdown) leaves the queue.
    pub async fn slot(self: &Arc<Self>, priority: Priority) -> Result<Slot, NoSlot> {
        let (ticket, evicted) = {
            let mut state = self.state();
            if state.inflight < state.limit && state.waiting.is_empty() {
                state.inflight += 1;
                return Ok(Slot { owner: self.clone() });
            }
            let mut evicted = None;
            if state.waiting.len() >= state.max_queued {
                match state.waiting.evict_less_important_than(priority) {
                    Some(waker) => evicted = waker,
                    None => return Err(NoSlot::QueueFull),
                }
            }
            (state.waiting.push(priority), evicted)
        };
        if let Some(waker) = evicted {
            waker.wake();
        }
        match (Wait { owner: self, ticket: Some(ticket) }).await {
            Outcome::Granted => Ok(Slot { owner: self.clone() }),
            Outcome::Evicted => Err(NoSlot::Evicted),
        }
    }

    /// Shadow mode: waits for a slot even past `max_queued`; says whether the bound was
    /// exceeded (the request would have been refused, or would have evicted someone).
    pub async fn slot_past_bound(self: &Arc<Self>, priority: Priority) -> (Slot, bool) {
        let mut over = false;
        loop {
            let ticket = {
                let mut state = self.state();
                if state.inflight < state.limit && state.waiting.is_empty() {
                    state.inflight += 1;
                    return (Slot { owner: self.clone() }, over);
                }
                over |= state.waiting.len() >= state.max_queued;
                state.waiting.push(priority)
            };
            // Only an enforcing waiter evicts; should the mode change meanwhile, queue again.
            if (Wait { owner: self, ticket: Some(ticket) }).await == Outcome::Granted {
                return (Slot { owner: self.clone() }, over);
            }
        }
    }

    /// Gives a slot back: to the most important waiter if the limit allows, else free.
    fn release(&self) {
        let mut state = self.state();
        state.inflight -= 1;
        let mut next = None;
        if state.inflight < state.limit {
            if let Some(waker) = state.waiting.grant_most_important() {
                state.inflight += 1;
                next = waker;
            }
        }
        drop(state);
        if let Some(waker) = next {
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
        let left = self.owner.state().waiting.leave(ticket);
        if left == Some(Outcome::Granted) {
            // Granted but never taken: pass the slot on.
            self.owner.release();
        }
    }
}

#[cfg(test)]
mod tests;
