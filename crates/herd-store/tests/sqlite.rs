//! The store conformance suite on SQLite; the peer handle opens the same
//! file again, as a second server process on the host would.

mod conformance;

use std::path::PathBuf;

use conformance::Harness;
use herd_store::Store;

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
        Store::open(self.path.to_str().unwrap()).await.unwrap()
    }
    /// Several processes may share one SQLite file (replicas on one host).
    async fn peer(&self) -> Option<Store> {
        Some(self.open().await)
    }
}

conformance_suite!(Sqlite::new());
