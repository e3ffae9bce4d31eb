//! [`Reflector`]: a local copy of every object of one kind, kept current by
//! a store watch (kube-rs's reflector and store). It lists, then watches
//! from the list's revision; when the watch fails (compaction, a store
//! error) it lists again. It is only a cache: the store stays the truth,
//! and every write still goes to the store with its revision check.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use herd_core::{Object, Resource};
use herd_store::{EventKind, KeyValue, ListOptions, Revision, Store, StoreError};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::objects::{collection_prefix, decode};

/// Pause before listing again after a failure.
const RELIST_DELAY: Duration = Duration::from_millis(200);

struct Shared<S: Resource> {
    /// Shared, so a pass's list is a copy of pointers, not of objects.
    objects: RwLock<BTreeMap<String, Arc<Object<S>>>>,
    /// The store revision of the list or of the last change of this kind
    /// the copy took; None until the first list. Not moved by writes of
    /// other kinds: every commit reaches every watch, and a controller
    /// woken by each would pass again and again over nothing new.
    revision: watch::Sender<Option<Revision>>,
    /// The revision of the last change that matters (see [`Reflector::start_with`]).
    mattered: watch::Sender<Option<Revision>>,
    /// Whether a change from the first object to the second matters.
    matters: fn(&Object<S>, &Object<S>) -> bool,
}

/// A cheap handle on the copy; clones share it.
pub struct Reflector<S: Resource> {
    shared: Arc<Shared<S>>,
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
        let shared = Arc::new(Shared {
            objects: RwLock::default(),
            revision: watch::Sender::new(None),
            mattered: watch::Sender::new(None),
            matters,
        });
        tokio::spawn(run(store, shared.clone(), stop));
        Reflector { shared }
    }

    /// Waits until the copy holds a complete list.
    pub async fn synced(&self) {
        let mut revision = self.shared.revision.subscribe();
        let _ = revision.wait_for(Option::is_some).await;
    }

    /// Every object, by name: a copy of each.
    pub fn list(&self) -> Vec<Object<S>> {
        self.map(Object::clone)
    }

    /// Every object, by name, shared with the cache: a pass over many
    /// objects copies pointers, and clones only the ones it changes.
    pub fn list_shared(&self) -> Vec<Arc<Object<S>>> {
        self.shared.objects.read().map(|m| m.values().cloned().collect()).unwrap_or_default()
    }

    /// `f` of every object, under the read lock: for a pass that needs a
    /// few fields of each, without copying every object.
    pub fn map<T>(&self, mut f: impl FnMut(&Object<S>) -> T) -> Vec<T> {
        self.shared.objects.read().map(|m| m.values().map(|o| f(o)).collect()).unwrap_or_default()
    }

    /// One object, shared with the cache.
    pub fn get_shared(&self, name: &str) -> Option<Arc<Object<S>>> {
        self.shared.objects.read().ok()?.get(name).cloned()
    }

    pub fn get(&self, name: &str) -> Option<Object<S>> {
        self.shared.objects.read().ok()?.get(name).map(|o| Object::clone(o))
    }

    /// The revision of the last change the copy took (None until synced).
    pub fn revision(&self) -> Option<Revision> {
        *self.shared.revision.borrow()
    }

    /// Changes whenever the copy takes a change.
    pub fn changes(&self) -> watch::Receiver<Option<Revision>> {
        self.shared.revision.subscribe()
    }

    /// Changes when the copy takes a change that matters.
    pub fn changes_that_matter(&self) -> watch::Receiver<Option<Revision>> {
        self.shared.mattered.subscribe()
    }
}

async fn run<S: Resource>(store: Store, shared: Arc<Shared<S>>, stop: CancellationToken) {
    let prefix = collection_prefix(S::PLURAL);
    while !stop.is_cancelled() {
        if let Err(error) = follow(&store, &shared, &prefix, &stop).await {
            tracing::warn!(%error, kind = S::KIND, "cache watch ended; listing again");
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
async fn follow<S: Resource>(
    store: &Store,
    shared: &Shared<S>,
    prefix: &str,
    stop: &CancellationToken,
) -> Result<(), StoreError> {
    let page = store.list(prefix, &ListOptions::default(), |_| true).await?;
    let mut fresh = BTreeMap::new();
    for kv in &page.items {
        match decode::<S>(kv) {
            Ok(object) => {
                fresh.insert(name_of(prefix, &kv.key).to_string(), Arc::new(object));
            }
            Err(error) => tracing::error!(%error, "skipping an unreadable stored object"),
        }
    }
    if let Ok(mut objects) = shared.objects.write() {
        *objects = fresh;
    }
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
        let mut mattered = false;
        if let Ok(mut objects) = shared.objects.write() {
            for event in batch.events {
                let name = name_of(prefix, &event.key).to_string();
                match event.kind {
                    EventKind::Delete => {
                        mattered |= objects.remove(&name).is_some();
                    }
                    EventKind::Put => {
                        let kv = KeyValue {
                            key: event.key,
                            value: event.value.to_vec(),
                            create_revision: event.create_revision,
                            mod_revision: event.revision,
                        };
                        match decode::<S>(&kv) {
                            Ok(object) => {
                                mattered |= objects.get(&name).is_none_or(|old| (shared.matters)(old, &object));
                                objects.insert(name, Arc::new(object));
                            }
                            Err(error) => tracing::error!(%error, "skipping an unreadable stored object"),
                        }
                    }
                }
            }
        }
        if mattered {
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
