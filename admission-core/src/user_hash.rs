//! User priority: `SipHash-2-4(user_id) mod 128` keyed per re-key period.
//!
//! The key for period `n = unix_seconds / rekey_every` is the 128-bit SipHash-2-4 of
//! `secret || n.to_le_bytes()` under the all-zero key. SipHash-2-4 is specified
//! (Aumasson & Bernstein 2012) and the `siphasher` crate implements it bit-exactly on
//! every platform, so every entry sidecar sharing the secret agrees on every user's
//! level during a period, and all of them re-key at the same instant.

use siphasher::sip::SipHasher24;
use siphasher::sip128::{Hasher128, SipHasher24 as SipHasher24x128};
use std::hash::Hasher;
use std::time::Duration;

use crate::priority::USER_LEVELS;

#[derive(Clone)]
pub struct UserPriorityHasher {
    secret: Vec<u8>,
    rekey_every_secs: u64,
}

impl std::fmt::Debug for UserPriorityHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        f.debug_struct("UserPriorityHasher")
            .field("rekey_every_secs", &self.rekey_every_secs)
            .finish()
    }
}

impl UserPriorityHasher {
    /// Default re-key period: one hour.
    pub const DEFAULT_REKEY: Duration = Duration::from_secs(3600);

    /// `rekey_every` is rounded down to whole seconds, minimum one second.
    pub fn new(secret: impl Into<Vec<u8>>, rekey_every: Duration) -> Self {
        UserPriorityHasher { secret: secret.into(), rekey_every_secs: rekey_every.as_secs().max(1) }
    }

    /// The re-key period number at `unix_time` (time since the Unix epoch).
    pub fn period(&self, unix_time: Duration) -> u64 {
        unix_time.as_secs() / self.rekey_every_secs
    }

    /// The hash key of a period.
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
        let (k0, k1) = self.period_key(period);
        let mut h = SipHasher24::new_with_keys(k0, k1);
        h.write(user_id);
        (h.finish() % USER_LEVELS as u64) as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_known_answer() {
        // Pinned so a dependency bump or refactor that changes the hash fails loudly:
        // entry sidecars of different versions must agree.
        let h = UserPriorityHasher::new(*b"weir-test-secret", Duration::from_secs(3600));
        let got: Vec<u8> = ["alice", "bob", "carol", "dave"]
            .iter()
            .map(|u| h.user_priority_in_period(u.as_bytes(), 493_000))
            .collect();
        assert_eq!(got, KNOWN_ANSWER);
    }

    // Cross-checked against an independent SipHash-2-4 implementation (Python, verified on
    // the reference vector 0x726fdb47dd0e0e31).
    const KNOWN_ANSWER: [u8; 4] = [92, 79, 37, 91];

    #[test]
    fn same_period_same_level_other_period_reshuffles() {
        let h = UserPriorityHasher::new(*b"s", Duration::from_secs(3600));
        let t = Duration::from_secs(1_800_000_000);
        assert_eq!(h.user_priority(b"u1", t), h.user_priority(b"u1", t + Duration::from_secs(1)));
        let changed = (0..200)
            .filter(|i| {
                let id = format!("user-{i}");
                h.user_priority_in_period(id.as_bytes(), 1)
                    != h.user_priority_in_period(id.as_bytes(), 2)
            })
            .count();
        assert!(changed > 180, "re-keying must reshuffle almost every user, moved {changed}/200");
    }

    #[test]
    fn spreads_evenly_over_128_levels() {
        let h = UserPriorityHasher::new(*b"s", Duration::from_secs(3600));
        let mut counts = [0u32; 128];
        for i in 0..128_000 {
            counts[h.user_priority_in_period(format!("u{i}").as_bytes(), 7) as usize] += 1;
        }
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(*min > 850 && *max < 1150, "uneven spread: min {min} max {max}");
    }
}
