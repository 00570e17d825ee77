//! The pending queue's policy, shared by the proxy and the simulator: the door (queue or
//! refuse a request that finds no free slot), the waiter's timer (give up, evict the less
//! important behind it, or check again later), the check at dequeue, and the app's
//! completion rate those use. Pure: the caller reads the sidecar into [`Conditions`] and
//! lends its queue through [`Waiters`]; every rule itself is [`deadline_gate`]'s.
//!
//! One timer per waiter covers both ways a wait ends early: its budget no longer covers
//! the app's typical time ([`give_up_at`]), and, while the level binds, the max wait
//! (`overload_max_wait`) waited out. It first fires just past the max wait (or at the
//! give-up instant, if sooner), then every eighth of the max wait while the level binds
//! (the admitted tail depends on it) and every max wait while it does not (a stalled app
//! behind an open level keeps its waiters for their budgets: their timers must not cost
//! more than a few wake-ups each), never past the give-up instant.
//!
//! The service order ([`serve_next`], [`Service`]): while the level binds, the most important
//! waiter first (FIFO within one compound level), so an overload's backlog is the least
//! important class's. While it does not (a burst, a hiccup: nobody is being refused):
//!
//! - **A short queue is FIFO.** While the queue drains, at the app's completion rate, within
//!   half the task timeout less the app's typical time ([`QueuePolicy::fifo_depth`]), the
//!   oldest waiter goes first, as in the app's own queue: everybody in it is served well
//!   within their budget whatever the order, so a priority order would only stretch the
//!   least important class's tail (a 1.5x burst of 500 ms on a healthy app: served within
//!   ~250 ms by a FIFO, at ~375 ms by priority plus the urgent tier). Half the budget leaves
//!   room for a completion rate that is overestimated (it is the generous one the door
//!   uses) before anyone's wait nears its budget.
//! - **A longer queue is served by priority, the urgent first.** A waiter whose budget is
//!   running out is *urgent*: its give-up instant is within the urgency horizon
//!   ([`QueuePolicy::urgent_until`], a quarter of the task timeout past the app's typical
//!   time). Urgent waiters go first, most important first among them; the rest wait in
//!   priority order. So a less important waiter is served ahead of a more important one
//!   only while the more important one has more than the horizon of slack left, and once a
//!   waiter is urgent nothing less important is served before it: the rule never delays a
//!   more important waiter past its own give-up. In a long burst (or an overload the level
//!   has not cut yet) the most important class is served first, and the least important
//!   waiters, passed over by every more important arrival, are served within the last
//!   horizon of their budget instead of being given up.

use std::time::Duration;

use crate::clock::Nanos;
pub use crate::gate::Verdict;
use crate::gate::{deadline_gate, expected_wait, give_up_at, DeadlineCheck, Stage};
use crate::priority::{AdmissionLevel, Priority};

/// The shortest re-check interval: the proxy's timers have millisecond resolution, so a
/// finer one would fire at the next millisecond anyway.
const MIN_RECHECK: Nanos = 1_000_000;

/// While the level binds, a waiter past the max wait is checked again every this fraction
/// of it: the waiters it drops are the admitted tail, which overshoots the max wait by up to
/// one interval.
const RECHECK_DIVISOR: u64 = 8;

/// While the level does not bind, a waiter whose give-up instant is within this fraction of
/// the task timeout is urgent (see the module's comment). A quarter of the budget is many
/// dequeues for any app that can meet the budget at all (the urgent tier empties at the
/// app's full rate), and leaves the more important waiters three quarters of their budget
/// of priority order, so an overload the level has not cut yet still serves the most
/// important class first for its first ~370 ms of waiting.
const URGENCY_DIVISOR: u64 = 4;

/// While the level does not bind, the queue is FIFO as long as it drains within this
/// fraction of the task timeout (less the app's typical time): see the module's comment.
const FIFO_DIVISOR: u64 = 2;

/// The sidecar's settings the policy needs, built once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuePolicy {
    task_timeout: Nanos,
    /// Zero: off.
    overload_max_wait: Nanos,
    /// Shadow mode refuses nothing: its waiters wait as long as it takes.
    shadow: bool,
}

/// One request, as the queue sees it: fixed when it arrives. Times on the engine's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiter {
    pub priority: Priority,
    pub arrival: Nanos,
    /// Absolute.
    pub deadline: Nanos,
}

/// What the sidecar knows now, read fresh for each decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Conditions {
    pub now: Nanos,
    pub level: AdmissionLevel,
    /// The engine's `level_binds`: the max-wait rules apply only then.
    pub level_binds: bool,
    /// How long the app typically takes (zero: unknown).
    pub typical_app: Nanos,
}

/// The inputs of [`completion_rate`] besides the app's typical time.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Rates {
    /// The control law's capacity estimate, per second.
    pub capacity_estimate: Option<f64>,
    /// The best completion rate the adaptive limit has seen lately, per second.
    pub best_recent: f64,
    /// The in-flight limit now.
    pub inflight_limit: usize,
}

/// The pending queue as the policy sees it (the proxy's in-flight limit, the simulator's
/// model of it). Priority order: lower compound first, FIFO within one.
pub trait Waiters {
    /// Requests waiting that are served before a newcomer at `p` (as or more important);
    /// a waiter at `p` counts itself.
    fn waiting_ahead_of(&self, p: Priority) -> usize;
    /// Whether a request less important than `p` is waiting.
    fn less_important_waiting(&self, p: Priority) -> bool;
    /// Refuses every waiter less important than `bound`.
    fn evict_less_important_than(&mut self, bound: Priority);
    /// What the completion rate is made of (asked only when a wait must be predicted).
    fn rates(&self) -> Rates;
}

/// The door's answer for a request that finds no free slot (one that does takes it at
/// once: that is the in-flight limit's compare-exchange, not a decision).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    Queue,
    /// Refused now, a fast 503, rather than after a wait that cannot end in time.
    Refuse(Verdict),
}

/// The waiter's timer has fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Refused while waiting: [`Verdict::WaitedOut`] (the max wait, an overload refusal)
    /// or its budget gone (the rest).
    Refuse(Verdict),
    /// Keep waiting; fire again at this instant.
    CheckAt(Nanos),
}

/// The pending queue in two tiers, as [`serve_next`] sees it: the urgent waiters and the
/// rest, each in priority order (lower compound first, FIFO within one). A waiter moves to
/// the urgent tier once, and stays there (until it leaves the queue).
pub trait ServiceOrder {
    /// The queue's clock (the simulator's nanoseconds, the proxy's `Instant`).
    type Instant: Copy + Ord;
    /// What serving a waiter yields (the simulator's request, the proxy's waker).
    type Served;
    /// Waiters in both tiers.
    fn waiting(&self) -> usize;
    /// Serves the waiter that joined first, whatever its tier and priority.
    fn pop_oldest(&mut self) -> Option<Self::Served>;
    /// Moves every waiter whose expiry ([`QueuePolicy::expiry`]) is before `until` to the
    /// urgent tier. Amortised O(log n) per waiter: each moves once.
    fn promote_expiring_before(&mut self, until: Self::Instant);
    /// Serves the most important urgent waiter, if any.
    fn pop_most_important_urgent(&mut self) -> Option<Self::Served>;
    /// Serves the most important waiter of both tiers (the queue's own priority order).
    fn pop_most_important(&mut self) -> Option<Self::Served>;
}

/// The service order's inputs now ([`QueuePolicy::service`]), on the queue's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Service<I> {
    /// A waiter whose expiry is before this is urgent; `None` while the level binds, which
    /// serves in priority order across both tiers, exactly as a queue without tiers would.
    pub urgent_until: Option<I>,
    /// While at most this many wait, the oldest is served first (zero while the level
    /// binds).
    pub fifo_up_to: usize,
}

impl<I> Service<I> {
    /// Priority order only (the level binds).
    pub const PRIORITY: Service<I> = Service { urgent_until: None, fifo_up_to: 0 };
}

/// The service order: who gets the next free slot (see the module's comment).
pub fn serve_next<Q: ServiceOrder>(
    service: Service<Q::Instant>,
    queue: &mut Q,
) -> Option<Q::Served> {
    let Service { urgent_until, fifo_up_to } = service;
    if fifo_up_to > 0 && queue.waiting() <= fifo_up_to {
        return queue.pop_oldest();
    }
    match urgent_until {
        Some(until) => {
            queue.promote_expiring_before(until);
            queue.pop_most_important_urgent().or_else(|| queue.pop_most_important())
        }
        None => queue.pop_most_important(),
    }
}

// === impl QueuePolicy ===

impl QueuePolicy {
    pub fn new(task_timeout: Duration, overload_max_wait: Duration, shadow: bool) -> Self {
        QueuePolicy {
            task_timeout: nanos(task_timeout),
            overload_max_wait: nanos(overload_max_wait),
            shadow,
        }
    }

    /// The door: would the wait (the waiters served before this request, over the app's
    /// completion rate) plus the app's typical time overrun the budget, or, while the level
    /// binds, the max wait? Shadow mode queues everyone.
    pub fn door(&self, w: &Waiter, at: &Conditions, queue: &impl Waiters) -> Door {
        if self.shadow {
            return Door::Queue;
        }
        let ahead = queue.waiting_ahead_of(w.priority);
        if ahead == 0 {
            return Door::Queue;
        }
        let check = DeadlineCheck {
            expected_wait: expected_wait(ahead, completion_rate(queue.rates(), at.typical_app)),
            ..self.check(w, at, false)
        };
        match deadline_gate(Stage::Door, &check) {
            Verdict::Forward => Door::Queue,
            refused => Door::Refuse(refused),
        }
    }

    /// When a waiter's timer first fires (just queued at `at.now`); `None`: never (shadow).
    pub fn first_check(&self, w: &Waiter, at: &Conditions) -> Option<Nanos> {
        (!self.shadow).then(|| self.next_check(w, at))
    }

    /// The waiter's timer: while the level binds and the waiter has waited past the max
    /// wait, whatever of the cut class waits behind it would wait longer still, so it is
    /// evicted first (a more important waiter is never dropped while a less important one
    /// waits); then the gate decides about the waiter itself. Classes the level admits whole
    /// are never evicted or dropped for a wait, whoever waited.
    pub fn on_timer(&self, w: &Waiter, at: &Conditions, queue: &mut impl Waiters) -> Step {
        let past_max_wait = self.past_max_wait(w, at.now);
        if at.level_binds && past_max_wait {
            queue.evict_less_important_than(evict_below(w.priority, at.level));
        }
        let mut check = self.check(w, at, true);
        // Only what the max-wait rule reads is looked up (each is a walk of the queue).
        if check.overloaded && check.marginal && past_max_wait {
            // (Nothing less important is left after the eviction above, unless one joined
            // since: the proxy's queue is shared with other tasks.)
            check.less_important_waiting = queue.less_important_waiting(w.priority);
            // The rest of its wait: the waiters served before it, less itself.
            let ahead = queue.waiting_ahead_of(w.priority).saturating_sub(1);
            check.expected_wait =
                expected_wait(ahead, completion_rate(queue.rates(), at.typical_app));
        }
        match deadline_gate(Stage::Waiting, &check) {
            Verdict::Forward => Step::CheckAt(self.next_check(w, at)),
            refused => Step::Refuse(refused),
        }
    }

    /// Leaving the queue for the app: nothing past its deadline or the task timeout, or
    /// (if it `queued`) that cannot finish in time, is forwarded. The max wait is not asked:
    /// its timer asked it while it waited, and one leaving the queue is being served now.
    /// (The caller applies the verdict: shadow mode only counts it.)
    pub fn at_dequeue(&self, w: &Waiter, at: &Conditions, queued: bool) -> Verdict {
        let check = DeadlineCheck {
            overloaded: false,
            marginal: false,
            overload_max_wait: 0,
            ..self.check(w, at, queued)
        };
        deadline_gate(Stage::Dequeue, &check)
    }

    /// What a waiter's urgency is measured against, fixed when it joins the queue: the end of
    /// its budget (its deadline, or the task timeout after its arrival if sooner).
    pub fn expiry(&self, w: &Waiter) -> Nanos {
        w.deadline.min(w.arrival.saturating_add(self.task_timeout))
    }

    /// How far past now an expiry makes a waiter urgent: the app's typical time (it must
    /// still finish) plus the urgency horizon, a quarter of the task timeout. `None` while
    /// the level binds: then the queue serves in priority order only.
    pub fn urgency_horizon(&self, at: &Conditions) -> Option<Nanos> {
        (!at.level_binds)
            .then(|| at.typical_app.saturating_add(self.task_timeout / URGENCY_DIVISOR))
    }

    /// [`serve_next`]'s bound on the policy's clock: a waiter whose expiry is before it is
    /// urgent. `None` while the level binds.
    pub fn urgent_until(&self, at: &Conditions) -> Option<Nanos> {
        self.urgency_horizon(at).map(|h| at.now.saturating_add(h))
    }

    /// How many waiters the queue serves oldest first: as many as the app completes, at
    /// `completion_rate` per second, in half the task timeout less its typical time. Zero
    /// while the level binds (priority order only) or while the rate is unknown.
    pub fn fifo_depth(&self, at: &Conditions, completion_rate: Option<f64>) -> usize {
        if at.level_binds {
            return 0;
        }
        let Some(rate) = completion_rate.filter(|r| r.is_finite() && *r > 0.0) else {
            return 0;
        };
        let span = (self.task_timeout / FIFO_DIVISOR).saturating_sub(at.typical_app);
        // (Saturating: an absurd rate gives an unbounded depth, which is FIFO always.)
        (rate * span as f64 / 1e9).floor().min(usize::MAX as f64) as usize
    }

    /// [`serve_next`]'s inputs now, on the policy's clock.
    pub fn service(&self, at: &Conditions, completion_rate: Option<f64>) -> Service<Nanos> {
        Service {
            urgent_until: self.urgent_until(at),
            fifo_up_to: self.fifo_depth(at, completion_rate),
        }
    }

    /// The gate's inputs for `w` now, with nothing about the queue looked up.
    fn check(&self, w: &Waiter, at: &Conditions, queued: bool) -> DeadlineCheck {
        DeadlineCheck {
            arrival: w.arrival,
            now: at.now,
            deadline: w.deadline,
            task_timeout: self.task_timeout,
            typical_app: at.typical_app,
            expected_wait: 0,
            overloaded: at.level_binds,
            marginal: w.priority.business >= at.level.priority().business,
            overload_max_wait: self.overload_max_wait,
            less_important_waiting: false,
            queued,
        }
    }

    /// Waited strictly longer than the max wait (which is on).
    fn past_max_wait(&self, w: &Waiter, now: Nanos) -> bool {
        self.overload_max_wait > 0 && now.saturating_sub(w.arrival) > self.overload_max_wait
    }

    /// The timer's next instant (see the module's comment), after `at.now`.
    fn next_check(&self, w: &Waiter, at: &Conditions) -> Nanos {
        let give_up = give_up_at(w.arrival, w.deadline, self.task_timeout, at.typical_app);
        let max_wait = self.overload_max_wait;
        let next = if max_wait == 0 {
            give_up
        } else if !self.past_max_wait(w, at.now) {
            // A nanosecond past the max wait: the rule is "waited longer than".
            w.arrival.saturating_add(max_wait).saturating_add(1)
        } else if at.level_binds {
            at.now.saturating_add((max_wait / RECHECK_DIVISOR).max(MIN_RECHECK))
        } else {
            at.now.saturating_add(max_wait)
        };
        next.min(give_up).max(at.now.saturating_add(1))
    }
}

/// The bound a waiter past the max wait evicts below: less important than itself, and in
/// the class the level cuts in or a less important one.
pub fn evict_below(waiter: Priority, level: AdmissionLevel) -> Priority {
    let cut_class = Priority { business: level.priority().business, user: 0 };
    let above_cut_class = Priority::from_compound(cut_class.compound().saturating_sub(1))
        .unwrap_or(Priority::MOST_IMPORTANT);
    waiter.max(above_cut_class)
}

/// The app's completion rate when busy: the most generous of the law's estimate, the best
/// rate seen lately, and a full in-flight limit over the app's typical time (Little's law).
/// Generous on purpose: an underestimate would refuse requests that would have been
/// served; the wait gate still catches the rest. `None` when unknown.
pub fn completion_rate(r: Rates, typical_app: Nanos) -> Option<f64> {
    let typical = typical_app as f64 / 1e9;
    let by_limit = if typical > 0.0 { r.inflight_limit as f64 / typical } else { 0.0 };
    let rate = r.capacity_estimate.unwrap_or(0.0).max(r.best_recent).max(by_limit);
    (rate > 0.0).then_some(rate)
}

fn nanos(d: Duration) -> Nanos {
    d.as_nanos().min(u128::from(u64::MAX)) as Nanos
}

#[cfg(test)]
mod tests;
