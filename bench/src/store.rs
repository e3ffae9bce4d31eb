//! Store write throughput and latency, beside a baseline of plain SQL
//! inserts on the same database with the same durability settings.
//!
//! `cargo run --release -p herd-bench --bin store`
//! PostgreSQL runs too when HERD_BENCH_POSTGRES_URL (or
//! HERD_TEST_POSTGRES_URL) is set; each run uses a fresh schema.
//! Options (environment): BENCH_SEQUENTIAL (writes, default 2000),
//! BENCH_WRITERS (default 32), BENCH_PER_WRITER (default 200).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use herd_store::Store;
use tokio_postgres::NoTls;

/// A value about the size of a small object.
fn value(i: usize) -> Vec<u8> {
    format!(r#"{{"apiVersion":"herd/v1","kind":"Lease","metadata":{{"name":"bench-{i}","labels":{{"app":"bench"}}}},"spec":{{"holderIdentity":"replica-{i}","leaseDurationSeconds":15}}}}"#).into_bytes()
}

#[derive(Clone, Copy)]
struct Figures {
    ops_per_sec: f64,
    p50: Duration,
    p99: Duration,
}

fn figures(mut latencies: Vec<Duration>, elapsed: Duration) -> Figures {
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    Figures { ops_per_sec: latencies.len() as f64 / elapsed.as_secs_f64(), p50: at(0.50), p99: at(0.99) }
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Runs `op(i)` for i in 0..count, one at a time.
async fn sequential<F, Fut>(count: usize, op: F) -> anyhow::Result<Figures>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let mut latencies = Vec::with_capacity(count);
    let started = Instant::now();
    for i in 0..count {
        let t = Instant::now();
        op(i).await?;
        latencies.push(t.elapsed());
    }
    Ok(figures(latencies, started.elapsed()))
}

/// Runs `writers` tasks of `per_writer` ops each, all at once.
async fn concurrent<F, Fut>(writers: usize, per_writer: usize, op: F) -> anyhow::Result<Figures>
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let op = Arc::new(op);
    let started = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_writer);
                for i in 0..per_writer {
                    let t = Instant::now();
                    op(w, i).await?;
                    latencies.push(t.elapsed());
                }
                anyhow::Ok(latencies)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await??);
    }
    Ok(figures(latencies, started.elapsed()))
}

fn row(name: &str, store: Figures, baseline: Figures) {
    let ms = |d: Duration| format!("{:.3}", d.as_secs_f64() * 1000.0);
    println!(
        "{name:<28} {:>10.0} {:>9} {:>9}   {:>10.0} {:>9} {:>9}   {:>6.2}x {:>6.2}x",
        store.ops_per_sec,
        ms(store.p50),
        ms(store.p99),
        baseline.ops_per_sec,
        ms(baseline.p50),
        ms(baseline.p99),
        store.p50.as_secs_f64() / baseline.p50.as_secs_f64(),
        baseline.ops_per_sec / store.ops_per_sec,
    );
}

fn header(backend: &str) {
    println!("\n{backend}");
    println!(
        "{:<28} {:>10} {:>9} {:>9}   {:>10} {:>9} {:>9}   {:>7} {:>7}",
        "scenario", "store/s", "p50 ms", "p99 ms", "base/s", "p50 ms", "p99 ms", "p50", "time"
    );
}

/// The store's side of both scenarios: sequential, then concurrent writes.
async fn store_scenarios(store: &Store, plan: &Plan) -> anyhow::Result<(Figures, Figures)> {
    let s = store.clone();
    let seq = sequential(plan.sequential, move |i| {
        let s = s.clone();
        async move { s.create(&format!("/bench/seq/{i:08}"), value(i)).await.map(|_| ()).map_err(Into::into) }
    })
    .await?;
    let s = store.clone();
    let con = concurrent(plan.writers, plan.per_writer, move |w, i| {
        let s = s.clone();
        async move { s.create(&format!("/bench/con/{w:03}/{i:08}"), value(i)).await.map(|_| ()).map_err(Into::into) }
    })
    .await?;
    Ok((seq, con))
}

struct Plan {
    sequential: usize,
    writers: usize,
    per_writer: usize,
}

async fn bench_sqlite(plan: &Plan) -> anyhow::Result<()> {
    let dir = tempfile::tempdir_in(std::env::current_dir()?)?;
    let store = Store::open(dir.path().join("store.db").to_str().context("path")?).await?;
    let base_path = dir.path().join("baseline.db");
    {
        let conn = herd_store::sqlite::open_connection(&base_path)?;
        conn.execute_batch("CREATE TABLE t (key TEXT PRIMARY KEY, value BLOB NOT NULL)")?;
    }
    header("SQLite (WAL, synchronous=FULL)");

    let (seq_store, con_store) = store_scenarios(&store, plan).await?;
    let base = Arc::new(std::sync::Mutex::new(herd_store::sqlite::open_connection(&base_path)?));
    let b = base.clone();
    let seq_base = sequential(plan.sequential, move |i| {
        let b = b.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let conn = b.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                conn.execute("INSERT INTO t (key, value) VALUES (?1, ?2)", rusqlite::params![format!("/bench/seq/{i:08}"), value(i)])?;
                anyhow::Ok(())
            })
            .await?
        }
    })
    .await?;
    row("sequential single writes", seq_store, seq_base);

    // Baseline: every writer has its own connection and commits its own
    // insert, as an application without group commit would.
    let path = Arc::new(base_path.clone());
    let con_base = concurrent(plan.writers, plan.per_writer, move |w, i| {
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
                    conn.execute("INSERT INTO t (key, value) VALUES (?1, ?2)", rusqlite::params![format!("/bench/con/{w:03}/{i:08}"), value(i)])?;
                    anyhow::Ok(())
                })
            })
            .await?
        }
    })
    .await?;
    row(&format!("concurrent ({} writers)", plan.writers), con_store, con_base);
    println!("  store concurrent vs store sequential throughput: {:.1}x", con_store.ops_per_sec / seq_store.ops_per_sec);
    Ok(())
}

async fn pg_client(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

async fn bench_postgres(plan: &Plan, base_url: &str) -> anyhow::Result<()> {
    let schema = format!("herd_bench_{}", uuid::Uuid::now_v7().simple());
    let admin = pg_client(base_url).await?;
    admin.batch_execute(&format!("CREATE SCHEMA {schema}; CREATE TABLE {schema}.t (key TEXT COLLATE \"C\" PRIMARY KEY, value BYTEA NOT NULL)")).await?;
    let separator = if base_url.contains('?') { '&' } else { '?' };
    let url = format!("{base_url}{separator}options=-csearch_path%3D{schema}");
    let result = async {
        let store = Store::open(&url).await?;
        header("PostgreSQL (synchronous_commit as configured)");

        let (seq_store, con_store) = store_scenarios(&store, plan).await?;
        let base = Arc::new(pg_client(&url).await?);
        let insert = Arc::new(base.prepare("INSERT INTO t (key, value) VALUES ($1, $2)").await?);
        let (b, ins) = (base.clone(), insert.clone());
        let seq_base = sequential(plan.sequential, move |i| {
            let (b, ins) = (b.clone(), ins.clone());
            async move {
                b.execute(&*ins, &[&format!("/bench/seq/{i:08}"), &value(i)]).await?;
                anyhow::Ok(())
            }
        })
        .await?;
        row("sequential single writes", seq_store, seq_base);

        // Baseline: one connection per writer, each insert its own commit.
        let mut clients = Vec::new();
        for _ in 0..plan.writers {
            let client = pg_client(&url).await?;
            let statement = client.prepare("INSERT INTO t (key, value) VALUES ($1, $2)").await?;
            clients.push(Arc::new((client, statement)));
        }
        let clients = Arc::new(clients);
        let con_base = concurrent(plan.writers, plan.per_writer, move |w, i| {
            let entry = clients[w].clone();
            async move {
                entry.0.execute(&entry.1, &[&format!("/bench/con/{w:03}/{i:08}"), &value(i)]).await?;
                anyhow::Ok(())
            }
        })
        .await?;
        row(&format!("concurrent ({} writers)", plan.writers), con_store, con_base);
        println!("  store concurrent vs store sequential throughput: {:.1}x", con_store.ops_per_sec / seq_store.ops_per_sec);
        anyhow::Ok(())
    }
    .await;
    admin.batch_execute(&format!("SET client_min_messages = warning; DROP SCHEMA {schema} CASCADE")).await?;
    result
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let plan = Plan {
        sequential: env_usize("BENCH_SEQUENTIAL", 2000),
        writers: env_usize("BENCH_WRITERS", 32),
        per_writer: env_usize("BENCH_PER_WRITER", 200),
    };
    println!("store benchmark: {} sequential writes; {} writers x {} writes", plan.sequential, plan.writers, plan.per_writer);
    println!("ratios: p50 = store p50 / baseline p50; time = baseline throughput / store throughput (below 1: store faster)");
    bench_sqlite(&plan).await?;
    match std::env::var("HERD_BENCH_POSTGRES_URL").or_else(|_| std::env::var("HERD_TEST_POSTGRES_URL")) {
        Ok(url) => bench_postgres(&plan, &url).await?,
        Err(_) => println!("\nPostgreSQL: skipped (set HERD_BENCH_POSTGRES_URL)"),
    }
    Ok(())
}
