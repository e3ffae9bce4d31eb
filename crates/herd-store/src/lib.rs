//! herd's store: a revisioned key/value store with one total order of
//! revisions, compare-and-swap transactions, watches and compaction.
//!
//! [`Store`] is the one type the rest of herd uses. It owns what is the same
//! for every database: group commit of concurrent writers, the watch fan-out
//! and its catch-up logic, paging and filtering. A [`Backend`] is the small
//! part that differs: one durable transaction per batch, range reads and the
//! event log. Two backends exist, [`sqlite::SqliteBackend`] (the default) and
//! [`postgres::PostgresBackend`] (for several server replicas); one
//! conformance suite (`tests/conformance`) runs against both.
//!
//! Invariants:
//! - Every applied put or delete gets its own revision, one more than the
//!   previous; revisions are committed in order, so the event log has no
//!   holes below the head.
//! - A write is acknowledged only after its transaction is durable.
//! - A watch delivers every event after its start revision exactly once, in
//!   revision order, or fails with [`StoreError::Compacted`]; it never skips.
//!   A [`PartitionWatch`] gives the same guarantee for one partition of a
//!   prefix.

mod backend;
mod commit;
mod error;
mod partition;
mod plan;
pub mod postgres;
pub mod sqlite;
mod store;
mod types;
mod watch;

pub use backend::{Backend, Committed};
pub use error::StoreError;
pub use partition::{PartitionOf, PartitionWatch, Partitioned};
pub use store::{CommitObserver, ListOptions, ListPage, Store, StoreStats};
pub use types::{Compare, Event, EventKind, KeyValue, Op, Revision, Txn, TxnOutcome, check_key};
pub use watch::{WatchBatch, Watcher};
