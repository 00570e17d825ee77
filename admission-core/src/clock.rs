//! Injectable monotonic clocks. The engine reads time only through [`Clock`], so tests
//! and the simulator step time deterministically with [`ManualClock`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Monotonic nanoseconds since an arbitrary, per-clock origin.
pub type Nanos = u64;

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Nanos;
}

/// Wall-independent monotonic time from [`Instant`].
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    pub fn new() -> Self {
        MonotonicClock { origin: Instant::now() }
    }

    /// A clock whose origin is `origin`: an instant read from the clock the caller's own
    /// timers run on (a runtime's, which tests may pause), so that no instant it later
    /// converts with [`Self::nanos_at`] lies before the origin.
    pub fn starting_at(origin: Instant) -> Self {
        MonotonicClock { origin }
    }

    /// Converts an `Instant` taken elsewhere (say, at request arrival) to this clock.
    pub fn nanos_at(&self, at: Instant) -> Nanos {
        at.saturating_duration_since(self.origin).as_nanos() as Nanos
    }

    /// The `Instant` at `nanos` on this clock (for a timer set from a time computed on it).
    pub fn instant_at(&self, nanos: Nanos) -> Instant {
        self.origin + Duration::from_nanos(nanos)
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> Nanos {
        self.origin.elapsed().as_nanos() as Nanos
    }
}

/// A clock that only moves when told to. Cloning shares the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
    }

    pub fn set(&self, to: Nanos) {
        self.now.store(to, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> Nanos {
        self.now.load(Ordering::SeqCst)
    }
}

impl<C: Clock> Clock for Arc<C> {
    #[inline]
    fn now(&self) -> Nanos {
        (**self).now()
    }
}
