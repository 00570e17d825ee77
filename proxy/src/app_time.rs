//! How long the app takes per request (an exponentially weighted moving average of the time
//! from dispatch to the end of the exchange). Two decisions need it:
//!
//! - at dequeue, a request that waited and has less budget left than the app usually takes
//!   would only waste the app's time: refuse it as a deadline shed instead;
//! - when a caller hangs up while the app works on its request, pingora drops the upstream
//!   connection but the app usually keeps working. Releasing the in-flight slot at once would
//!   let the app's own queue grow unseen (and hide the overload from the queuing time), so
//!   the slot is held for the app's expected remaining time.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Weight of a new sample, 1/8 (as TCP's SRTT).
const SHIFT: u32 = 3;

#[derive(Debug, Default)]
pub struct AppTime {
    /// EWMA in nanoseconds; 0 until the first sample.
    ewma_ns: AtomicU64,
}

impl AppTime {
    /// The typical time the app takes; zero before any request completed.
    #[inline]
    pub fn typical(&self) -> Duration {
        Duration::from_nanos(self.ewma_ns.load(Relaxed))
    }

    /// Adds one sample. Racing updates may lose a sample; an estimate does not need them all.
    #[inline]
    pub fn record(&self, took: Duration) {
        let sample = took.as_nanos().min(u128::from(u64::MAX)) as u64;
        let old = self.ewma_ns.load(Relaxed);
        let new = if old == 0 {
            sample
        } else {
            // old + (sample - old) / 8, in signed arithmetic.
            (old as i128 + ((sample as i128 - old as i128) >> SHIFT)) as u64
        };
        self.ewma_ns.store(new.max(1), Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_at_zero_then_follows_samples() {
        let t = AppTime::default();
        assert_eq!(t.typical(), Duration::ZERO);
        t.record(Duration::from_millis(20));
        assert_eq!(t.typical(), Duration::from_millis(20));
        for _ in 0..100 {
            t.record(Duration::from_millis(40));
        }
        let ms = t.typical().as_secs_f64() * 1000.0;
        assert!((39.0..=40.0).contains(&ms), "{ms}");
        for _ in 0..100 {
            t.record(Duration::from_millis(10));
        }
        let ms = t.typical().as_secs_f64() * 1000.0;
        assert!((10.0..=11.0).contains(&ms), "{ms}");
    }
}
