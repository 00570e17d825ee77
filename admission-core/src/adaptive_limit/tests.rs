use super::*;

const MS: u64 = 1_000_000;

/// A tiny closed model of a sidecar in front of an app of `workers` workers with service
/// time `service_ms`, offered more than it can take (saturated): every freed slot is
/// refilled at once and requests always wait for one. Returns the limit after `ms`.
struct App {
    workers: usize,
    service_ns: u64,
    /// (done at, dispatched at) per request in the app, FIFO start order.
    running: Vec<(u64, u64)>,
    queued: std::collections::VecDeque<u64>,
}

impl App {
    fn new(workers: usize, service_ms: u64) -> Self {
        App {
            workers,
            service_ns: service_ms * MS,
            running: Vec::new(),
            queued: Default::default(),
        }
    }

    fn inflight(&self) -> usize {
        self.running.len() + self.queued.len()
    }

    /// Runs saturated (or at `offered` requests/s if given) from `from` to `to`, ticking
    /// every millisecond.
    fn run(&mut self, l: &mut AdaptiveLimit, from: u64, to: u64, offered: Option<f64>) {
        let mut next_arrival = from;
        let mut backlog = 0usize;
        let mut t = from;
        while t < to {
            // Completions.
            let mut i = 0;
            while i < self.running.len() {
                if self.running[i].0 <= t {
                    let (_, at) = self.running.swap_remove(i);
                    l.on_response(Duration::from_nanos(t - at));
                    if let Some(q) = self.queued.pop_front() {
                        self.running.push((t + self.service_ns, q));
                    }
                } else {
                    i += 1;
                }
            }
            // Arrivals.
            match offered {
                None => backlog = usize::MAX,
                Some(rate) => {
                    while next_arrival <= t {
                        backlog += 1;
                        next_arrival += (1e9 / rate) as u64;
                    }
                }
            }
            while backlog > 0 && self.inflight() < l.limit() {
                backlog = backlog.saturating_sub(1);
                if self.running.len() < self.workers {
                    self.running.push((t + self.service_ns, t));
                } else {
                    self.queued.push_back(t);
                }
                l.on_dispatch(self.inflight());
            }
            if backlog > 0 {
                l.on_waiting();
            }
            l.tick(t);
            t += MS;
        }
    }
}

fn adaptive(ceiling: usize) -> AdaptiveLimit {
    AdaptiveLimit::new(AdaptiveLimitConfig { ceiling, ..AdaptiveLimitConfig::default() }, 0)
}

#[test]
fn settles_just_above_the_apps_concurrency_when_saturated() {
    for workers in [1, 4, 16, 64] {
        let mut l = adaptive(256);
        let mut app = App::new(workers, 10);
        app.run(&mut l, 0, 3_000 * MS, None);
        let s = l.status();
        let steady = s.steady_limit;
        assert!(
            steady >= workers && steady <= workers + workers / 2 + 2,
            "{workers} workers: limit {steady} ({s:?})"
        );
    }
}

#[test]
fn keeps_the_app_busy_while_it_moves_the_queue_out() {
    // 4 x 10 ms = 400/s; saturated for 3 s: the app completes nearly all it can.
    let mut l = adaptive(256);
    let mut app = App::new(4, 10);
    app.run(&mut l, 0, 1_000 * MS, None);
    let before = l.status();
    app.run(&mut l, 1_000 * MS, 3_000 * MS, None);
    let rate = l.max_rate();
    assert!(rate >= 390.0, "max completion rate {rate}/s ({before:?})");
    assert!(app.queued.len() <= 2, "the app's own queue holds {}", app.queued.len());
}

#[test]
fn starts_low_and_never_leaves_its_bounds() {
    let mut l = AdaptiveLimit::new(
        AdaptiveLimitConfig {
            ceiling: 8,
            floor: 2,
            initial: 100,
            ..AdaptiveLimitConfig::default()
        },
        0,
    );
    assert_eq!(l.limit(), 8, "the initial limit is capped by the ceiling");
    let mut app = App::new(64, 10);
    app.run(&mut l, 0, 2_000 * MS, None);
    assert_eq!(l.status().steady_limit, 8, "a fast app is held at the ceiling");
    let mut l = AdaptiveLimit::new(
        AdaptiveLimitConfig { ceiling: 8, floor: 2, ..AdaptiveLimitConfig::default() },
        0,
    );
    let mut app = App::new(1, 10);
    app.run(&mut l, 0, 2_000 * MS, None);
    assert!((2..=3).contains(&l.limit()), "floor 2, one worker: {}", l.limit());
}

#[test]
fn a_fixed_limit_never_moves() {
    let mut l = AdaptiveLimit::fixed(5, 0);
    let mut app = App::new(1, 10);
    app.run(&mut l, 0, 2_000 * MS, None);
    assert_eq!(l.limit(), 5);
    assert!(!l.status().probing);
}

#[test]
fn costs_nothing_below_capacity() {
    // 0.8 x 400/s, evenly spaced: nothing should ever wait for a slot after the start.
    let mut l = adaptive(256);
    let mut app = App::new(4, 10);
    app.run(&mut l, 0, 3_000 * MS, Some(320.0));
    assert!(l.limit() >= 4, "limit {} below the app's concurrency at 0.8x", l.limit());
    let rate = l.max_rate();
    assert!((300.0..=340.0).contains(&rate), "completions {rate}/s at 320/s offered");
}

#[test]
fn follows_an_app_that_slows_down_and_recovers() {
    let mut l = adaptive(256);
    let mut app = App::new(4, 10);
    app.run(&mut l, 0, 2_000 * MS, None);
    let fast = l.status();
    app.service_ns = 20 * MS;
    app.run(&mut l, 2_000 * MS, 4_000 * MS, None);
    let slow = l.status();
    // Same concurrency, double the time: the limit stays, the no-load time doubles.
    assert!((4..=7).contains(&slow.steady_limit), "slow: {slow:?}");
    assert!(slow.no_load_time >= Duration::from_millis(19), "slow: {slow:?}");
    assert!((180.0..=220.0).contains(&l.max_rate()), "slow: {}/s", l.max_rate());
    app.service_ns = 10 * MS;
    app.run(&mut l, 4_000 * MS, 6_000 * MS, None);
    let back = l.status();
    assert!((4..=7).contains(&back.steady_limit), "back: {back:?} (fast was {fast:?})");
    assert!(back.no_load_time <= Duration::from_millis(11), "back: {back:?}");
}

#[test]
fn probes_while_saturated_and_only_then() {
    let mut l = adaptive(256);
    let mut app = App::new(8, 10);
    app.run(&mut l, 0, 2_000 * MS, None);
    assert!(l.status().probes >= 1, "a saturated app is probed for its no-load time");
    let mut l = adaptive(256);
    let mut app = App::new(8, 10);
    for step in 0..40u64 {
        app.run(&mut l, step * 50 * MS, (step + 1) * 50 * MS, Some(200.0));
        assert_eq!(l.status().probes, 0, "probed an app with room at step {step}");
    }
}
