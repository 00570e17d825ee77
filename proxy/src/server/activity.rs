//! What the connection driver knows of a connection's requests, shared with its
//! `CallerIo`: how many are inside, since when none is (the idle timeout), and whether the
//! next bytes start a request head.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::Instant;

/// One connection's requests (see the module's documentation).
#[derive(Debug)]
pub(crate) struct Activity {
    /// Requests of this connection inside the sidecar (until their response head).
    busy: AtomicUsize,
    /// When the last request left, in nanoseconds since [`epoch`].
    idle_since: AtomicU64,
    /// HTTP/1.1: the next bytes read are (most likely) a request head.
    expect_head: AtomicBool,
}

/// Keeps a connection counted busy while one of its requests is inside.
pub(super) struct Busy<'a>(&'a Activity);

// === impl Activity ===

impl Activity {
    pub(super) fn new() -> Self {
        Activity {
            busy: AtomicUsize::new(0),
            idle_since: AtomicU64::new(since_epoch(Instant::now())),
            expect_head: AtomicBool::new(true),
        }
    }

    /// A response head left: the next bytes read (most likely) start a request head.
    pub(super) fn expect_head(&self) {
        self.expect_head.store(true, Release);
    }

    /// Whether the next read is expected to start a request head; clears the expectation.
    pub(crate) fn take_expect_head(&self) -> bool {
        self.expect_head.swap(false, AcqRel)
    }

    /// When the connection has been idle for `idle` (no request inside since then), or
    /// `None` while a request is inside.
    pub(super) fn idle_deadline(&self, idle: Duration) -> Option<Instant> {
        if self.busy.load(Acquire) > 0 {
            return None;
        }
        Some(epoch() + Duration::from_nanos(self.idle_since.load(Acquire)) + idle)
    }
}

impl<'a> Busy<'a> {
    pub(super) fn new(activity: &'a Activity) -> Self {
        activity.busy.fetch_add(1, AcqRel);
        Busy(activity)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        // Stamped before the count drops, so a watcher that sees zero sees the new stamp.
        self.0.idle_since.store(since_epoch(Instant::now()), Release);
        self.0.busy.fetch_sub(1, AcqRel);
    }
}

/// A process-wide origin for instants kept in atomics.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn since_epoch(t: Instant) -> u64 {
    t.saturating_duration_since(epoch()).as_nanos() as u64
}
