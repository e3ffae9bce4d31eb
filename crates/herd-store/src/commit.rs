//! How transactions reach the backend: group commit, one backend commit at a
//! time, each taking every transaction queued while the one before ran.
//!
//! Two committers, chosen by [`Backend::commits_in_caller`]:
//! - [`WriterTask`]: one task commits for every writer. Used where a commit
//!   runs on a blocking thread anyway (SQLite), so the hop to the task is
//!   small beside it, and where writers that commit for themselves were
//!   measured to form smaller batches under a burst.
//! - [`Combiner`]: the writers commit themselves, one at a time; whoever
//!   holds the turn commits everything queued, its own write among it. Used
//!   where a commit is a network round trip (PostgreSQL): a lone writer then
//!   pays no hop to another task and back, which was a tenth of a write.
//!
//! Invariant (both): batches are committed and their events published in
//! revision order, and every queued transaction is answered, also when the
//! writer that queued it, or the one committing it, stopped waiting.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use tokio::sync::oneshot::error::TryRecvError;
use tokio::sync::{mpsc, oneshot};

use crate::backend::Backend;
use crate::error::StoreError;
use crate::store::StoreStats;
use crate::types::{Txn, TxnOutcome};
use crate::watch::Hub;

/// The most transactions one backend commit carries.
pub(crate) const MAX_BATCH: usize = 512;

type Reply = oneshot::Sender<Result<TxnOutcome, StoreError>>;
type Answer = oneshot::Receiver<Result<TxnOutcome, StoreError>>;

struct WriteRequest {
    txn: Txn,
    reply: Reply,
}

/// What both committers need to commit a batch.
struct Target {
    backend: Arc<dyn Backend>,
    hub: Arc<Hub>,
    stats: Arc<StoreStats>,
}

impl Target {
    /// Commits one batch, hands its events to the watch hub and answers
    /// each writer.
    async fn commit(&self, batch: Vec<WriteRequest>) {
        let (txns, replies): (Vec<Txn>, Vec<Reply>) = batch.into_iter().map(|r| (r.txn, r.reply)).unzip();
        let count = txns.len() as u64;
        let _in_flight = self.hub.commit_begins();
        let started = std::time::Instant::now();
        let result = self.backend.commit(txns).await;
        self.stats.observe_commit(started.elapsed());
        match result {
            Ok(committed) => {
                self.stats.commits.fetch_add(1, Ordering::Relaxed);
                self.stats.txns.fetch_add(count, Ordering::Relaxed);
                self.hub.publish(committed.events);
                for (reply, outcome) in replies.into_iter().zip(committed.outcomes) {
                    let _ = reply.send(Ok(outcome));
                }
            }
            Err(error) => {
                self.stats.commit_failures.fetch_add(1, Ordering::Relaxed);
                tracing::error!(%error, transactions = count, "store commit failed");
                for reply in replies {
                    let _ = reply.send(Err(error.clone()));
                }
            }
        }
    }
}

/// Commits transactions for the store, in one of two ways (module docs).
pub(crate) enum Committer {
    Task(WriterTask),
    Combining(Arc<Combiner>),
}

impl Committer {
    /// The committer the backend asks for; a writer task is started here.
    pub(crate) fn start(backend: Arc<dyn Backend>, hub: Arc<Hub>, stats: Arc<StoreStats>) -> Committer {
        let in_caller = backend.commits_in_caller();
        let target = Target { backend, hub, stats };
        if in_caller {
            Committer::Combining(Arc::new(Combiner { target, queue: Mutex::new(Vec::new()), turn: Default::default() }))
        } else {
            let (writes, requests) = mpsc::channel(4 * MAX_BATCH);
            tokio::spawn(write_loop(target, requests));
            Committer::Task(WriterTask { writes })
        }
    }

    /// Commits `txn` (with whatever else is queued); durable when this returns.
    pub(crate) async fn commit(&self, txn: Txn) -> Result<TxnOutcome, StoreError> {
        let (reply, answer) = oneshot::channel();
        let request = WriteRequest { txn, reply };
        match self {
            Committer::Task(task) => task.writes.send(request).await.map_err(|_| StoreError::Closed)?,
            Committer::Combining(combiner) => {
                let combiner = combiner.clone();
                return FinishedEvenIfDropped::new(async move { combiner.commit(request, answer).await }).await;
            }
        }
        answer.await.map_err(|_| StoreError::Closed)?
    }
}

pub(crate) struct WriterTask {
    writes: mpsc::Sender<WriteRequest>,
}

/// The writer task: takes every queued transaction (up to MAX_BATCH) and
/// commits them in one backend transaction.
async fn write_loop(target: Target, mut requests: mpsc::Receiver<WriteRequest>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while requests.recv_many(&mut batch, MAX_BATCH).await > 0 {
        target.commit(std::mem::take(&mut batch)).await;
    }
}

pub(crate) struct Combiner {
    target: Target,
    queue: Mutex<Vec<WriteRequest>>,
    /// Held by the writer committing; waiters get it in arrival order.
    turn: tokio::sync::Mutex<()>,
}

impl Combiner {
    async fn commit(&self, request: WriteRequest, mut answer: Answer) -> Result<TxnOutcome, StoreError> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner).push(request);
        loop {
            // The answer is polled only while another writer has the turn: a
            // polled receiver keeps this task's waker, and answering our own
            // write would then wake this task once more for nothing, which
            // costs a wake-up of another worker thread per write.
            let turn = match self.turn.try_lock() {
                Ok(turn) => turn,
                Err(_) => tokio::select! {
                    biased;
                    outcome = &mut answer => return outcome.map_err(|_| StoreError::Closed)?,
                    turn = self.turn.lock() => turn,
                },
            };
            let batch = {
                let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
                let taken = queue.len().min(MAX_BATCH);
                let rest = queue.split_off(taken);
                std::mem::replace(&mut *queue, rest)
            };
            // An empty queue: a writer before us committed ours, and as it
            // answered before giving up the turn, the answer is waiting.
            let ours_may_be_left = !batch.is_empty();
            if ours_may_be_left {
                self.target.commit(batch).await;
            }
            drop(turn);
            match answer.try_recv() {
                Ok(outcome) => return outcome,
                Err(TryRecvError::Empty) if ours_may_be_left => {}
                Err(TryRecvError::Empty) => return answer.await.map_err(|_| StoreError::Closed)?,
                Err(TryRecvError::Closed) => return Err(StoreError::Closed),
            }
        }
    }
}

/// A future that, dropped before it is done, is finished by a task of its
/// own (its output dropped): a writer that stopped waiting may hold the turn
/// in the middle of a commit that answers others, or have its write queued
/// where only it would come back to commit it.
struct FinishedEvenIfDropped<T: Send + 'static> {
    future: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
}

impl<T: Send + 'static> FinishedEvenIfDropped<T> {
    fn new(future: impl Future<Output = T> + Send + 'static) -> FinishedEvenIfDropped<T> {
        FinishedEvenIfDropped { future: Some(Box::pin(future)) }
    }
}

impl<T: Send + 'static> Future for FinishedEvenIfDropped<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let Some(future) = self.future.as_mut() else { return Poll::Pending };
        let output = std::task::ready!(future.as_mut().poll(cx));
        self.future = None;
        Poll::Ready(output)
    }
}

impl<T: Send + 'static> Drop for FinishedEvenIfDropped<T> {
    fn drop(&mut self) {
        if let (Some(future), Ok(runtime)) = (self.future.take(), tokio::runtime::Handle::try_current()) {
            runtime.spawn(future);
        }
    }
}
