//! The PostgreSQL backend, for several server replicas sharing one store.
//!
//! Revision order equals commit order: every writing transaction first takes
//! a transaction-scoped advisory lock (keyed by the schema) and holds it
//! until it commits, so the next writer reads the new head (in a statement
//! after the lock, hence with a snapshot that includes the previous commit)
//! only after this one is visible. The event log therefore never shows a hole that
//! fills later.
//!
//! A batch costs one round trip, whatever its size: the `herd_commit`
//! function (created with the tables) evaluates the compares and applies the
//! operations inside the database, in one statement and so in one implicit
//! transaction, and returns the outcomes and events (`herd_commit_one` does
//! the same for a single transaction of one compare and one operation,
//! most writes, with scalars instead of arrays). The acknowledgement
//! waits for ReadyForQuery, which PostgreSQL sends after the commit.
//! Commits are announced with `NOTIFY`; other processes' watches wake on it
//! (and poll as a fallback, since a notification can be lost with its
//! connection). The writer connection is also the listener: PostgreSQL
//! hands a backend its own notifications without signalling another
//! process, so a commit costs no wake-up of a second backend and task, as
//! it would with a separate listening connection. It only `LISTEN`s once
//! the watch tailer found another process writing
//! ([`Backend::hear_other_writers`]): reading back its own notifications
//! cost a lone writer's backend 20-40 µs a write.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, PoisonError};

use async_trait::async_trait;
use tokio::sync::{Mutex, Notify, Semaphore, SemaphorePermit};
use tokio_postgres::{Client, NoTls, Statement};

use crate::backend::{Backend, Committed};
use crate::error::StoreError;
use crate::types::{Compare, Event, EventKind, KeyValue, Op, Revision, Txn, TxnOutcome, prefix_end};

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS herd_kv (
    key TEXT COLLATE "C" PRIMARY KEY,
    value BYTEA NOT NULL,
    create_revision BIGINT NOT NULL,
    mod_revision BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS herd_events (
    revision BIGINT PRIMARY KEY,
    key TEXT COLLATE "C" NOT NULL,
    deleted BOOLEAN NOT NULL,
    value BYTEA NOT NULL,
    create_revision BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS herd_meta (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    compacted BIGINT NOT NULL
);
INSERT INTO herd_meta (id, compacted) VALUES (1, 0) ON CONFLICT DO NOTHING;

-- Commits a batch of transactions in one statement (one round trip, one
-- implicit transaction). Compares are given per transaction, in order:
-- c_rev -1 means "exists", 0 "absent", n "mod revision is n". Returns one
-- row per event (out_event) and one per transaction (its outcome).
CREATE OR REPLACE FUNCTION herd_commit(
    txn_count int, c_txn int[], c_key text[], c_rev bigint[],
    o_txn int[], o_key text[], o_del boolean[], o_val bytea[], channel text)
RETURNS TABLE (out_event boolean, out_txn int, out_index int, out_key text, out_actual bigint,
               out_revision bigint, out_deleted boolean, out_value bytea, out_create bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    head bigint;
    t int;
    ci int := 1;
    oi int := 1;
    nc int := coalesce(array_length(c_txn, 1), 0);
    nops int := coalesce(array_length(o_txn, 1), 0);
    cur bigint;
    failed boolean;
    cidx int;
    created bigint;
    old_value bytea;
    wrote boolean := false;
BEGIN
    -- The lock serialises writers; the head is read after it is held.
    PERFORM pg_advisory_xact_lock(hashtext(current_schema()));
    SELECT GREATEST(COALESCE((SELECT max(e.revision) FROM herd_events e), 0), m.compacted) INTO head
        FROM herd_meta m WHERE m.id = 1;
    FOR t IN 0 .. txn_count - 1 LOOP
        failed := false;
        cidx := 0;
        WHILE ci <= nc AND c_txn[ci] = t LOOP
            IF NOT failed THEN
                SELECT k.mod_revision INTO cur FROM herd_kv k WHERE k.key = c_key[ci];
                IF (c_rev[ci] = -1 AND cur IS NULL) OR (c_rev[ci] = 0 AND cur IS NOT NULL)
                   OR (c_rev[ci] > 0 AND cur IS DISTINCT FROM c_rev[ci]) THEN
                    failed := true;
                    RETURN QUERY SELECT false, t, cidx, c_key[ci], cur, head, NULL::boolean, NULL::bytea, NULL::bigint;
                END IF;
            END IF;
            ci := ci + 1;
            cidx := cidx + 1;
        END LOOP;
        WHILE oi <= nops AND o_txn[oi] = t LOOP
            IF failed THEN
                NULL;
            ELSIF o_del[oi] THEN
                DELETE FROM herd_kv k WHERE k.key = o_key[oi] RETURNING k.value, k.create_revision INTO old_value, created;
                IF FOUND THEN
                    head := head + 1;
                    INSERT INTO herd_events (revision, key, deleted, value, create_revision)
                        VALUES (head, o_key[oi], true, old_value, created);
                    RETURN QUERY SELECT true, t, NULL::int, o_key[oi], NULL::bigint, head, true, old_value, created;
                    wrote := true;
                END IF;
            ELSE
                head := head + 1;
                INSERT INTO herd_kv AS k (key, value, create_revision, mod_revision) VALUES (o_key[oi], o_val[oi], head, head)
                    ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, mod_revision = EXCLUDED.mod_revision
                    RETURNING k.create_revision INTO created;
                INSERT INTO herd_events (revision, key, deleted, value, create_revision)
                    VALUES (head, o_key[oi], false, o_val[oi], created);
                RETURN QUERY SELECT true, t, NULL::int, o_key[oi], NULL::bigint, head, false, o_val[oi], created;
                wrote := true;
            END IF;
            oi := oi + 1;
        END LOOP;
        IF NOT failed THEN
            RETURN QUERY SELECT false, t, NULL::int, NULL::text, NULL::bigint, head, NULL::boolean, NULL::bytea, NULL::bigint;
        END IF;
    END LOOP;
    IF wrote THEN
        PERFORM pg_notify(channel, head::text);
    END IF;
END
$fn$;

-- The same for a batch of one transaction with at most one compare and one
-- operation (most writes), without arrays or a row per event: one row, with
-- the deleted value for a delete (the caller knows a put's). Written with
-- few plpgsql expressions: each is set up again in every transaction, a
-- cost that one write per transaction pays in full.
CREATE OR REPLACE FUNCTION herd_commit_one(
    c_key text, c_rev bigint, o_key text, o_del boolean, o_val bytea, channel text,
    OUT out_failed boolean, OUT out_actual bigint, OUT out_revision bigint,
    OUT out_wrote boolean, OUT out_old bytea, OUT out_create bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    cur bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext(current_schema()));
    -- Events left after a compaction are all above its point.
    SELECT COALESCE(max(e.revision), (SELECT m.compacted FROM herd_meta m WHERE m.id = 1)), false, false
        INTO out_revision, out_failed, out_wrote FROM herd_events e;
    IF c_key = o_key AND NOT o_del AND c_rev >= 0 THEN
        -- A create or an update of the revision read: the write is the compare.
        IF c_rev = 0 THEN
            INSERT INTO herd_kv AS k (key, value, create_revision, mod_revision)
                VALUES (o_key, o_val, out_revision + 1, out_revision + 1) ON CONFLICT (key) DO NOTHING
                RETURNING k.create_revision INTO out_create;
        ELSE
            UPDATE herd_kv k SET value = o_val, mod_revision = out_revision + 1
                WHERE k.key = o_key AND k.mod_revision = c_rev RETURNING k.create_revision INTO out_create;
        END IF;
        IF NOT FOUND THEN
            SELECT k.mod_revision INTO out_actual FROM herd_kv k WHERE k.key = c_key;
            out_failed := true;
            RETURN;
        END IF;
    ELSE
        IF c_key IS NOT NULL THEN
            SELECT k.mod_revision INTO cur FROM herd_kv k WHERE k.key = c_key;
            IF (c_rev = -1 AND cur IS NULL) OR (c_rev = 0 AND cur IS NOT NULL)
               OR (c_rev > 0 AND cur IS DISTINCT FROM c_rev) THEN
                out_failed := true;
                out_actual := cur;
                RETURN;
            END IF;
        END IF;
        IF o_key IS NULL THEN
            RETURN;
        ELSIF o_del THEN
            DELETE FROM herd_kv k WHERE k.key = o_key RETURNING k.value, k.create_revision INTO out_old, out_create;
            IF NOT FOUND THEN
                RETURN;
            END IF;
        ELSE
            INSERT INTO herd_kv AS k (key, value, create_revision, mod_revision)
                VALUES (o_key, o_val, out_revision + 1, out_revision + 1)
                ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, mod_revision = EXCLUDED.mod_revision
                RETURNING k.create_revision INTO out_create;
        END IF;
    END IF;
    INSERT INTO herd_events AS e (revision, key, deleted, value, create_revision)
        VALUES (out_revision + 1, o_key, o_del, CASE WHEN o_del THEN out_old ELSE o_val END, out_create)
        RETURNING e.revision, true INTO out_revision, out_wrote;
    PERFORM pg_notify(channel, out_revision::text);
END
$fn$;
"#;

const CHANNEL: &str = "herd_commits";
const PID_PREFIX: &str = "postgres-pid:";
/// The head revision, in a query over `herd_meta m`: the newest event's, or
/// the compaction point when every event is compacted.
const HEAD: &str = "GREATEST(COALESCE((SELECT max(revision) FROM herd_events), 0), m.compacted)";
/// Read connections per process, at most, each kept once opened.
/// PostgreSQL refuses connections past `max_connections` (100 by default):
/// three replicas that opened one per concurrent read (and closed all but
/// eight after) went past it in the chaos soak, and requests failed with
/// "too many clients already". With this bound, three replicas hold at
/// most 51 (a writer each too), and a read waits for a connection instead.
pub const MAX_READERS: usize = 16;

/// A connection with its statements prepared once.
struct Conn {
    client: Client,
    stmts: Statements,
}

struct Statements {
    get: Statement,
    range: Statement,
    events: Statement,
    lock: Statement,
    head: Statement,
    commit: Statement,
    commit_one: Statement,
}

impl Conn {
    async fn connect(url: &str) -> Result<Conn, StoreError> {
        let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::warn!(%error, "postgres connection ended");
            }
        });
        Conn::prepare(client).await
    }

    /// The writer connection: it turns other processes' notifications into
    /// wake-ups on `external` (its own are this process's commits, already
    /// handed to the watch tailer), once it LISTENs (`listen`, or later).
    /// Its backend pid is stored in `own_pid`.
    async fn connect_writer(
        url: &str,
        external: Arc<Notify>,
        own_pid: Arc<AtomicI32>,
        listen: bool,
    ) -> Result<Conn, StoreError> {
        let (client, mut connection) = tokio_postgres::connect(url, NoTls).await?;
        let seen_pid = own_pid.clone();
        tokio::spawn(async move {
            let messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            futures_util::pin_mut!(messages);
            while let Some(message) = futures_util::StreamExt::next(&mut messages).await {
                match message {
                    Ok(tokio_postgres::AsyncMessage::Notification(n))
                        if n.process_id() != seen_pid.load(Ordering::Relaxed) =>
                    {
                        external.notify_one()
                    }
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(%error, "postgres writer connection ended; watches poll until it is back");
                        return;
                    }
                }
            }
        });
        let conn = Conn::prepare(client).await?;
        // Before LISTEN, so that no notification comes before the pid is known.
        own_pid.store(conn.backend_pid().await?, Ordering::Relaxed);
        if listen {
            conn.listen().await?;
        }
        Ok(conn)
    }

    async fn listen(&self) -> Result<(), StoreError> {
        Ok(self.client.batch_execute(&format!("LISTEN {CHANNEL}")).await?)
    }

    async fn backend_pid(&self) -> Result<i32, StoreError> {
        Ok(self.client.query_one("SELECT pg_backend_pid()", &[]).await?.get(0))
    }

    async fn prepare(client: Client) -> Result<Conn, StoreError> {
        // Each read is one statement, so it sees one snapshot: the head
        // revision and the rows agree.
        let get = client
            .prepare(&format!(
                "SELECT {HEAD}, k.key, k.value, k.create_revision, k.mod_revision
                 FROM herd_meta m LEFT JOIN herd_kv k ON k.key = $1 WHERE m.id = 1"
            ))
            .await?;
        let range = client
            .prepare(&format!(
                "SELECT {HEAD}, k.key, k.value, k.create_revision, k.mod_revision
                 FROM herd_meta m LEFT JOIN LATERAL (
                    SELECT * FROM herd_kv WHERE key >= $1 AND key < $2 AND key > $3 ORDER BY key LIMIT $4
                 ) k ON true WHERE m.id = 1 ORDER BY k.key"
            ))
            .await?;
        let events = client
            .prepare(
                "SELECT m.compacted, e.revision, e.key, e.deleted, e.value, e.create_revision
                 FROM herd_meta m LEFT JOIN LATERAL (
                    SELECT * FROM herd_events WHERE revision > $1 ORDER BY revision LIMIT $2
                 ) e ON true WHERE m.id = 1 ORDER BY e.revision",
            )
            .await?;
        let lock = client.prepare("SELECT pg_advisory_xact_lock(hashtext(current_schema()))").await?;
        let head = client.prepare(&format!("SELECT {HEAD}, m.compacted FROM herd_meta m WHERE m.id = 1")).await?;
        let commit = client.prepare("SELECT * FROM herd_commit($1, $2, $3, $4, $5, $6, $7, $8, $9)").await?;
        let commit_one = client.prepare("SELECT * FROM herd_commit_one($1, $2, $3, $4, $5, $6)").await?;
        let stmts = Statements { get, range, events, lock, head, commit, commit_one };
        Ok(Conn { client, stmts })
    }
}

/// The read connections: at most [`MAX_READERS`] lent at once, kept idle
/// between reads.
struct Readers {
    url: String,
    idle: std::sync::Mutex<Vec<Conn>>,
    lendable: Semaphore,
}

/// A read connection lent out of [`Readers`], given back when dropped
/// (unless PostgreSQL closed it).
struct Lent<'a> {
    conn: Option<Conn>,
    readers: &'a Readers,
    _permit: SemaphorePermit<'a>,
}

impl std::ops::Deref for Lent<'_> {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        self.conn.as_ref().expect("a lent connection is there until it is given back")
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take().filter(|c| !c.client.is_closed()) {
            self.readers.idle.lock().unwrap_or_else(PoisonError::into_inner).push(conn);
        }
    }
}

impl Readers {
    fn new(url: &str) -> Readers {
        Readers { url: url.to_string(), idle: Default::default(), lendable: Semaphore::new(MAX_READERS) }
    }

    async fn lend(&self) -> Result<Lent<'_>, StoreError> {
        let permit = self.lendable.acquire().await.map_err(|_| StoreError::Closed)?;
        let idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let conn = match idle {
            Some(conn) if !conn.client.is_closed() => conn,
            _ => Conn::connect(&self.url).await?,
        };
        Ok(Lent { conn: Some(conn), readers: self, _permit: permit })
    }
}

pub struct PostgresBackend {
    url: String,
    writer: Mutex<Conn>,
    readers: Readers,
    external: Arc<Notify>,
    /// The backend pid of the writer connection: notifications it sent are
    /// this process's own commits, already handed to the watch tailer.
    writer_pid: Arc<AtomicI32>,
    /// Whether the writer connection listens (another process writes).
    hearing: AtomicBool,
}

fn to_revision(value: i64) -> Revision {
    Revision::try_from(value).unwrap_or_default()
}

fn to_sql(revision: Revision) -> i64 {
    i64::try_from(revision).unwrap_or(i64::MAX)
}

fn to_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

impl PostgresBackend {
    /// Connects, creates the tables if needed and starts listening for
    /// other processes' commits.
    pub async fn connect(url: &str) -> Result<PostgresBackend, StoreError> {
        let (setup, connection) = tokio_postgres::connect(url, NoTls).await?;
        let setup_task = tokio::spawn(connection);
        // Two processes creating the schema at once would race on the
        // catalog; an advisory lock makes it one at a time.
        setup.batch_execute("SELECT pg_advisory_lock(8421001)").await?;
        let created = setup.batch_execute(SCHEMA).await;
        setup.batch_execute("SELECT pg_advisory_unlock(8421001)").await?;
        created?;
        drop(setup);
        let _ = setup_task.await;

        let external = Arc::new(Notify::new());
        let writer_pid = Arc::new(AtomicI32::new(0));
        let writer = Conn::connect_writer(url, external.clone(), writer_pid.clone(), false).await?;
        Ok(PostgresBackend {
            url: url.to_string(),
            writer: Mutex::new(writer),
            writer_pid,
            readers: Readers::new(url),
            external,
            hearing: AtomicBool::new(false),
        })
    }
}

/// A batch of one transaction with at most one compare and one operation
/// as one call of `herd_commit_one`; `None` for any other batch.
async fn commit_one(conn: &Conn, batch: &[Txn]) -> Option<Result<Committed, StoreError>> {
    let [txn] = batch else { return None };
    let (compare, op) = match (txn.compares.as_slice(), txn.ops.as_slice()) {
        ([], []) => (None, None),
        ([compare], []) => (Some(compare), None),
        ([], [op]) => (None, Some(op)),
        ([compare], [op]) => (Some(compare), Some(op)),
        _ => return None,
    };
    Some(commit_one_txn(conn, compare, op).await)
}

async fn commit_one_txn(conn: &Conn, compare: Option<&Compare>, op: Option<&Op>) -> Result<Committed, StoreError> {
    let c_key = compare.map(Compare::key);
    let c_rev = compare.map(|c| match c {
        Compare::Exists { .. } => -1,
        Compare::ModRevision { revision, .. } => to_sql(*revision),
    });
    let (o_key, o_del, o_val) = match op {
        None => (None, false, None),
        Some(Op::Put { key, value }) => (Some(key.as_str()), false, Some(value.as_slice())),
        Some(Op::Delete { key }) => (Some(key.as_str()), true, None),
    };
    let row =
        conn.client.query_one(&conn.stmts.commit_one, &[&c_key, &c_rev, &o_key, &o_del, &o_val, &CHANNEL]).await?;
    let revision = to_revision(row.get(2));
    if row.get::<_, bool>(0) {
        let outcome = TxnOutcome::CompareFailed {
            index: 0,
            key: c_key.unwrap_or_default().to_string(),
            actual: row.get::<_, Option<i64>>(1).map(to_revision),
        };
        return Ok(Committed { outcomes: vec![outcome], events: Vec::new() });
    }
    let mut events = Vec::new();
    if let (Some(op), true) = (op, row.get::<_, bool>(3)) {
        let (kind, value) = match op {
            Op::Put { value, .. } => (EventKind::Put, value.clone()),
            Op::Delete { .. } => (EventKind::Delete, row.get::<_, Option<Vec<u8>>>(4).unwrap_or_default()),
        };
        let create_revision = to_revision(row.get::<_, Option<i64>>(5).unwrap_or_default());
        events.push(Event { revision, kind, key: op.key().to_string(), value: value.into(), create_revision });
    }
    Ok(Committed { outcomes: vec![TxnOutcome::Committed { revision }], events })
}

/// One batch as one call of `herd_commit`.
async fn commit_batch(conn: &Conn, batch: &[Txn]) -> Result<Committed, StoreError> {
    let (mut c_txn, mut c_key, mut c_rev) = (Vec::<i32>::new(), Vec::<&str>::new(), Vec::<i64>::new());
    let (mut o_txn, mut o_key, mut o_del, mut o_val) =
        (Vec::<i32>::new(), Vec::<&str>::new(), Vec::<bool>::new(), Vec::<&[u8]>::new());
    for (t, txn) in batch.iter().enumerate() {
        let t = i32::try_from(t).unwrap_or(i32::MAX);
        for compare in &txn.compares {
            c_txn.push(t);
            c_key.push(compare.key());
            c_rev.push(match compare {
                Compare::Exists { .. } => -1,
                Compare::ModRevision { revision, .. } => to_sql(*revision),
            });
        }
        for op in &txn.ops {
            o_txn.push(t);
            match op {
                Op::Put { key, value } => {
                    o_key.push(key);
                    o_del.push(false);
                    o_val.push(value);
                }
                Op::Delete { key } => {
                    o_key.push(key);
                    o_del.push(true);
                    o_val.push(&[]);
                }
            }
        }
    }
    let count = i32::try_from(batch.len()).unwrap_or(i32::MAX);
    let rows = conn
        .client
        .query(&conn.stmts.commit, &[&count, &c_txn, &c_key, &c_rev, &o_txn, &o_key, &o_del, &o_val, &CHANNEL])
        .await?;
    let mut committed = Committed { outcomes: Vec::with_capacity(batch.len()), events: Vec::new() };
    for row in rows {
        let revision = to_revision(row.get(5));
        if row.get::<_, bool>(0) {
            let deleted: bool = row.get(6);
            committed.events.push(Event {
                revision,
                kind: if deleted { EventKind::Delete } else { EventKind::Put },
                key: row.get(3),
                value: row.get::<_, Vec<u8>>(7).into(),
                create_revision: to_revision(row.get(8)),
            });
        } else {
            committed.outcomes.push(match row.get::<_, Option<i32>>(2) {
                None => TxnOutcome::Committed { revision },
                Some(index) => TxnOutcome::CompareFailed {
                    index: usize::try_from(index).unwrap_or_default(),
                    key: row.get(3),
                    actual: row.get::<_, Option<i64>>(4).map(to_revision),
                },
            });
        }
    }
    if committed.outcomes.len() != batch.len() {
        return Err(StoreError::Backend(format!(
            "postgres: herd_commit answered {} of {} transactions",
            committed.outcomes.len(),
            batch.len()
        )));
    }
    Ok(committed)
}

#[async_trait]
impl Backend for PostgresBackend {
    fn name(&self) -> &'static str {
        "postgres"
    }

    async fn get(&self, key: &str) -> Result<(Option<KeyValue>, Revision), StoreError> {
        let conn = self.readers.lend().await?;
        let row = conn.client.query_one(&conn.stmts.get, &[&key]).await?;
        let kv = row.get::<_, Option<String>>(1).map(|key| KeyValue {
            key,
            value: row.get(2),
            create_revision: to_revision(row.get(3)),
            mod_revision: to_revision(row.get(4)),
        });
        Ok((kv, to_revision(row.get(0))))
    }

    async fn range(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<KeyValue>, Revision), StoreError> {
        let low = start_after.filter(|a| *a >= prefix).unwrap_or("");
        let end = prefix_end(prefix);
        let conn = self.readers.lend().await?;
        let rows = conn.client.query(&conn.stmts.range, &[&prefix, &end, &low, &to_limit(limit)]).await?;
        drop(conn);
        let head = rows.first().map(|r| to_revision(r.get(0))).unwrap_or_default();
        let kvs = rows
            .iter()
            .filter_map(|row| {
                row.get::<_, Option<String>>(1).map(|key| KeyValue {
                    key,
                    value: row.get(2),
                    create_revision: to_revision(row.get(3)),
                    mod_revision: to_revision(row.get(4)),
                })
            })
            .collect();
        Ok((kvs, head))
    }

    async fn commit(&self, batch: Vec<Txn>) -> Result<Committed, StoreError> {
        let mut conn = self.writer.lock().await;
        if conn.client.is_closed() {
            let listen = self.hearing.load(Ordering::Relaxed);
            *conn = Conn::connect_writer(&self.url, self.external.clone(), self.writer_pid.clone(), listen).await?;
            // Commits of other processes while it was down were not heard.
            self.external.notify_one();
        }
        match commit_one(&conn, &batch).await {
            Some(committed) => committed,
            None => commit_batch(&conn, &batch).await,
        }
    }

    async fn events_after(&self, after: Revision, limit: usize) -> Result<Vec<Event>, StoreError> {
        let conn = self.readers.lend().await?;
        let rows = conn.client.query(&conn.stmts.events, &[&to_sql(after), &to_limit(limit)]).await?;
        drop(conn);
        let compacted = rows.first().map(|r| to_revision(r.get(0))).unwrap_or_default();
        if after < compacted {
            return Err(StoreError::Compacted { requested: after, compacted });
        }
        Ok(rows
            .iter()
            .filter_map(|row| {
                row.get::<_, Option<i64>>(1).map(|revision| Event {
                    revision: to_revision(revision),
                    key: row.get(2),
                    kind: if row.get(3) { EventKind::Delete } else { EventKind::Put },
                    value: row.get::<_, Vec<u8>>(4).into(),
                    create_revision: to_revision(row.get(5)),
                })
            })
            .collect())
    }

    async fn compact(&self, upto: Revision) -> Result<(), StoreError> {
        let mut conn = self.writer.lock().await;
        let conn = &mut *conn;
        let tx = conn.client.transaction().await?;
        tx.query_one(&conn.stmts.lock, &[]).await?;
        let head = tx.query_one(&conn.stmts.head, &[]).await?;
        let (head, compacted) = (to_revision(head.get(0)), to_revision(head.get(1)));
        let upto = upto.min(head);
        if upto > compacted {
            tx.execute("DELETE FROM herd_events WHERE revision <= $1", &[&to_sql(upto)]).await?;
            tx.execute("UPDATE herd_meta SET compacted = $1 WHERE id = 1", &[&to_sql(upto)]).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    fn commits_in_caller(&self) -> bool {
        true
    }

    fn external_commits(&self) -> Option<Arc<Notify>> {
        Some(self.external.clone())
    }

    async fn hear_other_writers(&self) -> Result<(), StoreError> {
        let conn = self.writer.lock().await;
        if !self.hearing.load(Ordering::Relaxed) {
            conn.listen().await?;
            self.hearing.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The database server's clock (`clock_timestamp()`, in microseconds
    /// since the epoch).
    async fn clock(&self) -> Result<Option<std::time::SystemTime>, StoreError> {
        let conn = self.readers.lend().await?;
        let row = conn.client.query_one("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8", &[]).await?;
        let micros = u64::try_from(row.get::<_, i64>(0))
            .map_err(|_| StoreError::Backend("the database's clock is before 1970".into()))?;
        Ok(Some(std::time::UNIX_EPOCH + std::time::Duration::from_micros(micros)))
    }

    /// The writer connection's backend pid: PostgreSQL ends that session
    /// as soon as the process dies and its socket closes.
    fn liveness_token(&self) -> Option<String> {
        Some(format!("{PID_PREFIX}{}", self.writer_pid.load(Ordering::Relaxed)))
    }

    async fn is_alive(&self, token: &str) -> Result<bool, StoreError> {
        let Some(pid) = token.strip_prefix(PID_PREFIX).and_then(|p| p.parse::<i32>().ok()) else { return Ok(true) };
        let conn = self.readers.lend().await?;
        let row = conn.client.query_one("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", &[&pid]).await?;
        Ok(row.get::<_, i64>(0) > 0)
    }
}
