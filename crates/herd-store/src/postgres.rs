//! The PostgreSQL backend, for several server replicas sharing one store.
//!
//! Revision order equals commit order: every writing transaction first locks
//! the one `herd_meta` row (`SELECT ... FOR UPDATE`) and holds it until it
//! commits, so the next writer reads the new head only after this one is
//! visible. The event log therefore never shows a hole that fills later.
//! Commits are announced with `NOTIFY`; other processes' watches wake on it
//! (and poll as a fallback, since a notification can be lost with its
//! connection).

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::{Mutex, Notify};
use tokio_postgres::{Client, NoTls, Statement, Transaction};

use crate::backend::Backend;
use crate::error::StoreError;
use crate::types::{Event, EventKind, KeyValue, Op, Revision, Txn, TxnOutcome, prefix_end};

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
    revision BIGINT NOT NULL,
    compacted BIGINT NOT NULL
);
INSERT INTO herd_meta (id, revision, compacted) VALUES (1, 0, 0) ON CONFLICT DO NOTHING;
"#;

const CHANNEL: &str = "herd_commits";
const MAX_IDLE_READERS: usize = 8;

/// A connection with its statements prepared once.
struct Conn {
    client: Client,
    stmts: Statements,
}

struct Statements {
    get: Statement,
    range: Statement,
    events: Statement,
    lock_head: Statement,
    mod_revision: Statement,
    put: Statement,
    delete: Statement,
    set_head: Statement,
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

    async fn prepare(client: Client) -> Result<Conn, StoreError> {
        // Each read is one statement, so it sees one snapshot: the head
        // revision and the rows agree.
        let get = client
            .prepare(
                "SELECT m.revision, k.key, k.value, k.create_revision, k.mod_revision
                 FROM herd_meta m LEFT JOIN herd_kv k ON k.key = $1 WHERE m.id = 1",
            )
            .await?;
        let range = client
            .prepare(
                "SELECT m.revision, k.key, k.value, k.create_revision, k.mod_revision
                 FROM herd_meta m LEFT JOIN LATERAL (
                    SELECT * FROM herd_kv WHERE key >= $1 AND key < $2 AND key > $3 ORDER BY key LIMIT $4
                 ) k ON true WHERE m.id = 1 ORDER BY k.key",
            )
            .await?;
        let events = client
            .prepare(
                "SELECT m.compacted, e.revision, e.key, e.deleted, e.value, e.create_revision
                 FROM herd_meta m LEFT JOIN LATERAL (
                    SELECT * FROM herd_events WHERE revision > $1 ORDER BY revision LIMIT $2
                 ) e ON true WHERE m.id = 1 ORDER BY e.revision",
            )
            .await?;
        let lock_head = client.prepare("SELECT revision, compacted FROM herd_meta WHERE id = 1 FOR UPDATE").await?;
        let mod_revision = client.prepare("SELECT mod_revision FROM herd_kv WHERE key = $1").await?;
        let put = client
            .prepare(
                "WITH up AS (
                    INSERT INTO herd_kv (key, value, create_revision, mod_revision) VALUES ($1, $2, $3, $3)
                    ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, mod_revision = EXCLUDED.mod_revision
                    RETURNING create_revision)
                 INSERT INTO herd_events (revision, key, deleted, value, create_revision)
                 SELECT $3, $1, false, $2, create_revision FROM up",
            )
            .await?;
        let delete = client
            .prepare(
                "WITH gone AS (DELETE FROM herd_kv WHERE key = $1 RETURNING value, create_revision)
                 INSERT INTO herd_events (revision, key, deleted, value, create_revision)
                 SELECT $2, $1, true, value, create_revision FROM gone",
            )
            .await?;
        let set_head = client
            .prepare(&format!(
                "WITH m AS (UPDATE herd_meta SET revision = $1 WHERE id = 1 RETURNING revision)
                 SELECT pg_notify('{CHANNEL}', revision::text) FROM m"
            ))
            .await?;
        let stmts = Statements { get, range, events, lock_head, mod_revision, put, delete, set_head };
        Ok(Conn { client, stmts })
    }
}

pub struct PostgresBackend {
    url: String,
    writer: Mutex<Conn>,
    readers: Mutex<Vec<Conn>>,
    external: Arc<Notify>,
    _listener: Client,
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
        let listener = listen(url, external.clone()).await?;
        Ok(PostgresBackend {
            url: url.to_string(),
            writer: Mutex::new(Conn::connect(url).await?),
            readers: Mutex::new(Vec::new()),
            external,
            _listener: listener,
        })
    }

    async fn reader(&self) -> Result<Conn, StoreError> {
        let pooled = self.readers.lock().await.pop();
        match pooled {
            Some(conn) if !conn.client.is_closed() => Ok(conn),
            _ => Conn::connect(&self.url).await,
        }
    }

    async fn give_back(&self, conn: Conn) {
        let mut idle = self.readers.lock().await;
        if idle.len() < MAX_IDLE_READERS && !conn.client.is_closed() {
            idle.push(conn);
        }
    }
}

/// A connection that LISTENs and turns notifications into wake-ups. The
/// returned client must be kept: dropping it closes the connection.
async fn listen(url: &str, external: Arc<Notify>) -> Result<Client, StoreError> {
    let (client, mut connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        let messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        futures_util::pin_mut!(messages);
        while let Some(message) = futures_util::StreamExt::next(&mut messages).await {
            match message {
                Ok(tokio_postgres::AsyncMessage::Notification(_)) => external.notify_one(),
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%error, "postgres listener connection failed; watches fall back to polling");
                    return;
                }
            }
        }
    });
    client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
    Ok(client)
}

async fn apply(stmts: &Statements, tx: &Transaction<'_>, txn: &Txn, revision: &mut Revision) -> Result<TxnOutcome, StoreError> {
    for (index, compare) in txn.compares.iter().enumerate() {
        let actual = tx.query_opt(&stmts.mod_revision, &[&compare.key()]).await?.map(|r| to_revision(r.get(0)));
        if !compare.holds(actual) {
            return Ok(TxnOutcome::CompareFailed { index, key: compare.key().to_string(), actual });
        }
    }
    for op in &txn.ops {
        let next = *revision + 1;
        let applied = match op {
            Op::Put { key, value } => tx.execute(&stmts.put, &[key, value, &to_sql(next)]).await?,
            Op::Delete { key } => tx.execute(&stmts.delete, &[key, &to_sql(next)]).await?,
        };
        if applied > 0 {
            *revision = next;
        }
    }
    Ok(TxnOutcome::Committed { revision: *revision })
}

#[async_trait]
impl Backend for PostgresBackend {
    fn name(&self) -> &'static str {
        "postgres"
    }

    async fn get(&self, key: &str) -> Result<(Option<KeyValue>, Revision), StoreError> {
        let conn = self.reader().await?;
        let row = conn.client.query_one(&conn.stmts.get, &[&key]).await;
        self.give_back(conn).await;
        let row = row?;
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
        let conn = self.reader().await?;
        let rows = conn.client.query(&conn.stmts.range, &[&prefix, &end, &low, &to_limit(limit)]).await;
        self.give_back(conn).await;
        let rows = rows?;
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

    async fn commit(&self, batch: Vec<Txn>) -> Result<Vec<TxnOutcome>, StoreError> {
        let mut conn = self.writer.lock().await;
        if conn.client.is_closed() {
            *conn = Conn::connect(&self.url).await?;
        }
        let conn = &mut *conn;
        let tx = conn.client.transaction().await?;
        let head = tx.query_one(&conn.stmts.lock_head, &[]).await?;
        let mut revision = to_revision(head.get(0));
        let mut outcomes = Vec::with_capacity(batch.len());
        for txn in &batch {
            outcomes.push(apply(&conn.stmts, &tx, txn, &mut revision).await?);
        }
        tx.query(&conn.stmts.set_head, &[&to_sql(revision)]).await?;
        tx.commit().await?;
        Ok(outcomes)
    }

    async fn events_after(&self, after: Revision, limit: usize) -> Result<Vec<Event>, StoreError> {
        let conn = self.reader().await?;
        let rows = conn.client.query(&conn.stmts.events, &[&to_sql(after), &to_limit(limit)]).await;
        self.give_back(conn).await;
        let rows = rows?;
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
                    value: row.get(4),
                    create_revision: to_revision(row.get(5)),
                })
            })
            .collect())
    }

    async fn compact(&self, upto: Revision) -> Result<(), StoreError> {
        let mut conn = self.writer.lock().await;
        let conn = &mut *conn;
        let tx = conn.client.transaction().await?;
        let head = tx.query_one(&conn.stmts.lock_head, &[]).await?;
        let (head, compacted) = (to_revision(head.get(0)), to_revision(head.get(1)));
        let upto = upto.min(head);
        if upto > compacted {
            tx.execute("DELETE FROM herd_events WHERE revision <= $1", &[&to_sql(upto)]).await?;
            tx.execute("UPDATE herd_meta SET compacted = $1 WHERE id = 1", &[&to_sql(upto)]).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    fn external_commits(&self) -> Option<Arc<Notify>> {
        Some(self.external.clone())
    }
}
