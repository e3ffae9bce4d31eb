//! Partitioned watches: one store watch on a prefix whose events a
//! partition function routes to the watches of their partition, so that
//! many watches of small partitions (each node's Commands, watched by that
//! node's agent) cost one look at each event, not one copy and one wake-up
//! per watch.
//!
//! Same guarantee as [`Watcher`]: every event of the partition after the
//! start revision exactly once, in revision order, or `Compacted`. Why:
//! a watch registers its channel with the router and notes how far the
//! router has routed, under one lock, so every later event of its
//! partition reaches the channel; what lies between its start and that
//! revision it reads from the log, then it follows the channel, dropping
//! what it already delivered. The router drops a watch whose channel is
//! full (its reader stalled) and all of them when its own store watch
//! fails; a dropped watch registers again and reads the log from where it
//! got, so it loses nothing (or learns that the log was compacted).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TryRecvError;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::error::StoreError;
use crate::store::Store;
use crate::types::{Event, Revision, check_key};
use crate::watch::{WatchBatch, Watcher};

/// Which partition an event belongs to (None: to none).
pub type PartitionOf = dyn Fn(&Event) -> Option<String> + Send + Sync;

/// Routed batches a watch may have unread before the router drops it.
const CHANNEL_CAPACITY: usize = 256;
/// How long the router waits before watching again after its watch failed.
const RETRY: Duration = Duration::from_secs(1);

struct Router {
    /// Every event up to here has been handed to the channels registered.
    routed: Revision,
    watches: HashMap<String, Vec<mpsc::Sender<Vec<Event>>>>,
}

struct Shared {
    store: Store,
    prefix: String,
    partition_of: Arc<PartitionOf>,
    router: Arc<Mutex<Router>>,
    stop: CancellationToken,
    _stop_router: DropGuard,
}

fn lock(router: &Mutex<Router>) -> MutexGuard<'_, Router> {
    // The router's state stays whole whatever panics: each change is one
    // assignment or one vector edit.
    router.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A prefix of the store split into partitions that can be watched one by
/// one. Cheap to clone; the router stops when `stop` fires or the last
/// clone (and the last watch) is dropped.
#[derive(Clone)]
pub struct Partitioned {
    shared: Arc<Shared>,
}

impl Partitioned {
    pub fn start(
        store: &Store,
        prefix: &str,
        partition_of: impl Fn(&Event) -> Option<String> + Send + Sync + 'static,
        stop: &CancellationToken,
    ) -> Result<Partitioned, StoreError> {
        check_key(prefix)?;
        let stop = stop.child_token();
        let router = Arc::new(Mutex::new(Router { routed: store.head(), watches: HashMap::new() }));
        let partition_of: Arc<PartitionOf> = Arc::new(partition_of);
        tokio::spawn(route(store.clone(), prefix.to_string(), partition_of.clone(), router.clone(), stop.clone()));
        let shared = Shared {
            store: store.clone(),
            prefix: prefix.to_string(),
            partition_of,
            router,
            _stop_router: stop.clone().drop_guard(),
            stop,
        };
        Ok(Partitioned { shared: Arc::new(shared) })
    }

    /// Watches one partition for changes after revision `after`. Fails at
    /// once with `Compacted` if that history is gone, `FutureRevision` if
    /// the store has not reached it.
    pub async fn watch(&self, partition: &str, after: Revision) -> Result<PartitionWatch, StoreError> {
        self.shared.store.check_reached(after).await?;
        let mut watch = PartitionWatch {
            owner: self.clone(),
            partition: partition.to_string(),
            delivered: after,
            phase: Phase::Unregistered,
            held: VecDeque::new(),
        };
        watch.register().await?;
        Ok(watch)
    }
}

/// Follows the prefix and hands each batch's events to their partitions' watches.
async fn route(
    store: Store,
    prefix: String,
    partition_of: Arc<PartitionOf>,
    router: Arc<Mutex<Router>>,
    stop: CancellationToken,
) {
    let mut from = lock(&router).routed;
    loop {
        match store.watch(&prefix, from).await {
            Ok(mut log) => loop {
                let batch = tokio::select! {
                    _ = stop.cancelled() => return,
                    batch = log.next() => batch,
                };
                match batch {
                    Ok(batch) => dispatch(&router, partition_of.as_ref(), batch),
                    Err(error) => {
                        tracing::warn!(%error, prefix, "a partitioned watch restarts: its watches read the log again");
                        break;
                    }
                }
            },
            Err(error) => tracing::warn!(%error, prefix, "a partitioned watch could not start"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(RETRY) => {}
        }
        // Whatever was routed last, the watches registered now are told
        // nothing more: each registers again and reads the log.
        from = store.head();
        let mut router = lock(&router);
        router.watches.clear();
        router.routed = from;
    }
}

fn dispatch(router: &Mutex<Router>, partition_of: &PartitionOf, batch: WatchBatch) {
    let mut by_partition: HashMap<String, Vec<Event>> = HashMap::new();
    for event in batch.events {
        if let Some(partition) = partition_of(&event) {
            by_partition.entry(partition).or_default().push(event);
        }
    }
    let mut router = lock(router);
    for (partition, events) in by_partition {
        if let Some(watches) = router.watches.get_mut(&partition) {
            // A full channel's reader stalled: dropped, it catches up from the log.
            watches.retain(|watch| watch.try_send(events.clone()).is_ok());
            if watches.is_empty() {
                router.watches.remove(&partition);
            }
        }
    }
    router.routed = batch.revision;
}

enum Phase {
    /// Not (or no longer) registered with the router.
    Unregistered,
    /// Reading the log up to `until`, where the router stood when this
    /// watch registered; what the router routes meanwhile waits in `live`.
    CatchingUp {
        log: Watcher,
        until: Revision,
        live: mpsc::Receiver<Vec<Event>>,
    },
    Live(mpsc::Receiver<Vec<Event>>),
}

/// A watch on one partition; see [`Partitioned::watch`].
pub struct PartitionWatch {
    owner: Partitioned,
    partition: String,
    /// Every event of the partition up to here has been delivered.
    delivered: Revision,
    phase: Phase,
    /// Batches taken from the channel to learn the progress, not yet delivered.
    held: VecDeque<Vec<Event>>,
}

impl PartitionWatch {
    async fn register(&mut self) -> Result<(), StoreError> {
        let shared = &self.owner.shared;
        if shared.stop.is_cancelled() {
            return Err(StoreError::Closed);
        }
        let (sender, live) = mpsc::channel(CHANNEL_CAPACITY);
        let until = {
            let mut router = lock(&shared.router);
            let watches = router.watches.entry(self.partition.clone()).or_default();
            watches.retain(|watch| !watch.is_closed());
            watches.push(sender);
            router.routed
        };
        self.phase = if self.delivered < until {
            let log = shared.store.watch(&shared.prefix, self.delivered).await?;
            Phase::CatchingUp { log, until, live }
        } else {
            Phase::Live(live)
        };
        Ok(())
    }

    /// Waits for the partition's next events. A batch may be empty of
    /// events and only move `revision`.
    pub async fn next(&mut self) -> Result<WatchBatch, StoreError> {
        loop {
            if let Some(events) = self.held.pop_front() {
                match self.fresh(events) {
                    Some(batch) => return Ok(batch),
                    None => continue,
                }
            }
            match &mut self.phase {
                Phase::Unregistered => self.register().await?,
                Phase::CatchingUp { log, until, .. } => {
                    let until = *until;
                    let batch = log.next().await?;
                    let partition_of = self.owner.shared.partition_of.as_ref();
                    let events = batch
                        .events
                        .into_iter()
                        .filter(|e| e.revision <= until && partition_of(e).as_deref() == Some(&self.partition))
                        .collect();
                    self.delivered = batch.revision.min(until);
                    if self.delivered == until
                        && let Phase::CatchingUp { live, .. } = std::mem::replace(&mut self.phase, Phase::Unregistered)
                    {
                        self.phase = Phase::Live(live);
                    }
                    return Ok(WatchBatch { events, revision: self.delivered });
                }
                Phase::Live(live) => match live.recv().await {
                    Some(events) => {
                        if let Some(batch) = self.fresh(events) {
                            return Ok(batch);
                        }
                    }
                    None => self.phase = Phase::Unregistered,
                },
            }
        }
    }

    /// The events of a routed batch not yet delivered, if any.
    fn fresh(&mut self, mut events: Vec<Event>) -> Option<WatchBatch> {
        events.retain(|e| e.revision > self.delivered);
        self.delivered = events.last()?.revision;
        Some(WatchBatch { events, revision: self.delivered })
    }

    /// The revision up to which every event of the partition has been
    /// delivered: past the partition's last event, up to where the router
    /// got, when nothing routed waits to be delivered.
    pub fn revision(&mut self) -> Revision {
        let Phase::Live(live) = &mut self.phase else { return self.delivered };
        // Read before the channel is drained: everything the router routed
        // up to `routed` is in the channel by then.
        let routed = lock(&self.owner.shared.router).routed;
        loop {
            match live.try_recv() {
                // What was delivered already (routed before this watch's
                // start) is no reason to hold the revision back.
                Ok(events) if events.last().is_some_and(|e| e.revision > self.delivered) => self.held.push_back(events),
                Ok(_) => {}
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    self.phase = Phase::Unregistered;
                    return self.delivered;
                }
            }
        }
        if self.held.is_empty() {
            self.delivered = self.delivered.max(routed);
        }
        self.delivered
    }
}
