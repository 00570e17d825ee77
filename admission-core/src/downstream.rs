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
//! - **An opening to fully open is let through gradually.** A callee's jump from a cut to
//!   fully open (its "nothing to refuse") is let through over `expiry /
//!   OPENING_RAMP_DIVISOR` (500 ms by default): the levels it newly admits are let through
//!   in order, linearly over the business classes this caller has asked about, so the
//!   callee sees its demand rise by steps it can judge and cut at, rather than the whole
//!   backlog its callers held back at once. A callee whose arrivals are only what its
//!   callers let through cannot see the demand beyond its level: admitted all at once, it
//!   flooded the callee, whose next cut (sized on a full queue) dipped into its top class
//!   (multihop-bench, the middle hop A at 6x: open -> 0.127 in 400 ms, 2-6 times a run). A
//!   partial opening is the callee's own step and is taken at once (ramped too, a callee
//!   that opens by fine steps every window was held ever further behind them); an
//!   unconfirmed dip (see below) is undone at once, to the level before it. A cut applies
//!   at once, as ever.
//! - **Allocation-free hot path.** [`DownstreamLevels::should_refuse`] is a read lock, a
//!   hash lookup by `&str` and one atomic load (and a relaxed load to track the top class).
//!   Only the first response from a new authority allocates (its slot).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::RwLock;
use std::time::Duration;

use crate::clock::{Clock, Nanos};
use crate::priority::{AdmissionLevel, HeaderValueError, Priority, USER_LEVELS};

/// Default expiry of a cached level without news.
pub const DEFAULT_EXPIRY: Duration = Duration::from_secs(2);
/// Default bound on the authorities with a cached level.
pub const DEFAULT_MAX_AUTHORITIES: usize = 64;

/// A level cutting into the top class seen is kept for `expiry / TOP_CLASS_EXPIRY_DIVISOR`.
pub const TOP_CLASS_EXPIRY_DIVISOR: u64 = 8;

/// An opening to fully open is let through over `expiry / OPENING_RAMP_DIVISOR` (see the module's
/// documentation): 500 ms at the default expiry, long enough for a callee whose windows
/// close after 100 ms at the earliest to see several steps of it and answer a cut, short
/// enough that a recovered callee is open again well within a second.
pub const OPENING_RAMP_DIVISOR: u32 = 4;

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
    /// The business classes asked about so far (bit `b` of word `b / 64`): an opening
    /// ramps over these only (a class nobody sends costs the callee nothing to admit).
    asked: [AtomicU64; 4],
    /// How long an opening takes to be let through whole (0: at once).
    ramp_micros: u64,
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
///
/// `ramp`, the opening under way: `(started_at_micros << 16) | (from compound + 1)`, 0 =
/// none; `settled`: the last level stored that was no dip (`compound + 1`, 0 = none), what
/// an unconfirmed dip returns to at once. Separate words: a reader that sees a new level
/// with an older ramp takes the lower of the two (the ramp never admits past the level), so
/// the race can only refuse a little more for one read, never admit what the level refuses.
#[derive(Debug, Default)]
struct Slot {
    state: AtomicU64,
    ramp: AtomicU64,
    settled: AtomicU64,
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
            asked: Default::default(),
            ramp_micros: (expiry.as_micros() as u64).max(1) / OPENING_RAMP_DIVISOR as u64,
            slots: RwLock::new(HashMap::with_capacity(max_authorities.min(1024))),
            cached: AtomicU64::new(0),
            uncached: AtomicU64::new(0),
            absent: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
            repeated: AtomicU64::new(0),
        }
    }

    /// The same cache with openings let through over `ramp` (zero: at once; the default is
    /// `expiry / OPENING_RAMP_DIVISOR`).
    pub fn with_opening_ramp(mut self, ramp: Duration) -> Self {
        self.ramp_micros = ramp.as_micros() as u64;
        self
    }

    pub fn expiry(&self) -> Duration {
        Duration::from_micros(self.expiry_micros)
    }

    /// How long an opening takes to be let through whole.
    pub fn opening_ramp(&self) -> Duration {
        Duration::from_micros(self.ramp_micros)
    }

    /// Notes that requests of business class `business` are sent (or refused before they
    /// are: the inbound role's route door asks through [`Self::level_news`], which cannot
    /// see the priority): an opening ramps over the classes noted. A relaxed load, and one
    /// atomic or the first time a class is seen.
    #[inline]
    pub fn note_class(&self, business: u8) {
        let (word, bit) = (&self.asked[business as usize / 64], 1u64 << (business % 64));
        if word.load(Relaxed) & bit == 0 {
            word.fetch_or(bit, Relaxed);
        }
    }

    fn asked(&self) -> [u64; 4] {
        std::array::from_fn(|i| self.asked[i].load(Relaxed))
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
        self.note_class(priority.business);
        self.level(authority).is_some_and(|level| !level.admits(priority))
    }

    /// The fresh cached level of `authority`, if any (while an opening ramps, the level it
    /// has reached).
    #[inline]
    pub fn level(&self, authority: &str) -> Option<AdmissionLevel> {
        let (state, ramp) = {
            let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
            let slot = slots.get(authority)?;
            (slot.state.load(Relaxed), slot.ramp.load(Relaxed))
        };
        self.effective(state, ramp, self.now_micros())
    }

    /// The fresh cached level of `authority` and whether its news is older than
    /// `expiry / TOP_CLASS_EXPIRY_DIVISOR` (stale: a caller that refuses everything it would
    /// send on it hears nothing new, so it may let a probe through to bring news).
    pub fn level_news(&self, authority: &str) -> Option<(AdmissionLevel, bool)> {
        let (state, ramp) = {
            let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
            let slot = slots.get(authority)?;
            (slot.state.load(Relaxed), slot.ramp.load(Relaxed))
        };
        let level = self.effective(state, ramp, self.now_micros())?;
        let remaining = (state >> LEVEL_BITS).saturating_sub(self.now_micros());
        let fresh_for = self.expiry_micros - self.expiry_micros / TOP_CLASS_EXPIRY_DIVISOR;
        Some((level, remaining < fresh_for))
    }

    /// Calls `f` for every authority with a slot and its fresh level (`None`: expired or
    /// never known). At most `max_authorities` calls.
    pub fn for_each(&self, mut f: impl FnMut(&str, Option<AdmissionLevel>)) {
        let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
        let now = self.now_micros();
        for (authority, slot) in slots.iter() {
            f(authority, self.effective(slot.state.load(Relaxed), slot.ramp.load(Relaxed), now));
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

    /// The word to store for `level` at `now`, replacing `old` (a slot's state), and
    /// whether `level` is a dip (kept for an eighth of the expiry only).
    fn state_for(&self, level: AdmissionLevel, old: u64, now: u64) -> (u64, bool) {
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
        let expires_at = now.saturating_add(expiry);
        ((expires_at << LEVEL_BITS) | (level.compound() as u64 + 1), dip)
    }

    fn store(&self, authority: &str, level: AdmissionLevel) -> Observation {
        {
            let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
            if let Some(slot) = slots.get(authority) {
                self.update(slot, level);
                return Observation::Cached(level);
            }
            if slots.len() >= self.max_authorities {
                return Observation::Uncached(level);
            }
        }
        let mut slots = self.slots.write().unwrap_or_else(|p| p.into_inner());
        // Re-checked under the write lock: another response may have taken the last slot.
        if let Some(slot) = slots.get(authority) {
            self.update(slot, level);
            return Observation::Cached(level);
        }
        if slots.len() >= self.max_authorities {
            return Observation::Uncached(level);
        }
        let slot = Slot::default();
        self.update(&slot, level);
        slots.insert(authority.into(), slot);
        Observation::Cached(level)
    }

    /// Stores `level` in `slot`: its expiry (see [`Self::state_for`]), and, for an opening
    /// from a fresh level, the ramp that lets it through (from the level reached so far, or
    /// at once back to the settled level an unconfirmed dip cut below).
    fn update(&self, slot: &Slot, level: AdmissionLevel) {
        let now = self.now_micros();
        let old = slot.state.load(Relaxed);
        let (state, dip) = self.state_for(level, old, now);
        let settled = match slot.settled.load(Relaxed) {
            0 => None,
            word => AdmissionLevel::from_compound((word - 1) as u16),
        };
        match self.fresh(old) {
            // Nothing fresh was known (everything went out): nothing to ramp from.
            None => slot.ramp.store(0, Relaxed),
            // The same level: an opening under way goes on.
            Some(previous) if previous == level => {}
            Some(previous) => {
                let reached = self.effective(old, slot.ramp.load(Relaxed), now).unwrap_or(previous);
                // A dip the callee did not confirm is undone at once, up to where it was.
                let from = match settled {
                    Some(settled) if level > previous && previous < settled => {
                        reached.max(settled.min(level))
                    }
                    _ => reached,
                };
                // Only an opening to fully open ramps: the callee's "nothing to refuse",
                // which behind its callers' caches it says without seeing the demand they
                // hold back. A partial opening is the callee's own step, taken at once
                // (ramped, a callee that opens by fine steps every window was held ever
                // further behind them). A new level while a ramp is under way goes on
                // from where it reached; a cut below that applies at once.
                let full = level == AdmissionLevel::FULLY_OPEN && level > previous;
                let ramping = reached < previous;
                let ramp = if self.ramp_micros > 0 && from < level && (full || ramping) {
                    ramp_word(now, from)
                } else {
                    0
                };
                slot.ramp.store(ramp, Relaxed);
            }
        }
        // A level that is no dip (its whole expiry) is what a later dip returns to.
        if !dip {
            slot.settled.store(level.compound() as u64 + 1, Relaxed);
        }
        slot.state.store(state, Relaxed);
    }

    /// The level a slot admits at `now`: its fresh level, or while an opening ramps the
    /// level the ramp has reached (never past the fresh level).
    fn effective(&self, state: u64, ramp: u64, now: u64) -> Option<AdmissionLevel> {
        let level = self.fresh(state)?;
        if ramp == 0 || self.ramp_micros == 0 {
            return Some(level);
        }
        let started = ramp >> LEVEL_BITS;
        let elapsed = now.saturating_sub(started);
        if elapsed >= self.ramp_micros {
            return Some(level);
        }
        let Some(from) = AdmissionLevel::from_compound(((ramp & LEVEL_MASK) - 1) as u16) else {
            return Some(level);
        };
        let share = elapsed as f64 / self.ramp_micros as f64;
        Some(ramp_level(from, level, &self.asked(), share).min(level))
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

fn ramp_word(now_micros: u64, from: AdmissionLevel) -> u64 {
    (now_micros << LEVEL_BITS) | (from.compound() as u64 + 1)
}

/// The level an opening from `from` to `target` has reached once `share` (0..1) of its
/// ramp has passed: of the levels above `from` up to `target` whose business class is in
/// `asked` (bit `b` of word `b / 64`), the first `share` of them (rounded down), in order;
/// classes nobody asked about are passed over (admitted with the next asked class, or at
/// the end). `from` itself for a share of 0, `target` from a share of 1 or when no level in
/// between was asked about; never below `from` or past `target`, and never lower for a
/// larger share. Users are spread evenly within a class, so within one class the load let
/// through grows linearly; across classes, by their share of the load.
pub fn ramp_level(
    from: AdmissionLevel,
    target: AdmissionLevel,
    asked: &[u64; 4],
    share: f64,
) -> AdmissionLevel {
    if target <= from || share >= 1.0 {
        return target;
    }
    let (lo, hi) = (from.compound() as u32, target.compound() as u32);
    let users = USER_LEVELS as u32;
    let is_asked = |b: u32| asked[(b / 64) as usize] & (1u64 << (b % 64)) != 0;
    // The asked levels in (lo, hi], class by class.
    let span = |b: u32| {
        let first = (b * users).max(lo + 1);
        let last = (b * users + users - 1).min(hi);
        (first, last)
    };
    let classes = (lo + 1) / users..=hi / users;
    let total: u32 = classes
        .clone()
        .filter(|&b| is_asked(b))
        .map(|b| {
            let (first, last) = span(b);
            last + 1 - first
        })
        .sum();
    if total == 0 {
        return target;
    }
    let mut admit = (share.max(0.0) * total as f64).floor() as u32;
    let mut reached = lo;
    for b in classes.filter(|&b| is_asked(b)) {
        if admit == 0 {
            break;
        }
        let (first, last) = span(b);
        let here = last + 1 - first;
        if admit <= here {
            reached = first + admit - 1;
            break;
        }
        admit -= here;
        reached = last;
    }
    AdmissionLevel::from_compound(reached as u16).unwrap_or(target).min(target)
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
    use crate::priority::COMPOUND_LEVELS;
    use proptest::prelude::*;

    /// A cache whose openings apply at once (the ramp has its own tests below).
    fn cache(max: usize) -> (DownstreamLevels<ManualClock>, ManualClock) {
        let clock = ManualClock::new();
        let c = DownstreamLevels::new(DEFAULT_EXPIRY, max, clock.clone())
            .with_opening_ramp(Duration::ZERO);
        (c, clock)
    }

    fn ramped() -> (DownstreamLevels<ManualClock>, ManualClock) {
        let clock = ManualClock::new();
        (DownstreamLevels::new(DEFAULT_EXPIRY, 4, clock.clone()), clock)
    }

    fn lv(s: &str) -> AdmissionLevel {
        AdmissionLevel::parse(s.as_bytes()).unwrap()
    }

    #[test]
    fn an_opening_is_let_through_over_the_classes_asked_about() {
        let (c, clock) = ramped();
        let ramp = DEFAULT_EXPIRY / OPENING_RAMP_DIVISOR;
        assert_eq!(c.opening_ramp(), ramp);
        for b in [0, 1, 2] {
            assert!(!c.should_refuse("a", p(b, 0)));
        }
        c.observe("a", [&b"1.57"[..]]);
        assert_eq!(c.level("a"), Some(lv("1.57")), "a cut from nothing known: at once");
        c.observe("a", [&b"255.127"[..]]);
        assert_eq!(c.level("a"), Some(lv("1.57")), "the opening starts where the cut was");
        assert!(c.should_refuse("a", p(1, 58)));
        // Asked above 1.57: class 1's users 58-127 (70 levels) and class 2 (128): 198.
        clock.advance(ramp / 2);
        assert_eq!(c.level("a"), Some(lv("2.28")), "half of 198 levels: 70 + 29");
        assert!(!c.should_refuse("a", p(2, 28)));
        assert!(c.should_refuse("a", p(2, 29)));
        // News of the same level does not start it again.
        c.observe("a", [&b"255.127"[..]]);
        assert_eq!(c.level("a"), Some(lv("2.28")));
        clock.advance(ramp / 2);
        assert_eq!(c.level("a"), Some(AdmissionLevel::FULLY_OPEN), "whole after the ramp");
        // A cut applies at once, and so does a cut in the middle of an opening.
        c.observe("a", [&b"1.0"[..]]);
        assert_eq!(c.level("a"), Some(lv("1.0")));
        c.observe("a", [&b"255.127"[..]]);
        clock.advance(ramp / 4);
        assert_eq!(c.level("a"), Some(lv("1.63")), "a quarter of 255 levels");
        c.observe("a", [&b"1.20"[..]]);
        assert_eq!(c.level("a"), Some(lv("1.20")), "a cut below where the opening reached");
        c.observe("a", [&b"255.127"[..]]);
        clock.advance(ramp / 4);
        c.observe("a", [&b"2.0"[..]]);
        assert_eq!(c.level("a"), Some(lv("1.78")), "a quarter of 235 levels, then a cut above");
        clock.advance(ramp / 2);
        assert_eq!(c.level("a"), Some(lv("1.103")), "... goes on from there: half of 50");
        clock.advance(ramp / 2);
        assert_eq!(c.level("a"), Some(lv("2.0")));
        // A partial opening is the callee's own step: at once.
        c.observe("a", [&b"2.50"[..]]);
        assert_eq!(c.level("a"), Some(lv("2.50")));
        // An opening over classes nobody sends is no load: at once.
        c.observe("a", [&b"9.0"[..]]);
        c.observe("a", [&b"255.127"[..]]);
        assert_eq!(c.level("a"), Some(AdmissionLevel::FULLY_OPEN));
    }

    #[test]
    fn an_unconfirmed_dip_is_undone_at_once_and_only_the_rest_ramps() {
        let (c, clock) = ramped();
        for b in [0, 1, 2] {
            c.should_refuse("a", p(b, 0));
        }
        c.observe("a", [&b"1.100"[..]]);
        c.observe("a", [&b"0.10"[..]]);
        assert_eq!(c.level("a"), Some(lv("0.10")), "a dip into the top class: at once");
        c.observe("a", [&b"255.127"[..]]);
        assert_eq!(c.level("a"), Some(lv("1.100")), "back where it was before the dip");
        clock.advance(DEFAULT_EXPIRY / OPENING_RAMP_DIVISOR);
        assert_eq!(c.level("a"), Some(AdmissionLevel::FULLY_OPEN));
        // A dip the callee confirms (the same level again) is a cut: an opening from it
        // ramps.
        c.observe("a", [&b"0.10"[..]]);
        c.observe("a", [&b"0.10"[..]]);
        c.observe("a", [&b"255.127"[..]]);
        assert_eq!(c.level("a"), Some(lv("0.10")));
        let (news, _stale) = c.level_news("a").unwrap();
        assert_eq!(news, lv("0.10"), "the route door sees the ramp too");
    }

    proptest! {
        /// The ramp's level lies between where the opening started and the level it
        /// opens to, grows with time, admits no more of the asked levels than its share of
        /// them, and is the target once the ramp is over.
        #[test]
        fn the_ramp_is_monotone_and_bounded(
            from in 0u16..(COMPOUND_LEVELS as u16),
            target in 0u16..(COMPOUND_LEVELS as u16),
            asked in prop::array::uniform4(any::<u64>()),
            mut shares in prop::collection::vec(0.0f64..1.2, 1..8),
        ) {
            let from = AdmissionLevel::from_compound(from).unwrap();
            let target = AdmissionLevel::from_compound(target).unwrap();
            shares.sort_by(f64::total_cmp);
            let asked_between = |upto: AdmissionLevel| {
                (from.compound() as u32 + 1..=upto.compound() as u32)
                    .filter(|&c| asked[(c / 128 / 64) as usize] & (1 << (c / 128 % 64)) != 0)
                    .count()
            };
            let total = asked_between(target);
            let mut last = None;
            for share in shares {
                let l = ramp_level(from, target, &asked, share);
                prop_assert!(l <= target.max(from));
                if target <= from || share >= 1.0 || total == 0 {
                    prop_assert_eq!(l, target);
                    continue;
                }
                prop_assert!(l >= from);
                prop_assert!(asked_between(l) as f64 <= share * total as f64 + 1e-9);
                prop_assert!(asked_between(l) as f64 > share * total as f64 - 1.0);
                if let Some(last) = last {
                    prop_assert!(l >= last);
                }
                last = Some(l);
            }
        }
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
