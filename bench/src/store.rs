//! Store write throughput and latency, beside two baselines on the same
//! database server with the same durability settings: plain SQL inserts (one row,
//! its own commit), and the same work one revisioned write must do,
//! written by hand (in one transaction: the next revision under the
//! writers' lock, the key row, the event row, and on PostgreSQL the
//! notification), each write its own commit.
//!
//! `cargo run --release -p herd-bench --bin store`
//! PostgreSQL runs too when HERD_BENCH_POSTGRES_URL (or
//! HERD_TEST_POSTGRES_URL) is set; the store uses a fresh schema, the
//! baselines a fresh database (so creating databases must be allowed).
//! Store and baseline take turns every 20 writes per writer, so that drift
//! of the machine (other load, the disk) falls on both alike.
//! Options (environment): BENCH_ROUNDS (default 5), BENCH_SEQUENTIAL
//! (writes per round, default 400), BENCH_WRITERS (default 32),
//! BENCH_PER_WRITER (writes per writer per round, default 40).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use herd_store::Store;
use tokio_postgres::NoTls;

/// A value about the size of a small object.
fn value(i: usize) -> Vec<u8> {
    format!(r#"{{"apiVersion":"herd/v1","kind":"Lease","metadata":{{"name":"bench-{i}","labels":{{"app":"bench"}}}},"spec":{{"holderIdentity":"replica-{i}","leaseDurationSeconds":15}}}}"#).into_bytes()
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Plan {
    rounds: usize,
    sequential: usize,
    writers: usize,
    per_writer: usize,
}

/// Latencies and busy time of one side, summed over rounds.
#[derive(Default)]
struct Side {
    latencies: Vec<Duration>,
    elapsed: Duration,
}

impl Side {
    fn ops_per_sec(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64()
    }
    fn quantile(&self, q: f64) -> Duration {
        let mut sorted = self.latencies.clone();
        sorted.sort();
        sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)]
    }
}

/// A write operation: (writer, index) to a future.
type WriteOp =
    Arc<dyn Fn(usize, usize) -> std::pin::Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>> + Send + Sync>;

fn op<F, Fut>(f: F) -> WriteOp
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    Arc::new(move |w, i| Box::pin(f(w, i)))
}

/// `writers` tasks each run `op(w, i)` for i in `indexes`, all at once.
async fn run_round(
    side: &mut Side,
    writers: usize,
    indexes: std::ops::Range<usize>,
    op: &WriteOp,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let (op, indexes) = (op.clone(), indexes.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(indexes.len());
                for i in indexes {
                    let t = Instant::now();
                    op(w, i).await?;
                    latencies.push(t.elapsed());
                }
                anyhow::Ok(latencies)
            })
        })
        .collect();
    for task in tasks {
        side.latencies.extend(task.await??);
    }
    side.elapsed += started.elapsed();
    Ok(())
}

/// Writes per writer before store and baseline take turns: the disk's and
/// the machine's drift (seconds long on a shared machine) then falls on
/// both alike, which whole rounds of 400 writes did not ensure.
const ALTERNATE_EVERY: usize = 20;

/// Alternates store and baseline rounds of the same shape, taking turns
/// every [`ALTERNATE_EVERY`] writes per writer.
async fn compare(
    plan: &Plan,
    writers: usize,
    per_round: usize,
    store: &WriteOp,
    baseline: &WriteOp,
) -> anyhow::Result<(Side, Side)> {
    let (mut s, mut b) = (Side::default(), Side::default());
    for round in 0..plan.rounds {
        for start in (round * per_round..(round + 1) * per_round).step_by(ALTERNATE_EVERY) {
            let indexes = start..(start + ALTERNATE_EVERY).min((round + 1) * per_round);
            run_round(&mut s, writers, indexes.clone(), store).await?;
            run_round(&mut b, writers, indexes, baseline).await?;
        }
    }
    Ok((s, b))
}

fn row(name: &str, store: &Side, baseline: &Side) {
    let ms = |d: Duration| format!("{:.3}", d.as_secs_f64() * 1000.0);
    println!(
        "{name:<28} {:>10.0} {:>9} {:>9}   {:>10.0} {:>9} {:>9}   {:>6.2}x {:>6.2}x",
        store.ops_per_sec(),
        ms(store.quantile(0.5)),
        ms(store.quantile(0.99)),
        baseline.ops_per_sec(),
        ms(baseline.quantile(0.5)),
        ms(baseline.quantile(0.99)),
        store.quantile(0.5).as_secs_f64() / baseline.quantile(0.5).as_secs_f64(),
        baseline.ops_per_sec() / store.ops_per_sec(),
    );
}

fn header(backend: &str) {
    println!("\n{backend}");
    println!(
        "{:<28} {:>10} {:>9} {:>9}   {:>10} {:>9} {:>9}   {:>7} {:>7}",
        "scenario", "store/s", "p50 ms", "p99 ms", "base/s", "p50 ms", "p99 ms", "p50", "time"
    );
}

fn store_op(store: &Store, scenario: String) -> WriteOp {
    let store = store.clone();
    op(move |w, i| {
        let (store, key) = (store.clone(), format!("/bench/{scenario}/{w:03}/{i:08}"));
        async move { store.create(&key, value(i)).await.map(|_| ()).map_err(Into::into) }
    })
}

/// A baseline: its name, and its operation for a scenario's keys.
type Baseline = (&'static str, Box<dyn Fn(String) -> WriteOp>);

/// Runs both scenarios for one backend against each baseline (the store
/// writes keys of its own for each, so that every write is a create).
async fn scenarios(plan: &Plan, store: &Store, baselines: Vec<Baseline>) -> anyhow::Result<()> {
    scenarios_from(plan, store, baselines, 0).await
}

/// As [`scenarios`], the baselines numbered from `first` (each number names
/// its scenarios' keys).
async fn scenarios_from(plan: &Plan, store: &Store, baselines: Vec<Baseline>, first: usize) -> anyhow::Result<()> {
    for (n, (name, baseline)) in (first..).zip(baselines) {
        println!("  against {name}:");
        let (seq, con) = (format!("seq{n}"), format!("con{n}"));
        let (seq_store, seq_base) =
            compare(plan, 1, plan.sequential, &store_op(store, seq.clone()), &baseline(seq)).await?;
        row("sequential single writes", &seq_store, &seq_base);
        let (con_store, con_base) =
            compare(plan, plan.writers, plan.per_writer, &store_op(store, con.clone()), &baseline(con)).await?;
        row(&format!("concurrent ({} writers)", plan.writers), &con_store, &con_base);
        println!(
            "  store concurrent vs store sequential throughput: {:.1}x",
            con_store.ops_per_sec() / seq_store.ops_per_sec()
        );
    }
    Ok(())
}

/// Runs `work` on a SQLite connection to `path` kept by this blocking
/// thread (each writer commits on its own connection, as an application
/// without group commit would).
async fn on_sqlite<T: Send + 'static>(
    path: Arc<std::path::PathBuf>,
    work: impl FnOnce(&mut rusqlite::Connection) -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(move || {
        thread_local!(static CONN: std::cell::RefCell<Option<rusqlite::Connection>> = const { std::cell::RefCell::new(None) });
        CONN.with(|cell| {
            let mut cell = cell.borrow_mut();
            if cell.as_ref().is_none_or(|c| c.path() != path.to_str()) {
                *cell = Some(herd_store::sqlite::open_connection(&path)?);
            }
            work(cell.as_mut().context("connection")?)
        })
    })
    .await?
}

async fn bench_sqlite(plan: &Plan) -> anyhow::Result<()> {
    let dir = tempfile::tempdir_in(std::env::current_dir()?)?;
    let store = Store::open(dir.path().join("store.db").to_str().context("path")?).await?;
    let base_path = Arc::new(dir.path().join("baseline.db"));
    herd_store::sqlite::open_connection(&base_path)?.execute_batch(
        "CREATE TABLE t (key TEXT PRIMARY KEY, value BLOB NOT NULL);
         CREATE TABLE kv (id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, create_revision INTEGER NOT NULL, mod_revision INTEGER NOT NULL, value BLOB NOT NULL);
         CREATE TABLE events (revision INTEGER PRIMARY KEY, key TEXT NOT NULL, deleted INTEGER NOT NULL, value BLOB NOT NULL, create_revision INTEGER NOT NULL);",
    )?;
    header("SQLite (WAL, synchronous=FULL)");
    let path = base_path.clone();
    let plain: Baseline = (
        "plain inserts",
        Box::new(move |scenario| {
            let path = path.clone();
            op(move |w, i| {
                let key = format!("/bench/{scenario}/{w:03}/{i:08}");
                on_sqlite(path.clone(), move |conn| {
                    conn.execute("INSERT INTO t (key, value) VALUES (?1, ?2)", rusqlite::params![key, value(i)])?;
                    Ok(())
                })
            })
        }),
    );
    let path = base_path.clone();
    let same_work: Baseline = (
        "the same work by hand (revision, key row, event row, one transaction)",
        Box::new(move |scenario| {
            let path = path.clone();
            op(move |w, i| {
                let key = format!("/bench/{scenario}/{w:03}/{i:08}");
                on_sqlite(path.clone(), move |conn| {
                    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                    let revision: i64 =
                        tx.query_row("SELECT COALESCE(MAX(revision), 0) + 1 FROM events", [], |r| r.get(0))?;
                    tx.execute(
                        "INSERT INTO kv (key, value, create_revision, mod_revision) VALUES (?1, ?2, ?3, ?3)",
                        rusqlite::params![key, value(i), revision],
                    )?;
                    tx.execute(
                    "INSERT INTO events (revision, key, deleted, value, create_revision) VALUES (?1, ?2, 0, ?3, ?1)",
                    rusqlite::params![revision, key, value(i)],
                )?;
                    tx.commit()?;
                    Ok(())
                })
            })
        }),
    );
    scenarios(plan, &store, vec![plain, same_work]).await
}

async fn pg_client(config: &tokio_postgres::Config) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// What one revisioned write does, as one statement (one round trip, one
/// implicit transaction): the writers' lock, the next revision, the key
/// row (refused if it exists: a create), the event row, the notification
/// on `channel`.
const SAME_WORK_FUNCTION: &str = "
CREATE FUNCTION same_work(k text, v bytea, channel text) RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE head bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext(current_schema()));
    SELECT COALESCE(max(revision), 0) + 1 INTO head FROM events;
    INSERT INTO kv (key, value, create_revision, mod_revision) VALUES (k, v, head, head);
    INSERT INTO events (revision, key, deleted, value, create_revision) VALUES (head, k, false, v, head);
    PERFORM pg_notify(channel, head::text);
    RETURN head;
END
$fn$;";

/// A connection that LISTENs on `channel` and takes every notification,
/// as the store's own listener takes its commits' (PostgreSQL signals a
/// listening backend at each commit that notifies it: work a notification
/// nobody hears does not cost).
async fn listener(config: &tokio_postgres::Config, channel: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, mut connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        let messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        futures_util::pin_mut!(messages);
        while let Some(Ok(_)) = futures_util::StreamExt::next(&mut messages).await {}
    });
    client.batch_execute(&format!("LISTEN {channel}")).await?;
    Ok(client)
}

/// The store runs in a fresh schema of the given database, the baselines
/// in a fresh database of their own: PostgreSQL wakes every listening
/// session of a database at each commit that notifies, whatever its
/// channel, so the store's listening writer and the baselines would
/// otherwise wake each other's backends.
async fn bench_postgres(plan: &Plan, base_url: &str) -> anyhow::Result<()> {
    let name = format!("herd_bench_{}", uuid::Uuid::now_v7().simple());
    let admin_config: tokio_postgres::Config = base_url.parse()?;
    let admin = pg_client(&admin_config).await?;
    // Each its own statement: CREATE DATABASE refuses to run in a transaction.
    admin.batch_execute(&format!("CREATE SCHEMA {name}")).await?;
    admin.batch_execute(&format!("CREATE DATABASE {name}")).await?;
    let mut base_config = admin_config.clone();
    base_config.dbname(&name);
    let separator = if base_url.contains('?') { '&' } else { '?' };
    let store_url = format!("{base_url}{separator}options=-csearch_path%3D{name}");
    let result = async {
        pg_client(&base_config)
            .await?
            .batch_execute(&format!(
                "CREATE TABLE t (key TEXT COLLATE \"C\" PRIMARY KEY, value BYTEA NOT NULL);
                 CREATE TABLE kv (key TEXT COLLATE \"C\" PRIMARY KEY, value BYTEA NOT NULL, create_revision BIGINT NOT NULL, mod_revision BIGINT NOT NULL);
                 CREATE TABLE events (revision BIGINT PRIMARY KEY, key TEXT COLLATE \"C\" NOT NULL, deleted BOOLEAN NOT NULL, value BYTEA NOT NULL, create_revision BIGINT NOT NULL);
                 {SAME_WORK_FUNCTION}"
            ))
            .await?;
        let store = Store::open(&store_url).await?;
        header("PostgreSQL (synchronous_commit as configured)");
        // One connection per writer, each write its own commit.
        let mut clients = Vec::new();
        for _ in 0..plan.writers.max(1) {
            let client = pg_client(&base_config).await?;
            let insert = client.prepare("INSERT INTO t (key, value) VALUES ($1, $2)").await?;
            let same_work = client.prepare("SELECT same_work($1, $2, $3)").await?;
            clients.push(Arc::new((client, insert, same_work)));
        }
        let clients = Arc::new(clients);
        // None: a plain insert; Some(channel): the same work, notifying it.
        let baseline = |notify: Option<&str>| {
            let (clients, notify) = (clients.clone(), notify.map(str::to_string));
            Box::new(move |scenario: String| {
                let (clients, notify) = (clients.clone(), notify.clone());
                op(move |w, i| {
                    let (entry, key) = (clients[w].clone(), format!("/bench/{scenario}/{w:03}/{i:08}"));
                    let notify = notify.clone();
                    async move {
                        match notify {
                            Some(channel) => entry.0.execute(&entry.2, &[&key, &value(i), &channel]).await?,
                            None => entry.0.execute(&entry.1, &[&key, &value(i)]).await?,
                        };
                        anyhow::Ok(())
                    }
                })
            }) as Box<dyn Fn(String) -> WriteOp>
        };
        scenarios(
            plan,
            &store,
            vec![
                ("plain inserts", baseline(None)),
                (
                    "the same work by hand (lock, revision, key row, event row, notify, one statement)",
                    baseline(Some("bench_unheard")),
                ),
            ],
        )
        .await?;
        // Last, since its listener hears every later commit of its database.
        let _listener = listener(&base_config, "bench_heard").await?;
        scenarios_from(
            plan,
            &store,
            vec![(
                "the same work by hand, its notifications heard by another session's listener",
                baseline(Some("bench_heard")),
            )],
            2,
        )
        .await
    }
    .await;
    admin.batch_execute(&format!("SET client_min_messages = warning; DROP SCHEMA {name} CASCADE")).await?;
    admin.batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)")).await?;
    result
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let plan = Plan {
        rounds: env_usize("BENCH_ROUNDS", 5),
        sequential: env_usize("BENCH_SEQUENTIAL", 400),
        writers: env_usize("BENCH_WRITERS", 32),
        per_writer: env_usize("BENCH_PER_WRITER", 40),
    };
    println!(
        "store benchmark: {} rounds of {} sequential writes, and of {} writers x {} writes; store and baseline alternate",
        plan.rounds, plan.sequential, plan.writers, plan.per_writer
    );
    println!(
        "ratios: p50 = store p50 / baseline p50; time = baseline throughput / store throughput (below 1: store faster)"
    );
    bench_sqlite(&plan).await?;
    match std::env::var("HERD_BENCH_POSTGRES_URL").or_else(|_| std::env::var("HERD_TEST_POSTGRES_URL")) {
        Ok(url) => bench_postgres(&plan, &url).await?,
        Err(_) => println!("\nPostgreSQL: skipped (set HERD_BENCH_POSTGRES_URL)"),
    }
    Ok(())
}
