//! The queue layer's wait: a slot in the service order, a bounded share per connection, and the
//! accounting of every way a wait can end (granted, refused, evicted, or the caller leaving,
//! which drops the future); and the glue that lends the queue and the sidecar's state to the
//! queue policy ([`admission_core::queue_policy`]).

use std::sync::atomic::{AtomicBool, Ordering::*};
use std::time::Duration;

use tokio::time::Instant;

use admission_core::queue_policy::{
    completion_rate, Conditions, Door, QueuePolicy, Rates, Step, Verdict, Waiter, Waiters,
};
use admission_core::Priority;

use super::{ConnState, Inbound};
use crate::app_client::AppClient;
use crate::inflight::{InflightLimit, NoSlot, Slot};

/// A request's place in the queue; whatever ends the wait is accounted for on drop.
struct Waiting<'a, A> {
    inbound: &'a Inbound<A>,
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

impl<A: AppClient> Inbound<A> {
    /// Waits for an in-flight slot in the service order (priority order, the urgent first
    /// while the level does not bind). `Err` = refused (queue full or this connection's
    /// share used up) or evicted by a more important newcomer. In shadow mode a full queue
    /// neither refuses nor evicts; the flag says it would have.
    pub(super) async fn wait_for_slot(
        &self,
        conn: &ConnState,
        waiter: &Waiter,
        refused: &AtomicBool,
    ) -> Result<(Slot, bool), ()> {
        let priority = waiter.priority;
        let clock = self.shared.engine.clock();
        let expiry = Some(clock.instant_at(self.queue_policy.expiry(waiter)));
        let share_used = conn.queued.fetch_add(1, AcqRel) >= self.max_queued_per_connection;
        let mut waiting =
            Waiting { inbound: self, conn, refused, since: Instant::now(), ended: None };
        if share_used && !self.shadow() {
            waiting.ended = Some(Ended::QueueFull);
            return Err(());
        }
        let limit = &self.shared.limit;
        if self.shadow() {
            let (slot, over) = limit.slot_past_bound(priority, expiry).await;
            waiting.ended = Some(Ended::Granted);
            return Ok((slot, over || share_used));
        }
        match limit.slot_until(priority, expiry).await {
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

impl<A> Drop for Waiting<'_, A> {
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

// === the queue policy's glue ===

/// The queue policy's view of this sidecar's pending queue: the in-flight limit's waiters,
/// and what the completion rate is made of (read only when a wait must be predicted).
pub(super) struct SidecarQueue<'a, R> {
    pub(super) limit: &'a InflightLimit,
    pub(super) rates: R,
}

impl<R: Fn() -> Rates> Waiters for SidecarQueue<'_, R> {
    fn waiting_ahead_of(&self, p: Priority) -> usize {
        self.limit.waiting_ahead_of(p)
    }

    fn less_important_waiting(&self, p: Priority) -> bool {
        self.limit.less_important_waiting(p)
    }

    fn evict_less_important_than(&mut self, bound: Priority) {
        self.limit.evict_less_important_than(bound);
    }

    fn rates(&self) -> Rates {
        (self.rates)()
    }
}

impl<A: AppClient> Inbound<A> {
    /// The request as the queue policy sees it, on the engine's clock.
    pub(super) fn waiter(&self, priority: Priority, arrival: Instant, deadline: Instant) -> Waiter {
        let clock = self.shared.engine.clock();
        let (arrival, deadline) = (arrival.into_std(), deadline.into_std());
        Waiter { priority, arrival: clock.nanos_at(arrival), deadline: clock.nanos_at(deadline) }
    }

    /// What the sidecar knows at `now`.
    pub(super) fn conditions(&self, now: Instant) -> Conditions {
        let engine = &self.shared.engine;
        Conditions {
            now: engine.clock().nanos_at(now.into_std()),
            level: engine.level(),
            level_binds: engine.level_binds(),
            typical_app: nanos(self.shared.app_time.typical()),
        }
    }

    fn sidecar_queue(&self) -> SidecarQueue<'_, impl Fn() -> Rates + '_> {
        let shared = &self.shared;
        SidecarQueue {
            limit: &shared.limit,
            rates: move || Rates {
                capacity_estimate: shared.engine.capacity_estimate(),
                best_recent: shared.control.status().completions_per_sec,
                inflight_limit: shared.limit.limit(),
            },
        }
    }

    /// The door, for a request that found no free slot. It also refreshes the queue's
    /// urgency horizon: every request that may queue passes here, and while the queue is
    /// empty its order does not matter.
    pub(super) fn door(&self, waiter: &Waiter) -> Door {
        let queue = self.sidecar_queue();
        let at = self.conditions(Instant::now());
        self.refresh_service_order(&at, &queue);
        door_turn(&self.queue_policy, waiter, &at, &queue)
    }

    /// Tells the queue the service order's horizon and FIFO depth now (none while the
    /// level binds).
    fn refresh_service_order(&self, at: &Conditions, queue: &SidecarQueue<'_, impl Fn() -> Rates>) {
        let horizon = self.queue_policy.urgency_horizon(at).map(Duration::from_nanos);
        self.shared.limit.set_urgency_horizon(horizon);
        // (The rates are a lock away: not asked while the level binds, when it is zero.)
        let fifo = if at.level_binds {
            0
        } else {
            self.queue_policy.fifo_depth(at, completion_rate(queue.rates(), at.typical_app))
        };
        self.shared.limit.set_fifo_depth(fifo);
    }

    /// The waiter's timer: resolves with the verdict that ends its wait (its budget gone, or
    /// the max wait waited out while the level binds, after it evicted the less important
    /// behind it); never in shadow mode.
    pub(super) async fn refused_while_waiting(&self, waiter: &Waiter) -> Verdict {
        let policy = &self.queue_policy;
        let clock = *self.shared.engine.clock();
        let Some(mut at) = policy.first_check(waiter, &self.conditions(Instant::now())) else {
            return std::future::pending().await;
        };
        loop {
            tokio::time::sleep_until(Instant::from_std(clock.instant_at(at))).await;
            let now = self.conditions(Instant::now());
            let mut queue = self.sidecar_queue();
            self.refresh_service_order(&now, &queue);
            match timer_turn(policy, waiter, &now, &mut queue) {
                Step::Refuse(verdict) => return verdict,
                Step::CheckAt(next) => at = next,
            }
        }
    }
}

/// The glue's decision at the door, callable without a runtime (see the tests, which hold
/// it against the simulator's).
pub(super) fn door_turn<R: Fn() -> Rates>(
    policy: &QueuePolicy,
    waiter: &Waiter,
    at: &Conditions,
    queue: &SidecarQueue<'_, R>,
) -> Door {
    policy.door(waiter, at, queue)
}

/// One turn of a waiter's timer, callable without a runtime: evictions happen in the
/// in-flight limit's queue (the evicted waiters' futures end in `NoSlot::Evicted`).
pub(super) fn timer_turn<R: Fn() -> Rates>(
    policy: &QueuePolicy,
    waiter: &Waiter,
    at: &Conditions,
    queue: &mut SidecarQueue<'_, R>,
) -> Step {
    policy.on_timer(waiter, at, queue)
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

#[cfg(test)]
mod tests;
