//! The queue layer's wait: a slot in priority order, a bounded share per connection, and the
//! accounting of every way a wait can end (granted, refused, evicted, or the caller leaving,
//! which drops the future).

use std::sync::atomic::{AtomicBool, Ordering::*};
use std::time::{Duration, Instant};

use admission_core::Priority;

use super::{ConnState, Inbound};
use crate::inflight::{NoSlot, Slot};

/// A request's place in the queue; whatever ends the wait is accounted for on drop.
struct Waiting<'a> {
    inbound: &'a Inbound,
    conn: &'a ConnState,
    /// Set when the sidecar itself refused the waiter (its budget ran out, or the max wait)
    /// and dropped this future: not a caller who left.
    refused: &'a AtomicBool,
    since: Instant,
    /// How the wait ended; `None` = the caller left (the future was dropped).
    ended: Option<Ended>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Ended {
    Granted,
    QueueFull,
    Evicted,
}

impl Inbound {
    /// Waits for an in-flight slot in priority order. `Err` = refused (queue full or this
    /// connection's share used up) or evicted by a more important newcomer. In shadow mode
    /// a full queue neither refuses nor evicts; the flag says it would have.
    pub(super) async fn wait_for_slot(
        &self,
        conn: &ConnState,
        priority: Priority,
        refused: &AtomicBool,
    ) -> Result<(Slot, bool), ()> {
        let share_used = conn.queued.fetch_add(1, AcqRel) >= self.max_queued_per_connection;
        let mut waiting =
            Waiting { inbound: self, conn, refused, since: Instant::now(), ended: None };
        if share_used && !self.shadow() {
            waiting.ended = Some(Ended::QueueFull);
            return Err(());
        }
        let limit = &self.shared.limit;
        if self.shadow() {
            let (slot, over) = limit.slot_past_bound(priority).await;
            waiting.ended = Some(Ended::Granted);
            return Ok((slot, over || share_used));
        }
        match limit.slot(priority).await {
            Ok(slot) => {
                waiting.ended = Some(Ended::Granted);
                Ok((slot, false))
            }
            Err(NoSlot::QueueFull) => {
                waiting.ended = Some(Ended::QueueFull);
                Err(())
            }
            Err(NoSlot::Evicted) => {
                waiting.ended = Some(Ended::Evicted);
                Err(())
            }
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.conn.queued.fetch_sub(1, AcqRel);
        let engine = &self.inbound.shared.engine;
        // A refusal by a full queue never entered it: a zero-wait sample from it would
        // dilute the very signal that says the queue is full.
        if self.ended == Some(Ended::QueueFull) {
            return;
        }
        // Every request leaving the queue counts, whatever the order it left in: the queue
        // is work-conserving, so its mean wait is the same as FIFO's.
        let waited: Duration = self.since.elapsed();
        engine.record_queuing(waited);
        self.inbound.metrics.queuing_time.record(waited.as_secs_f64());
        match self.ended {
            Some(Ended::Granted | Ended::QueueFull) => {}
            // Left without costing the app anything.
            Some(Ended::Evicted) => engine.record_gate_drop(),
            None => {
                engine.record_gate_drop();
                if !self.refused.load(Relaxed) {
                    self.inbound.metrics.queue_abandoned.increment(1);
                }
            }
        }
    }
}
