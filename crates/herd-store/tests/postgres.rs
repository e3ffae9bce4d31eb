//! The store conformance suite on PostgreSQL.
//!
//! Needs `HERD_TEST_POSTGRES_URL` (`.ci/run` sets it up). Without it the
//! tests fail in CI (`CI` set) and say loudly that they were skipped
//! elsewhere. Each test gets a schema of its own.

mod conformance;

use conformance::Harness;
use herd_store::Store;

struct Postgres {
    base: String,
    schema: String,
    url: String,
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = std::process::Command::new("psql")
            .args([self.base.as_str(), "-qc", &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema)])
            .env("PGOPTIONS", "--client-min-messages=warning")
            .status();
    }
}

impl Postgres {
    fn new() -> Option<Postgres> {
        let Ok(base) = std::env::var("HERD_TEST_POSTGRES_URL") else {
            if std::env::var_os("CI").is_some() {
                panic!("HERD_TEST_POSTGRES_URL is not set: CI must run the PostgreSQL tests");
            }
            eprintln!("!!! SKIPPED: HERD_TEST_POSTGRES_URL is not set; the PostgreSQL conformance tests did not run");
            return None;
        };
        let schema = format!("herd_test_{}", uuid::Uuid::now_v7().simple());
        let setup = std::process::Command::new("psql")
            .args([base.as_str(), "-qc", &format!("CREATE SCHEMA {schema}")])
            .status()
            .expect("psql must be installed to create test schemas");
        assert!(setup.success(), "could not create schema {schema} at {base}");
        let separator = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{separator}options=-csearch_path%3D{schema}");
        Some(Postgres { base, schema, url })
    }
}

impl Harness for Postgres {
    async fn open(&self) -> Store {
        Store::open(&self.url).await.unwrap()
    }
    async fn peer(&self) -> Option<Store> {
        Some(self.open().await)
    }
}

conformance_suite!(Postgres::new());

/// A burst of reads far past the bound on read connections: every read is
/// answered, and the process never holds more than its readers and its
/// writer (PostgreSQL refuses connections past `max_connections`; three
/// replicas that opened one per concurrent read went past it).
#[tokio::test(flavor = "multi_thread")]
async fn a_burst_of_reads_is_answered_through_a_bounded_number_of_connections() {
    let Some(postgres) = Postgres::new() else { return };
    let name = format!("herd_bound_{}", uuid::Uuid::now_v7().simple());
    let store = Store::open(&format!("{}&application_name={name}", postgres.url)).await.unwrap();
    store.create("/k", "v").await.unwrap();
    let (observer, connection) = tokio_postgres::connect(&postgres.base, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    // The most connections the store held at once, looked at all along.
    let most = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(0));
    let looking = tokio::spawn({
        let most = most.clone();
        async move {
            loop {
                let row = observer
                    .query_one("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", &[&name])
                    .await
                    .unwrap();
                most.fetch_max(row.get(0), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
        }
    });
    let answers = futures_util::future::join_all((0..300).map(|_| store.get("/k"))).await;
    looking.abort();
    let most = most.load(std::sync::atomic::Ordering::Relaxed);
    assert!(answers.iter().all(|a| a.as_ref().is_ok_and(|kv| kv.is_some())), "every read answered: {answers:?}");
    let bound = herd_store::postgres::MAX_READERS as i64 + 1;
    assert!((2..=bound).contains(&most), "{most} connections at once, for at most {bound} (readers and the writer)");
}
