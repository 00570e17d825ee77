//! The residence-time gate: the last check before a request is handed to the app.
//! It runs at dequeue, behind the last point where delay accumulates, so anything it
//! forwards is within both bounds (seed 003).

use crate::clock::Nanos;

/// What to do with a request leaving the pending queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateDecision {
    Forward,
    /// The caller's deadline has passed: the answer would arrive to nobody.
    DeadlinePassed,
    /// It waited longer than the task timeout, even though its own deadline is later.
    WaitedTooLong,
}

/// `arrival`, `now` and `deadline` are on the same clock. `deadline` is absolute.
#[inline]
pub fn residence_gate(
    arrival: Nanos,
    now: Nanos,
    deadline: Nanos,
    task_timeout: Nanos,
) -> GateDecision {
    if now >= deadline {
        GateDecision::DeadlinePassed
    } else if now.saturating_sub(arrival) > task_timeout {
        GateDecision::WaitedTooLong
    } else {
        GateDecision::Forward
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn forwards_within_both_bounds() {
        assert_eq!(residence_gate(0, 10 * MS, 480 * MS, 500 * MS), GateDecision::Forward);
    }

    #[test]
    fn drops_at_or_after_deadline() {
        assert_eq!(residence_gate(0, 480 * MS, 480 * MS, 500 * MS), GateDecision::DeadlinePassed);
        assert_eq!(residence_gate(0, 900 * MS, 480 * MS, 500 * MS), GateDecision::DeadlinePassed);
    }

    #[test]
    fn drops_long_waiters_with_generous_deadlines() {
        assert_eq!(residence_gate(0, 501 * MS, 10_000 * MS, 500 * MS), GateDecision::WaitedTooLong);
    }
}
