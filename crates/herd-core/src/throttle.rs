//! [`Bucket`]: a token bucket, to limit how often something may happen
//! (refused joins from one address). Pure: the caller passes the time.

use std::time::{Duration, Instant};

/// Holds up to `burst` tokens and gains one every `every`; each event
/// takes one, and none may happen while it is empty.
#[derive(Clone, Debug)]
pub struct Bucket {
    tokens: f64,
    at: Instant,
}

/// How big a bucket is and how fast it fills.
#[derive(Clone, Copy, Debug)]
pub struct Rate {
    pub burst: u32,
    pub every: Duration,
}

impl Bucket {
    /// A full bucket at `now`.
    pub fn full(rate: Rate, now: Instant) -> Bucket {
        Bucket { tokens: f64::from(rate.burst), at: now }
    }

    fn refill(&mut self, rate: Rate, now: Instant) {
        let gained = now.saturating_duration_since(self.at).as_secs_f64() / rate.every.as_secs_f64().max(f64::EPSILON);
        self.tokens = (self.tokens + gained).min(f64::from(rate.burst));
        self.at = now.max(self.at);
    }

    /// Whether an event may happen at `now` (the bucket is not empty).
    pub fn allows(&mut self, rate: Rate, now: Instant) -> bool {
        self.refill(rate, now);
        self.tokens >= 1.0
    }

    /// Takes a token for an event at `now` (none left: nothing changes).
    pub fn take(&mut self, rate: Rate, now: Instant) {
        self.refill(rate, now);
        self.tokens = (self.tokens - 1.0).max(0.0);
    }

    /// Whether it is full again at `now`: nothing to remember.
    pub fn is_full(&mut self, rate: Rate, now: Instant) -> bool {
        self.refill(rate, now);
        self.tokens >= f64::from(rate.burst)
    }

    /// How long from `now` until the next event may happen.
    pub fn wait(&mut self, rate: Rate, now: Instant) -> Duration {
        self.refill(rate, now);
        rate.every.mul_f64((1.0 - self.tokens).max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const RATE: Rate = Rate { burst: 10, every: Duration::from_secs(1) };

    #[test]
    fn a_burst_then_one_per_period() {
        let start = Instant::now();
        let mut bucket = Bucket::full(RATE, start);
        for _ in 0..10 {
            assert!(bucket.allows(RATE, start));
            bucket.take(RATE, start);
        }
        assert!(!bucket.allows(RATE, start));
        assert_eq!(bucket.wait(RATE, start), Duration::from_secs(1));
        assert!(!bucket.allows(RATE, start + Duration::from_millis(900)));
        assert!(bucket.allows(RATE, start + Duration::from_secs(1)));
        assert!(bucket.is_full(RATE, start + Duration::from_secs(11)));
    }

    proptest! {
        /// However events come, no more happen in a span than the burst
        /// plus one per period of it.
        #[test]
        fn never_more_than_the_burst_and_the_rate(gaps in proptest::collection::vec(0u64..700, 1..200)) {
            let start = Instant::now();
            let mut bucket = Bucket::full(RATE, start);
            let (mut now, mut happened) = (start, 0u32);
            for gap in gaps {
                now += Duration::from_millis(gap);
                if bucket.allows(RATE, now) {
                    bucket.take(RATE, now);
                    happened += 1;
                }
            }
            let periods = (now - start).as_secs_f64() / RATE.every.as_secs_f64();
            prop_assert!(f64::from(happened) <= f64::from(RATE.burst) + periods + 1e-9);
        }
    }
}
