//! Watches: one tailer per store fans events out in revision order; each
//! watcher catches up from the log on its own, then follows the fan-out,
//! and falls back to the log whenever it lags.
//!
//! This process's commits are fanned out by the committer itself, as it
//! commits, when they join up with what was sent last; otherwise (another
//! process wrote in between, on PostgreSQL) it wakes the tailer, which reads
//! the log. The tailer also reads the log when another process's commit
//! wakes it and at each poll. A lock orders the two senders, so batches go
//! out contiguous and in revision order.
//!
//! A process that writes alone does not listen for other processes'
//! commits (on PostgreSQL, hearing its own notifications was a tenth of a
//! write): the tailer asks the backend to listen once it finds another
//! writer, either by a commit of this process that does not join up or by
//! events in the log that it read while this process committed nothing.
//! Until then the poll delivers other processes' commits.
//!
//! Why no event is skipped or repeated: a watcher subscribes to the fan-out
//! before its first log read, so every event after that read arrives through
//! the fan-out; it drops events at or below the last revision it delivered,
//! and it checks that each delivered event is exactly one after the last.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, broadcast};
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
    /// The newest revision fanned out; held while sending, so that the
    /// committer and the tailer send in order.
    sent: Mutex<Revision>,
    /// The same, for readers that must not wait on the lock.
    head: AtomicU64,
    /// Wakes the tailer: a commit of this process did not join up.
    behind: Notify,
    own: OwnCommits,
}

/// This process's commits in flight, so that the tailer can tell whether
/// what it read from the log was written by another process.
#[derive(Default)]
struct OwnCommits {
    begun: AtomicU64,
    ended: AtomicU64,
}

impl OwnCommits {
    /// When no commit is in flight, a mark for [`OwnCommits::none_since`].
    fn quiet(&self) -> Option<u64> {
        // `ended` first: equal counts then mean none was in flight when
        // `ended` was read, and none began before `begun` was.
        let ended = self.ended.load(Ordering::SeqCst);
        let begun = self.begun.load(Ordering::SeqCst);
        (begun == ended).then_some(begun)
    }

    /// Whether no commit began since `mark` was taken.
    fn none_since(&self, mark: u64) -> bool {
        self.begun.load(Ordering::SeqCst) == mark
    }
}

/// A commit of this process, from before it is sent to the backend until
/// its events are published (or it failed).
pub(crate) struct CommitInFlight<'a>(&'a OwnCommits);

impl Drop for CommitInFlight<'_> {
    fn drop(&mut self) {
        self.0.ended.fetch_add(1, Ordering::SeqCst);
    }
}

impl Hub {
    pub(crate) fn start(backend: Arc<dyn Backend>, head: Revision, stop: CancellationToken) -> Arc<Hub> {
        let (fanout, _) = broadcast::channel(FANOUT_CAPACITY);
        let hub = Arc::new(Hub {
            fanout,
            sent: Mutex::new(head),
            head: AtomicU64::new(head),
            behind: Notify::new(),
            own: OwnCommits::default(),
        });
        tokio::spawn(tail(backend, hub.clone(), stop));
        hub
    }

    /// Marks a commit of this process in flight until the guard is dropped,
    /// after its events were published.
    pub(crate) fn commit_begins(&self) -> CommitInFlight<'_> {
        self.own.begun.fetch_add(1, Ordering::SeqCst);
        CommitInFlight(&self.own)
    }

    /// Fans out the events of a commit of this process, or, when they do
    /// not join up with what was sent, has the tailer read the log.
    pub(crate) fn publish(&self, events: Vec<Event>) {
        let mut sent = self.sent();
        let fresh: Vec<Event> = events.into_iter().filter(|e| e.revision > *sent).collect();
        if fresh.is_empty() {
            return;
        }
        if is_contiguous(*sent, &fresh) {
            self.send(&mut sent, fresh);
        } else {
            self.behind.notify_one();
        }
    }

    fn sent(&self) -> MutexGuard<'_, Revision> {
        self.sent.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends a batch that joins up with `sent` and moves it on.
    fn send(&self, sent: &mut Revision, events: Vec<Event>) {
        let end = events.last().map_or(*sent, |e| e.revision);
        let _ = self.fanout.send(Arc::new(Batch { events }));
        *sent = end;
        self.head.store(end, Ordering::Release);
    }

    pub(crate) fn head(&self) -> Revision {
        self.head.load(Ordering::Acquire)
    }
}

async fn tail(backend: Arc<dyn Backend>, hub: Arc<Hub>, stop: CancellationToken) {
    let external = backend.external_commits();
    let mut hearing = false;
    loop {
        let mut another_writes = false;
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = hub.behind.notified() => another_writes = true,
            _ = async { match &external { Some(n) => n.notified().await, None => std::future::pending().await } } => {}
            _ = tokio::time::sleep(POLL_INTERVAL) => {}
        }
        let quiet = hub.own.quiet();
        let sent_any = read_log(backend.as_ref(), &hub).await;
        another_writes |= sent_any && quiet.is_some_and(|mark| hub.own.none_since(mark));
        if another_writes && !hearing {
            match backend.hear_other_writers().await {
                Ok(()) => {
                    tracing::info!("another process writes to this store; listening for its commits");
                    hearing = true;
                }
                Err(error) => tracing::warn!(%error, "could not listen for other processes' commits; polling"),
            }
        }
    }
}

/// Sends everything in the log after what was sent; whether there was any.
async fn read_log(backend: &dyn Backend, hub: &Hub) -> bool {
    let mut sent_any = false;
    loop {
        let after = *hub.sent();
        let events = match backend.events_after(after, LOG_CHUNK).await {
            Ok(events) => events,
            Err(StoreError::Compacted { compacted, .. }) => {
                // History was compacted past what was fanned out; watchers
                // re-read the log from their own position and learn
                // whether they lost anything.
                tracing::warn!(after, compacted, "watch tailer fell behind compaction");
                let mut sent = hub.sent();
                let _ = hub.fanout.send(Arc::new(Batch { events: Vec::new() }));
                *sent = compacted.max(*sent);
                return sent_any;
            }
            Err(error) => {
                tracing::warn!(%error, "watch tailer could not read the event log");
                return sent_any;
            }
        };
        let full = events.len() == LOG_CHUNK;
        let joined = {
            let mut sent = hub.sent();
            // The committer may have sent some of them meanwhile.
            let fresh: Vec<Event> = events.into_iter().filter(|e| e.revision > *sent).collect();
            let joined = is_contiguous(*sent, &fresh);
            if joined && !fresh.is_empty() {
                hub.send(&mut sent, fresh);
                sent_any = true;
            }
            joined
        };
        if !joined {
            tracing::error!(after, "gap in the event log; reading again");
            tokio::time::sleep(Duration::from_millis(20)).await;
        } else if !full {
            return sent_any;
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
