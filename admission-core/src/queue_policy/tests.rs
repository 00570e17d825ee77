use super::*;
use proptest::prelude::*;

const MS: u64 = 1_000_000;
const MAX_WAIT: u64 = 30 * MS;

fn policy() -> QueuePolicy {
    QueuePolicy::new(Duration::from_millis(500), Duration::from_nanos(MAX_WAIT), false)
}

/// A queue in priority order (compounds), with fixed rates.
#[derive(Debug, Clone, Default)]
struct Model {
    compounds: Vec<u16>,
    rates: Rates,
    evicted: Vec<u16>,
}

impl Waiters for Model {
    fn waiting_ahead_of(&self, p: Priority) -> usize {
        self.compounds.iter().filter(|&&c| c <= p.compound()).count()
    }
    fn less_important_waiting(&self, p: Priority) -> bool {
        self.compounds.iter().any(|&c| c > p.compound())
    }
    fn evict_less_important_than(&mut self, bound: Priority) {
        let (keep, gone) = self.compounds.iter().partition(|&&c| c <= bound.compound());
        self.compounds = keep;
        self.evicted.extend::<Vec<u16>>(gone);
    }
    fn rates(&self) -> Rates {
        self.rates
    }
}

fn p(business: u8, user: u8) -> Priority {
    Priority { business, user }
}

fn level(business: u8, user: u8) -> AdmissionLevel {
    AdmissionLevel::from_compound(p(business, user).compound()).unwrap()
}

fn at(now: u64, binds: bool) -> Conditions {
    Conditions { now, level: level(1, 64), level_binds: binds, typical_app: 10 * MS }
}

fn waiter(priority: Priority) -> Waiter {
    Waiter { priority, arrival: 0, deadline: 500 * MS }
}

fn queue(waiting: &[Priority], per_sec: f64) -> Model {
    Model {
        compounds: waiting.iter().map(|p| p.compound()).collect(),
        rates: Rates { capacity_estimate: Some(per_sec), ..Rates::default() },
        evicted: Vec::new(),
    }
}

#[test]
fn the_door_queues_behind_nobody_and_refuses_a_wait_past_the_budget() {
    let w = waiter(p(1, 0));
    assert_eq!(policy().door(&w, &at(0, false), &queue(&[], 1.0)), Door::Queue);
    // 10 ahead at 100/s: 100 ms + 10 ms of the app's fits 500 ms; at 20/s it does not.
    let ahead = [p(0, 0); 10];
    assert_eq!(policy().door(&w, &at(0, false), &queue(&ahead, 100.0)), Door::Queue);
    assert_eq!(
        policy().door(&w, &at(0, false), &queue(&ahead, 20.0)),
        Door::Refuse(Verdict::ExpectedWaitTooLong)
    );
    // While the level binds, 100 ms expected is past the 30 ms max wait.
    assert_eq!(
        policy().door(&w, &at(0, true), &queue(&ahead, 100.0)),
        Door::Refuse(Verdict::ExpectedWaitTooLong)
    );
    // Shadow mode queues everyone.
    let shadow = QueuePolicy::new(Duration::from_millis(500), Duration::from_millis(30), true);
    assert_eq!(shadow.door(&w, &at(0, true), &queue(&ahead, 20.0)), Door::Queue);
}

#[test]
fn the_completion_rate_is_the_most_generous_estimate() {
    let r = Rates { capacity_estimate: Some(300.0), best_recent: 350.0, inflight_limit: 4 };
    assert_eq!(completion_rate(r, 10 * MS), Some(400.0));
    assert_eq!(completion_rate(r, 0), Some(350.0));
    assert_eq!(completion_rate(Rates::default(), 0), None);
}

#[test]
fn the_timer_fires_past_the_max_wait_then_often_while_the_level_binds() {
    let w = waiter(p(1, 100));
    assert_eq!(policy().first_check(&w, &at(0, true)), Some(MAX_WAIT + 1));
    let mut q = queue(&[p(1, 100)], 1e6);
    // Nothing behind it and nothing ahead: about to be served, kept.
    assert_eq!(
        policy().on_timer(&w, &at(MAX_WAIT + 1, true), &mut q),
        Step::CheckAt(MAX_WAIT + 1 + MAX_WAIT / 8)
    );
    assert_eq!(
        policy().on_timer(&w, &at(MAX_WAIT + 1, false), &mut q),
        Step::CheckAt(2 * MAX_WAIT + 1)
    );
    // Never past the give-up instant (490 ms + 1: the budget left no longer covers 10 ms).
    assert_eq!(policy().on_timer(&w, &at(480 * MS, false), &mut q), Step::CheckAt(490 * MS + 1));
    assert_eq!(
        policy().on_timer(&w, &at(490 * MS + 1, false), &mut q),
        Step::Refuse(Verdict::CannotFinish)
    );
    // Max wait off: one timer at the give-up instant; shadow: none.
    let off = QueuePolicy::new(Duration::from_millis(500), Duration::ZERO, false);
    assert_eq!(off.first_check(&w, &at(0, true)), Some(490 * MS + 1));
    let shadow = QueuePolicy::new(Duration::from_millis(500), Duration::from_millis(30), true);
    assert_eq!(shadow.first_check(&w, &at(0, true)), None);
}

#[test]
fn a_waiter_past_the_max_wait_evicts_the_cut_class_behind_it_then_goes() {
    // The level cuts in class 1; the waiter is class 1, behind 20 of its own class.
    let w = waiter(p(1, 100));
    let mut waiting = vec![p(1, 50); 20];
    waiting.extend([p(1, 100), p(1, 120), p(2, 0)]);
    let mut q = queue(&waiting, 100.0);
    let step = policy().on_timer(&w, &at(MAX_WAIT + 1, true), &mut q);
    assert_eq!(q.evicted, vec![p(1, 120).compound(), p(2, 0).compound()]);
    assert_eq!(step, Step::Refuse(Verdict::WaitedOut));
    // A class the level admits whole neither evicts its own class nor goes.
    let w = waiter(p(0, 100));
    let mut q = queue(&[p(0, 50), p(0, 100), p(0, 120), p(1, 70)], 1.0);
    let step = policy().on_timer(&w, &at(MAX_WAIT + 1, true), &mut q);
    assert_eq!(q.evicted, vec![p(1, 70).compound()]);
    assert!(matches!(step, Step::CheckAt(_)));
    // Without the level binding, nothing is evicted.
    let w = waiter(p(1, 100));
    let mut q = queue(&waiting, 100.0);
    assert!(matches!(policy().on_timer(&w, &at(MAX_WAIT + 1, false), &mut q), Step::CheckAt(_)));
    assert!(q.evicted.is_empty());
}

#[test]
fn dequeue_asks_the_budget_only() {
    let w = waiter(p(2, 0));
    assert_eq!(policy().at_dequeue(&w, &at(200 * MS, true), true), Verdict::Forward);
    assert_eq!(policy().at_dequeue(&w, &at(495 * MS, true), true), Verdict::CannotFinish);
    assert_eq!(policy().at_dequeue(&w, &at(495 * MS, true), false), Verdict::Forward);
    assert_eq!(policy().at_dequeue(&w, &at(500 * MS, true), false), Verdict::DeadlinePassed);
}

proptest! {
    /// Whatever the state, the timer moves forward and never past the give-up instant,
    /// nothing at or above the waiter is evicted, and a class the level admits whole is
    /// never dropped for its wait.
    #[test]
    fn the_timer_is_bounded_and_spares_the_more_important(
        waiting in prop::collection::vec((0u8..4, 0u8..128), 0..40),
        me in (0u8..4, 0u8..128),
        cut in (0u8..4, 0u8..128),
        now in 0u64..600 * MS,
        typical in 0u64..100 * MS,
        binds: bool,
        per_sec in prop::option::of(1.0f64..2000.0),
    ) {
        let mut q = queue(&waiting.iter().map(|&(b, u)| p(b, u)).collect::<Vec<_>>(), 0.0);
        q.rates.capacity_estimate = per_sec;
        let me = p(me.0, me.1);
        let w = waiter(me);
        let c = Conditions { now, level: level(cut.0, cut.1), level_binds: binds, typical_app: typical };
        let give_up = give_up_at(w.arrival, w.deadline, 500 * MS, typical);
        match policy().on_timer(&w, &c, &mut q) {
            Step::CheckAt(next) => {
                prop_assert!(next > now);
                prop_assert!(next <= give_up.max(now + 1));
            }
            Step::Refuse(Verdict::WaitedOut) => {
                prop_assert!(binds && me.business >= cut.0);
            }
            Step::Refuse(_) => prop_assert!(now >= give_up),
        }
        prop_assert!(q.evicted.iter().all(|&c| c > me.compound()));
    }
}
