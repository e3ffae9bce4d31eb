//! The configuration keeper (leader only): after any change to an intent
//! object it makes the configuration again (`herd_core::configuration`)
//! and, when it differs, stores it with the next serial (`/config/document`),
//! and the small facts every heartbeat reads (`/config/facts`: the serial,
//! this leader's URL and term, written again when a new leader takes over).
//! Heartbeat answers then carry the facts to every node and the document
//! to the master candidates whose copy is older (`crate::nodes`): a change
//! costs O(candidates) documents, not O(nodes). It wakes on changes of
//! the intent kinds (a Node's beyond its heartbeat) and every two seconds
//! (the secrets), not on every heartbeat's status write.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use herd_core::configuration::{CONFIGURATION_KINDS, Configuration, SECRETS_PREFIX, Ssconf, delta, intent_of, next};
use herd_store::{ListOptions, Revision};
use serde_json::Value;

use crate::controllers::runtime::{Controller, Next};
use crate::objects::{Objects, ObjectsError, collection_prefix};

pub const DOCUMENT_KEY: &str = "/config/document";
pub const FACTS_KEY: &str = "/config/facts";
/// How many deltas are kept: a candidate further behind gets the document.
pub const KEPT_DELTAS: u64 = 64;

/// Where the delta from `serial - 1` to `serial` is kept.
pub fn delta_key(serial: u64) -> String {
    format!("/config/deltas/{serial:020}")
}

/// How often the configuration is made again when nothing wakes the keeper.
const PASS_INTERVAL: Duration = Duration::from_secs(2);
/// At most one pass this often: a burst of Commands is one new serial, not
/// one each (each pass reads every intent object).
const MIN_GAP: Duration = Duration::from_millis(500);

pub struct ConfigurationKeeper {
    pub objects: Objects,
    /// Where this leader serves, for the facts.
    master_url: String,
    /// This leader's term, for the facts.
    term: u64,
    /// The configuration and facts last stored (read at the first pass).
    current: Option<Configuration>,
    facts: Option<Ssconf>,
    loaded: bool,
    last_pass: Option<tokio::time::Instant>,
    /// Each intent object's store key, with the revision its intent was
    /// made from: a pass decodes only the objects changed since the last.
    decoded: HashMap<String, (Revision, Option<Value>)>,
}

fn json<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, ObjectsError> {
    serde_json::to_vec(value).map_err(|e| ObjectsError::BadRequest(e.to_string()))
}

impl ConfigurationKeeper {
    pub fn new(objects: Objects, master_url: String, term: u64) -> Self {
        ConfigurationKeeper {
            objects,
            master_url,
            term,
            current: None,
            facts: None,
            loaded: false,
            last_pass: None,
            decoded: HashMap::new(),
        }
    }

    async fn intent(&mut self) -> Result<Vec<Value>, ObjectsError> {
        let mut objects = Vec::new();
        let mut decoded = HashMap::with_capacity(self.decoded.len());
        for plural in CONFIGURATION_KINDS {
            let page = self.objects.store().list(&collection_prefix(plural), &ListOptions::default(), |_| true).await?;
            for kv in page.items {
                let intent = match self.decoded.remove(&kv.key) {
                    Some((revision, intent)) if revision == kv.mod_revision => intent,
                    _ => {
                        let value: Value = serde_json::from_slice(&kv.value)
                            .map_err(|e| ObjectsError::Corrupt { key: kv.key.clone(), reason: e.to_string() })?;
                        intent_of(&value)
                    }
                };
                objects.extend(intent.clone());
                decoded.insert(kv.key, (kv.mod_revision, intent));
            }
        }
        self.decoded = decoded;
        Ok(objects)
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
}

impl Controller for ConfigurationKeeper {
    const NAME: &'static str = "configuration";

    async fn synced(&self) {}

    async fn reconcile(&mut self) -> Result<Next, ObjectsError> {
        // Not a sleep here: a leader stepping down must not wait for it.
        if let Some(wait) = self.last_pass.map(|last| MIN_GAP.saturating_sub(last.elapsed())).filter(|w| !w.is_zero()) {
            return Ok(Next::Requeue(wait));
        }
        self.last_pass = Some(tokio::time::Instant::now());
        let store = self.objects.store().clone();
        if !self.loaded {
            let read = async |key: &str| store.get(key).await.map(|kv| kv.map(|kv| kv.value));
            self.current = read(DOCUMENT_KEY).await?.and_then(|v| serde_json::from_slice(&v).ok());
            self.facts = read(FACTS_KEY).await?.and_then(|v| serde_json::from_slice(&v).ok());
            self.loaded = true;
        }
        let intent = self.intent().await?;
        let made = next(self.current.as_ref(), intent, self.secrets().await?);
        let revision = async |key: &str| store.get(key).await.map(|kv| kv.map(|kv| kv.mod_revision));
        if self.current.as_ref().is_none_or(|c| c.serial != made.serial) {
            // The delta first: a heartbeat that sees the new serial finds it.
            if let Some(previous) = self.current.as_ref().filter(|c| c.serial + 1 == made.serial) {
                let key = delta_key(made.serial);
                self.objects.put_key(&key, revision(&key).await?, json(&delta(previous, &made))?).await?;
                if let Some(old) = made.serial.checked_sub(KEPT_DELTAS) {
                    let old = delta_key(old);
                    if let Some(at) = revision(&old).await? {
                        self.objects.delete_key(&old, at).await?;
                    }
                }
            }
            self.objects.put_key(DOCUMENT_KEY, revision(DOCUMENT_KEY).await?, json(&made)?).await?;
            tracing::info!(serial = made.serial, objects = made.objects.len(), "the configuration changed");
        }
        // A new leader names itself even when the configuration is the same.
        let facts = Ssconf { serial: made.serial, master_urls: vec![self.master_url.clone()], term: self.term };
        if self.facts.as_ref() != Some(&facts) {
            self.objects.put_key(FACTS_KEY, revision(FACTS_KEY).await?, json(&facts)?).await?;
            self.facts = Some(facts);
        }
        self.current = Some(made);
        Ok(Next::Requeue(PASS_INTERVAL))
    }
}
