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
