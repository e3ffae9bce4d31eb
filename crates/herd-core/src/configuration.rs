//! The cluster configuration, Ganeti's `config.data`: every intent object
//! (Nodes, the ClusterConfig, Apps, AppClusters, Members, DisruptionBudgets
//! and Commands not yet settled) and the cluster's secrets (token hashes, the sealed CA),
//! with a serial that rises whenever any of them changes. Master
//! candidates keep a copy, enough to start a master from
//! (`herd cluster master-failover`); every node keeps the small facts (the
//! serial, the master's URLs and its term, Ganeti's ssconf).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::kinds::ManagementState;

/// The kinds (plurals) whose objects make up the configuration.
pub const CONFIGURATION_KINDS: [&str; 8] =
    ["nodes", "clusterconfigs", "apps", "appclusters", "members", "commands", "disruptionbudgets", "operations"];

/// The store keys under which the secrets are kept.
pub const SECRETS_PREFIX: &str = "/secrets/";

/// A configuration and its serial.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Configuration {
    pub serial: u64,
    /// blake3 of the objects, as written.
    pub digest: String,
    pub objects: Vec<Value>,
    /// Store key to value (JSON text) of every key under [`SECRETS_PREFIX`].
    #[serde(default)]
    pub secrets: BTreeMap<String, String>,
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
    let mut hasher = blake3::Hasher::new();
    hasher.update(&serde_json::to_vec(objects).unwrap_or_default());
    hasher.update(&serde_json::to_vec(secrets).unwrap_or_default());
    hasher.finalize().to_hex().to_string()
}

/// The delta that takes `previous` to `next`.
pub fn delta(previous: &Configuration, next: &Configuration) -> Delta {
    let before: BTreeMap<(String, String), &Value> = previous.objects.iter().map(|o| (key_of(o), o)).collect();
    let after: BTreeMap<(String, String), &Value> = next.objects.iter().map(|o| (key_of(o), o)).collect();
    let upserts = after.iter().filter(|(k, v)| before.get(*k) != Some(*v)).map(|(_, v)| (*v).clone()).collect();
    let deletes = before.keys().filter(|k| !after.contains_key(*k)).cloned().collect();
    let mut secrets: BTreeMap<String, Option<String>> = next
        .secrets
        .iter()
        .filter(|(k, v)| previous.secrets.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), Some(v.clone())))
        .collect();
    secrets.extend(previous.secrets.keys().filter(|k| !next.secrets.contains_key(*k)).map(|k| (k.clone(), None)));
    Delta { from: previous.serial, serial: next.serial, digest: next.digest.clone(), upserts, deletes, secrets }
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
/// the copy needs: a Node's address, and a Member's state and what it was
/// configured as (not what is observed of it every heartbeat). None for a
/// settled Command (no longer intent).
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
                fields.remove("ready");
                fields.remove("reason");
                if let Some(detail) = fields.get_mut("stateDetail").and_then(Value::as_object_mut) {
                    detail.remove("lastKnownState");
                }
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

/// The configuration made of `objects` (in a stable order), with the
/// serial after `previous`: the same when nothing changed, one more when
/// anything did.
pub fn next(
    previous: Option<&Configuration>,
    mut objects: Vec<Value>,
    secrets: BTreeMap<String, String>,
) -> Configuration {
    objects.sort_by_cached_key(key_of);
    let digest = digest_of(&objects, &secrets);
    let serial = match previous {
        Some(previous) if previous.digest == digest => previous.serial,
        Some(previous) => previous.serial + 1,
        None => 1,
    };
    Configuration { serial, digest, objects, secrets }
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
        let intent = |objects: Vec<Value>| objects.iter().filter_map(intent_of).collect::<Vec<_>>();
        let none = BTreeMap::new;
        let first = next(None, intent(vec![node("n1", "candidate", true)]), none());
        assert_eq!(first.serial, 1);
        let same = next(Some(&first), intent(vec![node("n1", "candidate", false)]), none());
        assert_eq!((same.serial, &same.digest), (1, &first.digest), "status is not intent");
        let changed = next(Some(&first), intent(vec![node("n1", "drained", true)]), none());
        assert_eq!(changed.serial, 2);
        let reordered =
            next(Some(&first), intent(vec![node("n2", "regular", true), node("n1", "candidate", true)]), none());
        let again =
            next(Some(&reordered), intent(vec![node("n1", "candidate", true), node("n2", "regular", true)]), none());
        assert_eq!(again.serial, reordered.serial, "order does not matter");
        let secrets = BTreeMap::from([("/secrets/ca".to_string(), "{}".to_string())]);
        let with_secret = next(Some(&again), again.objects.clone(), secrets);
        assert_eq!(with_secret.serial, again.serial + 1, "a secret is part of the configuration");
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
    }

    fn config(serial: u64, objects: Vec<Value>, secrets: &[(&str, &str)]) -> Configuration {
        let secrets = secrets.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let made = next(None, objects, secrets);
        Configuration { serial, ..made }
    }

    #[test]
    fn a_delta_takes_a_copy_to_the_next_configuration_and_is_checked() {
        let intent = |objects: Vec<Value>| objects.iter().filter_map(intent_of).collect::<Vec<_>>();
        let before =
            config(4, intent(vec![node("n1", "candidate", true), node("n2", "regular", true)]), &[("/s/a", "1")]);
        let after =
            config(5, intent(vec![node("n1", "candidate", true), node("n3", "drained", true)]), &[("/s/b", "2")]);
        let change = delta(&before, &after);
        assert_eq!((change.from, change.serial, change.upserts.len()), (4, 5, 1));
        assert_eq!(change.deletes, vec![("Node".to_string(), "n2".to_string())]);
        assert_eq!(change.secrets.get("/s/a"), Some(&None));
        assert_eq!(apply(&before, &change).unwrap(), after);
        assert!(apply(&after, &change).unwrap_err().contains("starts at 4"));
        let tampered = Delta { upserts: Vec::new(), ..change };
        assert!(apply(&before, &tampered).unwrap_err().contains("needs the whole document"));
    }

    proptest::proptest! {
        #[test]
        fn applying_the_delta_always_gives_the_next_configuration(
            first in proptest::collection::btree_map("n[0-9]", "candidate|regular|drained", 0..8),
            second in proptest::collection::btree_map("n[0-9]", "candidate|regular|drained", 0..8),
        ) {
            let nodes = |roles: &BTreeMap<String, String>| {
                roles.iter().map(|(n, r)| intent_of(&node(n, r, true)).unwrap()).collect::<Vec<_>>()
            };
            let before = config(1, nodes(&first), &[]);
            let after = config(2, nodes(&second), &[]);
            proptest::prop_assert_eq!(apply(&before, &delta(&before, &after)).unwrap(), after);
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
