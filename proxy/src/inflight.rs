//! The app's pending queue: at most `max_inflight` requests go to the app at once, at most
//! `max_queued` wait (FIFO) for a slot. The limit can change at run time (the adaptive limit
//! that follows will drive it), so it is a semaphore whose permits can be added or retired.

use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The in-flight limit and the bounded queue in front of it.
#[derive(Debug)]
pub struct InflightLimit {
    slots: Arc<Semaphore>,
    /// The current limit.
    limit: AtomicUsize,
    /// Permits still to retire after a decrease that found them in use.
    retire: AtomicUsize,
    queued: AtomicUsize,
    max_queued: AtomicUsize,
}

/// A slot to the app; released (or retired, after a decrease) on drop.
#[derive(Debug)]
pub struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    owner: Arc<InflightLimit>,
}

/// Why no slot was granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueFull {
    Full,
}

// === impl InflightLimit ===

impl InflightLimit {
    pub fn new(max_inflight: usize, max_queued: usize) -> Arc<Self> {
        Arc::new(InflightLimit {
            slots: Arc::new(Semaphore::new(max_inflight)),
            limit: AtomicUsize::new(max_inflight),
            retire: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
            max_queued: AtomicUsize::new(max_queued),
        })
    }

    pub fn limit(&self) -> usize {
        self.limit.load(Relaxed)
    }

    pub fn max_queued(&self) -> usize {
        self.max_queued.load(Relaxed)
    }

    /// Requests waiting for a slot now.
    pub fn queued(&self) -> usize {
        self.queued.load(Relaxed)
    }

    /// Requests holding a slot now.
    pub fn inflight(&self) -> usize {
        let limit = self.limit.load(Relaxed) + self.retire.load(Relaxed);
        limit.saturating_sub(self.slots.available_permits())
    }

    /// Changes the in-flight limit; effective for the next dispatch. Slots in use beyond a
    /// lowered limit are retired as their requests finish.
    pub fn set_limit(&self, new: usize) {
        let new = new.max(1);
        let old = self.limit.swap(new, AcqRel);
        if new > old {
            let mut grow = new - old;
            // Cancel pending retirements first: those slots are still in use.
            while grow > 0 {
                let owed = self.retire.load(Acquire);
                if owed == 0 {
                    break;
                }
                let take = owed.min(grow);
                if self.retire.compare_exchange(owed, owed - take, AcqRel, Acquire).is_ok() {
                    grow -= take;
                }
            }
            self.slots.add_permits(grow);
        } else if old > new {
            let shrink = old - new;
            let retired_now = self.slots.forget_permits(shrink);
            self.retire.fetch_add(shrink - retired_now, AcqRel);
        }
    }

    pub fn set_max_queued(&self, n: usize) {
        self.max_queued.store(n, Relaxed);
    }

    /// A slot right away, without queuing, if one is free.
    pub fn try_slot(self: &Arc<Self>) -> Option<Slot> {
        let permit = self.slots.clone().try_acquire_owned().ok()?;
        Some(Slot { permit: Some(permit), owner: self.clone() })
    }

    /// Waits in FIFO order for a slot, or refuses at once when the queue is full.
    /// Dropping the future (client gone, shutdown) leaves the queue.
    pub async fn slot(self: &Arc<Self>) -> Result<Slot, QueueFull> {
        match self.queue(true).await {
            (Some(slot), _) => Ok(slot),
            (None, _) => Err(QueueFull::Full),
        }
    }

    /// Shadow mode: waits for a slot even past `max_queued`; says whether the bound was
    /// exceeded (the request would have been refused).
    pub async fn slot_past_bound(self: &Arc<Self>) -> (Slot, bool) {
        loop {
            if let (Some(slot), over) = self.queue(false).await {
                return (slot, over);
            }
        }
    }

    async fn queue(self: &Arc<Self>, enforce_bound: bool) -> (Option<Slot>, bool) {
        if let Some(slot) = self.try_slot() {
            return (Some(slot), false);
        }
        let waiting = self.queued.fetch_add(1, AcqRel);
        let _leave = QueuedGuard(&self.queued);
        let over = waiting >= self.max_queued.load(Relaxed);
        if over && enforce_bound {
            return (None, true);
        }
        // The semaphore is never closed, so acquiring cannot fail.
        match self.slots.clone().acquire_owned().await {
            Ok(permit) => (Some(Slot { permit: Some(permit), owner: self.clone() }), over),
            Err(_) => (None, over),
        }
    }
}

struct QueuedGuard<'a>(&'a AtomicUsize);

impl Drop for QueuedGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, AcqRel);
    }
}

// === impl Slot ===

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else { return };
        let mut owed = self.owner.retire.load(Acquire);
        while owed > 0 {
            match self.owner.retire.compare_exchange(owed, owed - 1, AcqRel, Acquire) {
                Ok(_) => {
                    permit.forget();
                    return;
                }
                Err(now) => owed = now,
            }
        }
    }
}

#[cfg(test)]
mod tests;
