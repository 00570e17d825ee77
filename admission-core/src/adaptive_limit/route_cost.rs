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
//! **A queue at the app slows every route, a downstream only its callers.** Without the
//! egress role (the app's calls unseen) a route whose downstream queues reads, at this hop,
//! as a route whose own time rose. So before the limit reads an interval's rise as the app's
//! own queue it asks whether the routes rose together ([`RouteCosts::close_interval`]): a
//! route whose answers in the interval rose above its baseline is left out of the
//! judgement when another route *vouches* that the app has no queue: that route's latest
//! [`RECENT`] answers (at least [`VERDICT_ANSWERS`] of them within the evidence span) are
//! within the noise tolerance of its baseline and exceed it by at most half what the risen
//! route's did (a queue adds about the same wait to every route; a route of a long baseline
//! has a tolerance that could hide it), and it had its baseline before the rise began (a
//! route first measured inside a queue would take the queue for its own time, and vouch for
//! it). A queue in front of the app's workers would have slowed the vouching route
//! too. With no route to vouch (every route with fresh answers rose, or only one route has
//! any) the interval is judged whole, as before. So an app of a single route cannot tell its
//! downstream's queue from its own, and keeps the behaviour it had; a route too rare to have
//! [`VERDICT_ANSWERS`] answers in the span is no evidence either way. An interval with
//! answers of a route not yet measured (its first [`ROUTE_BLOCK`]) says nothing of a rise
//! (`neutral`): at a start, the routes are measured before a rise is judged.
//!
//! Pure: the caller passes `now`.

use std::collections::VecDeque;

use crate::clock::Nanos;

/// Routes tracked at once.
pub const MAX_ROUTES: usize = 64;

/// Answers of one route a baseline candidate averages over (a burst of a slow route is
/// measured within its first few answers; one answer alone would be a lucky low).
pub const ROUTE_BLOCK: u32 = 8;

/// A route's latest answers a verdict (calm or risen) reads...
pub const RECENT: usize = 4;
/// ...and at least this many of them within the evidence span (one answer's own time is
/// too noisy to speak for its route).
pub const VERDICT_ANSWERS: usize = 3;

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
    /// The open interval's answers of this route: what they took, and what their route's
    /// baseline said they would.
    interval: Sums,
    /// `(at, own, expected)` of the latest answers (a ring, `next` the oldest slot once
    /// full; an answer before the route had a baseline was its own expectation).
    recent: [(Nanos, u64, u64); RECENT],
    recent_len: usize,
    next: usize,
    /// Since when the route has had a baseline.
    since: Option<Nanos>,
}

/// Answers, and the sums of their own and expected times (nanoseconds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sums {
    pub answers: u32,
    pub own: u128,
    pub expected: u128,
}

impl Sums {
    fn add(&mut self, own: u64, expected: u64) {
        self.answers = self.answers.saturating_add(1);
        self.own += u128::from(own);
        self.expected += u128::from(expected);
    }

    fn add_all(&mut self, other: Sums) {
        self.answers = self.answers.saturating_add(other.answers);
        self.own += other.own;
        self.expected += other.expected;
    }
}

/// A route's state by its latest answers.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Verdict {
    /// At its baseline (within the tolerance): by how much its answers exceeded it.
    Calm(f64),
    /// Above it.
    Risen,
}

impl RouteCost {
    fn baseline(&self) -> Option<u64> {
        self.lows.front().map(|&(_, m)| m)
    }

    /// Calm (with the mean excess of its answers over their baselines, nanoseconds, 0 if
    /// below) or risen, by the latest answers since `from` (at least [`VERDICT_ANSWERS`]);
    /// `None` without enough of them.
    fn verdict(&self, from: Nanos, tolerance: &impl Fn(f64) -> f64) -> Option<Verdict> {
        let fresh = self.recent[..self.recent_len].iter().filter(|&&(at, _, _)| at >= from);
        let (n, own, expected) = fresh.fold((0usize, 0, 0), |(n, o, e), &(_, own, exp)| {
            (n + 1, o + u128::from(own), e + u128::from(exp))
        });
        if n < VERDICT_ANSWERS {
            return None;
        }
        Some(if rose(own, expected, n as u128, tolerance) {
            Verdict::Risen
        } else {
            Verdict::Calm(excess(own, expected, n as u128))
        })
    }
}

/// The mean excess of `n` answers that took `own` in all over the `expected` they summed to
/// (nanoseconds, 0 if they took less).
fn excess(own: u128, expected: u128, n: u128) -> f64 {
    own.saturating_sub(expected) as f64 / n.max(1) as f64
}

/// Whether `n` answers that took `own` in all rose above the `expected` they summed to by
/// more than the tolerance of their mean.
fn rose(own: u128, expected: u128, n: u128, tolerance: &impl Fn(f64) -> f64) -> bool {
    if n == 0 {
        return false;
    }
    let (own, expected) = (own as f64 / n as f64, expected as f64 / n as f64);
    own > expected + tolerance(expected)
}

/// What [`RouteCosts::close_interval`] found in the closed interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouteSplit {
    /// The answers of the routes that rose alone.
    pub alone: Sums,
    /// Answers of routes without a baseline yet.
    pub neutral: u32,
}

/// See the module's documentation.
#[derive(Debug, Clone)]
pub struct RouteCosts {
    horizon: Nanos,
    routes: Vec<RouteCost>,
    /// The open interval's answers of routes without a baseline.
    neutral: u32,
}

impl RouteCosts {
    pub fn new(horizon: Nanos) -> Self {
        RouteCosts { horizon, routes: Vec::new(), neutral: 0 }
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
                    interval: Sums::default(),
                    recent: [(0, 0, 0); RECENT],
                    recent_len: 0,
                    next: 0,
                    since: None,
                });
                self.routes.len() - 1
            }
        };
        let r = &mut self.routes[i];
        r.last_seen = now;
        while r.lows.front().is_some_and(|&(end, _)| now.saturating_sub(end) > horizon) {
            r.lows.pop_front();
        }
        if r.lows.is_empty() {
            r.since = None;
        }
        let expected = r.baseline().unwrap_or(own);
        r.interval.add(own, expected);
        self.neutral += u32::from(r.since.is_none());
        r.recent[r.next] = (now, own, expected);
        r.next = (r.next + 1) % RECENT;
        r.recent_len = (r.recent_len + 1).min(RECENT);
        r.answers += 1;
        r.sum += u128::from(own);
        if r.answers >= ROUTE_BLOCK {
            let mean = (r.sum / u128::from(r.answers)) as u64;
            (r.answers, r.sum) = (0, 0);
            while r.lows.back().is_some_and(|&(_, m)| m >= mean) {
                r.lows.pop_back();
            }
            r.lows.push_back((now, mean.max(1)));
            r.since = r.since.or(Some(now));
        }
        Some(expected)
    }

    /// The open interval closes at `now`: the sums of its answers of the routes that rose
    /// alone, to be left out of its judgement (see the module doc: each rose in the
    /// interval, and another route vouches for the app, by its answers since `now - span`
    /// and with a baseline since `rise_began` or earlier), and how many of its answers were
    /// of routes not yet measured. `tolerance` is the limit's noise allowance over a
    /// baseline. Every route's interval starts anew.
    pub fn close_interval(
        &mut self,
        now: Nanos,
        span: Nanos,
        rise_began: Nanos,
        tolerance: impl Fn(f64) -> f64,
    ) -> RouteSplit {
        let from = now.saturating_sub(span);
        // The two calmest routes that may vouch: (index, excess).
        let mut calmest = [(usize::MAX, f64::INFINITY); 2];
        for (i, r) in self.routes.iter().enumerate() {
            if r.since.is_none_or(|s| s > rise_began) {
                continue;
            }
            if let Some(Verdict::Calm(e)) = r.verdict(from, &tolerance) {
                if e < calmest[0].1 {
                    calmest = [(i, e), calmest[0]];
                } else if e < calmest[1].1 {
                    calmest[1] = (i, e);
                }
            }
        }
        let mut alone = Sums::default();
        for (i, r) in self.routes.iter().enumerate() {
            let Sums { answers, own, expected } = r.interval;
            let n = u128::from(answers);
            if r.since.is_none() || !rose(own, expected, n, &tolerance) {
                continue;
            }
            // A queue adds about the same wait to every route: the route vouching rose by at
            // most half as much (a route of a long baseline, whose tolerance hides a queue
            // the others show, does not vouch against it).
            let vouch = if calmest[0].0 == i { calmest[1].1 } else { calmest[0].1 };
            if vouch <= excess(own, expected, n) / 2.0 {
                alone.add_all(r.interval);
            }
        }
        for r in self.routes.iter_mut() {
            r.interval = Sums::default();
        }
        RouteSplit { alone, neutral: std::mem::take(&mut self.neutral) }
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

    /// 20% over the baseline, at least 5 ms (the limit's defaults).
    fn tolerance(b: f64) -> f64 {
        (b * 0.2).max(5e6)
    }

    /// Ten answers of each route from `at` on, one a millisecond: `x` and `y` own time.
    fn both(c: &mut RouteCosts, at: Nanos, x: u64, y: u64) {
        for i in 0..10 {
            c.answer(at + i * MS, Some(route_key("/x")), x);
            c.answer(at + i * MS, Some(route_key("/y")), y);
        }
    }

    #[test]
    fn a_route_that_rose_alone_is_split_off_when_another_vouches() {
        let mut c = RouteCosts::new(10_000 * MS);
        both(&mut c, 0, 2 * MS, 50 * MS);
        assert_eq!(c.close_interval(10 * MS, 500 * MS, 10 * MS, tolerance).neutral, 16);
        // X rose (2 -> 100 ms), Y stayed: X's ten answers are split off.
        both(&mut c, 100 * MS, 100 * MS, 50 * MS);
        let split = c.close_interval(110 * MS, 500 * MS, 100 * MS, tolerance);
        assert_eq!((split.alone.answers, split.neutral), (10, 0));
        assert_eq!(split.alone.own, 1_000 * u128::from(MS));
        assert_eq!(split.alone.expected, 20 * u128::from(MS));
        // Both rose (a queue of 40 ms): nothing vouches, nothing is split off.
        both(&mut c, 200 * MS, 140 * MS, 90 * MS);
        assert_eq!(c.close_interval(210 * MS, 500 * MS, 200 * MS, tolerance).alone.answers, 0);
        // A route measured only after the rise began does not vouch.
        both(&mut c, 300 * MS, 100 * MS, 50 * MS);
        assert_eq!(c.close_interval(310 * MS, 500 * MS, 5 * MS, tolerance).alone.answers, 0);
        // Nor do answers older than the span.
        c.answer(1_000 * MS, Some(route_key("/x")), 100 * MS);
        assert_eq!(c.close_interval(1_000 * MS, 500 * MS, 1_000 * MS, tolerance).alone.answers, 0);
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
