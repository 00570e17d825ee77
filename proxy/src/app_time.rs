//! How long the app typically takes to answer a request: an exponentially weighted moving
//! average of the time from dispatch to the app's response headers, every sample capped.
//! Two decisions need it:
//!
//! - the deadline gate refuses a waiting request once its remaining budget no longer covers
//!   the app's typical time (it would only spend the app's time on an answer nobody waits
//!   for), and refuses at the door a request whose expected wait plus that time exceeds it;
//! - when a caller hangs up while the app works on its request, the app usually keeps
//!   working; the in-flight slot is held for the app's expected remaining time (never longer
//!   than this estimate), so the app's own queue does not grow unseen.
//!
//! It measures the app, not the caller: response headers end the sample, so neither a slow
//! upload nor a slow download counts, and one stuck request moves it by at most the cap.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Weight of a new sample, 1/8 (as TCP's SRTT).
const SHIFT: u32 = 3;

/// The default cap on one sample.
pub const DEFAULT_CAP: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub struct AppTime {
    /// EWMA in nanoseconds; 0 until the first sample.
    ewma_ns: AtomicU64,
    cap_ns: u64,
}

impl Default for AppTime {
    fn default() -> Self {
        Self::with_cap(DEFAULT_CAP)
    }
}

impl AppTime {
    /// An estimate whose samples are capped at `cap` (the task timeout: the app never gets
    /// longer than that from weir anyway).
    pub fn with_cap(cap: Duration) -> Self {
        AppTime {
            ewma_ns: AtomicU64::new(0),
            cap_ns: cap.as_nanos().clamp(1, u64::MAX as u128) as u64,
        }
    }

    /// The typical time the app takes; zero before any request completed.
    #[inline]
    pub fn typical(&self) -> Duration {
        Duration::from_nanos(self.ewma_ns.load(Relaxed))
    }

    /// Adds one sample. Racing updates may lose a sample; an estimate does not need them all.
    #[inline]
    pub fn record(&self, took: Duration) {
        let sample = (took.as_nanos().min(u128::from(u64::MAX)) as u64).min(self.cap_ns);
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

    #[test]
    fn one_stuck_request_moves_it_by_at_most_the_cap() {
        let t = AppTime::with_cap(Duration::from_millis(500));
        t.record(Duration::from_millis(10));
        t.record(Duration::from_secs(3600));
        let ms = t.typical().as_secs_f64() * 1000.0;
        assert!(ms <= 10.0 + 490.0 / 8.0 + 0.1, "{ms}");
        let fresh = AppTime::with_cap(Duration::from_millis(500));
        fresh.record(Duration::from_secs(60));
        assert_eq!(fresh.typical(), Duration::from_millis(500));
    }
}
