//! [`Backoff`]: the one capped exponential backoff every retry in herd
//! waits by (a member's restarts, a notify's, a refused eviction's, a
//! failed reconciliation's, a failed controller pass's).

use std::time::Duration;

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
