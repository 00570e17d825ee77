//! Each route's own time without a queue, so the limit judges a mix of routes of different
//! cost against the mix's own baseline, not the lowest mean of whatever mix came before.
//!
//! An app whose routes differ in cost (2 ms and 50 ms) raises its mean own time by the mix
//! alone when the slow route's share grows (a burst of it): read against a baseline measured
//! on the fast route, that is a rise, the surplus looks like a queue, and a suspicion cut
//! the limit of an async app that holds nothing while it waits (its slow route then waited
//! in the sidecar, and was refused there). A queue makes every route slower than its own
//! baseline; a mix shift does not. So each answer carries its route's no-queue time (the
//! lowest mean of [`ROUTE_BLOCK`] consecutive answers of that route over the horizon), and
//! the limit compares an interval's mean own time with the mean of those (see
//! `AdaptiveLimit::judge`).
//!
//! Bounded: at most [`MAX_ROUTES`] routes are tracked; a route is forgotten once unseen for
//! the horizon. An answer with no route, or of a route that finds the table full (paths
//! with ids in them), falls back to the limit's overall baseline, as before there were
//! routes. A route's first answers, before it has a baseline, are neutral (their own time
//! is taken as their baseline): an unmeasured route says nothing about a queue either way.
//! (That is at most `MAX_ROUTES x ROUTE_BLOCK` answers per horizon once the table is full.)
//!
//! Pure: the caller passes `now`.

use std::collections::VecDeque;

use crate::clock::Nanos;

/// Routes tracked at once.
pub const MAX_ROUTES: usize = 64;

/// Answers of one route a baseline candidate averages over (a burst of a slow route is
/// measured within its first few answers; one answer alone would be a lucky low).
pub const ROUTE_BLOCK: u32 = 8;

/// A route's key: a hash of its path (the caller's choice; equal paths, equal keys).
pub type RouteKey = u64;

#[derive(Debug, Clone)]
struct RouteCost {
    key: RouteKey,
    last_seen: Nanos,
    /// The open block.
    answers: u32,
    sum: u128,
    /// `(end, mean)` of the closed blocks over the horizon, means increasing from the
    /// front (a later lower mean drops the higher ones before it): the front is the lowest.
    lows: VecDeque<(Nanos, u64)>,
}

impl RouteCost {
    fn baseline(&self) -> Option<u64> {
        self.lows.front().map(|&(_, m)| m)
    }
}

/// See the module's documentation.
#[derive(Debug, Clone)]
pub struct RouteCosts {
    horizon: Nanos,
    routes: Vec<RouteCost>,
}

impl RouteCosts {
    pub fn new(horizon: Nanos) -> Self {
        RouteCosts { horizon, routes: Vec::new() }
    }

    /// An answer of `route` with `own` time at `now`: its route's no-queue time as known
    /// before it (`own` itself while the route has none yet), or `None` to fall back to the
    /// overall baseline (no route, or the table full).
    pub fn answer(&mut self, now: Nanos, route: Option<RouteKey>, own: u64) -> Option<u64> {
        let key = route?;
        let horizon = self.horizon;
        let i = match self.routes.iter().position(|r| r.key == key) {
            Some(i) => i,
            None => {
                self.routes.retain(|r| now.saturating_sub(r.last_seen) <= horizon);
                if self.routes.len() >= MAX_ROUTES {
                    return None;
                }
                self.routes.push(RouteCost {
                    key,
                    last_seen: now,
                    answers: 0,
                    sum: 0,
                    lows: VecDeque::new(),
                });
                self.routes.len() - 1
            }
        };
        let r = &mut self.routes[i];
        r.last_seen = now;
        while r.lows.front().is_some_and(|&(end, _)| now.saturating_sub(end) > horizon) {
            r.lows.pop_front();
        }
        let expected = r.baseline().unwrap_or(own);
        r.answers += 1;
        r.sum += u128::from(own);
        if r.answers >= ROUTE_BLOCK {
            let mean = (r.sum / u128::from(r.answers)) as u64;
            (r.answers, r.sum) = (0, 0);
            while r.lows.back().is_some_and(|&(_, m)| m >= mean) {
                r.lows.pop_back();
            }
            r.lows.push_back((now, mean.max(1)));
        }
        Some(expected)
    }

    /// Routes tracked now.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }
}

/// A route key for a request path (FNV-1a; the query is not part of the path).
pub fn route_key(path: &str) -> RouteKey {
    path.bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    #[test]
    fn a_route_is_judged_against_its_own_lowest_block() {
        let mut c = RouteCosts::new(10_000 * MS);
        let (x, y) = (Some(route_key("/x")), Some(route_key("/y")));
        assert_eq!(c.answer(0, y, 50 * MS), Some(50 * MS), "unmeasured: neutral");
        for i in 1..ROUTE_BLOCK as u64 {
            c.answer(i, y, 50 * MS);
        }
        assert_eq!(c.answer(10, y, 70 * MS), Some(50 * MS));
        assert_eq!(c.answer(10, x, 2 * MS), Some(2 * MS));
        assert_eq!(c.answer(10, None, 2 * MS), None);
        // Forgotten after the horizon.
        assert_eq!(c.answer(20_000 * MS, y, 60 * MS), Some(60 * MS));
    }

    #[test]
    fn the_table_is_bounded_and_forgets_unseen_routes() {
        let mut c = RouteCosts::new(10_000 * MS);
        for i in 0..MAX_ROUTES as u64 {
            assert!(c.answer(i, Some(i), MS).is_some());
        }
        assert_eq!(c.answer(100, Some(999), MS), None, "full: the overall baseline");
        assert_eq!(c.len(), MAX_ROUTES);
        assert_eq!(c.answer(20_000 * MS, Some(999), MS), Some(MS), "the others expired");
        assert_eq!(c.len(), 1);
    }
}
