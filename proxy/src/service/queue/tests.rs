//! The proxy's queue glue and the simulator's make the same decisions: the same policy
//! over their two queues (the in-flight limit's waiters here, the simulator's model there)
//! on random queue states, and the same service order. A drift in either queue's order,
//! counting or eviction, or in how either side asks the policy, shows up here.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use admission_core::{AdmissionLevel, Priority};
use proptest::prelude::*;

use super::{door_turn, timer_turn, SidecarQueue};
use crate::inflight::{InflightLimit, NoSlot, Slot};
use admission_core::queue_policy::{
    completion_rate, serve_next, Conditions, QueuePolicy, Rates, Service,
};

#[allow(dead_code)]
#[path = "../../../../admission-core/examples/simulate/queue.rs"]
mod sim_queue;

use sim_queue::{Pending, Request, SimQueue};

const MS: u64 = 1_000_000;

type Waiting = Pin<Box<dyn Future<Output = Result<Slot, NoSlot>>>>;

/// One state: waiters in arrival order (business, user, arrival ms), and the sidecar.
#[derive(Debug, Clone)]
struct State {
    waiters: Vec<(u8, u8, u64)>,
    now_ms: u64,
    level: (u8, u8),
    binds: bool,
    typical_ms: u64,
    rates: Rates,
    max_wait_ms: u64,
}

/// A user level: mostly among a few (so waiters share and neighbour priorities), or any.
fn user() -> impl Strategy<Value = u8> {
    prop_oneof![3 => 0u8..4, 1 => 0u8..128]
}

fn state() -> impl Strategy<Value = State> {
    (
        prop::collection::vec((0u8..4, user(), 0u64..400), 1..40),
        0u64..700,
        (0u8..4, user()),
        any::<bool>(),
        0u64..60,
        (prop::option::of(1.0f64..2000.0), 0.0f64..2000.0, 1usize..64),
        prop_oneof![Just(0u64), 1u64..100],
    )
        .prop_map(|(mut waiters, now_ms, level, binds, typical_ms, r, max_wait_ms)| {
            waiters.sort_by_key(|w| w.2);
            let rates = Rates { capacity_estimate: r.0, best_recent: r.1, inflight_limit: r.2 };
            State { waiters, now_ms, level, binds, typical_ms, rates, max_wait_ms }
        })
}

fn request(&(business, user, arrival_ms): &(u8, u8, u64)) -> Request {
    let arrival = arrival_ms * MS;
    let compound = Priority { business, user }.compound();
    let deadline = arrival + 500 * MS;
    Request { arrival, deadline, class: business, compound, expiry: deadline }
}

/// Both queues holding `s.waiters`, in arrival order (FIFO within a priority).
fn queues(s: &State) -> (Arc<InflightLimit>, Slot, Vec<Waiting>, Pending) {
    let limit = InflightLimit::new(1, 1_000);
    let held = limit.try_slot().expect("a free slot");
    let mut cx = Context::from_waker(Waker::noop());
    let mut proxy = Vec::new();
    let mut sim = Pending::new();
    for (id, w) in s.waiters.iter().enumerate() {
        let r = request(w);
        let limit = limit.clone();
        let priority = Priority::from_compound(r.compound).expect("valid");
        let mut wait: Waiting = Box::pin(async move { limit.slot(priority).await });
        assert!(wait.as_mut().poll(&mut cx).is_pending(), "queued");
        proxy.push(wait);
        sim.push(id as u64, r);
    }
    (limit, held, proxy, sim)
}

fn conditions(s: &State, now: u64) -> Conditions {
    let level = Priority { business: s.level.0, user: s.level.1 }.compound();
    Conditions {
        now,
        level: AdmissionLevel::from_compound(level).expect("valid"),
        level_binds: s.binds,
        typical_app: s.typical_ms * MS,
    }
}

fn policy(s: &State) -> QueuePolicy {
    let ms = std::time::Duration::from_millis;
    QueuePolicy::new(ms(500), ms(s.max_wait_ms), false)
}

/// The proxy's queue holding `s.waiters` with their expiries, on a clock where one of the
/// state's milliseconds is a second, half a second early: the test's own time (well under
/// half a second) never moves an expiry across the urgency bound.
fn proxy_queue_with_expiries(s: &State) -> (Arc<InflightLimit>, Slot, Vec<Waiting>) {
    let limit = InflightLimit::new(1, 1_000);
    let held = limit.try_slot().expect("a free slot");
    let mut cx = Context::from_waker(Waker::noop());
    let start = std::time::Instant::now();
    let at = |ms: u64| {
        let ahead = Duration::from_secs(ms) + Duration::from_millis(500);
        let back = Duration::from_secs(s.now_ms);
        (start + ahead).checked_sub(back).expect("the clock runs for an hour")
    };
    let proxy = s
        .waiters
        .iter()
        .map(|w| {
            let r = request(w);
            let (limit, expiry) = (limit.clone(), at(r.expiry / MS));
            let priority = Priority::from_compound(r.compound).expect("valid");
            let mut wait: Waiting =
                Box::pin(async move { limit.slot_until(priority, Some(expiry)).await });
            assert!(wait.as_mut().poll(&mut cx).is_pending(), "queued");
            wait
        })
        .collect();
    (limit, held, proxy)
}

/// Which of the proxy's waiters were evicted (their futures ended in `Evicted`).
fn evicted(proxy: &mut [Waiting]) -> Vec<u64> {
    let mut cx = Context::from_waker(Waker::noop());
    let mut out = Vec::new();
    for (id, wait) in proxy.iter_mut().enumerate() {
        match wait.as_mut().poll(&mut cx) {
            Poll::Pending => {}
            Poll::Ready(Err(NoSlot::Evicted)) => out.push(id as u64),
            Poll::Ready(other) => panic!("waiter {id} ended otherwise: {:?}", other.err()),
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// A waiter's timer fires: the same verdict or next check, the same waiters evicted.
    #[test]
    fn the_timer_decides_as_the_simulator_does(s in state(), pick in any::<prop::sample::Index>()) {
        let (limit, _held, mut proxy, mut sim) = queues(&s);
        let me = pick.index(s.waiters.len());
        let r = request(&s.waiters[me]);
        let now = (s.now_ms * MS).max(r.arrival);
        let at = conditions(&s, now);
        let policy = policy(&s);

        let rates = s.rates;
        let mut proxy_queue = SidecarQueue { limit: &limit, rates: move || rates };
        let proxy_step = timer_turn(&policy, &r.waiter(), &at, &mut proxy_queue);
        let mut sim_queue = SimQueue::new(&mut sim, s.rates);
        let sim_step = sim_queue::timer_turn(&policy, &r, &at, &mut sim_queue);

        prop_assert_eq!(proxy_step, sim_step);
        let mut sim_evicted: Vec<u64> = sim_queue.evicted.iter().map(|&(id, _)| id).collect();
        sim_evicted.sort_unstable();
        prop_assert_eq!(evicted(&mut proxy), sim_evicted);
        prop_assert_eq!(limit.queued(), sim.len());
    }

    /// Slots free one at a time: both queues grant them in the same order, oldest first
    /// while the queue is short and the urgent first while it is not, while the level does
    /// not bind.
    #[test]
    fn the_service_order_is_the_simulators(s in state()) {
        let at = conditions(&s, s.now_ms * MS);
        let policy = policy(&s);
        let horizon = policy.urgency_horizon(&at);
        // A twentieth of the rate: FIFO depths of 0 to 25, so both orders and the switch
        // between them are seen on queues of up to 40.
        let fifo_up_to =
            policy.fifo_depth(&at, completion_rate(s.rates, at.typical_app).map(|r| r / 20.0));
        // The simulator: one instant, the policy's bound.
        let mut sim = queues(&s).3;
        let service = Service { urgent_until: policy.urgent_until(&at), fifo_up_to };
        let sim_order: Vec<u64> =
            std::iter::from_fn(|| serve_next(service, &mut sim).map(|(id, _)| id)).collect();
        // The proxy: the same bound, in seconds (see `proxy_queue_with_expiries`).
        let (limit, held, mut proxy) = proxy_queue_with_expiries(&s);
        limit.set_urgency_horizon(horizon.map(|h| Duration::from_secs(h / MS)));
        limit.set_fifo_depth(fifo_up_to);
        let mut proxy_order = Vec::new();
        let mut cx = Context::from_waker(Waker::noop());
        let mut slot = Some(held);
        while let Some(freed) = slot.take() {
            drop(freed);
            for (id, wait) in proxy.iter_mut().enumerate() {
                if proxy_order.contains(&(id as u64)) {
                    continue;
                }
                if let Poll::Ready(granted) = wait.as_mut().poll(&mut cx) {
                    proxy_order.push(id as u64);
                    slot = Some(granted.expect("granted"));
                }
            }
        }
        prop_assert_eq!(proxy_order, sim_order);
    }

    /// A newcomer finds no free slot: both doors queue it or both refuse it.
    #[test]
    fn the_door_decides_as_the_simulator_does(
        s in state(),
        newcomer in (0u8..4, user()),
    ) {
        let (limit, _held, _proxy, mut sim) = queues(&s);
        let now = s.now_ms * MS;
        let r = request(&(newcomer.0, newcomer.1, s.now_ms));
        let at = conditions(&s, now);
        let policy = policy(&s);

        let rates = s.rates;
        let proxy_queue = SidecarQueue { limit: &limit, rates: move || rates };
        let proxy_door = door_turn(&policy, &r.waiter(), &at, &proxy_queue);
        let sim_door = sim_queue::door_turn(&policy, &r, &at, &SimQueue::new(&mut sim, s.rates));
        prop_assert_eq!(proxy_door, sim_door);
    }
}
