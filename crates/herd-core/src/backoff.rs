//! [`Backoff`]: the one capped exponential backoff every retry in herd
//! waits by (a member's restarts, a notify's, a refused eviction's, a
//! failed reconciliation's, a failed controller pass's), and
//! [`Contention`]: how long an optimistic write that lost a race to
//! another writer tries again.

use std::time::{Duration, Instant};

/// Waits `first` after the first failure in a row, twice as long after
/// each further one, and never longer than `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
}

impl Backoff {
    pub const fn new(first: Duration, max: Duration) -> Self {
        Backoff { first, max }
    }

    /// The pause after the `failures`-th failure in a row (`first` for
    /// the first, and for none).
    pub fn pause(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1);
        self.first.saturating_mul(2u32.saturating_pow(doublings)).min(self.max)
    }
}

/// A [`Backoff`] that counts the failures in a row itself, for a loop
/// that retries.
#[derive(Clone, Debug)]
pub struct Retries {
    backoff: Backoff,
    failures: u32,
}

impl Retries {
    pub fn new(backoff: Backoff) -> Self {
        Retries { backoff, failures: 0 }
    }

    /// Counts a failure; the pause before the next try.
    pub fn failed(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.backoff.pause(self.failures)
    }

    /// A success: the next failure waits the first pause again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

/// How an optimistic read-modify-write that lost a race (the object, or
/// a guard, moved between its read and its write) tries again: after a
/// short pause that grows, for as long as [`Contention::PATIENCE`], not a
/// fixed number of times. On a loaded host one read-and-write takes long
/// enough for a busy object (an Operation's or a member's status) to be
/// written several times over; a count of attempts then refuses the
/// caller a write nobody else wanted (as a Kubernetes API server's
/// guaranteed update, which tries until it lands).
#[derive(Clone, Debug)]
pub struct Contention {
    since: Instant,
    retries: Retries,
}

impl Contention {
    /// How long a write keeps trying before it is refused as contended.
    pub const PATIENCE: Duration = Duration::from_secs(10);
    /// The pauses between tries: short at first (the other writer is
    /// usually done), never long enough to matter to a caller.
    pub const BACKOFF: Backoff = Backoff::new(Duration::from_millis(2), Duration::from_millis(200));

    /// A write's first try, made at `now`.
    pub fn new(now: Instant) -> Self {
        Contention { since: now, retries: Retries::new(Self::BACKOFF) }
    }

    /// A try lost its race at `now`: the pause before the next, or `None`
    /// when the write has tried for [`Contention::PATIENCE`] and should be
    /// refused (after at least two tries, however slow each was).
    pub fn lost(&mut self, now: Instant) -> Option<Duration> {
        let first_loss = self.retries.failures == 0;
        let pause = self.retries.failed();
        (first_loss || now.saturating_duration_since(self.since) < Self::PATIENCE).then_some(pause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const RESTARTS: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));

    #[test]
    fn the_first_pause_then_doubling_up_to_the_cap() {
        let pauses: Vec<u64> = (0..9).map(|n| RESTARTS.pause(n).as_millis() as u64).collect();
        assert_eq!(pauses, [500, 500, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000]);
        assert_eq!(RESTARTS.pause(u32::MAX), Duration::from_secs(30));
    }

    #[test]
    fn retries_count_their_failures_and_start_over_after_a_success() {
        let mut retries = Retries::new(RESTARTS);
        let waited: Vec<u64> = (0..3).map(|_| retries.failed().as_millis() as u64).collect();
        assert_eq!(waited, [500, 1_000, 2_000]);
        retries.reset();
        assert_eq!(retries.failed(), Duration::from_millis(500));
    }

    #[test]
    fn a_lost_race_is_tried_again_for_the_patience_not_a_count() {
        let start = Instant::now();
        let mut contention = Contention::new(start);
        let pauses: Vec<u64> = (0..12).map(|_| contention.lost(start).unwrap().as_millis() as u64).collect();
        assert_eq!(pauses, [2, 4, 8, 16, 32, 64, 128, 200, 200, 200, 200, 200], "many quick losses: still trying");
        let late = start + Contention::PATIENCE;
        assert_eq!(contention.lost(late), None, "refused once the patience is spent");
        let mut slow = Contention::new(start);
        assert!(slow.lost(late).is_some(), "one slow try is tried once more");
        assert_eq!(slow.lost(late), None);
    }

    proptest! {
        #[test]
        fn pauses_never_shrink_and_never_pass_the_cap(
            first in 1u64..10_000,
            max in 1u64..1_000_000,
            failures in 0u32..200,
        ) {
            let backoff = Backoff::new(Duration::from_millis(first), Duration::from_millis(max));
            let (now, next) = (backoff.pause(failures), backoff.pause(failures + 1));
            prop_assert!(now <= next);
            prop_assert!(next <= backoff.max);
            prop_assert!(next <= now * 2 || now == Duration::ZERO);
        }
    }
}
