//! [`ChangeClock`]: since when, on this process's monotonic clock, each
//! thing has looked as it does now ("since when has this held").
//!
//! Liveness and timeouts are judged this way, never by comparing another
//! host's wall clock with ours: a value first seen by this process counts
//! from that sighting, so a process that just started gives everything a
//! full grace period.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// For each key, the value last seen and when it was first seen so.
pub struct ChangeClock<V> {
    seen: HashMap<String, (V, Instant)>,
}

impl<V> Default for ChangeClock<V> {
    fn default() -> Self {
        ChangeClock { seen: HashMap::new() }
    }
}

impl<V: PartialEq> ChangeClock<V> {
    /// Notes `value` for `key` at `now`; returns how long the key has held
    /// this value (zero when it just changed or was never seen).
    pub fn since(&mut self, key: &str, value: V, now: Instant) -> Duration {
        match self.seen.get_mut(key) {
            Some((held, at)) if *held == value => now.duration_since(*at),
            Some(entry) => {
                *entry = (value, now);
                Duration::ZERO
            }
            None => {
                self.seen.insert(key.to_string(), (value, now));
                Duration::ZERO
            }
        }
    }

    /// How many keys it holds.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// Forgets the keys `keep` says no to (things that are gone).
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.seen.retain(|key, _| keep(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn counts_from_the_first_sighting_of_each_value() {
        let mut clock = ChangeClock::default();
        assert_eq!(clock.since("a", 1, Instant::now()), Duration::ZERO);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(clock.since("a", 1, Instant::now()), Duration::from_secs(5));
        assert_eq!(clock.since("a", 2, Instant::now()), Duration::ZERO, "a change starts it again");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(clock.since("a", 2, Instant::now()), Duration::from_secs(2));
        clock.retain(|key| key != "a");
        assert_eq!(clock.since("a", 2, Instant::now()), Duration::ZERO, "forgotten");
    }
}
