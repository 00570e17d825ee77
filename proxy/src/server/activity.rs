//! What the connection driver knows of a connection's requests, shared with its
//! `CallerIo`: how many are inside, since when none is (the idle timeout), the response
//! bodies still being sent, since when the connection has waited for the next request head
//! (HTTP/1.1's header-read timeout), and whether the next bytes start a request head.
//!
//! The header-read timeout is the driver's, not hyper's: hyper's arms (and boxes) a timer
//! for every request head, the driver's one timer per connection reads these stamps when
//! it fires. The wait for a head starts when the previous exchange is over (its response
//! head handed over, its body sent, no write to the caller blocked), or at accept.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::Instant;

use crate::body::BodyEnd;

/// One connection's requests (see the module's documentation).
#[derive(Debug)]
pub(crate) struct Activity {
    /// Requests of this connection inside the sidecar (until their response head).
    busy: AtomicUsize,
    /// When the last request left, in nanoseconds since [`epoch`].
    idle_since: AtomicU64,
    /// HTTP/1.1: the next bytes read are (most likely) a request head.
    expect_head: AtomicBool,
    /// Response bodies of this connection still being sent after their request left.
    streaming: AtomicUsize,
    /// HTTP/1.1: a write to the caller is waiting for room in the socket.
    write_blocked: AtomicBool,
    /// When the connection last had nothing to finish (no request inside, no body being
    /// sent, no write blocked), in nanoseconds since [`epoch`]: a head is awaited since.
    head_wait_since: AtomicU64,
}

/// Keeps a connection counted busy while one of its requests is inside.
pub(super) struct Busy<'a>(&'a Activity);

// === impl Activity ===

impl Activity {
    pub(super) fn new() -> Self {
        let now = since_epoch(Instant::now());
        Activity {
            busy: AtomicUsize::new(0),
            idle_since: AtomicU64::new(now),
            expect_head: AtomicBool::new(true),
            streaming: AtomicUsize::new(0),
            write_blocked: AtomicBool::new(false),
            head_wait_since: AtomicU64::new(now),
        }
    }

    /// A response body starts being sent after its request left (ends with
    /// [`BodyEnd::body_ended`]).
    pub(super) fn streaming_started(&self) {
        self.streaming.fetch_add(1, AcqRel);
    }

    /// No response body is being sent.
    pub(super) fn none_streaming(&self) -> bool {
        self.streaming.load(Acquire) == 0
    }

    /// A write to the caller found no room (`true`), or made progress again (`false`).
    pub(crate) fn set_write_blocked(&self, blocked: bool) {
        if !blocked {
            // Stamped before it stops counting as blocked (as for the other two).
            self.head_wait_since.store(since_epoch(Instant::now()), Release);
        }
        self.write_blocked.store(blocked, Release);
    }

    /// HTTP/1.1: when the wait for the next request head exceeds `header_read`, or `None`
    /// while the connection still has something to finish (a request inside, a body being
    /// sent, a write blocked).
    pub(super) fn head_deadline(&self, header_read: Duration) -> Option<Instant> {
        if self.busy.load(Acquire) > 0
            || self.streaming.load(Acquire) > 0
            || self.write_blocked.load(Acquire)
        {
            return None;
        }
        Some(epoch() + Duration::from_nanos(self.head_wait_since.load(Acquire)) + header_read)
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
        let now = since_epoch(Instant::now());
        self.0.idle_since.store(now, Release);
        self.0.head_wait_since.store(now, Release);
        self.0.busy.fetch_sub(1, AcqRel);
    }
}

impl BodyEnd for Activity {
    /// A response body counted by [`Activity::streaming_started`] was sent or abandoned.
    fn body_ended(&self) {
        // Stamped before the count drops, as above.
        self.head_wait_since.store(since_epoch(Instant::now()), Release);
        self.streaming.fetch_sub(1, AcqRel);
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
