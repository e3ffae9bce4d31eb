//! [`Store`]: reads with paging and filtering, writes through group commit
//! (`commit`), watches.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use tokio_util::sync::{CancellationToken, DropGuard};

use crate::backend::Backend;
use crate::commit::Committer;
use crate::error::StoreError;
use crate::types::{Compare, KeyValue, Revision, Txn, TxnOutcome, check_key};
use crate::watch::{Hub, Watcher};

/// Keys read per backend range call while filtering.
const RANGE_CHUNK: usize = 500;

/// Told how long each backend commit took (the server's metrics keep a
/// histogram of it; the store depends on no metrics library).
pub type CommitObserver = Box<dyn Fn(std::time::Duration) + Send + Sync>;

/// Counters for `/metrics` and benchmarks.
#[derive(Default)]
pub struct StoreStats {
    /// Backend transactions (each one fsync).
    pub commits: AtomicU64,
    /// Store transactions carried by those commits.
    pub txns: AtomicU64,
    pub commit_failures: AtomicU64,
    commit_observer: std::sync::OnceLock<CommitObserver>,
}

impl StoreStats {
    /// Sets who is told each commit's duration (once; later calls are ignored).
    pub fn observe_commits(&self, observer: CommitObserver) {
        let _ = self.commit_observer.set(observer);
    }

    pub(crate) fn observe_commit(&self, took: std::time::Duration) {
        if let Some(observe) = self.commit_observer.get() {
            observe(took);
        }
    }
}

/// How to page a list.
#[derive(Clone, Debug, Default)]
pub struct ListOptions {
    /// At most this many items; 0 means all.
    pub limit: usize,
    /// Continue after this key (from a previous page's `next_key`).
    pub start_after: Option<String>,
}

#[derive(Clone, Debug)]
pub struct ListPage {
    pub items: Vec<KeyValue>,
    /// The head revision when the first chunk was read. Every change after
    /// it is seen by a watch started from it (some may already be in items).
    pub revision: Revision,
    /// Set when more items may follow: pass it as `start_after`.
    pub next_key: Option<String>,
}

struct Inner {
    backend: Arc<dyn Backend>,
    committer: Committer,
    hub: Arc<Hub>,
    stats: Arc<StoreStats>,
    _stop_tasks: DropGuard,
}

/// The revisioned key/value store. Cheap to clone; all clones share one
/// committer and one watch hub. Needs a tokio runtime.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

impl Store {
    pub async fn new(backend: Arc<dyn Backend>) -> Result<Store, StoreError> {
        let (_, head) = backend.get("/").await?;
        let stop = CancellationToken::new();
        let hub = Hub::start(backend.clone(), head, stop.clone());
        let stats = Arc::new(StoreStats::default());
        let committer = Committer::start(backend.clone(), hub.clone(), stats.clone());
        Ok(Store { inner: Arc::new(Inner { backend, committer, hub, stats, _stop_tasks: stop.drop_guard() }) })
    }

    /// Opens a store from a URL: `postgres://...` (or `postgresql://`), or
    /// `sqlite://PATH` / a plain file path for SQLite.
    pub async fn open(url: &str) -> Result<Store, StoreError> {
        let backend: Arc<dyn Backend> = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Arc::new(crate::postgres::PostgresBackend::connect(url).await?)
        } else {
            let path = url.strip_prefix("sqlite://").unwrap_or(url);
            Arc::new(crate::sqlite::SqliteBackend::open(path.as_ref()).await?)
        };
        Store::new(backend).await
    }

    /// `url` as it may be logged or shown: a password in it (`user:PASS@`,
    /// or a `password=` parameter) replaced by `***`.
    pub fn redacted_url(url: &str) -> String {
        let mut shown = url.to_string();
        if let Some(scheme_end) = shown.find("://") {
            let authority_end = shown[scheme_end + 3..].find(['/', '?']).map_or(shown.len(), |i| scheme_end + 3 + i);
            if let Some(at) = shown[..authority_end].rfind('@')
                && let Some(colon) = shown[scheme_end + 3..at].find(':')
            {
                shown.replace_range(scheme_end + 3 + colon + 1..at, "***");
            }
        }
        if let Some(query) = shown.find('?') {
            let redacted: Vec<String> = shown[query + 1..]
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, _)) if key.eq_ignore_ascii_case("password") => format!("{key}=***"),
                    _ => pair.to_string(),
                })
                .collect();
            shown = format!("{}?{}", &shown[..query], redacted.join("&"));
        }
        shown
    }

    pub fn backend_name(&self) -> &'static str {
        self.inner.backend.name()
    }

    pub fn stats(&self) -> &StoreStats {
        &self.inner.stats
    }

    /// A token by which other processes on this store can tell whether this
    /// one still lives (a PostgreSQL session, a locked file).
    pub fn liveness_token(&self) -> Option<String> {
        self.inner.backend.liveness_token()
    }

    /// The time on the store's own clock, if it has one
    /// ([`Backend::clock`]).
    pub async fn clock(&self) -> Result<Option<std::time::SystemTime>, StoreError> {
        self.inner.backend.clock().await
    }

    /// Whether the process behind a liveness token still lives.
    pub async fn is_alive(&self, token: &str) -> Result<bool, StoreError> {
        self.inner.backend.is_alive(token).await
    }

    /// The newest revision this process has seen committed.
    pub fn head(&self) -> Revision {
        self.inner.hub.head()
    }

    pub async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        check_key(key)?;
        Ok(self.inner.backend.get(key).await?.0)
    }

    /// Keys under `prefix` for which `keep` holds, in key order, paged.
    pub async fn list(
        &self,
        prefix: &str,
        options: &ListOptions,
        keep: impl Fn(&KeyValue) -> bool,
    ) -> Result<ListPage, StoreError> {
        check_key(prefix)?;
        let want = if options.limit == 0 { usize::MAX } else { options.limit };
        let mut items = Vec::new();
        let mut after = options.start_after.clone();
        let mut revision = None;
        loop {
            let chunk = RANGE_CHUNK.min(want.saturating_sub(items.len()).saturating_add(1));
            let (kvs, head) = self.inner.backend.range(prefix, after.as_deref(), chunk).await?;
            revision.get_or_insert(head);
            let exhausted = kvs.len() < chunk;
            after = kvs.last().map(|kv| kv.key.clone()).or(after);
            for kv in kvs {
                if !keep(&kv) {
                    continue;
                }
                if items.len() == want {
                    // One more match exists: the page is full and another follows.
                    let next_key = items.last().map(|kv: &KeyValue| kv.key.clone());
                    return Ok(ListPage { items, revision: revision.unwrap_or_default(), next_key });
                }
                items.push(kv);
            }
            if exhausted {
                return Ok(ListPage { items, revision: revision.unwrap_or_default(), next_key: None });
            }
        }
    }

    /// Runs a transaction; it is durable when this returns.
    pub async fn txn(&self, txn: Txn) -> Result<TxnOutcome, StoreError> {
        txn.check_keys()?;
        self.inner.committer.commit(txn).await
    }

    /// Creates a key that must not exist; returns its revision.
    pub async fn create(&self, key: &str, value: impl Into<Vec<u8>>) -> Result<Revision, StoreError> {
        let txn = Txn::new().when(Compare::ModRevision { key: key.into(), revision: 0 }).put(key, value);
        match self.txn(txn).await? {
            TxnOutcome::Committed { revision } => Ok(revision),
            TxnOutcome::CompareFailed { .. } => Err(StoreError::AlreadyExists(key.into())),
        }
    }

    /// Replaces a key's value if its mod revision is still `expected`.
    pub async fn update(
        &self,
        key: &str,
        value: impl Into<Vec<u8>>,
        expected: Revision,
    ) -> Result<Revision, StoreError> {
        let txn = Txn::new().when(Compare::ModRevision { key: key.into(), revision: expected }).put(key, value);
        match self.txn(txn).await? {
            TxnOutcome::Committed { revision } => Ok(revision),
            TxnOutcome::CompareFailed { actual: None, .. } => Err(StoreError::NotFound(key.into())),
            TxnOutcome::CompareFailed { actual, .. } => Err(StoreError::Conflict { key: key.into(), expected, actual }),
        }
    }

    /// Deletes a key, if its mod revision is `expected` when one is given.
    /// Returns the revision of the delete.
    pub async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<Revision, StoreError> {
        let compare = match expected {
            Some(revision) => Compare::ModRevision { key: key.into(), revision },
            None => Compare::Exists { key: key.into() },
        };
        match self.txn(Txn::new().when(compare).delete(key)).await? {
            TxnOutcome::Committed { revision } => Ok(revision),
            TxnOutcome::CompareFailed { actual: None, .. } => Err(StoreError::NotFound(key.into())),
            TxnOutcome::CompareFailed { actual, .. } => {
                Err(StoreError::Conflict { key: key.into(), expected: expected.unwrap_or_default(), actual })
            }
        }
    }

    /// Watches keys under `prefix` for changes after revision `after`.
    /// Fails at once with `Compacted` if that history is gone.
    pub async fn watch(&self, prefix: &str, after: Revision) -> Result<Watcher, StoreError> {
        check_key(prefix)?;
        self.check_reached(after).await?;
        Watcher::start(self.inner.backend.clone(), &self.inner.hub, prefix.to_string(), after).await
    }

    /// Whether the store has reached revision `after`, as a watch from it
    /// needs: `FutureRevision` if not (asked of the database when this
    /// process has not seen it, as another process may have written it).
    pub async fn check_reached(&self, after: Revision) -> Result<(), StoreError> {
        if after <= self.head() {
            return Ok(());
        }
        let (_, head) = self.inner.backend.get("/").await?;
        if after > head {
            return Err(StoreError::FutureRevision { requested: after, head });
        }
        Ok(())
    }

    /// Forgets the history up to and including `upto`. Watches from before
    /// it get `Compacted` and must relist.
    pub async fn compact(&self, upto: Revision) -> Result<(), StoreError> {
        self.inner.backend.compact(upto).await
    }
}

#[cfg(test)]
mod tests {
    use super::Store;

    #[test]
    fn a_logged_store_url_shows_no_password() {
        for (url, shown) in [
            ("postgres://herd:herd@127.0.0.1:5432/herd", "postgres://herd:***@127.0.0.1:5432/herd"),
            ("postgresql://u:p%40ss@db/x?sslmode=disable", "postgresql://u:***@db/x?sslmode=disable"),
            ("postgres://u@db/x?password=secret&user=u", "postgres://u@db/x?password=***&user=u"),
            ("postgres://db/x", "postgres://db/x"),
            ("/var/lib/herd/herd.db", "/var/lib/herd/herd.db"),
        ] {
            assert_eq!(Store::redacted_url(url), shown, "{url}");
        }
    }
}
