//! One window's arrivals histogram, written lock-free by `admit` and drained at rollover.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::*};

use crate::priority::{COMPOUND_LEVELS, USER_LEVELS};

const CLASSES: usize = COMPOUND_LEVELS / USER_LEVELS as usize;
const PER_CLASS: usize = USER_LEVELS as usize;

/// Arrivals per compound level, one histogram per shard, plus a "touched" flag per shard
/// and business class so a rollover drains only the classes that saw traffic (a
/// handful) instead of every counter, which would cost more than the admits it serves.
pub(super) struct WindowCounters {
    shards: usize,
    /// `histogram[shard * COMPOUND_LEVELS + level]`.
    histogram: Box<[AtomicU32]>,
    /// `touched[shard * CLASSES + business]`.
    touched: Box<[AtomicBool]>,
}

impl WindowCounters {
    pub(super) fn new(shards: usize) -> Self {
        WindowCounters {
            shards,
            histogram: (0..shards * COMPOUND_LEVELS).map(|_| AtomicU32::new(0)).collect(),
            touched: (0..shards * CLASSES).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// Counts one arrival at compound level `c` in `shard` (`< shards`).
    ///
    /// The flag is read after the increment and, at rollover, cleared before the class is
    /// drained (all `SeqCst`): either this admit saw the flag still set, so the drain that
    /// clears it comes later and sees the increment, or it saw the flag clear and sets it
    /// again, so the next drain of this set picks the count up. On x86 the `SeqCst` load
    /// is a plain load and the store happens once per class per window.
    #[inline]
    pub(super) fn record(&self, shard: usize, c: u16) {
        self.histogram[shard * COMPOUND_LEVELS + c as usize].fetch_add(1, SeqCst);
        let touched = &self.touched[shard * CLASSES + c as usize / PER_CLASS];
        if !touched.load(SeqCst) {
            touched.store(true, SeqCst);
        }
    }

    /// Moves the counts of all shards into `out` (one slot per compound level). Classes
    /// `out` held counts for before (`out_classes`) and that saw nothing now are zeroed.
    /// Returns `(arrivals, arrivals at or under level)`.
    pub(super) fn drain_into(
        &self,
        out: &mut [u32],
        out_classes: &mut [bool],
        level: usize,
    ) -> (u64, u64) {
        let (mut arrivals, mut admitted) = (0u64, 0u64);
        for (class, held) in out_classes.iter_mut().enumerate() {
            let range = class * PER_CLASS..(class + 1) * PER_CLASS;
            if std::mem::take(held) {
                out[range.clone()].fill(0);
            }
            for shard in 0..self.shards {
                // Load before swap: an atomic swap costs far more than a load, and most
                // flags are clear. A flag set just after the load is seen next drain.
                let touched = &self.touched[shard * CLASSES + class];
                if !touched.load(Relaxed) || !touched.swap(false, SeqCst) {
                    continue;
                }
                *held = true;
                let base = shard * COMPOUND_LEVELS;
                let counters = &self.histogram[base + range.start..base + range.end];
                for (c, (slot, counter)) in
                    range.clone().zip(out[range.clone()].iter_mut().zip(counters))
                {
                    // SeqCst (a plain load on x86): ordered after the flag swap above, so
                    // it cannot miss an increment made before the flag was seen set.
                    let n = match counter.load(SeqCst) {
                        0 => continue,
                        _ => counter.swap(0, SeqCst),
                    };
                    *slot += n;
                    arrivals += n as u64;
                    if c <= level {
                        admitted += n as u64;
                    }
                }
            }
        }
        (arrivals, admitted)
    }
}
