//! Per-thread shards of the hot-path counters. Two threads bumping the same cache line
//! pay a line transfer each time (tens of nanoseconds); each thread gets its own shard,
//! chosen once per thread, and only the rollover reads across shards.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};

/// At most this many shards per engine (memory: 256 KiB of histograms per shard).
pub(super) const MAX_SHARDS: usize = 8;

static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static THREAD_ORDINAL: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// A small, stable number per thread, handed out round-robin.
#[inline]
pub(crate) fn thread_ordinal() -> usize {
    THREAD_ORDINAL
        .try_with(|o| {
            let mut v = o.get();
            if v == usize::MAX {
                v = NEXT_THREAD.fetch_add(1, Relaxed);
                o.set(v);
            }
            v
        })
        .unwrap_or(0)
}

/// Shards for this machine: its parallelism rounded up to a power of two, capped.
pub(crate) fn shard_count() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).next_power_of_two().min(MAX_SHARDS)
}

/// Queuing samples of one shard packed in one word, so a sample is a single atomic add:
/// the count in the top `64 - SUM_BITS` bits, the sum of waits in microseconds below.
#[repr(align(128))] // own cache line pair: no false sharing with the next shard
#[derive(Default)]
pub(super) struct QueuingShard(AtomicU64);

const SUM_BITS: u32 = 43;
const SUM_MASK: u64 = (1 << SUM_BITS) - 1;
/// Longest wait one sample contributes. With at most [`MAX_WINDOW_REQUESTS`] samples a
/// window, the sum cannot carry into the count (1e6 * 8e6 us < 2^43).
const MAX_SAMPLE_US: u64 = 8_000_000;
/// Upper bound on `window_requests` that keeps the packing exact.
pub const MAX_WINDOW_REQUESTS: u32 = 1_000_000;

impl QueuingShard {
    /// Adds one sample; returns this shard's sample count including it.
    #[inline]
    pub(super) fn add(&self, waited_us: u64) -> u64 {
        let prev = self.0.fetch_add((1 << SUM_BITS) | waited_us.min(MAX_SAMPLE_US), Relaxed);
        (prev >> SUM_BITS) + 1
    }

    /// Reads `(count, sum_us)` without resetting.
    pub(super) fn peek(&self) -> (u64, u64) {
        let v = self.0.load(Relaxed);
        (v >> SUM_BITS, v & SUM_MASK)
    }

    /// Takes `(count, sum_us)` and resets.
    pub(super) fn take(&self) -> (u64, u64) {
        let v = self.0.swap(0, Relaxed);
        (v >> SUM_BITS, v & SUM_MASK)
    }
}

/// Keeps a value written on the hot path off the cache lines of its read-mostly
/// neighbours (the level and the active window set, read on every admit).
#[repr(align(128))]
#[derive(Default)]
pub(crate) struct Padded<T>(pub(crate) T);
