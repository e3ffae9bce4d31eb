//! The part of the store that differs per database.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::error::StoreError;
use crate::types::{Event, KeyValue, Revision, Txn, TxnOutcome};

/// What one committed batch did.
#[derive(Debug, Default)]
pub struct Committed {
    /// One per transaction, in order.
    pub outcomes: Vec<TxnOutcome>,
    /// The events it made, in revision order.
    pub events: Vec<Event>,
}

/// A database that can hold a revisioned key/value store.
///
/// Contract (checked by the conformance suite):
/// - `commit` applies the batch in one durable transaction, each transaction
///   in order, each seeing the effects of those before it; a transaction
///   whose compare fails applies nothing and does not stop the others.
///   Every applied operation gets the next revision, and revisions commit in
///   order, also when several processes write to the same database.
/// - The head revision is the newest event's, or the compaction point when
///   every event is compacted; no separate counter is written per commit.
/// - Reads return the head revision they were taken at, consistent with
///   the rows they return.
/// - `events_after` fails with `Compacted` when `after` lies before the
///   compaction point.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// `sqlite` or `postgres`, for logs and metrics.
    fn name(&self) -> &'static str;

    /// The key's record (if any) and the head revision.
    async fn get(&self, key: &str) -> Result<(Option<KeyValue>, Revision), StoreError>;

    /// Up to `limit` keys starting with `prefix` and greater than
    /// `start_after`, in key order, and the head revision.
    async fn range(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<KeyValue>, Revision), StoreError>;

    async fn commit(&self, batch: Vec<Txn>) -> Result<Committed, StoreError>;

    /// Whether writers should commit in their own tasks, taking turns,
    /// rather than through one writer task: true where a commit is a
    /// network round trip, so a hop to another task and back is a
    /// noticeable part of it (see the `commit` module).
    fn commits_in_caller(&self) -> bool {
        false
    }

    /// Up to `limit` events with revision greater than `after`, in order.
    async fn events_after(&self, after: Revision, limit: usize) -> Result<Vec<Event>, StoreError>;

    /// Forgets events up to and including `upto` (no further than the head).
    async fn compact(&self, upto: Revision) -> Result<(), StoreError>;

    /// The time on the store's own clock (None: the store has none of its
    /// own, as a file on this host shares the host's). Processes sharing a
    /// store on another host stamp and judge times by it, so that their
    /// own clocks may disagree.
    async fn clock(&self) -> Result<Option<std::time::SystemTime>, StoreError> {
        Ok(None)
    }

    /// A token by which other processes on this store can tell whether this
    /// one still lives (None: the backend cannot tell).
    fn liveness_token(&self) -> Option<String> {
        None
    }

    /// Whether the process behind a token of [`Backend::liveness_token`]
    /// still lives. When in doubt, alive: a wrong "alive" costs a wait, a
    /// wrong "dead" an early takeover.
    async fn is_alive(&self, token: &str) -> Result<bool, StoreError> {
        let _ = token;
        Ok(true)
    }

    /// Signalled when another process committed to the same database, for
    /// backends that several processes share. None: only this process writes.
    /// A backend may wait for [`Backend::hear_other_writers`] before it
    /// signals anything; the watch tailer polls meanwhile.
    fn external_commits(&self) -> Option<Arc<Notify>> {
        None
    }

    /// Another process was found writing to the same database: signal its
    /// commits on `external_commits` from now on. Called once; a process
    /// that writes alone then pays nothing to hear its own commits.
    async fn hear_other_writers(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
