//! [`Reflector`]: a local copy of every object of one kind, kept current by
//! a store watch (kube-rs's reflector and store). It lists, then watches
//! from the list's revision; when the watch fails (compaction, a store
//! error) it lists again. It is only a cache: the store stays the truth,
//! and every write still goes to the store with its revision check.
//! [`RawCache`] is the same for the raw values under a key prefix that
//! holds no objects (the configuration's document, deltas and facts).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use herd_core::{Object, Resource};
use herd_store::{EventKind, ListOptions, Revision, Store, StoreError};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use crate::objects::{ObjectsError, collection_prefix, decode_bytes};

/// Pause before listing again after a failure.
const RELIST_DELAY: Duration = Duration::from_millis(200);
/// Batches of changes a slow follower may fall behind by before it is
/// told to look at everything again.
const CHANGES_KEPT: usize = 1024;

/// What one batch of the copy's changes was: entries as they were and
/// are now (None: absent), or a fresh list (everything may have changed).
#[derive(Debug)]
pub enum Changed<T> {
    Entries(Vec<Change<T>>),
    Relisted,
}

/// An entry as it was and is (None: absent).
pub type Change<T> = (Option<Arc<T>>, Option<Arc<T>>);

struct Shared<T> {
    /// Under this store prefix, by the rest of the key.
    prefix: String,
    /// Shared, so a pass's list is a copy of pointers, not of objects.
    entries: RwLock<BTreeMap<String, Arc<T>>>,
    /// The store revision of the list or of the last change under the
    /// prefix the copy took; None until the first list. Not moved by
    /// writes elsewhere: every commit reaches every watch, and a
    /// controller woken by each would pass again and again over nothing new.
    revision: watch::Sender<Option<Revision>>,
    /// The revision of the last change that matters (see [`Reflector::start_with`]).
    mattered: watch::Sender<Option<Revision>>,
    /// Each batch of changes that matter, for followers that want to know
    /// which entries changed.
    changed: broadcast::Sender<Arc<Changed<T>>>,
    /// What the copy keeps of a stored value.
    decode: fn(&str, Bytes, Revision) -> Result<T, ObjectsError>,
    /// Whether a change from the first entry to the second matters.
    matters: fn(&T, &T) -> bool,
}

impl<T: Send + Sync + 'static> Shared<T> {
    /// Starts following the store; stops when `stop` fires.
    fn start(
        store: Store,
        stop: CancellationToken,
        prefix: String,
        decode: fn(&str, Bytes, Revision) -> Result<T, ObjectsError>,
        matters: fn(&T, &T) -> bool,
    ) -> Arc<Self> {
        let shared = Arc::new(Shared {
            prefix,
            entries: RwLock::default(),
            revision: watch::Sender::new(None),
            mattered: watch::Sender::new(None),
            changed: broadcast::Sender::new(CHANGES_KEPT),
            decode,
            matters,
        });
        tokio::spawn(run(store, shared.clone(), stop));
        shared
    }

    fn get(&self, name: &str) -> Option<Arc<T>> {
        self.entries.read().ok()?.get(name).cloned()
    }

    async fn synced(&self) {
        let mut revision = self.revision.subscribe();
        let _ = revision.wait_for(Option::is_some).await;
    }
}

/// A cheap handle on the copy; clones share it.
pub struct Reflector<S: Resource> {
    shared: Arc<Shared<Object<S>>>,
}

impl<S: Resource> Clone for Reflector<S> {
    fn clone(&self) -> Self {
        Reflector { shared: self.shared.clone() }
    }
}

impl<S: Resource> Reflector<S> {
    /// Starts following the store; stops when `stop` fires.
    pub fn start(store: Store, stop: CancellationToken) -> Self {
        Self::start_with(store, stop, |_, _| true)
    }

    /// Like [`Reflector::start`], with [`Reflector::changes_that_matter`]
    /// moving only on creations, deletions and the updates `matters`
    /// says matter (a Node's heartbeat time does not, to most controllers).
    pub fn start_with(store: Store, stop: CancellationToken, matters: fn(&Object<S>, &Object<S>) -> bool) -> Self {
        let decode = |key: &str, value: Bytes, revision| decode_bytes::<S>(key, &value, revision);
        Reflector { shared: Shared::start(store, stop, collection_prefix(S::PLURAL), decode, matters) }
    }

    /// Waits until the copy holds a complete list.
    pub async fn synced(&self) {
        self.shared.synced().await
    }

    /// Every object, by name: a copy of each.
    pub fn list(&self) -> Vec<Object<S>> {
        self.map(Object::clone)
    }

    /// Every object, by name, shared with the cache: a pass over many
    /// objects copies pointers, and clones only the ones it changes.
    pub fn list_shared(&self) -> Vec<Arc<Object<S>>> {
        self.shared.entries.read().map(|m| m.values().cloned().collect()).unwrap_or_default()
    }

    /// `f` of every object, under the read lock: for a pass that needs a
    /// few fields of each, without copying every object.
    pub fn map<T>(&self, mut f: impl FnMut(&Object<S>) -> T) -> Vec<T> {
        self.shared.entries.read().map(|m| m.values().map(|o| f(o)).collect()).unwrap_or_default()
    }

    /// One object, shared with the cache.
    pub fn get_shared(&self, name: &str) -> Option<Arc<Object<S>>> {
        self.shared.get(name)
    }

    pub fn get(&self, name: &str) -> Option<Object<S>> {
        self.shared.get(name).map(|o| Object::clone(&o))
    }

    /// The revision of the last change the copy took (None until synced).
    pub fn revision(&self) -> Option<Revision> {
        *self.shared.revision.borrow()
    }

    /// The revision of the last change that matters the copy took.
    pub fn revision_that_matters(&self) -> Option<Revision> {
        *self.shared.mattered.borrow()
    }

    /// Changes whenever the copy takes a change.
    pub fn changes(&self) -> watch::Receiver<Option<Revision>> {
        self.shared.revision.subscribe()
    }

    /// Changes when the copy takes a change that matters.
    pub fn changes_that_matter(&self) -> watch::Receiver<Option<Revision>> {
        self.shared.mattered.subscribe()
    }

    /// Each later batch of changes that matter, with the objects as they
    /// were and are (a follower that falls too far behind is told it
    /// lagged, and must look at everything).
    pub fn changed(&self) -> broadcast::Receiver<Arc<Changed<Object<S>>>> {
        self.shared.changed.subscribe()
    }
}

/// The raw values under a store prefix, kept current like a [`Reflector`]
/// (the values are shared with the watch, not copied).
#[derive(Clone)]
pub struct RawCache {
    store: Store,
    shared: Arc<Shared<Bytes>>,
}

impl RawCache {
    /// Starts following the keys under `prefix`; stops when `stop` fires.
    pub fn start(store: Store, prefix: &str, stop: CancellationToken) -> Self {
        let shared = Shared::start(store.clone(), stop, prefix.to_string(), |_, value, _| Ok(value), |_, _| true);
        RawCache { store, shared }
    }

    /// Waits until the copy holds a complete list.
    pub async fn synced(&self) {
        self.shared.synced().await
    }

    /// The value at `key` (under the prefix): from the copy once it holds
    /// a complete list, from the store before.
    pub async fn get(&self, key: &str) -> Result<Option<Bytes>, StoreError> {
        if self.shared.revision.borrow().is_some() {
            let name = key.strip_prefix(&self.shared.prefix).unwrap_or(key);
            return Ok(self.shared.get(name).map(|value| Bytes::clone(&value)));
        }
        Ok(self.store.get(key).await?.map(|kv| Bytes::from(kv.value)))
    }
}

async fn run<T: Send + Sync + 'static>(store: Store, shared: Arc<Shared<T>>, stop: CancellationToken) {
    while !stop.is_cancelled() {
        if let Err(error) = follow(&store, &shared, &stop).await {
            tracing::warn!(%error, prefix = %shared.prefix, "cache watch ended; listing again");
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(RELIST_DELAY) => {}
            }
        }
    }
}

fn name_of<'a>(prefix: &str, key: &'a str) -> &'a str {
    key.strip_prefix(prefix).unwrap_or(key)
}

/// Lists, then applies watch events until the watch fails or `stop` fires.
async fn follow<T>(store: &Store, shared: &Shared<T>, stop: &CancellationToken) -> Result<(), StoreError> {
    let prefix = &shared.prefix;
    let page = store.list(prefix, &ListOptions::default(), |_| true).await?;
    let mut fresh = BTreeMap::new();
    for kv in page.items {
        let name = name_of(prefix, &kv.key).to_string();
        match (shared.decode)(&kv.key, Bytes::from(kv.value), kv.mod_revision) {
            Ok(entry) => {
                fresh.insert(name, Arc::new(entry));
            }
            Err(error) => tracing::error!(%error, "skipping an unreadable stored value"),
        }
    }
    if let Ok(mut entries) = shared.entries.write() {
        *entries = fresh;
    }
    let _ = shared.changed.send(Arc::new(Changed::Relisted));
    shared.mattered.send_replace(Some(page.revision));
    shared.revision.send_replace(Some(page.revision));
    let mut watcher = store.watch(prefix, page.revision).await?;
    loop {
        let batch = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            batch = watcher.next() => batch?,
        };
        if batch.events.is_empty() {
            continue;
        }
        // Decoded before the lock is taken: readers do not wait on it.
        let changes: Vec<(String, Option<Arc<T>>)> = batch
            .events
            .into_iter()
            .filter_map(|event| {
                let name = name_of(prefix, &event.key).to_string();
                match event.kind {
                    EventKind::Delete => Some((name, None)),
                    EventKind::Put => match (shared.decode)(&event.key, event.value, event.revision) {
                        Ok(entry) => Some((name, Some(Arc::new(entry)))),
                        Err(error) => {
                            tracing::error!(%error, "skipping an unreadable stored value");
                            None
                        }
                    },
                }
            })
            .collect();
        let mut mattered = Vec::new();
        if let Ok(mut entries) = shared.entries.write() {
            for (name, entry) in changes {
                match entry {
                    None => {
                        if let Some(old) = entries.remove(&name) {
                            mattered.push((Some(old), None));
                        }
                    }
                    Some(entry) => {
                        let old = entries.insert(name, entry.clone());
                        if old.as_ref().is_none_or(|old| (shared.matters)(old, &entry)) {
                            mattered.push((old, Some(entry)));
                        }
                    }
                }
            }
        }
        if !mattered.is_empty() {
            if shared.changed.receiver_count() > 0 {
                let _ = shared.changed.send(Arc::new(Changed::Entries(mattered)));
            }
            shared.mattered.send_replace(Some(batch.revision));
        }
        shared.revision.send_replace(Some(batch.revision));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::Objects;
    use herd_core::kinds::{LeaseSpec, NodeSpec};

    async fn eventually(mut check: impl FnMut() -> bool) {
        for _ in 0..200 {
            if check() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the cache did not catch up");
    }

    #[tokio::test]
    async fn follows_creates_updates_and_deletes_of_its_kind() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("s.db").to_str().unwrap()).await.unwrap();
        let objects = Objects::new(store.clone());
        objects.create(Object::new("n1", NodeSpec::default()), false, false).await.unwrap();
        let stop = CancellationToken::new();
        let nodes = Reflector::<NodeSpec>::start(store.clone(), stop.clone());
        nodes.synced().await;
        assert_eq!(nodes.list().len(), 1);

        let created = objects.create(Object::new("n2", NodeSpec::default()), false, false).await.unwrap();
        objects
            .create(
                Object::new("other-kind", LeaseSpec { lease_duration_seconds: 1, ..Default::default() }),
                false,
                false,
            )
            .await
            .unwrap();
        let mut changed = created.clone();
        changed.spec.unschedulable = true;
        let changed = objects.update(changed, false).await.unwrap();
        eventually(|| nodes.get("n2").is_some_and(|n| n.spec.unschedulable)).await;
        assert_eq!(nodes.get("n2").unwrap().metadata.resource_version, changed.metadata.resource_version);
        assert_eq!(nodes.list().len(), 2, "only this kind");

        objects.delete_value("Node", "nodes", "n1", None, false).await.unwrap();
        eventually(|| nodes.get("n1").is_none()).await;

        stop.cancel();
    }

    #[tokio::test]
    async fn a_raw_cache_follows_the_values_under_its_prefix() {
        use herd_store::Txn;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("s.db").to_str().unwrap()).await.unwrap();
        store.txn(Txn::new().put("/config/facts", b"1".to_vec()).put("/other", b"x".to_vec())).await.unwrap();
        let stop = CancellationToken::new();
        let cache = RawCache::start(store.clone(), "/config/", stop.clone());
        assert_eq!(cache.get("/config/facts").await.unwrap().as_deref(), Some(&b"1"[..]), "synced or not");
        cache.synced().await;
        store.txn(Txn::new().put("/config/facts", b"2".to_vec()).put("/config/deltas/1", b"d".to_vec())).await.unwrap();
        eventually(|| cache.shared.get("facts").is_some_and(|value| value[..] == b"2"[..])).await;
        assert_eq!(cache.get("/config/facts").await.unwrap().as_deref(), Some(&b"2"[..]));
        assert_eq!(cache.get("/config/deltas/1").await.unwrap().as_deref(), Some(&b"d"[..]));
        assert_eq!(cache.get("/config/other").await.unwrap(), None);
        store.txn(Txn::new().delete("/config/deltas/1")).await.unwrap();
        eventually(|| cache.shared.get("deltas/1").is_none()).await;
        stop.cancel();
    }

    #[tokio::test]
    async fn only_a_change_of_its_kind_wakes_its_followers() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("s.db").to_str().unwrap()).await.unwrap();
        let objects = Objects::new(store.clone());
        let stop = CancellationToken::new();
        let nodes = Reflector::<NodeSpec>::start(store.clone(), stop.clone());
        nodes.synced().await;
        let mut changes = nodes.changes();
        changes.borrow_and_update();
        for i in 0..5 {
            let lease = LeaseSpec { lease_duration_seconds: 1, ..Default::default() };
            objects.create(Object::new(format!("l{i}"), lease), false, false).await.unwrap();
        }
        objects.create(Object::new("n1", NodeSpec::default()), false, false).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), changes.changed()).await.unwrap().unwrap();
        assert!(nodes.get("n1").is_some(), "the first wake-up is the node's creation, not a lease's");
        stop.cancel();
    }
}
