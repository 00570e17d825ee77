//! The deadline gate: every decision about a request's budget, as one pure function of
//! where the request is ([`Stage`]) and what the sidecar knows ([`DeadlineCheck`]).
//!
//! - At the door, a request whose expected wait (the more-important-or-equal waiters
//!   ahead of it over the app's completion rate) plus the app's typical time exceeds its
//!   remaining budget is refused at once: a fast 503 instead of a timeout after a wait.
//! - While it waits, it is refused as soon as its remaining budget no longer covers the
//!   app's typical time ([`give_up_at`]), not when it finally reaches the head.
//! - At dequeue (the residence gate, the last point where delay accumulates), nothing
//!   past its deadline or the task timeout, or that cannot finish in time, reaches the app.
//! - While the level binds (more than 1 in 50 arrivals beyond it, see
//!   [`level_binds`](crate::controller::level_binds)), a waiter of the class the level
//!   cuts in (or a less important one) older than `overload_max_wait` is dropped while it
//!   waits, unless it is about to be served, and only if no less important request waits:
//!   a more important waiter is never dropped while a less important one is still queued,
//!   and a class the level admits whole is bound by its budget only. The waiters it drops
//!   are the backlog of the class the level cuts in, which a priority queue would
//!   otherwise keep until their budget runs out. At the door, a newcomer whose expected
//!   wait already exceeds `overload_max_wait` is refused at once. Together they bound the
//!   admitted tail: what reaches the app waited at most about the max wait. With the level
//!   fully open (a burst, an app's hiccup) neither applies, and waiters keep their whole
//!   budget. (When and how often a waiter is asked is [`crate::queue_policy`]'s.)

use crate::clock::Nanos;

/// Where the request is when the gate is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Just admitted by the level, before it joins the queue (or takes a free slot).
    Door,
    /// Waiting in the queue (a timer at [`give_up_at`] asks again).
    Waiting,
    /// Leaving the queue for the app.
    Dequeue,
}

/// Everything the gate looks at. Times are on one clock, in nanoseconds; `deadline` is
/// absolute, the others are durations. A zero duration means "unknown" or "off".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeadlineCheck {
    pub arrival: Nanos,
    pub now: Nanos,
    pub deadline: Nanos,
    pub task_timeout: Nanos,
    /// How long the app typically takes to answer (dispatch to response headers).
    pub typical_app: Nanos,
    /// At the door, the expected wait in the queue; while waiting, the expected rest of
    /// the wait (the waiters ahead of it over the completion rate, [`expected_wait`]);
    /// zero at dequeue (it is being served now).
    pub expected_wait: Nanos,
    /// Whether the level binds: it refuses a real share of the arrivals (the engine's
    /// `level_binds`): the max-wait rules apply only then. A level that refuses (next to)
    /// nothing, behind callers whose egress refuses for it, or fully open during a burst or
    /// a hiccup, leaves waiters their whole budget.
    pub overloaded: bool,
    /// Whether the request is in the business class the level cuts in, or a less important
    /// one: the backlog the max wait trims. A class the level admits whole waits only
    /// for what is ahead of it in its own priority order, so its budget alone bounds it
    /// (an app's hiccup under overload must not cost the most important class).
    pub marginal: bool,
    /// Under overload, the longest a waiter may wait while nothing less important does.
    pub overload_max_wait: Nanos,
    /// Whether a less important request is waiting in the queue now.
    pub less_important_waiting: bool,
    /// Whether the request waited in the queue (rather than finding a free slot).
    pub queued: bool,
}

/// The gate's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Go on: into the queue (door), keep waiting, or to the app (dequeue).
    Forward,
    /// Refuse: the deadline has passed.
    DeadlinePassed,
    /// Refuse: waited longer than the task timeout.
    WaitedTooLong,
    /// Refuse: the budget left does not cover the app's typical time.
    CannotFinish,
    /// Refuse at the door: the expected wait plus the app's time exceeds the budget.
    ExpectedWaitTooLong,
    /// Refuse while waiting or at dequeue: waited past `overload_max_wait` under
    /// overload, and nothing less important is waiting.
    WaitedOut,
}

impl Verdict {
    pub fn is_forward(self) -> bool {
        self == Verdict::Forward
    }
}

/// The deadline gate: one pure function for the door, the wait and the dequeue.
pub fn deadline_gate(stage: Stage, c: &DeadlineCheck) -> Verdict {
    if c.now >= c.deadline {
        return Verdict::DeadlinePassed;
    }
    let remaining = c.deadline - c.now;
    let waited = c.now.saturating_sub(c.arrival);
    match stage {
        Stage::Door => {
            // Only waiters ahead make the wait worth predicting: a request that finds a
            // free slot goes straight on, and the app's bound is the caller's budget.
            if c.expected_wait > 0 && c.expected_wait.saturating_add(c.typical_app) > remaining {
                return Verdict::ExpectedWaitTooLong;
            }
            // While the level refuses, the queue is the spike's backlog, not a burst: a
            // newcomer that expects to wait past the max wait would be served late (the
            // admitted tail) or dropped later, so it is refused now. The expected wait
            // counts only waiters at or above its priority: the most important class is
            // refused here only when it alone overfills the queue.
            if c.overloaded
                && c.marginal
                && c.overload_max_wait > 0
                && c.expected_wait > c.overload_max_wait
            {
                return Verdict::ExpectedWaitTooLong;
            }
            Verdict::Forward
        }
        Stage::Waiting | Stage::Dequeue => {
            if waited > c.task_timeout {
                return Verdict::WaitedTooLong;
            }
            if c.queued && remaining < c.typical_app {
                return Verdict::CannotFinish;
            }
            // A waiter about to be served (less than an eighth of the max wait to go) is
            // kept: dropping it would bound nobody's wait and cost an answer, and at the
            // start of a spike it is typically the most important class at the head.
            if c.queued
                && c.overloaded
                && c.marginal
                && c.overload_max_wait > 0
                && waited > c.overload_max_wait
                && c.expected_wait > c.overload_max_wait / 8
                && !c.less_important_waiting
            {
                return Verdict::WaitedOut;
            }
            Verdict::Forward
        }
    }
}

/// When a waiting request stops being worth serving: once its remaining budget no longer
/// covers the app's typical time (at the latest its deadline, or the task timeout).
/// Under overload, the caller also asks [`deadline_gate`] at `arrival + overload_max_wait`.
pub fn give_up_at(
    arrival: Nanos,
    deadline: Nanos,
    task_timeout: Nanos,
    typical_app: Nanos,
) -> Nanos {
    // The first instant at which the wait gate refuses: the remaining budget is below the
    // app's time, or the wait exceeds the task timeout, or the deadline has come.
    let cannot_finish = deadline.saturating_sub(typical_app).saturating_add(1);
    cannot_finish.min(deadline).min(arrival.saturating_add(task_timeout).saturating_add(1))
}

/// The expected wait of a newcomer with `ahead` more-important-or-equal requests waiting
/// in front of it, when the app completes `completions_per_sec`. Zero with nobody ahead
/// or an unknown rate (never refuse on a guess); saturates for a stalled app.
pub fn expected_wait(ahead: usize, completions_per_sec: Option<f64>) -> Nanos {
    match completions_per_sec {
        _ if ahead == 0 => 0,
        None => 0,
        Some(rate) if rate.is_finite() && rate > 0.0 => {
            (ahead as f64 / rate * 1e9).min(u64::MAX as f64 / 2.0) as Nanos
        }
        Some(_) => u64::MAX / 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn check(now: u64, deadline: u64) -> DeadlineCheck {
        DeadlineCheck {
            arrival: 0,
            now: now * MS,
            deadline: deadline * MS,
            task_timeout: 500 * MS,
            typical_app: 10 * MS,
            queued: true,
            ..DeadlineCheck::default()
        }
    }

    #[test]
    fn door_refuses_when_the_expected_wait_exceeds_the_budget() {
        let mut c = check(0, 500);
        c.queued = false;
        c.expected_wait = 480 * MS;
        assert_eq!(deadline_gate(Stage::Door, &c), Verdict::Forward);
        c.expected_wait = 495 * MS;
        assert_eq!(deadline_gate(Stage::Door, &c), Verdict::ExpectedWaitTooLong);
        // Nobody ahead: forward whatever the app's time.
        c.expected_wait = 0;
        c.typical_app = 900 * MS;
        assert_eq!(deadline_gate(Stage::Door, &c), Verdict::Forward);
    }

    #[test]
    fn door_refuses_past_the_max_wait_only_under_overload() {
        let mut c = check(0, 500);
        c.queued = false;
        c.overload_max_wait = 30 * MS;
        c.expected_wait = 40 * MS;
        c.marginal = true;
        assert_eq!(deadline_gate(Stage::Door, &c), Verdict::Forward);
        c.overloaded = true;
        assert_eq!(deadline_gate(Stage::Door, &c), Verdict::ExpectedWaitTooLong);
        // A class the level admits whole is bound by its budget only.
        c.marginal = false;
        assert_eq!(deadline_gate(Stage::Door, &c), Verdict::Forward);
        c.marginal = true;
        c.expected_wait = 30 * MS;
        assert_eq!(deadline_gate(Stage::Door, &c), Verdict::Forward);
        c.overload_max_wait = 0;
        c.expected_wait = 400 * MS;
        assert_eq!(deadline_gate(Stage::Door, &c), Verdict::Forward);
    }

    #[test]
    fn waiting_gives_up_when_the_budget_no_longer_covers_the_app() {
        assert_eq!(deadline_gate(Stage::Waiting, &check(489, 500)), Verdict::Forward);
        assert_eq!(deadline_gate(Stage::Waiting, &check(491, 500)), Verdict::CannotFinish);
        assert_eq!(give_up_at(0, 500 * MS, 500 * MS, 10 * MS), 490 * MS + 1);
        assert_eq!(give_up_at(0, 9_000 * MS, 500 * MS, 10 * MS), 500 * MS + 1);
    }

    #[test]
    fn max_wait_never_drops_while_a_less_important_request_waits() {
        let mut c = check(150, 500);
        c.overloaded = true;
        c.overload_max_wait = 100 * MS;
        c.expected_wait = 50 * MS;
        c.marginal = true;
        c.less_important_waiting = true;
        assert_eq!(deadline_gate(Stage::Waiting, &c), Verdict::Forward);
        c.less_important_waiting = false;
        assert_eq!(deadline_gate(Stage::Waiting, &c), Verdict::WaitedOut);
        c.overloaded = false;
        assert_eq!(deadline_gate(Stage::Waiting, &c), Verdict::Forward);
        // A class the level admits whole is never dropped for its wait.
        c.overloaded = true;
        c.marginal = false;
        assert_eq!(deadline_gate(Stage::Waiting, &c), Verdict::Forward);
    }

    #[test]
    fn max_wait_keeps_a_waiter_about_to_be_served() {
        let mut c = check(150, 500);
        c.overloaded = true;
        c.overload_max_wait = 100 * MS;
        c.marginal = true;
        c.expected_wait = 12 * MS;
        assert_eq!(deadline_gate(Stage::Waiting, &c), Verdict::Forward);
        c.expected_wait = 13 * MS;
        assert_eq!(deadline_gate(Stage::Waiting, &c), Verdict::WaitedOut);
        // Being served now.
        c.expected_wait = 0;
        assert_eq!(deadline_gate(Stage::Dequeue, &c), Verdict::Forward);
    }

    #[test]
    fn expected_wait_is_position_over_rate() {
        assert_eq!(expected_wait(0, Some(100.0)), 0);
        assert_eq!(expected_wait(10, None), 0);
        assert_eq!(expected_wait(10, Some(100.0)), 100 * MS);
        assert!(expected_wait(1, Some(0.0)) > 1_000_000 * MS);
    }
}
