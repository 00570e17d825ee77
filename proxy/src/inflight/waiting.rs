//! The requests waiting for a slot, ordered most important first and, within one compound
//! priority, oldest first. Entries live in a slab indexed by ticket so a waiter finds its own
//! entry (to learn it was granted or evicted, or to leave) without searching; the slab and
//! its free list are reused, so a steady queue allocates only when it reaches a new depth.

use std::collections::BTreeMap;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

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
    /// Dequeue order: the smallest key is the next to go.
    order: BTreeMap<Key, usize>,
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
    Waiting { key: Key, waker: Option<Waker>, since: Instant },
    Done(Outcome),
    Vacant,
}

// === impl Waiting ===

impl Waiting {
    pub(super) fn len(&self) -> usize {
        self.order.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    pub(super) fn push(&mut self, priority: Priority) -> Ticket {
        let key = Key { priority: priority.compound(), seq: self.next_seq };
        self.next_seq += 1;
        let entry = Entry::Waiting { key, waker: None, since: Instant::now() };
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
        Ticket(index)
    }

    /// When the longest-waiting request joined (arrival order is `seq` order). Walks the
    /// queue: called from the 50 ms timer, on a queue of at most `max_queued`.
    pub(super) fn oldest_since(&self) -> Option<Instant> {
        let (_, &index) = self.order.iter().min_by_key(|(key, _)| key.seq)?;
        match self.entries[index] {
            Entry::Waiting { since, .. } => Some(since),
            Entry::Done(_) | Entry::Vacant => None,
        }
    }

    /// Waiters at least as important as `p` (who would be served before a newcomer at `p`).
    pub(super) fn ahead_of(&self, p: Priority) -> usize {
        self.order.range(..=Key { priority: p.compound(), seq: u64::MAX }).count()
    }

    /// Whether anyone less important than `p` waits.
    pub(super) fn any_less_important_than(&self, p: Priority) -> bool {
        self.order.last_key_value().is_some_and(|(key, _)| key.priority > p.compound())
    }

    /// Grants the most important waiter (the caller counts it in flight); its waker to wake.
    pub(super) fn grant_most_important(&mut self) -> Option<Option<Waker>> {
        let (_, index) = self.order.pop_first()?;
        Some(self.finish(index, Outcome::Granted))
    }

    /// Evicts the least important waiter if it is less important than `newcomer`.
    pub(super) fn evict_less_important_than(
        &mut self,
        newcomer: Priority,
    ) -> Option<Option<Waker>> {
        let (key, _) = self.order.last_key_value()?;
        if key.priority <= newcomer.compound() {
            return None;
        }
        let (_, index) = self.order.pop_last()?;
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
            Entry::Waiting { key, .. } => {
                self.order.remove(key);
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
