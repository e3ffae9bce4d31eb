//! The cluster configuration, Ganeti's `config.data`: every intent object
//! (Nodes, the ClusterConfig, Apps, AppClusters, Members, DisruptionBudgets
//! and Commands not yet settled) and the cluster's secrets (token hashes, the sealed CA),
//! with a serial that rises whenever any of them changes. Master
//! candidates keep a copy, enough to start a master from
//! (`herd cluster master-failover`); every node keeps the small facts (the
//! serial, the master's URLs and its term, Ganeti's ssconf).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::kinds::ManagementState;

/// Whether the objects of the kind served at `plural` make up the
/// configuration (their descriptors say they are replicated).
pub fn in_configuration(plural: &str) -> bool {
    crate::kinds::by_plural(plural).is_some_and(|d| d.replicated)
}

/// The store keys under which the secrets are kept.
pub const SECRETS_PREFIX: &str = "/secrets/";

/// A configuration and its serial.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Configuration {
    pub serial: u64,
    /// blake3 over each object's blake3 (as encoded, in order) and the secrets.
    pub digest: String,
    pub objects: Vec<Value>,
    /// Store key to value (JSON text) of every key under [`SECRETS_PREFIX`].
    #[serde(default)]
    pub secrets: BTreeMap<String, String>,
}

/// Only the serial of a configuration document or delta: for a reader
/// that needs nothing else (the server deciding what a candidate lacks, a
/// simulated candidate, which keeps no copy) and should not decode the
/// objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub struct SerialOnly {
    pub serial: u64,
}

/// What every node is told: the serial and where the master serves.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Ssconf {
    pub serial: u64,
    pub master_urls: Vec<String>,
    /// The master's leadership term: an agent follows no master of an
    /// older term than one it was told of.
    #[serde(default)]
    pub term: u64,
}

/// What changed from configuration serial `from` to `serial`: a candidate
/// whose copy is at `from` applies it instead of taking the whole
/// document, so that a change costs its own size, not the cluster's.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Delta {
    pub from: u64,
    pub serial: u64,
    /// The digest of the configuration at `serial`: the copy is checked
    /// against it once the delta is applied.
    pub digest: String,
    /// Objects new or changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upserts: Vec<Value>,
    /// Objects gone, as (kind, name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deletes: Vec<(String, String)>,
    /// Secrets changed (Some) or gone (None).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets: BTreeMap<String, Option<String>>,
}

/// Where an object sits in the configuration: its kind and name.
fn key_of(object: &Value) -> (String, String) {
    let text = |pointer: &str| object.pointer(pointer).and_then(Value::as_str).unwrap_or_default().to_string();
    (text("/kind"), text("/metadata/name"))
}

fn digest_of(objects: &[Value], secrets: &BTreeMap<String, String>) -> String {
    combine(objects.iter().map(hash_of), secrets)
}

/// One object's part of the digest.
fn hash_of(object: &Value) -> blake3::Hash {
    blake3::hash(&serde_json::to_vec(object).unwrap_or_default())
}

/// The digest of a configuration from its objects' hashes, in order: a
/// keeper that holds each object's hash makes it without encoding any.
fn combine(hashes: impl Iterator<Item = blake3::Hash>, secrets: &BTreeMap<String, String>) -> String {
    let mut hasher = blake3::Hasher::new();
    for hash in hashes {
        hasher.update(hash.as_bytes());
    }
    hasher.update(&serde_json::to_vec(secrets).unwrap_or_default());
    hasher.finalize().to_hex().to_string()
}

/// Applies `delta` to `copy`; refused (and `copy` unchanged) when the
/// copy is not at the delta's starting serial or does not come out with
/// the delta's digest.
pub fn apply(copy: &Configuration, delta: &Delta) -> Result<Configuration, String> {
    if copy.serial != delta.from {
        return Err(format!("the copy is at serial {}, the delta starts at {}", copy.serial, delta.from));
    }
    let mut objects: BTreeMap<(String, String), Value> = copy.objects.iter().map(|o| (key_of(o), o.clone())).collect();
    for gone in &delta.deletes {
        objects.remove(gone);
    }
    for object in &delta.upserts {
        objects.insert(key_of(object), object.clone());
    }
    let mut secrets = copy.secrets.clone();
    for (key, value) in &delta.secrets {
        match value {
            Some(value) => secrets.insert(key.clone(), value.clone()),
            None => secrets.remove(key),
        };
    }
    let objects: Vec<Value> = objects.into_values().collect();
    let digest = digest_of(&objects, &secrets);
    if digest != delta.digest {
        return Err(format!("the copy came out as {digest}, not {}: it needs the whole document", delta.digest));
    }
    Ok(Configuration { serial: delta.serial, digest, objects, secrets })
}

/// An object as the configuration keeps it: its metadata without the
/// revision, and its spec; of the status only what a master started from
/// the copy needs: a Node's address, a Member's state and what it was
/// configured as (not what is observed of it: its readiness, its crash
/// loop, what its configmeta said), a budget's approved evictions, and an
/// Operation's progress (its phase, steps and history: a failover must
/// neither forget what a drain evicted nor run a finished one again; its
/// blocker is worked out again). None for a settled Command (no longer
/// intent).
pub fn intent_of(object: &Value) -> Option<Value> {
    let kind = object.get("kind")?.as_str()?;
    if kind == "Command" {
        let state = object.pointer("/status/stateByManagement").cloned().unwrap_or_default();
        if serde_json::from_value::<ManagementState>(state).is_ok_and(ManagementState::is_settled) {
            return None;
        }
    }
    let mut metadata = object.get("metadata")?.clone();
    metadata.as_object_mut()?.remove("resourceVersion");
    let mut intent = serde_json::json!({
        "apiVersion": object.get("apiVersion"),
        "kind": kind,
        "metadata": metadata,
        "spec": object.get("spec"),
    });
    let status = match kind {
        "Node" => object.pointer("/status/address").map(|a| serde_json::json!({ "address": a })),
        "Member" => object.get("status").cloned().map(|mut status| {
            if let Some(fields) = status.as_object_mut() {
                for observed in ["ready", "readyChangedAt", "notReadyReason", "reason"] {
                    fields.remove(observed);
                }
                if let Some(detail) = fields.get_mut("stateDetail").and_then(Value::as_object_mut) {
                    for observed in ["lastKnownState", "crashLoop", "lostVolumes", "configDataDigest"] {
                        detail.remove(observed);
                    }
                }
            }
            status
        }),
        "Operation" => object.get("status").cloned().map(|mut status| {
            if let Some(fields) = status.as_object_mut() {
                fields.remove("blocker");
            }
            status
        }),
        // Approved evictions are decisions a new master must not make twice;
        // the counts it takes again.
        "DisruptionBudget" => object
            .pointer("/status/disruptedMembers")
            .map(|approved| serde_json::json!({ "disruptedMembers": approved })),
        _ => None,
    };
    if let Some(status) = status {
        intent["status"] = status;
    }
    Some(intent)
}

/// The configuration as its keeper holds it between passes: each object's
/// intent with its hash, in (kind, name) order, and what changed since the
/// last serial, so that a pass after a few changes costs those changes
/// and a hash per object, not an encoding of the whole configuration.
#[derive(Clone, Debug, Default)]
pub struct Intents {
    serial: u64,
    objects: BTreeMap<(String, String), (Value, blake3::Hash)>,
    secrets: BTreeMap<String, String>,
    /// Objects and secrets changed since `serial`.
    changed: BTreeSet<(String, String)>,
    changed_secrets: BTreeSet<String>,
}

impl Intents {
    /// The intents of a stored configuration, nothing changed since.
    pub fn of(configuration: &Configuration) -> Intents {
        let objects = configuration.objects.iter().map(|o| (key_of(o), (o.clone(), hash_of(o)))).collect();
        Intents { serial: configuration.serial, objects, secrets: configuration.secrets.clone(), ..Intents::default() }
    }

    pub fn serial(&self) -> u64 {
        self.serial
    }

    /// Takes in a stored object as it is now, or as it was before its
    /// deletion (`deleted`).
    pub fn observe(&mut self, object: &Value, deleted: bool) {
        let key = key_of(object);
        match (!deleted).then(|| intent_of(object)).flatten() {
            Some(intent) => {
                let hash = hash_of(&intent);
                if self.objects.get(&key).is_none_or(|(_, held)| *held != hash) {
                    self.objects.insert(key.clone(), (intent, hash));
                    self.changed.insert(key);
                }
            }
            None => {
                if self.objects.remove(&key).is_some() {
                    self.changed.insert(key);
                }
            }
        }
    }

    /// Takes in every stored object at once: those not among them are gone.
    pub fn observe_all(&mut self, objects: &[Value]) {
        let present: BTreeSet<(String, String)> = objects.iter().map(key_of).collect();
        let gone: Vec<_> = self.objects.keys().filter(|k| !present.contains(*k)).cloned().collect();
        for key in gone {
            self.objects.remove(&key);
            self.changed.insert(key);
        }
        for object in objects {
            self.observe(object, false);
        }
    }

    /// Takes in the secrets as they are now.
    pub fn observe_secrets(&mut self, secrets: BTreeMap<String, String>) {
        let keys: BTreeSet<&String> = secrets.keys().chain(self.secrets.keys()).collect();
        self.changed_secrets.extend(keys.into_iter().filter(|k| secrets.get(*k) != self.secrets.get(*k)).cloned());
        self.secrets = secrets;
    }

    pub fn is_changed(&self) -> bool {
        !self.changed.is_empty() || !self.changed_secrets.is_empty()
    }

    pub fn digest(&self) -> String {
        combine(self.objects.values().map(|(_, hash)| *hash), &self.secrets)
    }

    /// Moves to the next serial: the delta from the one before, what
    /// changed since (and that is forgotten).
    pub fn next_serial(&mut self) -> Delta {
        let from = self.serial;
        self.serial += 1;
        let (mut upserts, mut deletes) = (Vec::new(), Vec::new());
        for key in std::mem::take(&mut self.changed) {
            match self.objects.get(&key) {
                Some((intent, _)) => upserts.push(intent.clone()),
                None => deletes.push(key),
            }
        }
        let secrets = std::mem::take(&mut self.changed_secrets)
            .into_iter()
            .map(|k| (k.clone(), self.secrets.get(&k).cloned()))
            .collect();
        Delta { from, serial: self.serial, digest: self.digest(), upserts, deletes, secrets }
    }

    /// Moves on to `serial` with no delta (whoever holds an older copy
    /// needs the whole document); what changed is in that document.
    pub fn jump_to(&mut self, serial: u64) {
        self.serial = self.serial.max(serial);
        self.changed.clear();
        self.changed_secrets.clear();
    }

    /// The whole configuration at the current serial.
    pub fn document(&self) -> Configuration {
        Configuration {
            serial: self.serial,
            digest: self.digest(),
            objects: self.objects.values().map(|(intent, _)| intent.clone()).collect(),
            secrets: self.secrets.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(name: &str, role: &str, ready: bool) -> Value {
        json!({"kind": "Node", "metadata": {"name": name, "resourceVersion": "7", "generation": 1},
               "spec": {"role": role}, "status": {"ready": ready}})
    }

    #[test]
    fn the_serial_rises_with_intent_and_not_with_status() {
        let mut intents = Intents::default();
        intents.observe(&node("n1", "candidate", true), false);
        let first = intents.next_serial();
        assert_eq!((first.from, first.serial), (0, 1));
        intents.observe(&node("n1", "candidate", false), false);
        assert!(!intents.is_changed(), "status is not intent");
        intents.observe(&node("n1", "drained", true), false);
        assert!(intents.is_changed());
        assert_eq!(intents.next_serial().serial, 2);
        let (mut one, mut other) = (Intents::default(), Intents::default());
        one.observe_all(&[node("n2", "regular", true), node("n1", "candidate", true)]);
        other.observe_all(&[node("n1", "candidate", true), node("n2", "regular", true)]);
        assert_eq!(one.digest(), other.digest(), "order does not matter");
        one.observe_secrets(BTreeMap::from([("/secrets/ca".to_string(), "{}".to_string())]));
        assert_ne!(one.digest(), other.digest(), "a secret is part of the configuration");
    }

    #[test]
    fn a_master_started_from_the_copy_learns_addresses_and_member_states_not_observations() {
        let node = intent_of(&node("n1", "candidate", true)).unwrap();
        assert_eq!(node["metadata"].get("resourceVersion"), None);
        assert_eq!(node.get("status"), None, "a node with no address has no status here");
        let mut with_address = super::tests::node("n1", "candidate", true);
        with_address["status"]["address"] = json!("127.0.0.1:7001");
        assert_eq!(intent_of(&with_address).unwrap()["status"], json!({"address": "127.0.0.1:7001"}));
        let member = json!({"kind": "Member", "metadata": {"name": "m", "uid": "u", "ownerReferences": [{"uid": "c"}]},
            "spec": {"node": "n1"},
            "status": {"state": "configured", "ready": true, "reason": "x",
                       "stateDetail": {"lastConfiguredInstance": "i1", "lastKnownState": "running"}}});
        let kept = intent_of(&member).unwrap();
        assert_eq!(kept["metadata"]["ownerReferences"], json!([{"uid": "c"}]), "ownership survives");
        assert_eq!(kept["status"], json!({"state": "configured", "stateDetail": {"lastConfiguredInstance": "i1"}}));
        let mut observed = member.clone();
        observed["status"]["readyChangedAt"] = json!("2026-12-01T10:00:00.000Z");
        observed["status"]["notReadyReason"] = json!("its node is NotReady");
        observed["status"]["stateDetail"]["crashLoop"] = json!({"runs": 3, "lastExit": "exit status: 3"});
        observed["status"]["stateDetail"]["configDataDigest"] = json!("ab12");
        assert_eq!(intent_of(&observed).unwrap(), kept, "what is observed of a member is not configuration");
    }

    #[test]
    fn an_operation_keeps_its_progress_in_the_copy_but_not_its_blocker() {
        let drain = json!({"kind": "Operation", "metadata": {"name": "drain-n3"},
            "spec": {"action": {"type": "Drain", "node": "n3"}},
            "status": {"phase": "Succeeded", "done": 1, "total": 1,
                       "steps": [{"member": "m", "state": "Done", "since": "2026-12-01T10:00:00.000Z"}],
                       "blocker": {"message": "waiting for m", "since": "2026-12-01T10:00:00.000Z"},
                       "history": [{"at": "2026-12-01T10:00:00.000Z", "message": "node n3 drained"}]}});
        let kept = intent_of(&drain).unwrap();
        assert_eq!(kept["status"]["phase"], "Succeeded", "a finished Operation stays finished");
        assert_eq!(kept["status"]["steps"], drain["status"]["steps"], "what it did is kept");
        assert_eq!(kept["status"]["history"], drain["status"]["history"]);
        assert_eq!(kept["status"].get("blocker"), None);
    }

    fn secrets(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_delta_takes_a_copy_to_the_next_configuration_and_is_checked() {
        let mut intents = Intents::default();
        intents.observe_all(&[node("n1", "candidate", true), node("n2", "regular", true)]);
        intents.observe_secrets(secrets(&[("/s/a", "1")]));
        intents.next_serial();
        let before = intents.document();
        intents.observe_all(&[node("n1", "candidate", true), node("n3", "drained", true)]);
        intents.observe_secrets(secrets(&[("/s/b", "2")]));
        let change = intents.next_serial();
        let after = intents.document();
        assert_eq!((change.from, change.serial, change.upserts.len()), (1, 2, 1));
        assert_eq!(change.deletes, vec![("Node".to_string(), "n2".to_string())]);
        assert_eq!(change.secrets.get("/s/a"), Some(&None));
        assert_eq!(apply(&before, &change).unwrap(), after);
        assert!(apply(&after, &change).unwrap_err().contains("starts at 1"));
        let tampered = Delta { upserts: Vec::new(), ..change };
        assert!(apply(&before, &tampered).unwrap_err().contains("needs the whole document"));
        let restarted = Intents::of(&after);
        assert_eq!((restarted.serial(), restarted.digest(), restarted.is_changed()), (2, after.digest, false));
    }

    proptest::proptest! {
        /// Whatever the changes, one at a time or all at once, each
        /// serial's delta takes the previous document to the next, and
        /// the digest is that of the document's objects.
        #[test]
        fn each_delta_takes_the_previous_document_to_the_next(
            steps in proptest::collection::vec(
                (proptest::collection::btree_map("n[0-9]", "candidate|regular|drained", 0..8),
                 proptest::collection::btree_set("n[0-9]", 0..3),
                 proptest::bool::ANY),
                1..6),
        ) {
            let mut intents = Intents::default();
            let mut before = intents.document();
            for (roles, deleted, all_at_once) in steps {
                let nodes: Vec<Value> = roles.iter().map(|(n, r)| node(n, r, true)).collect();
                if all_at_once {
                    intents.observe_all(&nodes);
                } else {
                    for object in &nodes {
                        intents.observe(object, false);
                    }
                }
                for name in &deleted {
                    intents.observe(&node(name, "regular", true), true);
                }
                let change = intents.next_serial();
                let after = intents.document();
                proptest::prop_assert_eq!(&after.digest, &digest_of(&after.objects, &after.secrets));
                proptest::prop_assert_eq!(apply(&before, &change).unwrap(), after.clone());
                before = after;
            }
        }
    }

    #[test]
    fn a_settled_command_is_no_longer_intent() {
        let command = |state: &str| json!({"kind": "Command", "metadata": {"name": "c"}, "spec": {}, "status": {"stateByManagement": state}});
        assert!(intent_of(&command("PROCESSING")).is_some());
        assert!(intent_of(&command("COMPLETED")).is_none());
        assert!(intent_of(&json!({"kind": "Command", "metadata": {"name": "c"}, "spec": {}})).is_some());
    }
}
