//! User priority: a keyed hash of the user id into `0..=127`, re-keyed every period.
//!
//! Two schedules (docs/design.md, "Priorities"):
//!
//! - **Independent** (DAGOR's, as published): `SipHash-2-4(user_id) mod 128` under a fresh
//!   key each period. The key for period `n = unix_seconds / rekey_every` is the 128-bit
//!   SipHash-2-4 of `secret || n.to_le_bytes()` under the all-zero key. A user's level in
//!   one period says nothing about the next, but the number of periods a user is admitted
//!   is binomial: at 3x overload (a third admitted) over 30 periods one user in twenty is
//!   more than 15 percentage points away from the mean.
//! - **Balanced** (the default): periods are grouped in cycles of `N` (`cycle_periods`).
//!   One key per cycle gives each user a secret base level `b` and a secret order `pi` of
//!   the cycle's `N` slots; in period `i` of the cycle the level is
//!   `(b + floor(pi(i) * 128 / N)) mod 128`. Over a cycle every user visits every slot once,
//!   so for any admission cut `[0, U]` a user is admitted in `floor(N * (U + 1) / 128)` or
//!   `ceil(...)` periods of the cycle: the per-user spread is at most one period (`1/N`),
//!   and the refused set changes at every re-key. `b` is uniform and independent of the
//!   slot, so every period's level histogram is uniform (the control loop sees no jump at a
//!   re-key). `pi` is a keyed pseudo-random permutation per user (a small Feistel network
//!   with cycle walking), so a user who learns one period's level learns nothing about the
//!   next one beyond "one of the slots not yet visited", and two users' levels are not
//!   shifted together.
//!
//! SipHash-2-4 is specified (Aumasson & Bernstein 2012) and the `siphasher` crate
//! implements it bit-exactly on every platform; everything is derived from the secret and
//! the Unix time, so every entry sidecar sharing the secret (and the table) agrees on every
//! user's level during a period, and all of them re-key at the same instant.

use siphasher::sip::SipHasher24;
use siphasher::sip128::{Hasher128, SipHasher24 as SipHasher24x128};
use std::hash::Hasher;
use std::time::Duration;

use crate::priority::USER_LEVELS;

/// Largest `cycle_periods` accepted. The per-user spread is `1/N`; beyond a thousand
/// periods a cycle outlasts any overload worth balancing.
pub const MAX_CYCLE_PERIODS: u32 = 1024;

/// Default periods per balanced cycle: with the default one-hour period, one day.
pub const DEFAULT_CYCLE_PERIODS: u32 = 24;

/// Domain tag of the balanced schedule's cycle keys, so they never equal an independent
/// period key of the same secret.
const BALANCED_TAG: &[u8] = b"weir-balanced-user-levels-v1";

/// How user levels change from one re-key period to the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RekeySchedule {
    /// A fresh, independent key every period (DAGOR as published).
    Independent,
    /// Every user visits each of `cycle_periods` evenly spaced parts of the level range
    /// once per cycle, in a secret order.
    Balanced { cycle_periods: u32 },
}

impl Default for RekeySchedule {
    fn default() -> Self {
        RekeySchedule::Balanced { cycle_periods: DEFAULT_CYCLE_PERIODS }
    }
}

#[derive(Clone)]
pub struct UserPriorityHasher {
    secret: Vec<u8>,
    rekey_every_secs: u64,
    schedule: RekeySchedule,
}

impl std::fmt::Debug for UserPriorityHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        f.debug_struct("UserPriorityHasher")
            .field("rekey_every_secs", &self.rekey_every_secs)
            .field("schedule", &self.schedule)
            .finish()
    }
}

impl UserPriorityHasher {
    /// Default re-key period: one hour.
    pub const DEFAULT_REKEY: Duration = Duration::from_secs(3600);

    /// The independent schedule. `rekey_every` is rounded down to whole seconds, minimum
    /// one second.
    pub fn new(secret: impl Into<Vec<u8>>, rekey_every: Duration) -> Self {
        Self::with_schedule(secret, rekey_every, RekeySchedule::Independent)
    }

    /// `cycle_periods` of a balanced schedule is clamped to `1..=MAX_CYCLE_PERIODS` (the
    /// table validates it first).
    pub fn with_schedule(
        secret: impl Into<Vec<u8>>,
        rekey_every: Duration,
        schedule: RekeySchedule,
    ) -> Self {
        let schedule = match schedule {
            RekeySchedule::Balanced { cycle_periods } => {
                RekeySchedule::Balanced { cycle_periods: cycle_periods.clamp(1, MAX_CYCLE_PERIODS) }
            }
            other => other,
        };
        UserPriorityHasher {
            secret: secret.into(),
            rekey_every_secs: rekey_every.as_secs().max(1),
            schedule,
        }
    }

    pub fn schedule(&self) -> RekeySchedule {
        self.schedule
    }

    /// The re-key period number at `unix_time` (time since the Unix epoch).
    pub fn period(&self, unix_time: Duration) -> u64 {
        unix_time.as_secs() / self.rekey_every_secs
    }

    /// The independent schedule's hash key of a period.
    pub fn period_key(&self, period: u64) -> (u64, u64) {
        let mut h = SipHasher24x128::new_with_keys(0, 0);
        h.write(&self.secret);
        h.write(&period.to_le_bytes());
        let k = h.finish128();
        (k.h1, k.h2)
    }

    /// User priority `0..=127` of `user_id` at `unix_time`.
    pub fn user_priority(&self, user_id: &[u8], unix_time: Duration) -> u8 {
        self.user_priority_in_period(user_id, self.period(unix_time))
    }

    pub fn user_priority_in_period(&self, user_id: &[u8], period: u64) -> u8 {
        match self.schedule {
            RekeySchedule::Independent => {
                let (k0, k1) = self.period_key(period);
                let mut h = SipHasher24::new_with_keys(k0, k1);
                h.write(user_id);
                // 128 divides 2^64: no modulo bias.
                (h.finish() % USER_LEVELS as u64) as u8
            }
            RekeySchedule::Balanced { cycle_periods } => {
                let n = u64::from(cycle_periods);
                let (cycle, index) = (period / n, (period % n) as u32);
                let draw = self.balanced_draw(user_id, cycle, cycle_periods);
                let slot = draw.slot(index, cycle_periods);
                balanced_level(draw.base, slot, cycle_periods)
            }
        }
    }

    /// The balanced schedule's per-user secrets for one cycle.
    fn balanced_draw(&self, user_id: &[u8], cycle: u64, cycle_periods: u32) -> BalancedDraw {
        let mut key = SipHasher24x128::new_with_keys(0, 0);
        key.write(BALANCED_TAG);
        key.write(&(self.secret.len() as u64).to_le_bytes());
        key.write(&self.secret);
        key.write(&cycle_periods.to_le_bytes());
        key.write(&cycle.to_le_bytes());
        let key = key.finish128();
        let mut user = SipHasher24x128::new_with_keys(key.h1, key.h2);
        user.write(user_id);
        let user = user.finish128();
        BalancedDraw {
            base: (user.h1 % USER_LEVELS as u64) as u8,
            // The permutation's round keys: the user's second hash word under the cycle key,
            // so neither the order nor the base can be computed without the secret.
            round_key: (key.h1 ^ user.h2, key.h2.rotate_left(17) ^ user.h2),
        }
    }
}

/// The level of a user with base `base` in slot `slot` of a balanced cycle of `n` periods.
///
/// The `n` slot offsets `floor(s * 128 / n)` are as evenly spaced as integers allow, so any
/// arc of `A` levels contains `floor(A * n / 128)` or `ceil(A * n / 128)` of them: a user
/// whose base is `b` is admitted under the cut `[0, U]` in exactly as many slots as there are
/// offsets in the arc `[-b, U - b]` (mod 128), whatever `b` is.
pub fn balanced_level(base: u8, slot: u32, n: u32) -> u8 {
    let offset = u64::from(slot) * u64::from(USER_LEVELS) / u64::from(n.max(1));
    ((u64::from(base) + offset) % u64::from(USER_LEVELS)) as u8
}

struct BalancedDraw {
    base: u8,
    round_key: (u64, u64),
}

impl BalancedDraw {
    /// The slot of period `index` (`< n`): a keyed permutation of `0..n`.
    ///
    /// A four-round Feistel network over the smallest bit width holding `n` (halves of
    /// unequal width when it is odd), applied again while the result is `>= n` (cycle
    /// walking). A permutation of `0..2^bits` restricted that way is a permutation of `0..n`;
    /// `2^bits < 2n`, so fewer than two rounds of walking are needed on average, and the walk
    /// always ends because the cycle through `index` returns to `index`.
    fn slot(&self, index: u32, n: u32) -> u32 {
        if n <= 1 {
            return 0;
        }
        let bits = 32 - (n - 1).leading_zeros();
        let mut x = index;
        loop {
            x = self.feistel(x, bits);
            if x < n {
                return x;
            }
        }
    }

    fn feistel(&self, x: u32, bits: u32) -> u32 {
        // The value is (left: `lw` bits, right: `rw` bits); each round moves the right half
        // to the left and puts `left ^ F(right)` on the right, so the widths swap each round
        // and are back in place after an even number of rounds.
        let (mut lw, mut rw) = (bits / 2, bits - bits / 2);
        let (mut left, mut right) = (x >> rw, x & mask(rw));
        for round in 0u8..4 {
            let mut f = SipHasher24::new_with_keys(self.round_key.0, self.round_key.1);
            // Explicit little-endian bytes: `Hasher::write_u32` is native-endian.
            f.write(&[round]);
            f.write(&right.to_le_bytes());
            let mixed = left ^ (f.finish() as u32 & mask(lw));
            left = right;
            right = mixed;
            std::mem::swap(&mut lw, &mut rw);
        }
        (left << rw) | right
    }
}

fn mask(bits: u32) -> u32 {
    if bits >= 32 {
        u32::MAX
    } else {
        (1 << bits) - 1
    }
}

#[cfg(test)]
mod tests;
