//! The configuration keeper (leader only): after any change to an intent
//! object it makes the configuration again (`herd_core::configuration`)
//! and, when it differs, stores it with the next serial (`/config/document`,
//! and the small `/config/serial` that every heartbeat reads). Heartbeat
//! answers then carry the facts to every node and the document to the
//! master candidates whose copy is older (`crate::nodes`): a change costs
//! O(candidates) documents, not O(nodes).

use std::time::Duration;

use herd_core::configuration::{CONFIGURATION_KINDS, Configuration, intent_of, next};
use herd_store::ListOptions;
use serde_json::Value;

use crate::controllers::runtime::{Controller, Next};
use crate::objects::{Objects, ObjectsError, collection_prefix};

pub const DOCUMENT_KEY: &str = "/config/document";
pub const SERIAL_KEY: &str = "/config/serial";

/// How often the configuration is made again when nothing wakes the keeper.
const PASS_INTERVAL: Duration = Duration::from_secs(2);

pub struct ConfigurationKeeper {
    pub objects: Objects,
    /// The configuration last stored (read from the store at the first pass).
    current: Option<Configuration>,
    loaded: bool,
}

impl ConfigurationKeeper {
    pub fn new(objects: Objects) -> Self {
        ConfigurationKeeper { objects, current: None, loaded: false }
    }

    async fn intent(&self) -> Result<Vec<Value>, ObjectsError> {
        let mut objects = Vec::new();
        for plural in CONFIGURATION_KINDS {
            let page = self.objects.store().list(&collection_prefix(plural), &ListOptions::default(), |_| true).await?;
            for kv in &page.items {
                let value: Value = serde_json::from_slice(&kv.value)
                    .map_err(|e| ObjectsError::Corrupt { key: kv.key.clone(), reason: e.to_string() })?;
                objects.extend(intent_of(&value));
            }
        }
        Ok(objects)
    }
}

impl Controller for ConfigurationKeeper {
    const NAME: &'static str = "configuration";

    async fn synced(&self) {}

    async fn reconcile(&mut self) -> Result<Next, ObjectsError> {
        if !self.loaded {
            let stored = self.objects.store().get(DOCUMENT_KEY).await?;
            self.current = stored.and_then(|kv| serde_json::from_slice(&kv.value).ok());
            self.loaded = true;
        }
        let made = next(self.current.as_ref(), self.intent().await?);
        if self.current.as_ref().is_some_and(|c| c.serial == made.serial) {
            return Ok(Next::Requeue(PASS_INTERVAL));
        }
        let store = self.objects.store();
        let revision = async |key: &str| store.get(key).await.map(|kv| kv.map(|kv| kv.mod_revision));
        let document = serde_json::to_vec(&made).map_err(|e| ObjectsError::BadRequest(e.to_string()))?;
        self.objects.put_key(DOCUMENT_KEY, revision(DOCUMENT_KEY).await?, document).await?;
        let serial = serde_json::to_vec(&serde_json::json!({ "serial": made.serial, "digest": made.digest }))
            .map_err(|e| ObjectsError::BadRequest(e.to_string()))?;
        self.objects.put_key(SERIAL_KEY, revision(SERIAL_KEY).await?, serial).await?;
        tracing::info!(serial = made.serial, objects = made.objects.len(), "the configuration changed");
        self.current = Some(made);
        Ok(Next::Requeue(PASS_INTERVAL))
    }
}
