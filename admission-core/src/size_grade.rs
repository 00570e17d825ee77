//! Content-length grade with fine sub-steps (docs/design.md, "Priority table format").
//!
//! When a request carries no action to match, its size is the one value signal known
//! before the body is read. A plain log2 staircase (one grade per doubling) has cliffs:
//! real sizes cluster, so one notch of the dial can drop 40 points of traffic at once and
//! the controller swings between two bad levels. Here each doubling is split further by
//! the `sub_bits` bits that follow the leading one, so grade `g` covers the sizes
//! `[2^k + s * 2^(k - sub_bits), 2^k + (s + 1) * 2^(k - sub_bits))`. Only shifts and
//! masks: no division, no floating point.
//!
//! Grades map onto consecutive compound levels starting at `business.0`; with the default
//! `sub_bits = 7` each doubling is one business class and the sub-step is its user level.

use std::ops::RangeInclusive;

use serde::{Deserialize, Serialize};

use crate::priority::{Priority, COMPOUND_LEVELS, USER_LEVELS};
use crate::table::error::FieldError;

/// How sizes turn into priorities. Part of the priority table (`size_grade:`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SizeGradeConfig {
    /// First (most important) business class the grades occupy.
    pub business: u8,
    /// Power of two; smaller sizes share the lowest grade.
    pub min_bytes: u64,
    /// Power of two; larger sizes share the highest grade.
    pub max_bytes: u64,
    /// Sub-steps per doubling: `2^sub_bits`, `0..=7`.
    pub sub_bits: u8,
    /// Larger requests are more important (the usual case: a big upload is worth more
    /// than a ping). Set `false` to rank small requests first.
    pub larger_is_more_important: bool,
}

impl Default for SizeGradeConfig {
    fn default() -> Self {
        SizeGradeConfig {
            business: 100,
            min_bytes: 64,
            max_bytes: 16 << 20,
            sub_bits: 7,
            larger_is_more_important: true,
        }
    }
}

/// One invalid setting, named by its field (`min_bytes`, relative to `size_grade`).
pub type SizeGradeError = FieldError;

/// A validated [`SizeGradeConfig`], ready for the request path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeGrade {
    base: u16,
    min_log2: u32,
    max_log2: u32,
    sub_bits: u32,
    grades: u16,
    larger_first: bool,
}

// === impl SizeGradeConfig ===

impl SizeGradeConfig {
    /// Every problem at once.
    pub fn validate(&self) -> Result<(), Vec<SizeGradeError>> {
        SizeGrade::new(self).map(|_| ())
    }
}

// === impl SizeGrade ===

impl SizeGrade {
    pub fn new(config: &SizeGradeConfig) -> Result<Self, Vec<SizeGradeError>> {
        let mut errs = Vec::new();
        let mut bad = |field, message: String| errs.push(FieldError::new(field, message));
        if !config.min_bytes.is_power_of_two() {
            bad("min_bytes", format!("must be a power of two, got {}", config.min_bytes));
        }
        if !config.max_bytes.is_power_of_two() {
            bad("max_bytes", format!("must be a power of two, got {}", config.max_bytes));
        } else if config.max_bytes <= config.min_bytes {
            bad("max_bytes", format!("must exceed min_bytes ({})", config.min_bytes));
        }
        if config.sub_bits > 7 {
            bad("sub_bits", format!("must be in 0..=7, got {}", config.sub_bits));
        }
        if !errs.is_empty() {
            return Err(errs);
        }
        let min_log2 = config.min_bytes.ilog2();
        let max_log2 = config.max_bytes.ilog2();
        let grades = ((max_log2 - min_log2) as usize) << config.sub_bits;
        let base = config.business as usize * USER_LEVELS as usize;
        if base + grades > COMPOUND_LEVELS {
            let classes = grades.div_ceil(USER_LEVELS as usize);
            let message =
                format!("{grades} grades need {classes} business classes from here, past 255");
            return Err(vec![FieldError::new("business", message)]);
        }
        Ok(SizeGrade {
            base: base as u16,
            min_log2,
            max_log2,
            sub_bits: config.sub_bits as u32,
            grades: grades as u16,
            larger_first: config.larger_is_more_important,
        })
    }

    /// Number of distinct grades.
    pub fn grades(&self) -> u16 {
        self.grades
    }

    /// The business classes graded requests can land in.
    pub fn business_classes(&self) -> RangeInclusive<u8> {
        let first = self.base / USER_LEVELS;
        let last = (self.base + self.grades - 1) / USER_LEVELS;
        first as u8..=last as u8
    }

    /// Grade `0..grades()` of a length, ascending with size.
    #[inline]
    pub fn grade(&self, len: u64) -> u16 {
        let top = (1u64 << self.max_log2) - 1;
        let len = len.clamp(1 << self.min_log2, top);
        let k = len.ilog2();
        // The `sub_bits` bits after the leading one; sizes below 2^sub_bits are shifted up.
        let sub = if k >= self.sub_bits {
            len >> (k - self.sub_bits)
        } else {
            len << (self.sub_bits - k)
        } & ((1u64 << self.sub_bits) - 1);
        (((k - self.min_log2) << self.sub_bits) as u64 | sub) as u16
    }

    /// The priority of a request of `len` bytes.
    #[inline]
    pub fn priority(&self, len: u64) -> Priority {
        let g = self.grade(len);
        let rank = if self.larger_first { self.grades - 1 - g } else { g };
        let c = self.base + rank;
        // USER_LEVELS is 128: the split is a shift and a mask.
        Priority { business: (c >> 7) as u8, user: (c & 0x7f) as u8 }
    }
}

#[cfg(test)]
mod tests;
