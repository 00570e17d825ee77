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

// === the service order ===

/// The queue's two tiers as a plain list: each waiter's key (compound, arrival order), its
/// expiry, and whether it was promoted.
#[derive(Debug, Clone, Default)]
struct Tiers {
    waiters: Vec<Queued>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Queued {
    key: (u16, u64),
    expiry: u64,
    give_up: u64,
    urgent: bool,
}

impl Tiers {
    fn take(&mut self, pick: impl Fn(&Queued) -> bool) -> Option<Queued> {
        let i = (0..self.waiters.len())
            .filter(|&i| pick(&self.waiters[i]))
            .min_by_key(|&i| self.waiters[i].key)?;
        Some(self.waiters.swap_remove(i))
    }
}

impl ServiceOrder for Tiers {
    type Instant = u64;
    type Served = Queued;

    fn waiting(&self) -> usize {
        self.waiters.len()
    }
    fn pop_oldest(&mut self) -> Option<Queued> {
        let i = (0..self.waiters.len()).min_by_key(|&i| self.waiters[i].key.1)?;
        Some(self.waiters.swap_remove(i))
    }
    fn promote_expiring_before(&mut self, until: u64) {
        for w in &mut self.waiters {
            w.urgent |= w.expiry < until;
        }
    }
    fn pop_most_important_urgent(&mut self) -> Option<Queued> {
        self.take(|w| w.urgent)
    }
    fn pop_most_important(&mut self) -> Option<Queued> {
        self.take(|_| true)
    }
}

/// How a run of the one-server model ended.
#[derive(Debug, Default)]
struct Run {
    /// (served, instant, the waiters still queued then, whether it was a FIFO turn).
    served: Vec<(Queued, u64, Vec<Queued>, bool)>,
    given_up: Vec<Queued>,
}

/// One server taking `service` per request, in front of the policy's queue; `arrivals` are
/// (instant, compound), sorted. Every request's budget is the 500 ms task timeout; the app's
/// typical time is `service`. A waiter still queued at its give-up instant is given up.
/// `order`: the service order's bound at a dequeue instant.
fn serve_all(arrivals: &[(u64, u16)], service: u64, order: impl Fn(u64) -> Service<u64>) -> Run {
    let policy = policy();
    let mut queue = Tiers::default();
    let mut run = Run::default();
    let (mut next, mut free_at) = (0, 0u64);
    loop {
        let now = match (queue.waiters.is_empty(), arrivals.get(next)) {
            (true, None) => return run,
            (true, Some(&(at, _))) => at.max(free_at),
            (false, _) => free_at,
        };
        while let Some(&(at, compound)) = arrivals.get(next).filter(|a| a.0 <= now) {
            let w = Waiter {
                priority: Priority::from_compound(compound).expect("valid"),
                arrival: at,
                deadline: at + 500 * MS,
            };
            let give_up = give_up_at(w.arrival, w.deadline, 500 * MS, service);
            let key = (compound, next as u64);
            queue.waiters.push(Queued { key, expiry: policy.expiry(&w), give_up, urgent: false });
            next += 1;
        }
        let (gone, kept) = queue.waiters.iter().partition(|w| w.give_up <= now);
        queue.waiters = kept;
        run.given_up.extend::<Vec<Queued>>(gone);
        let turn = order(now);
        let fifo = turn.fifo_up_to > 0 && queue.waiters.len() <= turn.fifo_up_to;
        if let Some(w) = serve_next(turn, &mut queue) {
            run.served.push((w, now, queue.waiters.clone(), fifo));
            free_at = now + service;
        }
    }
}

/// The service order while the level does not bind, the app's completion rate known.
fn not_binding(service: u64) -> impl Fn(u64) -> Service<u64> {
    let rate = 1e9 / service as f64;
    move |now| policy().service(&Conditions { typical_app: service, ..at(now, false) }, Some(rate))
}

/// The same, without the FIFO turns (the order before them): the urgent tier only.
fn urgent_tier_only(service: u64) -> impl Fn(u64) -> Service<u64> {
    move |now| Service {
        urgent_until: policy().urgent_until(&Conditions { typical_app: service, ..at(now, false) }),
        fifo_up_to: 0,
    }
}

fn binding(service: u64) -> impl Fn(u64) -> Service<u64> {
    let rate = 1e9 / service as f64;
    move |now| policy().service(&Conditions { typical_app: service, ..at(now, true) }, Some(rate))
}

/// The longest wait of a run's served waiters.
fn max_wait(run: &Run, arrivals: &[(u64, u16)]) -> u64 {
    run.served.iter().map(|(w, now, _, _)| now - arrivals[w.key.1 as usize].0).max().unwrap_or(0)
}

/// The longest wait a FIFO queue gives these arrivals on the one-server model.
fn fifo_max_wait(arrivals: &[(u64, u16)], service: u64) -> u64 {
    let mut free_at = 0u64;
    let mut longest = 0;
    for &(at, _) in arrivals {
        let start = free_at.max(at);
        longest = longest.max(start - at);
        free_at = start + service;
    }
    longest
}

/// 1.5x of a 1 ms app for 500 ms, then 500 ms off, twice; classes 10/30/60, users spread.
fn on_off_bursts() -> Vec<(u64, u16)> {
    let mut arrivals = Vec::new();
    for burst in 0..2u64 {
        for i in 0..750u64 {
            let at = burst * 1_000 * MS + i * 2 * MS / 3;
            let business = match i % 10 {
                0 => 0,
                1..=3 => 1,
                _ => 2,
            };
            let user = ((i * 37) % 128) as u8;
            arrivals.push((at, p(business, user).compound()));
        }
    }
    arrivals
}

#[test]
fn a_burst_on_a_healthy_app_gives_nobody_up() {
    // Priority order alone starves the least important for the whole burst and its drain.
    let arrivals = on_off_bursts();
    let priority_only = serve_all(&arrivals, MS, binding(MS));
    assert!(priority_only.given_up.len() > 50, "{}", priority_only.given_up.len());
    // The urgent tier alone serves them in the last quarter of their budget...
    let urgent = serve_all(&arrivals, MS, urgent_tier_only(MS));
    assert_eq!(urgent.given_up, vec![]);
    assert!(max_wait(&urgent, &arrivals) > 350 * MS, "{}", max_wait(&urgent, &arrivals));
    // ...and the service order, FIFO while the queue is short, about as soon as a FIFO
    // (the queue's peak, a FIFO wait of ~250 ms, is just past the FIFO depth).
    let run = serve_all(&arrivals, MS, not_binding(MS));
    assert_eq!(run.given_up, vec![]);
    let fifo = fifo_max_wait(&arrivals, MS);
    assert!(fifo < 260 * MS);
    assert!(max_wait(&run, &arrivals) <= fifo + 10 * MS, "{} vs {fifo}", max_wait(&run, &arrivals));
}

#[test]
fn the_fifo_depth_is_what_the_app_completes_in_half_the_budget_less_its_time() {
    let c = Conditions { typical_app: 10 * MS, ..at(1_000 * MS, false) };
    // 800/s x (250 - 10) ms.
    assert_eq!(policy().fifo_depth(&c, Some(800.0)), 192);
    assert_eq!(policy().fifo_depth(&c, None), 0);
    assert_eq!(policy().fifo_depth(&c, Some(f64::NAN)), 0);
    assert_eq!(policy().fifo_depth(&Conditions { level_binds: true, ..c }, Some(800.0)), 0);
    // An app slower than half the budget: never FIFO.
    assert_eq!(policy().fifo_depth(&Conditions { typical_app: 300 * MS, ..c }, Some(800.0)), 0);
    let s = policy().service(&c, Some(800.0));
    assert_eq!(s, Service { urgent_until: Some(1_135 * MS), fifo_up_to: 192 });
}

#[test]
fn the_horizon_is_the_apps_time_plus_a_quarter_of_the_budget_and_none_while_binding() {
    let c = Conditions { typical_app: 10 * MS, ..at(1_000 * MS, false) };
    assert_eq!(policy().urgency_horizon(&c), Some(135 * MS));
    assert_eq!(policy().urgent_until(&c), Some(1_135 * MS));
    assert_eq!(policy().urgency_horizon(&Conditions { level_binds: true, ..c }), None);
    // The budget's end: the deadline, or the task timeout if sooner.
    let w = Waiter { priority: p(0, 0), arrival: 100 * MS, deadline: 300 * MS };
    assert_eq!(policy().expiry(&w), 300 * MS);
    assert_eq!(policy().expiry(&Waiter { deadline: 9_000 * MS, ..w }), 600 * MS);
}

/// Arrivals: (gap after the previous one in units of the service time / 4, compound).
fn arrivals() -> impl Strategy<Value = (Vec<(u64, u16)>, u64)> {
    let gaps = prop::collection::vec((0u64..10, (0u8..4, 0u8..128)), 1..120);
    (gaps, 1u64..20).prop_map(|(gaps, service_ms)| {
        let service = service_ms * MS;
        let mut at = 0;
        let list = gaps
            .into_iter()
            .map(|(gap, (b, u))| {
                at += gap * service / 4;
                (at, p(b, u).compound())
            })
            .collect();
        (list, service)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, max_global_rejects: 100_000, ..ProptestConfig::default() })]

    /// (a) With the level not binding, a queue a FIFO drains well within the horizon gives
    /// nobody up, whatever the priorities.
    #[test]
    fn with_the_level_open_what_a_fifo_drains_nobody_gives_up((arrivals, service) in arrivals()) {
        let horizon = policy().urgency_horizon(&Conditions { typical_app: service, ..at(0, false) }).expect("open");
        prop_assume!(fifo_max_wait(&arrivals, service) + service < horizon - service);
        let run = serve_all(&arrivals, service, not_binding(service));
        prop_assert_eq!(run.given_up, vec![]);
    }

    /// (b) While the level binds, the order is the priority order (FIFO within a compound),
    /// whatever was promoted while it did not.
    #[test]
    fn while_the_level_binds_the_order_is_priority_order(
        (arrivals, service) in arrivals(),
        open_until_ms in 0u64..1_000,
    ) {
        let run = serve_all(&arrivals, service, |now| {
            if now < open_until_ms * MS { not_binding(service)(now) } else { binding(service)(now) }
        });
        for (served, now, left, _) in &run.served {
            if *now >= open_until_ms * MS {
                prop_assert!(left.iter().all(|w| w.key > served.key), "{served:?} at {now}");
            }
        }
    }

    /// (c) A more important waiter is never delayed past its give-up by the rule: whoever is
    /// served, no more important waiter is urgent; so a waiter is served ahead of only more
    /// important ones for the last horizon of its budget, and one given up was passed in
    /// that span by more important waiters only.
    #[test]
    fn the_urgent_are_never_passed_by_the_less_important((arrivals, service) in arrivals()) {
        let order = urgent_tier_only(service);
        let run = serve_all(&arrivals, service, &order);
        for (served, now, left, _) in &run.served {
            let until = order(*now).urgent_until.expect("open");
            for w in left.iter().filter(|w| w.key < served.key) {
                prop_assert!(w.expiry >= until, "{w:?} passed by {served:?} at {now}");
            }
        }
        for gone in &run.given_up {
            for (served, now, _, _) in &run.served {
                let queued = *now >= arrivals[gone.key.1 as usize].0 && *now < gone.give_up;
                if queued && gone.expiry < order(*now).urgent_until.expect("open") {
                    prop_assert!(served.key < gone.key, "{gone:?} passed by {served:?} at {now}");
                }
            }
        }
    }

    /// (c') With the FIFO turns too: a turn that is not FIFO never passes an urgent waiter
    /// by a less important one; a FIFO turn serves the oldest waiter.
    #[test]
    fn each_turn_is_fifo_or_urgent_first((arrivals, service) in arrivals()) {
        let order = not_binding(service);
        let run = serve_all(&arrivals, service, &order);
        for (served, now, left, fifo) in &run.served {
            if *fifo {
                prop_assert!(left.iter().all(|w| w.key.1 > served.key.1), "{served:?} at {now}");
                continue;
            }
            let until = order(*now).urgent_until.expect("open");
            for w in left.iter().filter(|w| w.key < served.key) {
                prop_assert!(w.expiry >= until, "{w:?} passed by {served:?} at {now}");
            }
        }
    }

    /// (d) With the level open, a burst a FIFO drains within the FIFO share of the budget is
    /// served in arrival order, whatever the priorities: its waits are the app's own queue's.
    #[test]
    fn with_the_level_open_a_short_queue_is_served_in_arrival_order((arrivals, service) in arrivals()) {
        // The deepest queue a FIFO builds, in waits: under the FIFO depth's span.
        prop_assume!(fifo_max_wait(&arrivals, service) + 2 * service < 250 * MS - service);
        let run = serve_all(&arrivals, service, not_binding(service));
        prop_assert_eq!(&run.given_up, &vec![]);
        let order: Vec<u64> = run.served.iter().map(|(w, ..)| w.key.1).collect();
        prop_assert!(order.windows(2).all(|p| p[0] < p[1]), "{order:?}");
        prop_assert_eq!(max_wait(&run, &arrivals), fifo_max_wait(&arrivals, service));
    }

}
