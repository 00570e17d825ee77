//! The simulator's model of the sidecar's pending queue: two tiers (the urgent waiters and
//! the rest), each most important first, FIFO within one compound level, and the arrival
//! order across both; who is served next is the queue policy's [`serve_next`]. No I/O and nothing but admission-core, so the
//! proxy's tests can include it to hold its decisions against the proxy's own queue.

use std::collections::{BTreeMap, BTreeSet};

use admission_core::priority::COMPOUND_LEVELS;
use admission_core::queue_policy::{
    Conditions, Door, QueuePolicy, Rates, ServiceOrder, Step, Waiter, Waiters,
};
use admission_core::Priority;

#[derive(Debug, Clone, Copy)]
pub struct Request {
    pub arrival: u64,
    pub deadline: u64,
    pub class: u8,
    pub compound: u16,
    /// [`QueuePolicy::expiry`]: when its budget ends.
    pub expiry: u64,
}

/// Counts per compound level, for "how many more-important-or-equal requests wait".
pub struct Fenwick(pub Vec<u32>);

impl Fenwick {
    pub fn new() -> Self {
        Fenwick(vec![0; COMPOUND_LEVELS + 1])
    }
    pub fn add(&mut self, c: u16, d: i32) {
        let mut i = c as usize + 1;
        while i < self.0.len() {
            self.0[i] = (self.0[i] as i64 + d as i64) as u32;
            i += i & i.wrapping_neg();
        }
    }
    /// Count at levels `0..=c`.
    pub fn prefix(&self, c: u16) -> usize {
        let (mut i, mut s) = (c as usize + 1, 0usize);
        while i > 0 {
            s += self.0[i] as usize;
            i -= i & i.wrapping_neg();
        }
        s
    }
}

/// The sidecar's pending queue: two tiers, each most important first, FIFO within a level.
pub struct Pending {
    /// The waiters not (yet) urgent.
    pub by_priority: BTreeMap<(u16, u64), Request>,
    /// The urgent waiters.
    pub urgent: BTreeMap<(u16, u64), Request>,
    /// The waiters not yet urgent, soonest expiry first: (expiry, compound, id).
    pub by_expiry: BTreeSet<(u64, u16, u64)>,
    /// (arrival, id, compound): the oldest first.
    pub by_age: BTreeSet<(u64, u64, u16)>,
    pub counts: Fenwick,
}

impl Pending {
    pub fn push(&mut self, id: u64, r: Request) {
        self.by_priority.insert((r.compound, id), r);
        self.by_expiry.insert((r.expiry, r.compound, id));
        self.by_age.insert((r.arrival, id, r.compound));
        self.counts.add(r.compound, 1);
    }
    pub fn get(&self, key: (u16, u64)) -> Option<&Request> {
        self.by_priority.get(&key).or_else(|| self.urgent.get(&key))
    }
    pub fn remove(&mut self, key: (u16, u64)) -> Option<Request> {
        let r = match self.by_priority.remove(&key) {
            Some(r) => {
                self.by_expiry.remove(&(r.expiry, key.0, key.1));
                r
            }
            None => self.urgent.remove(&key)?,
        };
        self.by_age.remove(&(r.arrival, key.1, key.0));
        self.counts.add(r.compound, -1);
        Some(r)
    }
    /// The most important waiter of both tiers, without serving it.
    fn first_key(&self) -> Option<(u16, u64)> {
        let normal = self.by_priority.keys().next().copied();
        let urgent = self.urgent.keys().next().copied();
        normal.into_iter().chain(urgent).min()
    }
    /// The least important waiter of both tiers.
    fn last_key(&self) -> Option<(u16, u64)> {
        let normal = self.by_priority.keys().next_back().copied();
        let urgent = self.urgent.keys().next_back().copied();
        normal.into_iter().chain(urgent).max()
    }
    /// Removes the least important waiter if it is less important than `c`.
    pub fn pop_less_important_than(&mut self, c: u16) -> Option<(u64, Request)> {
        let key = self.last_key().filter(|&(k, _)| k > c)?;
        self.remove(key).map(|r| (key.1, r))
    }
    pub fn less_important_than(&self, c: u16) -> bool {
        self.last_key().is_some_and(|(k, _)| k > c)
    }
    pub fn oldest(&self) -> Option<u64> {
        self.by_age.iter().next().map(|&(a, _, _)| a)
    }
    pub fn len(&self) -> usize {
        self.by_priority.len() + self.urgent.len()
    }
}

impl ServiceOrder for Pending {
    type Instant = u64;
    type Served = (u64, Request);

    fn waiting(&self) -> usize {
        self.len()
    }

    fn pop_oldest(&mut self) -> Option<(u64, Request)> {
        let &(_, id, compound) = self.by_age.first()?;
        self.remove((compound, id)).map(|r| (id, r))
    }

    fn promote_expiring_before(&mut self, until: u64) {
        while let Some(&(expiry, compound, id)) = self.by_expiry.first() {
            if expiry >= until {
                break;
            }
            self.by_expiry.pop_first();
            if let Some(r) = self.by_priority.remove(&(compound, id)) {
                self.urgent.insert((compound, id), r);
            }
        }
    }

    fn pop_most_important_urgent(&mut self) -> Option<(u64, Request)> {
        let (&key, _) = self.urgent.first_key_value()?;
        self.remove(key).map(|r| (key.1, r))
    }

    fn pop_most_important(&mut self) -> Option<(u64, Request)> {
        let key = self.first_key()?;
        self.remove(key).map(|r| (key.1, r))
    }
}

impl Request {
    /// The request as the queue policy sees it.
    pub fn waiter(&self) -> Waiter {
        let priority = Priority::from_compound(self.compound).unwrap_or(Priority::MOST_IMPORTANT);
        Waiter { priority, arrival: self.arrival, deadline: self.deadline }
    }
}

impl Pending {
    pub fn new() -> Self {
        Pending {
            by_priority: BTreeMap::new(),
            urgent: BTreeMap::new(),
            by_expiry: BTreeSet::new(),
            by_age: BTreeSet::new(),
            counts: Fenwick::new(),
        }
    }
}

/// The queue policy's view of the simulated queue. The waiters it evicts are collected
/// here for the simulator to refuse (and count).
pub struct SimQueue<'a> {
    pub pending: &'a mut Pending,
    pub rates: Rates,
    pub evicted: Vec<(u64, Request)>,
}

impl<'a> SimQueue<'a> {
    pub fn new(pending: &'a mut Pending, rates: Rates) -> Self {
        SimQueue { pending, rates, evicted: Vec::new() }
    }
}

impl Waiters for SimQueue<'_> {
    fn waiting_ahead_of(&self, p: Priority) -> usize {
        self.pending.counts.prefix(p.compound())
    }

    fn less_important_waiting(&self, p: Priority) -> bool {
        self.pending.less_important_than(p.compound())
    }

    fn evict_less_important_than(&mut self, bound: Priority) {
        while let Some(evicted) = self.pending.pop_less_important_than(bound.compound()) {
            self.evicted.push(evicted);
        }
    }

    fn rates(&self) -> Rates {
        self.rates
    }
}

/// The simulator's decision at the door (for a request that finds no free slot).
pub fn door_turn(policy: &QueuePolicy, r: &Request, at: &Conditions, queue: &SimQueue<'_>) -> Door {
    policy.door(&r.waiter(), at, queue)
}

/// One turn of a waiter's timer; the waiters it evicted are left in `queue.evicted`.
pub fn timer_turn(
    policy: &QueuePolicy,
    r: &Request,
    at: &Conditions,
    queue: &mut SimQueue<'_>,
) -> Step {
    policy.on_timer(&r.waiter(), at, queue)
}
