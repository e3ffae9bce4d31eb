//! The SQLite backend: one file, WAL, `synchronous=FULL`, so an acknowledged
//! write survives power loss. One writer connection, a few readers (WAL lets
//! them read while the writer commits). An exclusive lock on `<db>.lock`
//! keeps a second process from opening the same store.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::backend::Backend;
use crate::error::StoreError;
use crate::types::{Event, EventKind, KeyValue, Op, Revision, Txn, TxnOutcome, prefix_end};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value BLOB NOT NULL,
    create_revision INTEGER NOT NULL,
    mod_revision INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    revision INTEGER PRIMARY KEY,
    key TEXT NOT NULL,
    deleted INTEGER NOT NULL,
    value BLOB NOT NULL,
    create_revision INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    revision INTEGER NOT NULL,
    compacted INTEGER NOT NULL
);
INSERT OR IGNORE INTO meta (id, revision, compacted) VALUES (1, 0, 0);
";

/// Readers kept open for reuse.
const MAX_IDLE_READERS: usize = 8;

pub struct SqliteBackend {
    path: PathBuf,
    writer: Arc<Mutex<Connection>>,
    readers: Arc<Mutex<Vec<Connection>>>,
    _lock: File,
}

/// Opens a connection with the durability settings every herd SQLite
/// connection uses. Public so that benchmarks can measure a baseline with
/// exactly the same settings.
pub fn open_connection(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    Ok(conn)
}

fn lock_error(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(format!("sqlite: a connection lock was poisoned: {e}"))
}

fn join_error(e: tokio::task::JoinError) -> StoreError {
    StoreError::Backend(format!("sqlite worker failed: {e}"))
}

fn to_revision(value: i64) -> Revision {
    Revision::try_from(value).unwrap_or_default()
}

fn to_sql(revision: Revision) -> i64 {
    i64::try_from(revision).unwrap_or(i64::MAX)
}

impl SqliteBackend {
    pub async fn open(path: &Path) -> Result<SqliteBackend, StoreError> {
        let path = path.to_path_buf();
        tokio::task::spawn_blocking(move || Self::open_blocking(path)).await.map_err(join_error)?
    }

    fn open_blocking(path: PathBuf) -> Result<SqliteBackend, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| StoreError::Backend(format!("creating {}: {e}", dir.display())))?;
        }
        let lock_path = path.with_extension("lock");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| StoreError::Backend(format!("opening {}: {e}", lock_path.display())))?;
        lock.try_lock().map_err(|_| StoreError::Locked(format!("{} is locked", lock_path.display())))?;
        let writer = open_connection(&path)?;
        writer.execute_batch(SCHEMA)?;
        Ok(SqliteBackend {
            path,
            writer: Arc::new(Mutex::new(writer)),
            readers: Arc::new(Mutex::new(Vec::new())),
            _lock: lock,
        })
    }

    /// Runs `read` in a read transaction on a pooled connection.
    async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let readers = self.readers.clone();
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let pooled = readers.lock().map_err(lock_error)?.pop();
            let mut conn = match pooled {
                Some(conn) => conn,
                None => open_connection(&path)?,
            };
            let result = {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
                let result = read(&tx);
                tx.finish()?;
                result
            };
            let mut idle = readers.lock().map_err(lock_error)?;
            if idle.len() < MAX_IDLE_READERS {
                idle.push(conn);
            }
            result
        })
        .await
        .map_err(join_error)?
    }
}

fn head(tx: &rusqlite::Transaction<'_>) -> Result<(Revision, Revision), StoreError> {
    let (revision, compacted): (i64, i64) =
        tx.query_row("SELECT revision, compacted FROM meta WHERE id = 1", [], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok((to_revision(revision), to_revision(compacted)))
}

fn row_to_kv(row: &rusqlite::Row<'_>) -> rusqlite::Result<KeyValue> {
    Ok(KeyValue {
        key: row.get(0)?,
        value: row.get(1)?,
        create_revision: to_revision(row.get(2)?),
        mod_revision: to_revision(row.get(3)?),
    })
}

fn mod_revision(tx: &rusqlite::Transaction<'_>, key: &str) -> Result<Option<Revision>, StoreError> {
    let mut stmt = tx.prepare_cached("SELECT mod_revision FROM kv WHERE key = ?1")?;
    Ok(stmt.query_row([key], |r| r.get::<_, i64>(0)).optional()?.map(to_revision))
}

/// Applies one transaction inside the batch's SQL transaction.
fn apply(tx: &rusqlite::Transaction<'_>, txn: &Txn, revision: &mut Revision) -> Result<TxnOutcome, StoreError> {
    for (index, compare) in txn.compares.iter().enumerate() {
        let actual = mod_revision(tx, compare.key())?;
        if !compare.holds(actual) {
            return Ok(TxnOutcome::CompareFailed { index, key: compare.key().to_string(), actual });
        }
    }
    for op in &txn.ops {
        match op {
            Op::Put { key, value } => {
                let next = *revision + 1;
                let create: i64 = tx
                    .prepare_cached(
                        "INSERT INTO kv (key, value, create_revision, mod_revision) VALUES (?1, ?2, ?3, ?3)
                         ON CONFLICT (key) DO UPDATE SET value = excluded.value, mod_revision = excluded.mod_revision
                         RETURNING create_revision",
                    )?
                    .query_row(params![key, value, to_sql(next)], |r| r.get(0))?;
                tx.prepare_cached("INSERT INTO events (revision, key, deleted, value, create_revision) VALUES (?1, ?2, 0, ?3, ?4)")?
                    .execute(params![to_sql(next), key, value, create])?;
                *revision = next;
            }
            Op::Delete { key } => {
                let old: Option<(Vec<u8>, i64)> = tx
                    .prepare_cached("DELETE FROM kv WHERE key = ?1 RETURNING value, create_revision")?
                    .query_row([key], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()?;
                if let Some((value, create)) = old {
                    let next = *revision + 1;
                    tx.prepare_cached("INSERT INTO events (revision, key, deleted, value, create_revision) VALUES (?1, ?2, 1, ?3, ?4)")?
                        .execute(params![to_sql(next), key, value, create])?;
                    *revision = next;
                }
            }
        }
    }
    Ok(TxnOutcome::Committed { revision: *revision })
}

#[async_trait]
impl Backend for SqliteBackend {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    async fn get(&self, key: &str) -> Result<(Option<KeyValue>, Revision), StoreError> {
        let key = key.to_string();
        self.read(move |tx| {
            let kv = tx
                .prepare_cached("SELECT key, value, create_revision, mod_revision FROM kv WHERE key = ?1")?
                .query_row([&key], row_to_kv)
                .optional()?;
            Ok((kv, head(tx)?.0))
        })
        .await
    }

    async fn range(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<KeyValue>, Revision), StoreError> {
        let low = start_after.filter(|a| *a >= prefix).unwrap_or("").to_string();
        let (prefix, end) = (prefix.to_string(), prefix_end(prefix));
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(move |tx| {
            let mut stmt = tx.prepare_cached(
                "SELECT key, value, create_revision, mod_revision FROM kv
                 WHERE key >= ?1 AND key < ?2 AND key > ?3 ORDER BY key LIMIT ?4",
            )?;
            let kvs = stmt.query_map(params![prefix, end, low, limit], row_to_kv)?.collect::<Result<Vec<_>, _>>()?;
            Ok((kvs, head(tx)?.0))
        })
        .await
    }

    async fn commit(&self, batch: Vec<Txn>) -> Result<Vec<TxnOutcome>, StoreError> {
        let writer = self.writer.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = writer.lock().map_err(lock_error)?;
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let (mut revision, _) = head(&tx)?;
            let outcomes = batch.iter().map(|txn| apply(&tx, txn, &mut revision)).collect::<Result<Vec<_>, _>>()?;
            tx.execute("UPDATE meta SET revision = ?1 WHERE id = 1", [to_sql(revision)])?;
            tx.commit()?;
            Ok(outcomes)
        })
        .await
        .map_err(join_error)?
    }

    async fn events_after(&self, after: Revision, limit: usize) -> Result<Vec<Event>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(move |tx| {
            let (_, compacted) = head(tx)?;
            if after < compacted {
                return Err(StoreError::Compacted { requested: after, compacted });
            }
            let mut stmt = tx.prepare_cached(
                "SELECT revision, key, deleted, value, create_revision FROM events WHERE revision > ?1 ORDER BY revision LIMIT ?2",
            )?;
            let events = stmt
                .query_map(params![to_sql(after), limit], |r| {
                    Ok(Event {
                        revision: to_revision(r.get(0)?),
                        key: r.get(1)?,
                        kind: if r.get::<_, bool>(2)? { EventKind::Delete } else { EventKind::Put },
                        value: r.get(3)?,
                        create_revision: to_revision(r.get(4)?),
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(events)
        })
        .await
    }

    async fn compact(&self, upto: Revision) -> Result<(), StoreError> {
        let writer = self.writer.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = writer.lock().map_err(lock_error)?;
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let (head, compacted) = head(&tx)?;
            let upto = upto.min(head);
            if upto > compacted {
                tx.execute("DELETE FROM events WHERE revision <= ?1", [to_sql(upto)])?;
                tx.execute("UPDATE meta SET compacted = ?1 WHERE id = 1", [to_sql(upto)])?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
        .map_err(join_error)?
    }
}
