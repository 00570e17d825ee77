//! The egress role's memory of its downstreams: per authority, the last valid
//! `x-admission-level` a response carried, kept until `expiry` passes without news, so a
//! caller refuses locally what the downstream would shed (docs/design.md, "Roles", egress)
//! and a recovered downstream is probed again once the news is old.
//!
//! - **Only valid news is cached.** A response with no level is no news (the cached one
//!   ages); one with a malformed, out-of-range or repeated level is ignored and counted,
//!   never cached, and does not refresh the cached one either.
//! - **Bounded.** At most `max_authorities` authorities get a slot, the first ones seen;
//!   a slot is never evicted, so the set of `weir_downstream_level{authority}` label
//!   values is bounded too. Responses from any further authority are not cached (their
//!   requests are never refused locally: the downstream refuses them itself) and are
//!   aggregated in one counter, [`LevelCounters::uncached`].
//! - **A dip into the top class is short-lived.** A level lower than the fresh one it
//!   replaces that cuts into the most important business class this caller has sent (a
//!   callee settling, a one-window dip) is kept for an eighth of `expiry` only: cached for
//!   the full expiry, one bad window would refuse the requests that matter most at every
//!   caller for two seconds, while the callee itself may already admit them again. Past
//!   that, the next such request goes out and brings news; the same level again (a cut that
//!   holds) is kept for the whole expiry.
//! - **Allocation-free hot path.** [`DownstreamLevels::should_refuse`] is a read lock, a
//!   hash lookup by `&str` and one atomic load (and a relaxed load to track the top class).
//!   Only the first response from a new authority allocates (its slot).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::RwLock;
use std::time::Duration;

use crate::clock::{Clock, Nanos};
use crate::priority::{AdmissionLevel, HeaderValueError, Priority};

/// Default expiry of a cached level without news.
pub const DEFAULT_EXPIRY: Duration = Duration::from_secs(2);
/// Default bound on the authorities with a cached level.
pub const DEFAULT_MAX_AUTHORITIES: usize = 64;

/// A level cutting into the top class seen is kept for `expiry / TOP_CLASS_EXPIRY_DIVISOR`.
pub const TOP_CLASS_EXPIRY_DIVISOR: u64 = 8;

/// What one response's level header did to the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observation {
    /// A valid level, now cached for the authority.
    Cached(AdmissionLevel),
    /// A valid level from an authority beyond `max_authorities`: not cached.
    Uncached(AdmissionLevel),
    /// No level header: nothing changes.
    Absent,
    /// A level header that does not parse (or is out of range): ignored.
    Malformed(HeaderValueError),
    /// More than one level header: ignored (which one would be the truth?).
    Repeated,
}

/// Counts of what the responses carried, since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LevelCounters {
    pub cached: u64,
    pub uncached: u64,
    pub absent: u64,
    pub malformed: u64,
    pub repeated: u64,
}

/// Per-authority admission levels with an expiry. `C` is injectable so tests step time.
pub struct DownstreamLevels<C: Clock> {
    clock: C,
    expiry_micros: u64,
    max_authorities: usize,
    /// The most important business class asked about so far (255 before any).
    top_class: AtomicU8,
    slots: RwLock<HashMap<Box<str>, Slot>>,
    cached: AtomicU64,
    uncached: AtomicU64,
    absent: AtomicU64,
    malformed: AtomicU64,
    repeated: AtomicU64,
}

/// One authority's level: `(expires_at_micros << 16) | (compound + 1)`, 0 = nothing known.
/// One word, so a reader never sees a level with another level's expiry. Microseconds in
/// 48 bits last 8.9 years of uptime; the compound level needs 15 bits.
#[derive(Debug, Default)]
struct Slot {
    state: AtomicU64,
}

const LEVEL_BITS: u32 = 16;
const LEVEL_MASK: u64 = (1 << LEVEL_BITS) - 1;

// === impl DownstreamLevels ===

impl<C: Clock> DownstreamLevels<C> {
    /// `expiry` is clamped to at least one microsecond; `max_authorities` may be 0 (nothing
    /// is cached: local refusal off).
    pub fn new(expiry: Duration, max_authorities: usize, clock: C) -> Self {
        DownstreamLevels {
            clock,
            expiry_micros: (expiry.as_micros() as u64).max(1),
            max_authorities,
            top_class: AtomicU8::new(u8::MAX),
            slots: RwLock::new(HashMap::with_capacity(max_authorities.min(1024))),
            cached: AtomicU64::new(0),
            uncached: AtomicU64::new(0),
            absent: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
            repeated: AtomicU64::new(0),
        }
    }

    pub fn expiry(&self) -> Duration {
        Duration::from_micros(self.expiry_micros)
    }

    pub fn max_authorities(&self) -> usize {
        self.max_authorities
    }

    /// Records the level header values of one response from `authority` (all values of the
    /// header, in order). Exactly one valid value is cached; anything else is counted.
    pub fn observe<'v>(
        &self,
        authority: &str,
        values: impl IntoIterator<Item = &'v [u8]>,
    ) -> Observation {
        let mut values = values.into_iter();
        let observation = match (values.next(), values.next()) {
            (None, _) => Observation::Absent,
            (Some(_), Some(_)) => Observation::Repeated,
            (Some(value), None) => match AdmissionLevel::parse(value) {
                Err(e) => Observation::Malformed(e),
                Ok(level) => self.store(authority, level),
            },
        };
        let counter = match observation {
            Observation::Cached(_) => &self.cached,
            Observation::Uncached(_) => &self.uncached,
            Observation::Absent => &self.absent,
            Observation::Malformed(_) => &self.malformed,
            Observation::Repeated => &self.repeated,
        };
        counter.fetch_add(1, Relaxed);
        observation
    }

    /// `true` iff a fresh cached level of `authority` does not admit `priority`.
    #[inline]
    pub fn should_refuse(&self, authority: &str, priority: Priority) -> bool {
        if priority.business < self.top_class.load(Relaxed) {
            self.top_class.fetch_min(priority.business, Relaxed);
        }
        self.level(authority).is_some_and(|level| !level.admits(priority))
    }

    /// The fresh cached level of `authority`, if any.
    #[inline]
    pub fn level(&self, authority: &str) -> Option<AdmissionLevel> {
        let state = {
            let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
            slots.get(authority)?.state.load(Relaxed)
        };
        self.fresh(state)
    }

    /// The fresh cached level of `authority` and whether its news is older than
    /// `expiry / TOP_CLASS_EXPIRY_DIVISOR` (stale: a caller that refuses everything it would
    /// send on it hears nothing new, so it may let a probe through to bring news).
    pub fn level_news(&self, authority: &str) -> Option<(AdmissionLevel, bool)> {
        let state = {
            let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
            slots.get(authority)?.state.load(Relaxed)
        };
        let level = self.fresh(state)?;
        let remaining = (state >> LEVEL_BITS).saturating_sub(self.now_micros());
        let fresh_for = self.expiry_micros - self.expiry_micros / TOP_CLASS_EXPIRY_DIVISOR;
        Some((level, remaining < fresh_for))
    }

    /// Calls `f` for every authority with a slot and its fresh level (`None`: expired or
    /// never known). At most `max_authorities` calls.
    pub fn for_each(&self, mut f: impl FnMut(&str, Option<AdmissionLevel>)) {
        let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
        for (authority, slot) in slots.iter() {
            f(authority, self.fresh(slot.state.load(Relaxed)));
        }
    }

    /// Authorities with a slot.
    pub fn len(&self) -> usize {
        self.slots.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn counters(&self) -> LevelCounters {
        LevelCounters {
            cached: self.cached.load(Relaxed),
            uncached: self.uncached.load(Relaxed),
            absent: self.absent.load(Relaxed),
            malformed: self.malformed.load(Relaxed),
            repeated: self.repeated.load(Relaxed),
        }
    }

    /// The word to store for `level`, replacing `old` (a slot's state).
    fn state_for(&self, level: AdmissionLevel, old: u64) -> u64 {
        let top = self.top_class.load(Relaxed);
        // A dip: lower than the fresh level it replaces, into the top class asked about
        // (255: nothing asked yet, or only unmarked traffic, the least important class).
        let dip = self.fresh(old).is_some_and(|old| level < old)
            && top != u8::MAX
            && level.priority().business <= top;
        let expiry = if dip {
            (self.expiry_micros / TOP_CLASS_EXPIRY_DIVISOR).max(1)
        } else {
            self.expiry_micros
        };
        let expires_at = self.now_micros().saturating_add(expiry);
        (expires_at << LEVEL_BITS) | (level.compound() as u64 + 1)
    }

    fn store(&self, authority: &str, level: AdmissionLevel) -> Observation {
        let state = self.state_for(level, 0);
        {
            let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
            if let Some(slot) = slots.get(authority) {
                slot.state.store(self.state_for(level, slot.state.load(Relaxed)), Relaxed);
                return Observation::Cached(level);
            }
            if slots.len() >= self.max_authorities {
                return Observation::Uncached(level);
            }
        }
        let mut slots = self.slots.write().unwrap_or_else(|p| p.into_inner());
        // Re-checked under the write lock: another response may have taken the last slot.
        if let Some(slot) = slots.get(authority) {
            slot.state.store(self.state_for(level, slot.state.load(Relaxed)), Relaxed);
            return Observation::Cached(level);
        }
        if slots.len() >= self.max_authorities {
            return Observation::Uncached(level);
        }
        slots.insert(authority.into(), Slot { state: AtomicU64::new(state) });
        Observation::Cached(level)
    }

    fn fresh(&self, state: u64) -> Option<AdmissionLevel> {
        let compound = state & LEVEL_MASK;
        if compound == 0 || self.now_micros() >= state >> LEVEL_BITS {
            return None;
        }
        AdmissionLevel::from_compound((compound - 1) as u16)
    }

    fn now_micros(&self) -> u64 {
        let now: Nanos = self.clock.now();
        now / 1_000
    }
}

impl<C: Clock> std::fmt::Debug for DownstreamLevels<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DownstreamLevels")
            .field("expiry", &self.expiry())
            .field("max_authorities", &self.max_authorities)
            .field("authorities", &self.len())
            .field("counters", &self.counters())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use proptest::prelude::*;

    fn cache(max: usize) -> (DownstreamLevels<ManualClock>, ManualClock) {
        let clock = ManualClock::new();
        (DownstreamLevels::new(DEFAULT_EXPIRY, max, clock.clone()), clock)
    }

    fn p(business: u8, user: u8) -> Priority {
        Priority::new(business, user).unwrap()
    }

    #[test]
    fn refuses_below_the_cached_level_until_it_expires() {
        let (c, clock) = cache(4);
        assert!(!c.should_refuse("b:80", p(255, 127)), "nothing known: nothing refused");
        assert_eq!(
            c.observe("b:80", [&b"3.64"[..]]),
            Observation::Cached(c.level("b:80").unwrap())
        );
        assert!(!c.should_refuse("b:80", p(3, 64)));
        assert!(!c.should_refuse("b:80", p(2, 127)));
        assert!(c.should_refuse("b:80", p(3, 65)));
        assert!(c.should_refuse("b:80", p(4, 0)));
        assert!(!c.should_refuse("other:80", p(4, 0)), "levels are per authority");
        clock.advance(DEFAULT_EXPIRY - Duration::from_millis(1));
        assert!(c.should_refuse("b:80", p(4, 0)));
        clock.advance(Duration::from_millis(1));
        assert!(!c.should_refuse("b:80", p(4, 0)), "expired: probed again");
        assert_eq!(c.level("b:80"), None);
    }

    #[test]
    fn a_dip_into_the_top_class_is_cached_briefly() {
        let (c, clock) = cache(4);
        // The caller sends business 1 and 3; the callee was open.
        assert!(!c.should_refuse("b", p(1, 90)));
        assert!(!c.should_refuse("b", p(3, 0)));
        c.observe("b", [&b"255.127"[..]]);
        c.observe("b", [&b"1.60"[..]]);
        assert!(c.should_refuse("b", p(1, 90)), "refused while the news is fresh");
        clock.advance(DEFAULT_EXPIRY / TOP_CLASS_EXPIRY_DIVISOR as u32);
        assert!(!c.should_refuse("b", p(1, 90)), "a dip into the top class ages fast");
        // A cut below the top class keeps the whole expiry.
        c.observe("b", [&b"2.10"[..]]);
        clock.advance(DEFAULT_EXPIRY - Duration::from_millis(1));
        assert!(c.should_refuse("b", p(3, 0)));
        assert!(!c.should_refuse("b", p(2, 10)));
        // A dip confirmed by the next answer (the cut holds) keeps the whole expiry too.
        c.observe("b", [&b"1.60"[..]]);
        c.observe("b", [&b"1.60"[..]]);
        clock.advance(DEFAULT_EXPIRY - Duration::from_millis(1));
        assert!(c.should_refuse("b", p(1, 90)));
    }

    #[test]
    fn news_refreshes_and_no_news_ages() {
        let (c, clock) = cache(4);
        c.observe("b", [&b"1.0"[..]]);
        clock.advance(Duration::from_millis(1500));
        assert_eq!(c.observe("b", std::iter::empty::<&[u8]>()), Observation::Absent);
        clock.advance(Duration::from_millis(600));
        assert_eq!(c.level("b"), None, "a response without the header is not news");
        c.observe("b", [&b"1.0"[..]]);
        clock.advance(Duration::from_millis(1500));
        c.observe("b", [&b"255.127"[..]]);
        clock.advance(Duration::from_millis(1500));
        assert_eq!(c.level("b"), Some(AdmissionLevel::FULLY_OPEN));
        assert!(!c.should_refuse("b", Priority::LEAST_IMPORTANT));
    }

    #[test]
    fn malformed_and_repeated_values_are_counted_never_cached() {
        let (c, _clock) = cache(4);
        c.observe("b", [&b"5.5"[..]]);
        let bad: [&[u8]; 8] = [b"", b" 1.1", b"x", b"256.0", b"1.128", b"-1.0", b"1", b"1.1.1"];
        for v in bad {
            assert!(matches!(c.observe("b", [v]), Observation::Malformed(_)), "{v:?}");
        }
        assert_eq!(c.observe("b", [&b"0.0"[..], &b"0.0"[..]]), Observation::Repeated);
        assert_eq!(c.observe("new", [&b"0.0"[..], &b"1.0"[..]]), Observation::Repeated);
        assert_eq!(c.level("b"), AdmissionLevel::parse(b"5.5").ok());
        assert_eq!(c.len(), 1, "bad news from a new authority takes no slot");
        let n = c.counters();
        assert_eq!((n.cached, n.malformed, n.repeated), (1, 8, 2));
    }

    #[test]
    fn beyond_max_authorities_nothing_is_cached() {
        let (c, _clock) = cache(2);
        c.observe("a", [&b"0.0"[..]]);
        c.observe("b", [&b"0.0"[..]]);
        assert!(matches!(c.observe("c", [&b"0.0"[..]]), Observation::Uncached(_)));
        assert!(!c.should_refuse("c", p(9, 9)));
        assert!(c.should_refuse("a", p(9, 9)));
        assert!(matches!(c.observe("a", [&b"1.0"[..]]), Observation::Cached(_)));
        assert_eq!(c.len(), 2);
        assert_eq!(c.counters().uncached, 1);
        let (zero, _) = cache(0);
        assert!(matches!(zero.observe("a", [&b"0.0"[..]]), Observation::Uncached(_)));
        assert!(zero.is_empty());
    }

    fn priority() -> impl Strategy<Value = Priority> {
        (any::<u8>(), 0u8..128).prop_map(|(b, u)| p(b, u))
    }

    #[derive(Debug, Clone)]
    enum Step {
        Valid(usize, Priority),
        Garbage(usize, Vec<u8>),
        Twice(usize, Priority),
        Absent(usize),
        Wait(u16),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0usize..6, priority()).prop_map(|(a, l)| Step::Valid(a, l)),
            (0usize..6, prop::collection::vec(any::<u8>(), 0..8))
                .prop_map(|(a, g)| Step::Garbage(a, g)),
            (0usize..6, priority()).prop_map(|(a, l)| Step::Twice(a, l)),
            (0usize..6).prop_map(Step::Absent),
            (0u16..3000).prop_map(Step::Wait),
        ]
    }

    proptest! {
        /// Against a naive model (a map of authority -> (level, time seen, its expiry),
        /// first `max` authorities only; a level into the top class asked about so far
        /// expires after an eighth): the cache refuses exactly what the model's fresh level
        /// does not admit, garbage and repeats never change a verdict, and at most `max`
        /// authorities ever hold a slot.
        #[test]
        fn matches_a_naive_model(
            max in 0usize..5,
            steps in prop::collection::vec(step(), 1..80),
            probes in prop::collection::vec((0usize..6, priority()), 1..20),
        ) {
            let (c, clock) = cache(max);
            let mut model: HashMap<usize, (Priority, u64, u64)> = HashMap::new();
            let mut now_ms = 0u64;
            let mut top = u8::MAX;
            let fresh_at = |m: &HashMap<usize, (Priority, u64, u64)>, a: usize, now: u64| {
                m.get(&a).filter(|(_, at, exp)| now < at + exp).map(|(l, _, _)| *l)
            };
            let expiry = |l: Priority, old: Option<Priority>, top: u8| {
                let dip = old.is_some_and(|o| l < o) && top != u8::MAX && l.business <= top;
                if dip { 250 } else { 2000 }
            };
            let name = |a: usize| format!("svc-{a}:8080");
            for s in steps {
                match s {
                    Step::Valid(a, l) => {
                        let v = AdmissionLevel::new(l).encode();
                        c.observe(&name(a), [v.as_bytes()]);
                        if model.contains_key(&a) || model.len() < max {
                            let exp = expiry(l, fresh_at(&model, a, now_ms), top);
                            model.insert(a, (l, now_ms, exp));
                        }
                    }
                    Step::Garbage(a, g) => {
                        let o = c.observe(&name(a), [&g[..]]);
                        if let Ok(l) = AdmissionLevel::parse(&g) {
                            prop_assert!(matches!(o, Observation::Cached(_) | Observation::Uncached(_)));
                            if model.contains_key(&a) || model.len() < max {
                                let old = fresh_at(&model, a, now_ms);
                                model.insert(a, (l.priority(), now_ms, expiry(l.priority(), old, top)));
                            }
                        } else {
                            prop_assert!(matches!(o, Observation::Malformed(_)));
                        }
                    }
                    Step::Twice(a, l) => {
                        let v = AdmissionLevel::new(l).encode();
                        c.observe(&name(a), [v.as_bytes(), v.as_bytes()]);
                    }
                    Step::Absent(a) => {
                        c.observe(&name(a), std::iter::empty::<&[u8]>());
                    }
                    Step::Wait(ms) => {
                        clock.advance(Duration::from_millis(ms as u64));
                        now_ms += ms as u64;
                    }
                }
                prop_assert!(c.len() <= max);
                for &(a, q) in &probes {
                    let fresh = model.get(&a).filter(|(_, at, exp)| now_ms < at + exp);
                    let want = fresh.is_some_and(|(l, _, _)| q > *l);
                    prop_assert_eq!(c.should_refuse(&name(a), q), want);
                    top = top.min(q.business);
                }
            }
        }
    }
}
