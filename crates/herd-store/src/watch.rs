//! Watches: one tailer per store fans events out in revision order; each
//! watcher catches up from the log on its own, then follows the fan-out,
//! and falls back to the log whenever it lags.
//!
//! The tailer gets this process's commits straight from the writer and
//! reads the log only when they do not join up with what it sent last
//! (another process wrote in between, on PostgreSQL) or when woken by
//! another process's commit or its poll.
//!
//! Why no event is skipped or repeated: a watcher subscribes to the fan-out
//! before its first log read, so every event after that read arrives through
//! the fan-out; it drops events at or below the last revision it delivered,
//! and it checks that each delivered event is exactly one after the last.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use crate::backend::Backend;
use crate::error::StoreError;
use crate::types::{Event, Revision};

/// Events read from the log per call.
const LOG_CHUNK: usize = 1000;
/// Batches the fan-out keeps for slow watchers before they must re-read.
const FANOUT_CAPACITY: usize = 256;
/// How often the tailer looks at the log without being woken, to catch
/// commits whose wake-up was lost (a dropped PostgreSQL notification).
const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// A contiguous run of events, `(first - 1, last]`.
struct Batch {
    events: Vec<Event>,
}

pub(crate) struct Hub {
    fanout: broadcast::Sender<Arc<Batch>>,
    /// The newest revision fanned out.
    head: AtomicU64,
    local: mpsc::UnboundedSender<Vec<Event>>,
}

impl Hub {
    pub(crate) fn start(backend: Arc<dyn Backend>, head: Revision, stop: CancellationToken) -> Arc<Hub> {
        let (fanout, _) = broadcast::channel(FANOUT_CAPACITY);
        let (local, commits) = mpsc::unbounded_channel();
        let hub = Arc::new(Hub { fanout, head: AtomicU64::new(head), local });
        tokio::spawn(tail(backend, hub.clone(), commits, stop));
        hub
    }

    /// Hands the events of a commit of this process to the tailer.
    pub(crate) fn publish(&self, events: Vec<Event>) {
        if !events.is_empty() {
            let _ = self.local.send(events);
        }
    }

    fn send(&self, events: Vec<Event>) -> Revision {
        let end = events.last().map_or(0, |e| e.revision);
        let _ = self.fanout.send(Arc::new(Batch { events }));
        self.head.store(end, Ordering::Release);
        end
    }

    pub(crate) fn head(&self) -> Revision {
        self.head.load(Ordering::Acquire)
    }
}

async fn tail(
    backend: Arc<dyn Backend>,
    hub: Arc<Hub>,
    mut commits: mpsc::UnboundedReceiver<Vec<Event>>,
    stop: CancellationToken,
) {
    let external = backend.external_commits();
    let mut last = hub.head();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            Some(events) = commits.recv() => {
                let fresh: Vec<Event> = events.into_iter().filter(|e| e.revision > last).collect();
                if fresh.is_empty() {
                    continue;
                }
                if is_contiguous(last, &fresh) {
                    last = hub.send(fresh);
                    continue;
                }
            }
            _ = async { match &external { Some(n) => n.notified().await, None => std::future::pending().await } } => {}
            _ = tokio::time::sleep(POLL_INTERVAL) => {}
        }
        last = read_log(backend.as_ref(), &hub, last).await;
    }
}

/// Sends everything in the log after `last`; returns the new last.
async fn read_log(backend: &dyn Backend, hub: &Hub, mut last: Revision) -> Revision {
    loop {
        let events = match backend.events_after(last, LOG_CHUNK).await {
            Ok(events) => events,
            Err(StoreError::Compacted { compacted, .. }) => {
                // History was compacted past what was fanned out; watchers
                // re-read the log from their own position and learn
                // whether they lost anything.
                tracing::warn!(last, compacted, "watch tailer fell behind compaction");
                let _ = hub.fanout.send(Arc::new(Batch { events: Vec::new() }));
                return compacted;
            }
            Err(error) => {
                tracing::warn!(%error, "watch tailer could not read the event log");
                return last;
            }
        };
        if events.is_empty() {
            return last;
        }
        if !is_contiguous(last, &events) {
            tracing::error!(last, first = events[0].revision, "gap in the event log; reading again");
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let full = events.len() == LOG_CHUNK;
        last = hub.send(events);
        if !full {
            return last;
        }
    }
}

fn is_contiguous(after: Revision, events: &[Event]) -> bool {
    events.iter().zip(after + 1..).all(|(e, want)| e.revision == want)
}

/// Events for one watcher: those under its prefix, and how far it got.
#[derive(Debug)]
pub struct WatchBatch {
    pub events: Vec<Event>,
    /// Every event up to and including this revision has been delivered.
    pub revision: Revision,
}

/// A watch on a key prefix from a revision; see [`crate::Store::watch`].
pub struct Watcher {
    backend: Arc<dyn Backend>,
    fanout: broadcast::Receiver<Arc<Batch>>,
    prefix: String,
    delivered: Revision,
    from_log: bool,
}

impl Watcher {
    pub(crate) async fn start(
        backend: Arc<dyn Backend>,
        hub: &Hub,
        prefix: String,
        after: Revision,
    ) -> Result<Watcher, StoreError> {
        let fanout = hub.fanout.subscribe();
        // Fail now, not on the first event, if the history is gone.
        backend.events_after(after, 1).await?;
        Ok(Watcher { backend, fanout, prefix, delivered: after, from_log: true })
    }

    /// The revision up to which everything has been delivered.
    pub fn revision(&self) -> Revision {
        self.delivered
    }

    /// Waits for the next events under the prefix. A batch may be empty of
    /// events and only move `revision` (changes elsewhere in the store).
    pub async fn next(&mut self) -> Result<WatchBatch, StoreError> {
        loop {
            if self.from_log {
                let events = self.backend.events_after(self.delivered, LOG_CHUNK).await?;
                if events.is_empty() {
                    self.from_log = false;
                    continue;
                }
                if !is_contiguous(self.delivered, &events) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                return Ok(self.deliver(events));
            }
            match self.fanout.recv().await {
                Ok(batch) => {
                    // Batches are contiguous: what is new is a suffix.
                    let fresh = &batch.events[batch.events.partition_point(|e| e.revision <= self.delivered)..];
                    if batch.events.is_empty() || fresh.first().is_some_and(|e| e.revision != self.delivered + 1) {
                        // A compaction signal, or a batch that does not join up
                        // with what was delivered: the log decides.
                        self.from_log = true;
                        continue;
                    }
                    let Some(last) = fresh.last() else { continue };
                    self.delivered = last.revision;
                    // Only this watcher's events are copied (their values shared).
                    let events = fresh.iter().filter(|e| e.key.starts_with(&self.prefix)).cloned().collect();
                    return Ok(WatchBatch { events, revision: self.delivered });
                }
                Err(broadcast::error::RecvError::Lagged(_)) => self.from_log = true,
                Err(broadcast::error::RecvError::Closed) => return Err(StoreError::Closed),
            }
        }
    }

    fn deliver(&mut self, events: Vec<Event>) -> WatchBatch {
        self.delivered = events.last().map_or(self.delivered, |e| e.revision);
        let events = events.into_iter().filter(|e| e.key.starts_with(&self.prefix)).collect();
        WatchBatch { events, revision: self.delivered }
    }
}
