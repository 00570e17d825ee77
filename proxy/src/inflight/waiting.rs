//! The requests waiting for a slot, in two tiers: the urgent waiters (their budget is
//! running out) and the rest, each ordered most important first and, within one compound
//! priority, oldest first; and all of them in arrival order. Who is granted next is the
//! queue policy's [`serve_next`](admission_core::queue_policy::serve_next): while the level
//! does not bind, the oldest while the queue is short, else the urgent tier first; the most
//! important of both tiers while it binds. Entries live in a
//! slab indexed by ticket so a waiter finds its own entry (to learn it was granted or
//! evicted, or to leave) without searching; the slab and its free list are reused, so a
//! steady queue allocates only when it reaches a new depth.

use std::collections::{BTreeMap, BTreeSet};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use admission_core::queue_policy::{Service, ServiceOrder};
use admission_core::Priority;

/// A waiter's handle on its entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ticket(usize);

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// A slot was granted and already counted as in flight.
    Granted,
    /// A more important newcomer took the place of this one in a full queue.
    Evicted,
}

#[derive(Debug, Default)]
pub(super) struct Waiting {
    /// The waiters not (yet) urgent, the smallest key first.
    order: BTreeMap<Key, usize>,
    /// The urgent waiters, the smallest key first.
    urgent: BTreeMap<Key, usize>,
    /// The waiters in `order` that have an expiry, soonest first.
    by_expiry: BTreeSet<(Instant, Key)>,
    /// Every waiter, both tiers: arrival order (`seq`) to its compound priority. (Whatever
    /// leaves a tier leaves this too: a grant counts its slot before it pops, so a stale
    /// entry here would leak a slot.)
    by_arrival: BTreeMap<u64, u16>,
    entries: Vec<Entry>,
    vacant: Vec<usize>,
    next_seq: u64,
}

/// Compound priority (smaller = more important), then arrival order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    priority: u16,
    seq: u64,
}

#[derive(Debug)]
enum Entry {
    Waiting { key: Key, expiry: Option<Instant>, waker: Option<Waker>, since: Instant },
    Done(Outcome),
    Vacant,
}

// === impl Waiting ===

impl Waiting {
    pub(super) fn len(&self) -> usize {
        self.order.len() + self.urgent.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.order.is_empty() && self.urgent.is_empty()
    }

    /// Queues a waiter whose budget ends at `expiry` (`None`: never urgent).
    pub(super) fn push(&mut self, priority: Priority, expiry: Option<Instant>) -> Ticket {
        let key = Key { priority: priority.compound(), seq: self.next_seq };
        self.next_seq += 1;
        let entry = Entry::Waiting { key, expiry, waker: None, since: Instant::now() };
        let index = match self.vacant.pop() {
            Some(i) => {
                self.entries[i] = entry;
                i
            }
            None => {
                self.entries.push(entry);
                self.entries.len() - 1
            }
        };
        self.order.insert(key, index);
        self.by_arrival.insert(key.seq, key.priority);
        if let Some(expiry) = expiry {
            self.by_expiry.insert((expiry, key));
        }
        Ticket(index)
    }

    /// When the longest-waiting request joined (arrival order is `seq` order).
    pub(super) fn oldest_since(&self) -> Option<Instant> {
        let (&seq, &priority) = self.by_arrival.first_key_value()?;
        let key = Key { priority, seq };
        let &index = self.order.get(&key).or_else(|| self.urgent.get(&key))?;
        match self.entries[index] {
            Entry::Waiting { since, .. } => Some(since),
            Entry::Done(_) | Entry::Vacant => None,
        }
    }

    /// Waiters at least as important as `p` (who would be served before a newcomer at `p`).
    /// (The urgent tier is not counted apart: the door predicts waits in priority order.)
    pub(super) fn ahead_of(&self, p: Priority) -> usize {
        let bound = ..=Key { priority: p.compound(), seq: u64::MAX };
        self.order.range(bound).count() + self.urgent.range(bound).count()
    }

    /// Whether anyone less important than `p` waits.
    pub(super) fn any_less_important_than(&self, p: Priority) -> bool {
        self.last_key().is_some_and(|key| key.priority > p.compound())
    }

    /// The least important waiter of both tiers.
    fn last_key(&self) -> Option<Key> {
        let normal = self.order.last_key_value().map(|(&key, _)| key);
        let urgent = self.urgent.last_key_value().map(|(&key, _)| key);
        normal.max(urgent)
    }

    /// The most important waiter of both tiers.
    fn first_key(&self) -> Option<Key> {
        let normal = self.order.first_key_value().map(|(&key, _)| key);
        let urgent = self.urgent.first_key_value().map(|(&key, _)| key);
        match (normal, urgent) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Takes `key` out of whichever tier holds it (and the expiry index); its slab index.
    fn unlink(&mut self, key: Key) -> Option<usize> {
        self.by_arrival.remove(&key.seq);
        if let Some(index) = self.order.remove(&key) {
            if let Entry::Waiting { expiry: Some(expiry), .. } = self.entries[index] {
                self.by_expiry.remove(&(expiry, key));
            }
            return Some(index);
        }
        self.urgent.remove(&key)
    }

    /// Grants the next waiter in the policy's order (`service`: see
    /// [`serve_next`](admission_core::queue_policy::serve_next)); the caller counts it in
    /// flight. Its waker to wake.
    pub(super) fn grant_next(&mut self, service: Service<Instant>) -> Option<Option<Waker>> {
        admission_core::queue_policy::serve_next(service, self)
            .map(|index| self.finish(index, Outcome::Granted))
    }

    /// Evicts the least important waiter if it is less important than `newcomer`.
    pub(super) fn evict_less_important_than(
        &mut self,
        newcomer: Priority,
    ) -> Option<Option<Waker>> {
        let key = self.last_key()?;
        if key.priority <= newcomer.compound() {
            return None;
        }
        let index = self.unlink(key)?;
        Some(self.finish(index, Outcome::Evicted))
    }

    fn finish(&mut self, index: usize, outcome: Outcome) -> Option<Waker> {
        match std::mem::replace(&mut self.entries[index], Entry::Done(outcome)) {
            Entry::Waiting { waker, .. } => waker,
            Entry::Done(_) | Entry::Vacant => None,
        }
    }

    /// Ready with the outcome once the wait ended (the ticket is then spent); otherwise
    /// remembers the waker.
    pub(super) fn poll(&mut self, ticket: Ticket, cx: &mut Context<'_>) -> Poll<Outcome> {
        match &mut self.entries[ticket.0] {
            Entry::Waiting { waker, .. } => {
                match waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => *waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            Entry::Done(outcome) => {
                let outcome = *outcome;
                self.vacate(ticket.0);
                Poll::Ready(outcome)
            }
            Entry::Vacant => Poll::Ready(Outcome::Evicted),
        }
    }

    /// The waiter leaves (its future was dropped). Returns the outcome if the wait had
    /// already ended unseen: a granted slot must then be given back.
    pub(super) fn leave(&mut self, ticket: Ticket) -> Option<Outcome> {
        let outcome = match &self.entries[ticket.0] {
            &Entry::Waiting { key, .. } => {
                self.unlink(key);
                None
            }
            Entry::Done(outcome) => Some(*outcome),
            Entry::Vacant => return None,
        };
        self.vacate(ticket.0);
        outcome
    }

    fn vacate(&mut self, index: usize) {
        self.entries[index] = Entry::Vacant;
        self.vacant.push(index);
    }
}

/// The tiers as the policy's service order sees them: serving yields the slab index.
impl ServiceOrder for Waiting {
    type Instant = Instant;
    type Served = usize;

    fn waiting(&self) -> usize {
        self.len()
    }

    fn pop_oldest(&mut self) -> Option<usize> {
        let (&seq, &priority) = self.by_arrival.first_key_value()?;
        self.unlink(Key { priority, seq })
    }

    fn promote_expiring_before(&mut self, until: Instant) {
        while let Some(&(expiry, key)) = self.by_expiry.first() {
            if expiry >= until {
                break;
            }
            self.by_expiry.pop_first();
            if let Some(index) = self.order.remove(&key) {
                self.urgent.insert(key, index);
            }
        }
    }

    fn pop_most_important_urgent(&mut self) -> Option<usize> {
        let (key, index) = self.urgent.pop_first()?;
        self.by_arrival.remove(&key.seq);
        Some(index)
    }

    fn pop_most_important(&mut self) -> Option<usize> {
        let key = self.first_key()?;
        self.unlink(key)
    }
}
