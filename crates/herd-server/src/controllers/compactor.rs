//! The compactor: forgets store history older than a retention window, so
//! that the event log (which every heartbeat adds to) does not grow without
//! bound. Watches that fall further behind than the window get 410 and
//! relist, as Kubernetes clients do.
//!
//! Running it on several replicas at once is harmless: compaction to a
//! revision already compacted does nothing.

use std::collections::VecDeque;
use std::time::Duration;

use herd_store::{Revision, Store};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How much history watches can resume from.
pub const HISTORY_RETENTION: Duration = Duration::from_secs(300);
const SAMPLE_INTERVAL: Duration = Duration::from_secs(30);

/// The newest revision that is older than `retain`, dropping the samples
/// it supersedes. Samples are (when seen, head revision then), oldest first.
pub fn compaction_target(
    samples: &mut VecDeque<(Instant, Revision)>,
    now: Instant,
    retain: Duration,
) -> Option<Revision> {
    let mut target = None;
    while let Some(&(seen, revision)) = samples.front() {
        if now.duration_since(seen) < retain {
            break;
        }
        target = Some(revision);
        samples.pop_front();
    }
    target
}

pub async fn run(store: Store, stop: CancellationToken) {
    let mut samples = VecDeque::new();
    let mut ticks = tokio::time::interval(SAMPLE_INTERVAL);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let now = Instant::now();
        samples.push_back((now, store.head()));
        if let Some(revision) = compaction_target(&mut samples, now, HISTORY_RETENTION)
            && let Err(error) = store.compact(revision).await
        {
            tracing::warn!(%error, revision, "compaction failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compacts_to_the_newest_sample_past_retention() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut samples: VecDeque<_> = [(at(0), 10), (at(30), 20), (at(60), 30), (at(90), 40)].into();
        assert_eq!(compaction_target(&mut samples, at(50), Duration::from_secs(60)), None);
        assert_eq!(compaction_target(&mut samples, at(125), Duration::from_secs(60)), Some(30));
        assert_eq!(samples.iter().map(|s| s.1).collect::<Vec<_>>(), [40]);
    }
}
