//! Store write throughput and latency, beside a baseline of plain SQL
//! inserts on the same database with the same durability settings.
//!
//! `cargo run --release -p herd-bench --bin store`
//! PostgreSQL runs too when HERD_BENCH_POSTGRES_URL (or
//! HERD_TEST_POSTGRES_URL) is set; each run uses a fresh schema.
//! Store and baseline alternate in rounds, so that drift of the machine
//! (other load, the disk) falls on both alike.
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

/// Alternates store and baseline rounds of the same shape.
async fn compare(
    plan: &Plan,
    writers: usize,
    per_round: usize,
    store: &WriteOp,
    baseline: &WriteOp,
) -> anyhow::Result<(Side, Side)> {
    let (mut s, mut b) = (Side::default(), Side::default());
    for round in 0..plan.rounds {
        let indexes = round * per_round..(round + 1) * per_round;
        run_round(&mut s, writers, indexes.clone(), store).await?;
        run_round(&mut b, writers, indexes, baseline).await?;
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

fn store_op(store: &Store, scenario: &'static str) -> WriteOp {
    let store = store.clone();
    op(move |w, i| {
        let store = store.clone();
        async move {
            store.create(&format!("/bench/{scenario}/{w:03}/{i:08}"), value(i)).await.map(|_| ()).map_err(Into::into)
        }
    })
}

/// Runs both scenarios for one backend, given its baseline operations.
async fn scenarios(plan: &Plan, store: &Store, seq_base: WriteOp, con_base: WriteOp) -> anyhow::Result<()> {
    let (seq_store, seq_baseline) = compare(plan, 1, plan.sequential, &store_op(store, "seq"), &seq_base).await?;
    row("sequential single writes", &seq_store, &seq_baseline);
    let (con_store, con_baseline) =
        compare(plan, plan.writers, plan.per_writer, &store_op(store, "con"), &con_base).await?;
    row(&format!("concurrent ({} writers)", plan.writers), &con_store, &con_baseline);
    println!(
        "  store concurrent vs store sequential throughput: {:.1}x",
        con_store.ops_per_sec() / seq_store.ops_per_sec()
    );
    Ok(())
}

async fn bench_sqlite(plan: &Plan) -> anyhow::Result<()> {
    let dir = tempfile::tempdir_in(std::env::current_dir()?)?;
    let store = Store::open(dir.path().join("store.db").to_str().context("path")?).await?;
    let base_path = Arc::new(dir.path().join("baseline.db"));
    herd_store::sqlite::open_connection(&base_path)?
        .execute_batch("CREATE TABLE t (key TEXT PRIMARY KEY, value BLOB NOT NULL)")?;
    header("SQLite (WAL, synchronous=FULL)");
    // Baseline: each writer has its own connection and commits each insert
    // itself, as an application without group commit would.
    let insert = |scenario: &'static str| {
        let path = base_path.clone();
        op(move |w, i| {
            let path = path.clone();
            async move {
                tokio::task::spawn_blocking(move || {
                    thread_local!(static CONN: std::cell::RefCell<Option<rusqlite::Connection>> = const { std::cell::RefCell::new(None) });
                    CONN.with(|cell| {
                        let mut cell = cell.borrow_mut();
                        if cell.is_none() {
                            *cell = Some(herd_store::sqlite::open_connection(&path)?);
                        }
                        let conn = cell.as_ref().context("connection")?;
                        conn.execute("INSERT INTO t (key, value) VALUES (?1, ?2)", rusqlite::params![format!("/bench/{scenario}/{w:03}/{i:08}"), value(i)])?;
                        anyhow::Ok(())
                    })
                })
                .await?
            }
        })
    };
    scenarios(plan, &store, insert("seq"), insert("con")).await
}

async fn pg_client(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

async fn bench_postgres(plan: &Plan, base_url: &str) -> anyhow::Result<()> {
    let schema = format!("herd_bench_{}", uuid::Uuid::now_v7().simple());
    let admin = pg_client(base_url).await?;
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {schema}; CREATE TABLE {schema}.t (key TEXT COLLATE \"C\" PRIMARY KEY, value BYTEA NOT NULL)"
        ))
        .await?;
    let separator = if base_url.contains('?') { '&' } else { '?' };
    let url = format!("{base_url}{separator}options=-csearch_path%3D{schema}");
    let result = async {
        let store = Store::open(&url).await?;
        header("PostgreSQL (synchronous_commit as configured)");
        // Baseline: one connection per writer, each insert its own commit.
        let mut clients = Vec::new();
        for _ in 0..plan.writers.max(1) {
            let client = pg_client(&url).await?;
            let statement = client.prepare("INSERT INTO t (key, value) VALUES ($1, $2)").await?;
            clients.push(Arc::new((client, statement)));
        }
        let clients = Arc::new(clients);
        let insert = |scenario: &'static str| {
            let clients = clients.clone();
            op(move |w, i| {
                let entry = clients[w].clone();
                async move {
                    entry.0.execute(&entry.1, &[&format!("/bench/{scenario}/{w:03}/{i:08}"), &value(i)]).await?;
                    anyhow::Ok(())
                }
            })
        };
        scenarios(plan, &store, insert("seq"), insert("con")).await
    }
    .await;
    admin.batch_execute(&format!("SET client_min_messages = warning; DROP SCHEMA {schema} CASCADE")).await?;
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
