//! The configuration keeper (leader only): it follows the intent objects
//! (a store watch from where its last pass got, so that a pass costs the
//! changes since, `herd_core::configuration::Intents`) and, when they
//! changed, stores the next serial: its delta (`/config/deltas/<serial>`,
//! the last 64 kept), the whole document (`/config/document`) when it is
//! 16 serials behind or at a quiet pass, and the small facts every
//! heartbeat reads (`/config/facts`: the serial, this leader's URL and
//! term, written again when a new leader takes over). Heartbeat answers
//! carry the facts to every node and, to the master candidates whose copy
//! is older, the deltas since their serial or the document and the deltas
//! after it (`crate::nodes`): a change costs O(candidates) deltas, not
//! O(nodes) documents. It wakes on changes of the intent kinds (a Node's
//! beyond its heartbeat) and every two seconds (the secrets).
//!
//! Invariant: every serial after the stored document's, up to the facts',
//! has its delta stored, so a new leader reads the configuration back as
//! document plus deltas.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use herd_core::configuration::{Configuration, Intents, SECRETS_PREFIX, Ssconf, apply};
use herd_store::{EventKind, ListOptions, StoreError, Watcher};

use crate::controllers::caches::Caches;
use crate::controllers::runtime::{Controller, Next, Trigger};
use crate::objects::{Objects, ObjectsError, decode_value};

/// Where the configuration is stored: the document, the facts, the deltas.
pub const CONFIG_PREFIX: &str = "/config/";
pub const DOCUMENT_KEY: &str = "/config/document";
pub const FACTS_KEY: &str = "/config/facts";
/// How many deltas are kept: a candidate further behind gets the document.
pub const KEPT_DELTAS: u64 = 64;
/// The document is written again once it is this many serials behind (and
/// whenever a pass finds nothing new): a burst of changes writes deltas,
/// each its own size, not the whole configuration each serial.
pub const DOCUMENT_LAG: u64 = 16;
const _: () = assert!(DOCUMENT_LAG < KEPT_DELTAS, "every serial after the document's has its delta");

/// Where the delta from `serial - 1` to `serial` is kept.
pub fn delta_key(serial: u64) -> String {
    format!("/config/deltas/{serial:020}")
}

/// How often the configuration is made again when nothing wakes the keeper.
const PASS_INTERVAL: Duration = Duration::from_secs(2);
/// Where the objects live; the keeper follows the configuration's kinds.
const OBJECTS_PREFIX: &str = "/registry/";

pub struct ConfigurationKeeper {
    pub objects: Objects,
    /// Where this leader serves, for the facts.
    master_url: String,
    /// This leader's term, for the facts.
    term: u64,
    /// The configuration as last stored, with what changed since (None
    /// until the first pass reads it back).
    intents: Option<Intents>,
    /// The serial of the document stored.
    document_serial: u64,
    facts: Option<Ssconf>,
    /// Follows the objects from where the last pass read them (None: read
    /// them all again).
    changes: Option<Watcher>,
    /// What wakes it: a change that matters of any replicated kind.
    replicated: Vec<Trigger>,
}

fn json<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, ObjectsError> {
    serde_json::to_vec(value).map_err(|e| ObjectsError::BadRequest(e.to_string()))
}

/// Whether a store key holds an object of the configuration's kinds.
fn in_configuration(key: &str) -> bool {
    key.strip_prefix(OBJECTS_PREFIX)
        .and_then(|rest| rest.split_once('/'))
        .is_some_and(|(plural, _)| herd_core::configuration::in_configuration(plural))
}

impl ConfigurationKeeper {
    /// `caches`: where the replicated kinds' changes are heard.
    pub fn new(objects: Objects, caches: &Caches, master_url: String, term: u64) -> Self {
        let replicated = caches.replicated();
        ConfigurationKeeper {
            objects,
            master_url,
            term,
            intents: None,
            document_serial: 0,
            facts: None,
            changes: None,
            replicated,
        }
    }

    /// The configuration as stored: the document and the deltas after it
    /// up to the facts' serial. When a delta is missing, what the copies
    /// hold cannot be known: the configuration goes on past the facts'
    /// serial with a whole document and no delta.
    async fn load(&mut self) -> Result<Intents, ObjectsError> {
        let store = self.objects.store();
        let read =
            async |key: &str| -> Result<Option<Vec<u8>>, ObjectsError> { Ok(store.get(key).await?.map(|kv| kv.value)) };
        let mut document: Configuration = match read(DOCUMENT_KEY).await? {
            Some(bytes) => serde_json::from_slice(&bytes).unwrap_or_default(),
            None => Configuration::default(),
        };
        self.document_serial = document.serial;
        self.facts = read(FACTS_KEY).await?.and_then(|bytes| serde_json::from_slice(&bytes).ok());
        let told = self.facts.as_ref().map_or(0, |f| f.serial);
        while document.serial < told {
            let delta = read(&delta_key(document.serial + 1)).await?.and_then(|b| serde_json::from_slice(&b).ok());
            match delta.map(|delta| apply(&document, &delta)) {
                Some(Ok(next)) => document = next,
                _ => {
                    tracing::warn!(
                        document = document.serial,
                        told,
                        "configuration deltas missing: the next serial is a whole document"
                    );
                    let mut intents = Intents::of(&document);
                    intents.jump_to(told + 1);
                    self.document_serial = 0;
                    return Ok(intents);
                }
            }
        }
        Ok(Intents::of(&document))
    }

    /// Brings `intents` up to the store: every object read again at the
    /// first pass (or when the watch fell behind a compaction), then only
    /// the changes since the last pass.
    async fn catch_up(&mut self, intents: &mut Intents) -> Result<(), ObjectsError> {
        let store = self.objects.store().clone();
        loop {
            let Some(changes) = self.changes.as_mut() else {
                let page = store.list(OBJECTS_PREFIX, &ListOptions::default(), |kv| in_configuration(&kv.key)).await?;
                let objects = page
                    .items
                    .iter()
                    .map(|kv| decode_value(&kv.value, &kv.key, kv.mod_revision))
                    .collect::<Result<Vec<_>, _>>()?;
                intents.observe_all(&objects);
                self.changes = Some(store.watch(OBJECTS_PREFIX, page.revision).await?);
                return Ok(());
            };
            let head = store.head();
            // Only each object's last change counts (a member is written
            // several times in a burst): one decoding per object.
            let mut latest = HashMap::new();
            while changes.revision() < head {
                let batch = match changes.next().await {
                    Ok(batch) => batch,
                    Err(StoreError::Compacted { .. }) => break,
                    Err(error) => {
                        // What it had read is dropped: the next pass reads everything.
                        self.changes = None;
                        return Err(error.into());
                    }
                };
                latest
                    .extend(batch.events.into_iter().filter(|e| in_configuration(&e.key)).map(|e| (e.key.clone(), e)));
            }
            if changes.revision() >= head {
                for event in latest.values() {
                    match decode_value(&event.value, &event.key, event.revision) {
                        Ok(object) => intents.observe(&object, event.kind == EventKind::Delete),
                        Err(error) => {
                            // The watch is past it: the next pass reads everything.
                            self.changes = None;
                            return Err(error);
                        }
                    }
                }
                return Ok(());
            }
            self.changes = None;
        }
    }

    async fn secrets(&self) -> Result<BTreeMap<String, String>, ObjectsError> {
        let page = self.objects.store().list(SECRETS_PREFIX, &ListOptions::default(), |_| true).await?;
        page.items
            .into_iter()
            .map(|kv| match String::from_utf8(kv.value) {
                Ok(text) => Ok((kv.key, text)),
                Err(e) => Err(ObjectsError::Corrupt { key: kv.key, reason: e.to_string() }),
            })
            .collect()
    }

    /// Stores the next serial: its delta, the document when due, then the facts.
    async fn store_serial(&mut self, intents: &mut Intents, quiet: bool) -> Result<(), ObjectsError> {
        let store = self.objects.store().clone();
        let revision = async |key: &str| store.get(key).await.map(|kv| kv.map(|kv| kv.mod_revision));
        if intents.is_changed() || intents.serial() == 0 {
            // The delta first: a heartbeat that sees the new serial finds it.
            let delta = intents.next_serial();
            let key = delta_key(delta.serial);
            self.objects.put_key(&key, revision(&key).await?, json(&delta)?).await?;
            if let Some(old) = delta.serial.checked_sub(KEPT_DELTAS) {
                let old = delta_key(old);
                if let Some(at) = revision(&old).await? {
                    self.objects.delete_key(&old, at).await?;
                }
            }
            tracing::debug!(serial = delta.serial, upserts = delta.upserts.len(), "the configuration changed");
        }
        let serial = intents.serial();
        let lag = serial - self.document_serial;
        if self.document_serial == 0 || lag >= DOCUMENT_LAG || (quiet && lag > 0) {
            let document = intents.document();
            self.objects.put_key(DOCUMENT_KEY, revision(DOCUMENT_KEY).await?, json(&document)?).await?;
            self.document_serial = serial;
            tracing::info!(serial, objects = document.objects.len(), "the configuration document written");
        }
        // A new leader names itself even when the configuration is the same.
        let facts = Ssconf { serial, master_urls: vec![self.master_url.clone()], term: self.term };
        if self.facts.as_ref() != Some(&facts) {
            self.objects.put_key(FACTS_KEY, revision(FACTS_KEY).await?, json(&facts)?).await?;
            self.facts = Some(facts);
        }
        Ok(())
    }
}

impl Controller for ConfigurationKeeper {
    const NAME: &'static str = "configuration";
    /// A burst of Commands is one new serial, not one each.
    const MIN_GAP: Duration = Duration::from_millis(500);

    async fn synced(&self) {}

    /// Every replicated kind's changes that matter (not a heartbeat's
    /// time: [`Self::MIN_GAP`] makes a burst of changes one serial).
    fn triggers(&self) -> Vec<Trigger> {
        self.replicated.clone()
    }

    async fn reconcile(&mut self) -> Result<Next, ObjectsError> {
        self.pass().await?;
        Ok(Next::Requeue(PASS_INTERVAL))
    }
}

impl ConfigurationKeeper {
    async fn pass(&mut self) -> Result<(), ObjectsError> {
        // Taken back only once stored: after a failed pass, the stored
        // configuration and every object are read again.
        let mut intents = match self.intents.take() {
            Some(intents) => intents,
            None => {
                self.changes = None;
                self.load().await?
            }
        };
        self.catch_up(&mut intents).await?;
        intents.observe_secrets(self.secrets().await?);
        let quiet = !intents.is_changed();
        self.store_serial(&mut intents, quiet).await?;
        self.intents = Some(intents);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use herd_core::Object;
    use herd_core::kinds::NodeSpec;
    use herd_store::Store;

    use super::*;

    async fn stored<T: serde::de::DeserializeOwned>(objects: &Objects, key: &str) -> Option<T> {
        let kv = objects.store().get(key).await.unwrap()?;
        Some(serde_json::from_slice(&kv.value).unwrap())
    }

    async fn serials(objects: &Objects) -> (u64, u64) {
        let document: Configuration = stored(objects, DOCUMENT_KEY).await.unwrap();
        let facts: Ssconf = stored(objects, FACTS_KEY).await.unwrap();
        (document.serial, facts.serial)
    }

    /// A burst of changes writes a delta per serial and the document every
    /// DOCUMENT_LAG serials; a new leader reads back the same configuration
    /// from the document and the deltas after it, and goes on from its
    /// serial; with a delta missing it goes past it with a whole document.
    #[tokio::test]
    async fn the_document_lags_by_deltas_that_a_new_leader_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let objects = Objects::new(Store::open(dir.path().join("s.db").to_str().unwrap()).await.unwrap());
        let node = |i: usize| Object::new(format!("n{i}"), NodeSpec::default());
        objects.create(node(0), false, false).await.unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let _stop = stop.clone().drop_guard();
        let caches = Caches::new(objects.store().clone(), stop);
        let mut keeper = ConfigurationKeeper::new(objects.clone(), &caches, "https://a".into(), 1);
        keeper.pass().await.unwrap();
        assert_eq!(serials(&objects).await, (1, 1));
        for i in 1..=20 {
            objects.create(node(i), false, false).await.unwrap();
            keeper.pass().await.unwrap();
        }
        assert_eq!(serials(&objects).await, (17, 21), "the document is written every {DOCUMENT_LAG} serials");
        for serial in 18..=21 {
            let delta: herd_core::configuration::Delta = stored(&objects, &delta_key(serial)).await.unwrap();
            assert_eq!((delta.from, delta.upserts.len()), (serial - 1, 1), "one new node each");
        }
        let made = keeper.intents.as_ref().unwrap().document();
        assert_eq!(made.objects.len(), 21);

        let mut successor = ConfigurationKeeper::new(objects.clone(), &caches, "https://b".into(), 2);
        assert_eq!(successor.load().await.unwrap().document(), made, "the document and the deltas after it");
        successor.pass().await.unwrap();
        assert_eq!(serials(&objects).await, (21, 21), "nothing changed: the same serial, the document caught up");
        let facts: Ssconf = stored(&objects, FACTS_KEY).await.unwrap();
        assert_eq!((facts.master_urls, facts.term), (vec!["https://b".to_string()], 2), "the new leader named");

        for i in 21..=23 {
            objects.create(node(i), false, false).await.unwrap();
            successor.pass().await.unwrap();
        }
        assert_eq!(serials(&objects).await, (21, 24));
        let delta = objects.store().get(&delta_key(23)).await.unwrap().unwrap();
        objects.delete_key(&delta_key(23), delta.mod_revision).await.unwrap();
        let mut third = ConfigurationKeeper::new(objects.clone(), &caches, "https://c".into(), 3);
        third.pass().await.unwrap();
        // Past the facts' serial (to 25, and 26 with what the copies were
        // missing), with a whole document and no delta from 24.
        assert_eq!(serials(&objects).await, (26, 26), "past the facts with a whole document");
        let document: Configuration = stored(&objects, DOCUMENT_KEY).await.unwrap();
        assert_eq!(document.objects.len(), 24, "read from the objects themselves");
        assert!(stored::<herd_core::configuration::Delta>(&objects, &delta_key(25)).await.is_none(), "no delta to it");
    }
}
