use super::*;
use crate::clock::ManualClock;
use crate::downstream::DEFAULT_EXPIRY;
use proptest::prelude::*;

fn p(business: u8, user: u8) -> Priority {
    Priority::new(business, user).unwrap()
}

fn level(s: &str) -> AdmissionLevel {
    AdmissionLevel::parse(s.as_bytes()).unwrap()
}

fn deps(max_routes: usize, max_deps: usize) -> (RouteDependencies<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    (RouteDependencies::new(Duration::from_secs(30), max_routes, max_deps, clock.clone()), clock)
}

#[test]
fn a_route_depends_on_what_it_called_until_the_dependency_expires() {
    let (d, clock) = deps(4, 4);
    assert_eq!(d.learn("/x", "b:80", "/b"), Learned::New);
    assert_eq!(d.learn("/x", "b:80", "/b"), Learned::Renewed);
    assert_eq!(d.learn("/y", "c:80", "/c"), Learned::New);
    let cached = |a: &str, _r: &str| (a == "b:80").then(|| level("1.10"));
    let own = level("255.127");
    assert_eq!(d.aggregated("/x", own, cached), level("1.10"));
    assert_eq!(d.aggregated("/y", own, cached), own, "Y does not call B: its own level");
    assert_eq!(d.aggregated("/unknown", level("3.0"), cached), level("3.0"));
    assert_eq!(d.aggregated("/x", level("0.5"), cached), level("0.5"), "min(own, downstream)");
    assert!(d.should_refuse("/x", p(2, 0), cached));
    assert!(!d.should_refuse("/x", p(1, 10), cached));
    assert!(!d.should_refuse("/y", p(200, 0), cached));
    clock.advance(Duration::from_secs(29));
    d.learn("/y", "c:80", "/c");
    clock.advance(Duration::from_secs(1));
    assert!(!d.should_refuse("/x", p(2, 0), cached), "expired: the route keeps its own level");
    assert_eq!(d.dependencies("/x"), Vec::<(String, String)>::new());
    assert_eq!(d.dependencies("/y"), vec![("c:80".to_string(), "/c".to_string())]);
}

#[test]
fn the_lowest_fresh_downstream_level_binds() {
    let (d, _clock) = deps(4, 4);
    d.learn("/x", "b:80", "/b1");
    d.learn("/x", "b:80", "/b2");
    d.learn("/x", "c:80", "/c");
    let cached = |a: &str, r: &str| match (a, r) {
        ("b:80", "/b1") => Some(level("4.0")),
        ("b:80", "/b2") => Some(level("2.100")),
        _ => None,
    };
    assert_eq!(d.lowest("/x", cached), Some(level("2.100")));
}

#[test]
fn state_is_bounded_and_overflow_is_counted() {
    let (d, clock) = deps(2, 2);
    assert_eq!(d.learn("/r1", "a", "/1"), Learned::New);
    assert_eq!(d.learn("/r1", "a", "/2"), Learned::New);
    assert_eq!(d.learn("/r1", "a", "/3"), Learned::DependencyOverflow);
    assert_eq!(d.learn("/r2", "a", "/1"), Learned::New);
    assert_eq!(d.learn("/r3", "a", "/1"), Learned::RouteOverflow);
    assert_eq!(d.learn("", "a", "/1"), Learned::BadRoute);
    assert_eq!(d.learn(&"/x".repeat(200), "a", "/1"), Learned::BadRoute);
    assert_eq!((d.routes(), d.dependency_slots()), (2, 3));
    // Expired slots are reclaimed.
    clock.advance(Duration::from_secs(20));
    d.learn("/r2", "a", "/1");
    clock.advance(Duration::from_secs(11));
    assert_eq!(d.learn("/r1", "a", "/3"), Learned::New, "replaces an expired dependency");
    assert_eq!(d.learn("/r3", "a", "/1"), Learned::RouteOverflow, "r1 and r2 are live");
    clock.advance(Duration::from_secs(31));
    assert_eq!(d.learn("/r3", "a", "/1"), Learned::New, "reclaims a dead route");
    assert_eq!(d.routes(), 2);
    let n = d.counters();
    assert_eq!(
        (n.new, n.renewed, n.route_overflow, n.dependency_overflow, n.bad_route),
        (5, 1, 2, 1, 2)
    );
}

fn levels(
    max_a: usize,
    max_r: usize,
) -> (RouteLevels<ManualClock>, DownstreamLevels<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    (
        RouteLevels::new(DEFAULT_EXPIRY, max_a, max_r, clock.clone()),
        DownstreamLevels::new(DEFAULT_EXPIRY, max_a, clock.clone()),
        clock,
    )
}

#[test]
fn the_route_level_wins_and_falls_back_to_the_authority_level() {
    let (r, a, clock) = levels(4, 4);
    a.observe("a:80", [&b"255.127"[..]]);
    let o = r.observe("a:80", "/x", [&b"/x"[..]], [&b"1.20"[..]]);
    assert!(matches!(o, RouteObservation::Level(Observation::Cached(_))));
    assert!(r.should_refuse("a:80", "/x", p(2, 0), &a));
    assert!(!r.should_refuse("a:80", "/y", p(2, 0), &a), "another route: the authority's level");
    assert_eq!(r.level("a:80", "/y", &a), Some(AdmissionLevel::FULLY_OPEN));
    clock.advance(DEFAULT_EXPIRY);
    assert!(!r.should_refuse("a:80", "/x", p(2, 0), &a), "expired");
    a.observe("a:80", [&b"0.0"[..]]);
    assert!(r.should_refuse("a:80", "/x", p(2, 0), &a), "expired route: the authority's level");
    assert_eq!(r.level("a:80", "/x", &a), Some(level("0.0")));
}

#[test]
fn route_headers_that_do_not_match_are_counted_never_cached() {
    let (r, a, _clock) = levels(1, 1);
    let none = std::iter::empty::<&[u8]>;
    assert_eq!(r.observe("a", "/x", none(), none()), RouteObservation::Absent);
    assert_eq!(r.observe("a", "/x", [&b"/y"[..]], [&b"1.0"[..]]), RouteObservation::RouteMismatch);
    assert_eq!(r.observe("a", "/x", none(), [&b"1.0"[..]]), RouteObservation::RouteMismatch);
    assert_eq!(
        r.observe("a", "/x", [&b"/x"[..], &b"/x"[..]], [&b"1.0"[..]]),
        RouteObservation::RouteMismatch
    );
    assert!(matches!(
        r.observe("a", "/x", [&b"/x"[..]], [&b"1.x"[..]]),
        RouteObservation::Level(Observation::Malformed(_))
    ));
    assert!(matches!(
        r.observe("a", "/x", [&b"/x"[..]], none()),
        RouteObservation::Level(Observation::Absent)
    ));
    assert!(matches!(
        r.observe("a", "/z", [&b"/z"[..]], [&b"1.0"[..]]),
        RouteObservation::Level(Observation::Cached(_))
    ));
    assert!(matches!(
        r.observe("a", "/w", [&b"/w"[..]], [&b"1.0"[..]]),
        RouteObservation::Level(Observation::Uncached(_))
    ));
    assert_eq!(
        r.observe("b", "/x", [&b"/x"[..]], [&b"1.0"[..]]),
        RouteObservation::AuthorityOverflow
    );
    assert_eq!((r.authorities(), r.len()), (1, 1));
    assert!(!r.should_refuse("a", "/x", p(9, 0), &a));
    let c = r.counters();
    assert_eq!((c.absent, c.route_mismatch, c.authority_overflow), (1, 3, 1));
    let l = r.level_counters();
    assert_eq!((l.cached, l.uncached, l.malformed, l.absent), (1, 1, 1, 1));
}

#[test]
fn a_retry_is_refused_until_the_level_changes() {
    let clock = ManualClock::new();
    let m = RetryMemory::new(DEFAULT_EXPIRY, 2, clock.clone());
    m.refused(1, level("2.0"));
    assert!(m.is_refused_retry(1, Some(level("2.0"))));
    assert!(!m.is_refused_retry(2, Some(level("2.0"))), "another call");
    assert!(!m.is_refused_retry(1, Some(level("3.0"))), "the level changed: it goes out");
    assert!(!m.is_refused_retry(1, Some(level("2.0"))), "and is forgotten");
    m.refused(1, level("2.0"));
    clock.advance(DEFAULT_EXPIRY);
    assert!(!m.is_refused_retry(1, Some(level("2.0"))), "expired");
    m.refused(1, level("2.0"));
    assert!(!m.is_refused_retry(1, None), "nothing fresh known: it goes out");
    for id in 10..20 {
        m.refused(id, level("2.0"));
    }
    assert_eq!(m.len(), 2, "bounded");
    assert!(m.is_refused_retry(19, Some(level("2.0"))), "the newest kept");
    assert_eq!(m.refused_retries(), 2);
}

#[test]
fn retry_after_grows_with_the_time_a_class_is_refused() {
    let clock = ManualClock::new();
    let ages = RefusalAges::new(Duration::from_secs(1), clock.clone());
    assert_eq!(ages.refuse(3), Duration::from_secs(1));
    for _ in 0..8 {
        clock.advance(Duration::from_millis(500));
        ages.refuse(3);
    }
    assert_eq!(ages.refuse(3), Duration::from_secs(3), "4 s of refusals: 1 + 4 / 2");
    assert_eq!(ages.refuse(4), Duration::from_secs(1), "per class");
    for _ in 0..60 {
        clock.advance(Duration::from_millis(500));
        ages.refuse(3);
    }
    assert_eq!(ages.refuse(3), Duration::from_secs(8), "capped");
    clock.advance(Duration::from_millis(1001));
    assert_eq!(ages.refuse(3), Duration::from_secs(1), "a pause starts it again");
}

fn priority() -> impl Strategy<Value = Priority> {
    (any::<u8>(), 0u8..128).prop_map(|(b, u)| p(b, u))
}

#[derive(Debug, Clone)]
enum Step {
    /// A response from authority `a` to a call of route `r` carrying a valid level.
    Valid(usize, usize, Priority),
    /// ... carrying garbage.
    Garbage(usize, usize, Vec<u8>),
    /// ... naming another route.
    Mismatch(usize, usize, Priority),
    /// ... without route headers.
    Absent(usize, usize),
    /// The authority's own level (the per-authority cache).
    Authority(usize, Priority),
    Wait(u16),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0usize..4, 0usize..4, priority()).prop_map(|(a, r, l)| Step::Valid(a, r, l)),
        1 => (0usize..4, 0usize..4, prop::collection::vec(any::<u8>(), 0..6))
            .prop_map(|(a, r, g)| Step::Garbage(a, r, g)),
        1 => (0usize..4, 0usize..4, priority()).prop_map(|(a, r, l)| Step::Mismatch(a, r, l)),
        1 => (0usize..4, 0usize..4).prop_map(|(a, r)| Step::Absent(a, r)),
        2 => (0usize..4, priority()).prop_map(|(a, l)| Step::Authority(a, l)),
        2 => (0u16..3000).prop_map(Step::Wait),
    ]
}

/// One cached level in the model: the level, when it was seen, how long it is kept.
type ModelSlot = (Priority, u64, u64);

proptest! {
    /// Against a naive model (maps of authority -> level and (authority, route) -> level,
    /// each with the time seen and its expiry; first `max_a` authorities, first `max_r`
    /// routes of each; a lower level into the top class asked about so far expires after an
    /// eighth): the per-route cache refuses exactly what the model's fresh route level, else
    /// its fresh authority level, does not admit; garbage, mismatched and absent headers
    /// never change a verdict; the slots never exceed the bounds.
    #[test]
    fn the_per_route_cache_matches_a_naive_model(
        max_a in 0usize..4,
        max_r in 0usize..4,
        steps in prop::collection::vec(step(), 1..80),
        probes in prop::collection::vec((0usize..4, 0usize..4, priority()), 1..16),
    ) {
        let (cache, authority_cache, clock) = levels(max_a, max_r);
        // The route caches: one per authority, created by the first route level it sends.
        let mut routes: HashMap<usize, HashMap<usize, ModelSlot>> = HashMap::new();
        let mut authorities: HashMap<usize, ModelSlot> = HashMap::new();
        let mut now = 0u64;
        // Top class asked about, per route cache and for the authority cache.
        let mut route_top: HashMap<(usize, usize), u8> = HashMap::new();
        let mut authority_top = u8::MAX;
        let fresh = |slot: Option<&ModelSlot>, now: u64| {
            slot.filter(|(_, at, exp)| now < at + exp).map(|(l, _, _)| *l)
        };
        let expiry = |l: Priority, old: Option<Priority>, top: u8| {
            let dip = old.is_some_and(|o| l < o) && top != u8::MAX && l.business <= top;
            if dip { 250 } else { 2000 }
        };
        let name = |a: usize| format!("svc-{a}:8080");
        let route = |r: usize| format!("/api/{r}");
        for s in steps {
            let store = |a: usize, r: usize, l: Priority, routes: &mut HashMap<usize, HashMap<usize, ModelSlot>>| {
                if !routes.contains_key(&a) && routes.len() >= max_a {
                    return;
                }
                let per = routes.entry(a).or_default();
                // The authority's cache exists now, even if this route finds it full.
                if per.contains_key(&r) || per.len() < max_r {
                    let t = per_route_top(&route_top, a);
                    let exp = expiry(l, fresh(per.get(&r), now), t);
                    per.insert(r, (l, now, exp));
                }
            };
            match s {
                Step::Valid(a, r, l) => {
                    let v = AdmissionLevel::new(l).encode();
                    let rt = route(r);
                    cache.observe(&name(a), &rt, [rt.as_bytes()], [v.as_bytes()]);
                    store(a, r, l, &mut routes);
                }
                Step::Garbage(a, r, g) => {
                    let rt = route(r);
                    cache.observe(&name(a), &rt, [rt.as_bytes()], [&g[..]]);
                    match AdmissionLevel::parse(&g) {
                        Ok(l) => store(a, r, l.priority(), &mut routes),
                        // A bad value still makes the authority's route cache (no slot).
                        Err(_) => {
                            if !routes.contains_key(&a) && routes.len() < max_a {
                                routes.insert(a, HashMap::new());
                            }
                        }
                    }
                }
                Step::Mismatch(a, r, l) => {
                    let v = AdmissionLevel::new(l).encode();
                    let other = format!("{}/other", route(r));
                    cache.observe(&name(a), &route(r), [other.as_bytes()], [v.as_bytes()]);
                }
                Step::Absent(a, r) => {
                    let none = std::iter::empty::<&[u8]>;
                    cache.observe(&name(a), &route(r), none(), none());
                }
                Step::Authority(a, l) => {
                    let v = AdmissionLevel::new(l).encode();
                    authority_cache.observe(&name(a), [v.as_bytes()]);
                    if authorities.contains_key(&a) || authorities.len() < max_a {
                        let exp = expiry(l, fresh(authorities.get(&a), now), authority_top);
                        authorities.insert(a, (l, now, exp));
                    }
                }
                Step::Wait(ms) => {
                    clock.advance(Duration::from_millis(ms as u64));
                    now += ms as u64;
                }
            }
            prop_assert!(cache.authorities() <= max_a);
            prop_assert!(cache.len() <= max_a * max_r);
            for &(a, r, q) in &probes {
                let by_route = routes.get(&a).and_then(|per| fresh(per.get(&r), now));
                let want = match by_route {
                    Some(l) => q > l,
                    None => fresh(authorities.get(&a), now).is_some_and(|l| q > l),
                };
                prop_assert_eq!(
                    cache.should_refuse(&name(a), &route(r), q, &authority_cache),
                    want,
                    "authority {} route {} priority {:?}", a, r, q
                );
                // The route cache saw the question (its top class) if the authority has one;
                // the authority cache only when the route had nothing fresh.
                if routes.contains_key(&a) {
                    let t = route_top.entry((a, usize::MAX)).or_insert(u8::MAX);
                    *t = (*t).min(q.business);
                }
                if by_route.is_none() {
                    authority_top = authority_top.min(q.business);
                }
            }
        }
    }
}

/// The top class asked of authority `a`'s route cache (one per authority, shared by its
/// routes, as in [`DownstreamLevels`]).
fn per_route_top(tops: &HashMap<(usize, usize), u8>, a: usize) -> u8 {
    tops.get(&(a, usize::MAX)).copied().unwrap_or(u8::MAX)
}

#[test]
fn a_stale_refusing_level_lets_one_probe_through_per_interval() {
    let (d, clock) = deps(4, 4);
    d.learn("/x", "b", "/b");
    let every = Duration::from_millis(250);
    let stale = std::cell::Cell::new(false);
    let news = |_: &str, _: &str| Some((level("1.0"), stale.get()));
    assert_eq!(d.door("/x", p(0, 0), every, news), RouteDoor::Pass);
    assert_eq!(d.door("/x", p(2, 0), every, news), RouteDoor::Refuse, "fresh news: refused");
    stale.set(true);
    assert_eq!(d.door("/x", p(2, 0), every, news), RouteDoor::Probe, "stale: one probe");
    assert_eq!(d.door("/x", p(2, 0), every, news), RouteDoor::Refuse, "and only one");
    clock.advance(every);
    assert_eq!(d.door("/x", p(2, 0), every, news), RouteDoor::Probe, "one per interval");
    assert_eq!(d.door("/y", p(2, 0), every, news), RouteDoor::Pass, "another route calls nothing");
}

#[test]
fn news_goes_stale_after_an_eighth_of_the_expiry() {
    let clock = ManualClock::new();
    let c = DownstreamLevels::new(DEFAULT_EXPIRY, 4, clock.clone());
    c.observe("b", [&b"3.0"[..]]);
    assert_eq!(c.level_news("b"), Some((level("3.0"), false)));
    clock.advance(DEFAULT_EXPIRY / 8 + Duration::from_millis(1));
    assert_eq!(c.level_news("b"), Some((level("3.0"), true)));
    clock.advance(DEFAULT_EXPIRY);
    assert_eq!(c.level_news("b"), None);
}

fn holds() -> (RouteHolds<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    (RouteHolds::new(4, clock.clone()), clock)
}

/// Feeds `windows` windows of answers: per route, `(answers per window, hold ms, wait ms)`.
fn feed(
    h: &RouteHolds<ManualClock>,
    clock: &ManualClock,
    windows: u32,
    routes: &[(&str, u32, u64, u64)],
) {
    let ms = Duration::from_millis;
    for _ in 0..windows {
        for &(route, n, hold, wait) in routes {
            for _ in 0..n {
                h.record(route, ms(hold), ms(wait));
            }
        }
        clock.advance(HOLD_WINDOW);
    }
    // One answer closes the last window.
    h.record(routes[0].0, ms(routes[0].2), ms(routes[0].3));
}

#[test]
fn routes_that_wait_on_a_slow_downstream_take_the_cut() {
    // X: 100/s holding 140 ms, 120 of it waiting on B; Y: 150/s holding 35 ms, 12 on C.
    let (h, clock) = holds();
    feed(&h, &clock, 10, &[("/x", 20, 140, 120), ("/y", 30, 35, 12)]);
    assert!(h.spares("/y") && !h.spares("/x"), "{:?}", h.spared());
    assert!(!h.spares("/unknown"));
    // Nothing heard for longer than the decision lives: nothing is spared.
    clock.advance(Duration::from_secs(3));
    assert!(!h.spares("/y"));
}

#[test]
fn nothing_is_spared_while_the_app_is_held_by_its_own_work() {
    let (h, clock) = holds();
    // Y floods the app's own work; X's slow calls hold little of it.
    feed(&h, &clock, 10, &[("/x", 2, 140, 120), ("/y", 200, 60, 12)]);
    assert!(h.spared().is_empty(), "{:?}", h.spared());
    // Similar waits everywhere: no route is lighter than another.
    let (h, clock) = holds();
    feed(&h, &clock, 10, &[("/x", 20, 140, 120), ("/y", 20, 130, 100)]);
    assert!(h.spared().is_empty(), "{:?}", h.spared());
    // Short waits (a call's round trip) are no downstream's overload.
    let (h, clock) = holds();
    feed(&h, &clock, 10, &[("/x", 20, 21, 1), ("/y", 20, 20, 0)]);
    assert!(h.spared().is_empty(), "{:?}", h.spared());
}

#[test]
fn sparing_ends_once_the_heavy_routes_hold_little_and_state_is_bounded() {
    let (h, clock) = holds();
    feed(&h, &clock, 10, &[("/x", 20, 140, 120), ("/y", 30, 35, 12)]);
    assert!(h.spares("/y"));
    // X refused at the door: it holds less, but a quarter of the app still keeps Y spared...
    feed(&h, &clock, 20, &[("/x", 3, 140, 120), ("/y", 30, 35, 12)]);
    assert!(h.spares("/y"), "hysteresis");
    // ...and once it holds little, the own level applies to every route again.
    feed(&h, &clock, 30, &[("/x", 1, 140, 120), ("/y", 30, 35, 12)]);
    assert!(!h.spares("/y"), "{:?}", h.spared());
    // At most four routes followed; bad routes never.
    let (h, clock) = holds();
    for i in 0..10 {
        h.record(&format!("/r{i}"), Duration::from_millis(10), Duration::ZERO);
    }
    h.record("", Duration::from_millis(10), Duration::ZERO);
    clock.advance(HOLD_WINDOW);
    h.record("/r0", Duration::from_millis(10), Duration::ZERO);
    assert_eq!(h.routes(), 4);
}

#[test]
fn spared_count_matches_the_spared_routes() {
    let (h, clock) = holds();
    assert_eq!(h.spared_count(), 0);
    feed(&h, &clock, 10, &[("/x", 20, 140, 120), ("/y", 30, 35, 12), ("/z", 10, 30, 5)]);
    assert_eq!(h.spared_count(), 2);
    assert_eq!(h.spared_count(), h.spared().len());
    assert!(h.sparing());
    clock.advance(Duration::from_secs(3));
    assert_eq!(h.spared_count(), 0);
    assert!(!h.sparing());
}

#[test]
fn a_window_never_holds_half_a_sample() {
    // Recorders on several threads (sharing shards: more threads than shards here) while
    // another thread drains windows: in every drained window each route's hold is exactly
    // three times its wait (as in every sample), and no sample is lost or counted twice.
    const THREADS: u64 = 4;
    const SAMPLES: u64 = 20_000;
    let h = RouteHolds::new(8, ManualClock::new());
    let done = std::sync::atomic::AtomicU64::new(0);
    let mut drained = 0u64;
    let mut check = |h: &RouteHolds<ManualClock>| {
        let mut window = HashMap::new();
        h.take_window(&mut window);
        for (route, r) in &window {
            let w = r.window;
            assert_eq!(w.hold_ns, 3 * w.wait_ns, "{route}: {w:?}");
            drained += u64::from(w.answers);
        }
    };
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (h, done) = (&h, &done);
            s.spawn(move || {
                let route = format!("/r{t}");
                for i in 0..SAMPLES {
                    let wait = Duration::from_micros(1 + (i * 7 + t) % 997);
                    h.record(&route, wait * 3, wait);
                }
                done.fetch_add(1, Relaxed);
            });
        }
        while done.load(Relaxed) < THREADS {
            check(&h);
        }
    });
    check(&h);
    assert_eq!(drained, THREADS * SAMPLES);
}
