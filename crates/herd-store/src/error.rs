//! What can go wrong in the store.

use crate::types::Revision;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("key {0:?} already exists")]
    AlreadyExists(String),
    #[error("key {0:?} not found")]
    NotFound(String),
    #[error("key {key:?} has revision {actual:?}, the write expected {expected}")]
    Conflict { key: String, expected: Revision, actual: Option<Revision> },
    #[error(
        "revision {requested} is compacted (history starts after {compacted}): list again, then watch from the list's revision"
    )]
    Compacted { requested: Revision, compacted: Revision },
    /// A watch from a revision the store has not reached: the client's
    /// revision is from elsewhere (another store, one restored since).
    #[error(
        "revision {requested} is ahead of the store (its newest is {head}): list again, then watch from the list's revision"
    )]
    FutureRevision { requested: Revision, head: Revision },
    #[error("invalid key {0:?}: keys are 1-1024 printable ASCII characters without spaces")]
    InvalidKey(String),
    #[error("store backend error: {0}")]
    Backend(String),
    #[error("the store is closed")]
    Closed,
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Backend(format!("sqlite: {e}"))
    }
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        // The Display of a database error is only "db error"; the detail
        // (and the SQLSTATE) is in the DbError behind it.
        match e.as_db_error() {
            Some(db) => StoreError::Backend(format!("postgres: {} ({})", db.message(), db.code().code())),
            None => StoreError::Backend(format!("postgres: {e}")),
        }
    }
}
