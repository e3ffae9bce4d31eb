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

/// A store written before the keys had a rowid table opens with every key,
/// value and revision as it was, and goes on from its head.
#[tokio::test]
async fn a_store_with_keys_in_a_table_without_rowid_is_moved_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    let old = rusqlite::Connection::open(&path).unwrap();
    old.execute_batch(
        "CREATE TABLE kv (key TEXT PRIMARY KEY, value BLOB NOT NULL, create_revision INTEGER NOT NULL,
                          mod_revision INTEGER NOT NULL) WITHOUT ROWID;
         CREATE TABLE events (revision INTEGER PRIMARY KEY, key TEXT NOT NULL, deleted INTEGER NOT NULL,
                              value BLOB NOT NULL, create_revision INTEGER NOT NULL);
         CREATE TABLE meta (id INTEGER PRIMARY KEY CHECK (id = 1), compacted INTEGER NOT NULL);
         INSERT INTO meta (id, compacted) VALUES (1, 0);
         INSERT INTO kv VALUES ('/a', x'61', 1, 3), ('/b', x'62', 2, 2);
         INSERT INTO events VALUES (1, '/a', 0, x'60', 1), (2, '/b', 0, x'62', 2), (3, '/a', 0, x'61', 1);",
    )
    .unwrap();
    drop(old);
    let store = Store::open(path.to_str().unwrap()).await.unwrap();
    let a = store.get("/a").await.unwrap().unwrap();
    assert_eq!((&a.value[..], a.create_revision, a.mod_revision), (&b"a"[..], 1, 3));
    let page = store.list("/", &Default::default(), |_| true).await.unwrap();
    assert_eq!(page.items.iter().map(|kv| kv.key.as_str()).collect::<Vec<_>>(), ["/a", "/b"]);
    assert_eq!(page.revision, 3);
    let revision = store.create("/c", b"c".to_vec()).await.unwrap();
    assert_eq!(revision, 4, "writes go on from the head");
    drop(store);
    let sql: String = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("SELECT sql FROM sqlite_master WHERE name = 'kv'", [], |r| r.get(0))
        .unwrap();
    assert!(!sql.contains("WITHOUT ROWID"), "{sql}");
}
