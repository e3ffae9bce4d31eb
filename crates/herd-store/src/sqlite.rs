//! The SQLite backend: one file, WAL, `synchronous=FULL`, so an acknowledged
//! write survives power loss. One writer connection, a few readers (WAL lets
//! them read while the writer commits).
//!
//! Several processes may share the file (server replicas on one host):
//! their writes serialise on SQLite's own write lock (`BEGIN IMMEDIATE`),
//! and the head revision is read inside it, so revisions still commit in
//! order. A thread per store polls `PRAGMA data_version` to notice other
//! processes' commits and wake the watch tailer.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use tokio::sync::Notify;

use crate::backend::{Backend, Committed};
use crate::error::StoreError;
use crate::plan::{self, Write};
use crate::types::{Event, EventKind, KeyValue, Revision, Txn, prefix_end};

/// The keys live in a rowid table with an index on the key, the value
/// last: a lookup searches the index, which holds only keys, and reads
/// the one row it finds. (With the key as the primary key of a `WITHOUT
/// ROWID` table, a search compared against whole cells, and every large
/// value on its path, a configuration document of megabytes, was read
/// in full from its overflow pages at each lookup of a nearby key.)
const KEYS: &str = "
CREATE TABLE IF NOT EXISTS kv (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    create_revision INTEGER NOT NULL,
    mod_revision INTEGER NOT NULL,
    value BLOB NOT NULL
);";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS events (
    revision INTEGER PRIMARY KEY,
    key TEXT NOT NULL,
    deleted INTEGER NOT NULL,
    value BLOB NOT NULL,
    create_revision INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    compacted INTEGER NOT NULL
);
INSERT OR IGNORE INTO meta (id, compacted) VALUES (1, 0);
";

/// Each connection's page cache.
const CACHE_KIB: i64 = 32 * 1024;

/// Reads run at once, each on a connection kept open for reuse: more wait
/// for one (a thousand heartbeats at once would otherwise open, warm and
/// close a connection each, on as many blocking threads).
const READERS: usize = 8;

/// How often the file is checked for other processes' commits.
const CHANGE_POLL: Duration = Duration::from_millis(25);

pub struct SqliteBackend {
    path: PathBuf,
    writer: Arc<Mutex<Connection>>,
    readers: Arc<Mutex<Vec<Connection>>>,
    /// A permit per reader connection.
    reading: Arc<tokio::sync::Semaphore>,
    external: Arc<Notify>,
    /// Locked for as long as this process has the store open: the liveness
    /// token names it (processes sharing a SQLite file share a host).
    alive: (File, PathBuf),
}

const ALIVE_PREFIX: &str = "sqlite-file:";

impl Drop for SqliteBackend {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.alive.1);
    }
}

/// Creates and locks this process's liveness file.
fn lock_alive_file(db: &Path) -> Result<(File, PathBuf), StoreError> {
    let dir = db.with_extension("alive");
    std::fs::create_dir_all(&dir).map_err(|e| StoreError::Backend(format!("creating {}: {e}", dir.display())))?;
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    let path = dir.join(format!("{}-{nanos}.lock", std::process::id()));
    let file = File::create(&path).map_err(|e| StoreError::Backend(format!("creating {}: {e}", path.display())))?;
    file.try_lock().map_err(|e| StoreError::Backend(format!("locking {}: {e}", path.display())))?;
    Ok((file, path))
}

/// Opens a connection with the durability settings every herd SQLite
/// connection uses. Public so that benchmarks can measure a baseline with
/// exactly the same settings.
pub fn open_connection(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    // The default 2 MiB cache per connection misses on every lookup once
    // the store outgrows it. No memory map: a read after another
    // connection's write drops the whole map (munmap, then page faults
    // again), which under a stream of writes cost more than the preads.
    conn.pragma_update(None, "cache_size", -CACHE_KIB)?;
    conn.pragma_update(None, "mmap_size", 0)?;
    Ok(conn)
}

/// Moves the keys of a store written before they had a rowid table (one
/// transaction, once: the revisions and values stay as they were).
fn move_keys_to_rowid_table(conn: &mut Connection) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let sql: String =
        tx.query_row("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'kv'", [], |r| r.get(0))?;
    if !sql.contains("WITHOUT ROWID") {
        return Ok(());
    }
    tx.execute_batch("ALTER TABLE kv RENAME TO kv_without_rowid")?;
    tx.execute_batch(KEYS)?;
    tx.execute_batch(
        "INSERT INTO kv (key, create_revision, mod_revision, value)
             SELECT key, create_revision, mod_revision, value FROM kv_without_rowid ORDER BY key;
         DROP TABLE kv_without_rowid;",
    )?;
    tx.commit()?;
    Ok(())
}

/// Signals `changed` whenever another connection commits to the file (also
/// this process's writer: the tailer then finds nothing new, cheaply). Ends
/// when the backend is gone.
fn watch_file(conn: Connection, changed: Weak<Notify>) {
    std::thread::spawn(move || {
        let version = |conn: &Connection| conn.query_row("PRAGMA data_version", [], |r| r.get::<_, i64>(0)).ok();
        let mut last = version(&conn);
        loop {
            std::thread::sleep(CHANGE_POLL);
            let Some(changed) = changed.upgrade() else { return };
            let now = version(&conn);
            if now != last {
                last = now;
                changed.notify_one();
            }
        }
    });
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
            std::fs::create_dir_all(dir)
                .map_err(|e| StoreError::Backend(format!("creating {}: {e}", dir.display())))?;
        }
        let mut writer = open_connection(&path)?;
        writer.execute_batch(KEYS)?;
        writer.execute_batch(SCHEMA)?;
        move_keys_to_rowid_table(&mut writer)?;
        let external = Arc::new(Notify::new());
        watch_file(open_connection(&path)?, Arc::downgrade(&external));
        let alive = lock_alive_file(&path)?;
        Ok(SqliteBackend {
            path,
            writer: Arc::new(Mutex::new(writer)),
            readers: Arc::new(Mutex::new(Vec::new())),
            reading: Arc::new(tokio::sync::Semaphore::new(READERS)),
            external,
            alive,
        })
    }

    /// Runs a point read here, on the caller's thread, when a pooled
    /// connection and a reader's place are free: it reads pages that are
    /// almost always cached (its own cache, the OS's page cache), in microseconds, and
    /// handing it to the blocking pool and back costs two thread switches
    /// more than that. Otherwise as [`Self::read`].
    async fn read_here<T: Send + 'static>(
        &self,
        read: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let pooled = match self.reading.try_acquire() {
            Ok(permit) => self.readers.lock().map_err(lock_error)?.pop().map(|conn| (permit, conn)),
            Err(_) => None,
        };
        // Without both, no permit is kept while waiting for one.
        let Some((_permit, mut conn)) = pooled else { return self.read(read).await };
        let result = in_read_transaction(&mut conn, read);
        self.readers.lock().map_err(lock_error)?.push(conn);
        result
    }

    /// Runs `read` in a read transaction on a pooled connection.
    async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let readers = self.readers.clone();
        let path = self.path.clone();
        let permit = self.reading.clone().acquire_owned().await.map_err(|_| StoreError::Closed)?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let pooled = readers.lock().map_err(lock_error)?.pop();
            let mut conn = match pooled {
                Some(conn) => conn,
                None => open_connection(&path)?,
            };
            let result = in_read_transaction(&mut conn, read);
            readers.lock().map_err(lock_error)?.push(conn);
            result
        })
        .await
        .map_err(join_error)?
    }
}

fn in_read_transaction<T>(
    conn: &mut rusqlite::Connection,
    read: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
    let result = read(&tx);
    tx.finish()?;
    result
}

/// The head revision (the newest event's, or the compaction point when
/// every event is compacted) and the compaction point.
fn head(tx: &rusqlite::Transaction<'_>) -> Result<(Revision, Revision), StoreError> {
    let (revision, compacted): (i64, i64) = tx
        .prepare_cached(
            "SELECT max(coalesce((SELECT max(revision) FROM events), 0), compacted), compacted FROM meta WHERE id = 1",
        )?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?;
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

fn insert_event(tx: &rusqlite::Transaction<'_>, event: &Event) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT INTO events (revision, key, deleted, value, create_revision) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![
        to_sql(event.revision),
        event.key,
        event.kind == EventKind::Delete,
        &event.value[..],
        to_sql(event.create_revision)
    ])?;
    Ok(())
}

/// Makes one planned write and returns its event.
fn write(tx: &rusqlite::Transaction<'_>, planned: &Write<'_>) -> Result<Event, StoreError> {
    let event = match *planned {
        Write::Put { key, value, revision } => {
            let create: i64 = tx
                .prepare_cached(
                    "INSERT INTO kv (key, value, create_revision, mod_revision) VALUES (?1, ?2, ?3, ?3)
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value, mod_revision = excluded.mod_revision
                     RETURNING create_revision",
                )?
                .query_row(params![key, value, to_sql(revision)], |r| r.get(0))?;
            Event {
                revision,
                kind: EventKind::Put,
                key: key.to_string(),
                value: bytes::Bytes::copy_from_slice(value),
                create_revision: to_revision(create),
            }
        }
        Write::Delete { key, revision } => {
            let (value, create): (Vec<u8>, i64) = tx
                .prepare_cached("DELETE FROM kv WHERE key = ?1 RETURNING value, create_revision")?
                .query_row([key], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?
                .ok_or_else(|| StoreError::Backend(format!("sqlite: planned delete of {key} found no key")))?;
            Event {
                revision,
                kind: EventKind::Delete,
                key: key.to_string(),
                value: value.into(),
                create_revision: to_revision(create),
            }
        }
    };
    insert_event(tx, &event)?;
    Ok(event)
}

#[async_trait]
impl Backend for SqliteBackend {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    async fn get(&self, key: &str) -> Result<(Option<KeyValue>, Revision), StoreError> {
        let key = key.to_string();
        self.read_here(move |tx| {
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

    async fn commit(&self, batch: Vec<Txn>) -> Result<Committed, StoreError> {
        let writer = self.writer.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = writer.lock().map_err(lock_error)?;
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let (head, _) = head(&tx)?;
            let mut current = HashMap::new();
            for key in plan::keys_to_read(&batch) {
                if let Some(revision) = mod_revision(&tx, &key)? {
                    current.insert(key, revision);
                }
            }
            let plan = plan::plan(&batch, head, &current);
            let events = plan.writes.iter().map(|w| write(&tx, w)).collect::<Result<Vec<_>, _>>()?;
            tx.commit()?;
            Ok(Committed { outcomes: plan.outcomes, events })
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
                        value: r.get::<_, Vec<u8>>(3)?.into(),
                        create_revision: to_revision(r.get(4)?),
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(events)
        })
        .await
    }

    fn external_commits(&self) -> Option<Arc<Notify>> {
        Some(self.external.clone())
    }

    fn liveness_token(&self) -> Option<String> {
        Some(format!("{ALIVE_PREFIX}{}", self.alive.1.display()))
    }

    /// Alive while its file is locked; a dead process's file is removed.
    async fn is_alive(&self, token: &str) -> Result<bool, StoreError> {
        let Some(path) = token.strip_prefix(ALIVE_PREFIX) else { return Ok(true) };
        let file = match File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(_) => return Ok(true),
        };
        match file.try_lock() {
            Ok(()) => {
                drop(file);
                let _ = std::fs::remove_file(path);
                Ok(false)
            }
            Err(_) => Ok(true),
        }
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
