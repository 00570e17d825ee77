//! Walks of a window's arrivals histogram (`histogram[c]` counts arrivals at compound
//! level `c`): the level for a target, the fine steps, and whether a level binds.

use super::window::Zone;
use crate::priority::{AdmissionLevel, COMPOUND_LEVELS, USER_LEVELS};

/// A level binds when more than 1 in this many of a window's arrivals lie beyond it: below
/// that it refuses (next to) nothing, as behind callers whose egress refuses beyond it.
const BINDS_ONE_IN: u64 = 50;

/// Whether `level` binds on a window's arrivals: more than 1 in 50 (`BINDS_ONE_IN`) of them lie
/// beyond it. The one boundary between a level that refuses a real share of what arrives
/// (the engine's `level_binds` for the level in force, under which the
/// queue's max wait applies) and one that cuts but refuses next to nothing (behind callers
/// whose egress refuses beyond it: the capacity law's censored window).
pub fn level_binds(histogram: &[u32], level: AdmissionLevel) -> bool {
    let all: u64 = histogram.iter().map(|&n| u64::from(n)).sum();
    arrivals_beyond(histogram, level) * BINDS_ONE_IN > all
}

/// Arrivals less important than `level` (those it refuses).
pub(super) fn arrivals_beyond(histogram: &[u32], level: AdmissionLevel) -> u64 {
    let first = (level.compound() as usize + 1).min(histogram.len());
    histogram[first..].iter().map(|&n| u64::from(n)).sum()
}

/// The level that admits about `target` of the window's arrivals, at least one fine step
/// tighter when cutting and one looser when relaxing (so a cut always sheds something
/// that arrived, and a relax always admits more).
pub(super) fn toward_target(
    histogram: &[u32],
    current: AdmissionLevel,
    zone: Zone,
    target: f64,
) -> AdmissionLevel {
    let proposed = level_for_target(histogram, target);
    match zone {
        Zone::Cut if proposed >= current => step_below(histogram, current),
        Zone::Relax if proposed <= current => step_above(histogram, current),
        _ => proposed,
    }
}

/// The least important level whose cumulative arrivals stay within `target`; fully open
/// when everything fits. Levels only ever land just below a non-empty bucket.
pub fn level_for_target(histogram: &[u32], target: f64) -> AdmissionLevel {
    let mut cumulative = 0u64;
    // Whole business classes first (a vectorised sum), buckets only in the class where
    // the target falls: the walk runs on every rollover.
    for (class, chunk) in histogram.chunks(USER_LEVELS as usize).enumerate() {
        let sum: u64 = chunk.iter().map(|&n| n as u64).sum();
        if (cumulative + sum) as f64 <= target {
            cumulative += sum;
            continue;
        }
        for (u, &n) in chunk.iter().enumerate() {
            if n > 0 && (cumulative + n as u64) as f64 > target {
                // Admit everything strictly more important than this bucket.
                let c = class * USER_LEVELS as usize + u;
                return AdmissionLevel::from_compound(c.saturating_sub(1) as u16)
                    .unwrap_or(AdmissionLevel::FULLY_OPEN);
            }
            cumulative += n as u64;
        }
    }
    AdmissionLevel::FULLY_OPEN
}

/// One fine step tighter than `current`: just below the nearest non-empty bucket at or
/// under it, so the step always sheds something that arrived.
fn step_below(histogram: &[u32], current: AdmissionLevel) -> AdmissionLevel {
    let cur = current.compound() as usize;
    let c = (0..=cur).rev().find(|&c| histogram[c] > 0).unwrap_or(0);
    AdmissionLevel::from_compound(c.saturating_sub(1) as u16).unwrap_or(current)
}

/// One fine step looser: up to just below the next non-empty bucket above the one
/// `current` would admit next, so the step lets exactly one more bucket in.
pub(super) fn step_above(histogram: &[u32], current: AdmissionLevel) -> AdmissionLevel {
    let cur = current.compound() as usize;
    let first = (cur + 1..COMPOUND_LEVELS).find(|&c| histogram[c] > 0);
    let Some(first) = first else { return AdmissionLevel::FULLY_OPEN };
    match (first + 1..COMPOUND_LEVELS).find(|&c| histogram[c] > 0) {
        Some(next) => AdmissionLevel::from_compound((next - 1) as u16).unwrap_or(current),
        None => AdmissionLevel::FULLY_OPEN,
    }
}
