//! The store conformance suite on SQLite, plus SQLite-only behaviour.

mod conformance;

use std::path::PathBuf;
use std::time::Duration;

use conformance::Harness;
use herd_store::{Store, StoreError};

struct Sqlite {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Sqlite {
    fn new() -> Option<Sqlite> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        Some(Sqlite { _dir: dir, path })
    }
}

impl Harness for Sqlite {
    async fn open(&self) -> Store {
        // A store that was just dropped releases its file lock when its
        // background tasks notice; give them a moment.
        for _ in 0..100 {
            match Store::open(self.path.to_str().unwrap()).await {
                Err(StoreError::Locked(_)) => tokio::time::sleep(Duration::from_millis(20)).await,
                other => return other.unwrap(),
            }
        }
        panic!("the store stayed locked");
    }
    async fn peer(&self) -> Option<Store> {
        None
    }
}

conformance_suite!(Sqlite::new());

#[tokio::test]
async fn a_second_process_cannot_open_the_same_file() {
    let h = Sqlite::new().unwrap();
    let _first = h.open().await;
    match Store::open(h.path.to_str().unwrap()).await {
        Err(StoreError::Locked(message)) => assert!(message.contains("store.lock"), "{message}"),
        other => panic!("expected Locked, got {:?}", other.map(|_| ())),
    }
}
