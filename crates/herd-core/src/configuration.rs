//! The cluster configuration, Ganeti's `config.data`: every intent object
//! (Nodes, the ClusterConfig, Apps, AppClusters, Members and Commands not
//! yet settled) and the cluster's secrets (token hashes, the sealed CA),
//! with a serial that rises whenever any of them changes. Master
//! candidates keep a copy, enough to start a master from
//! (`herd cluster master-failover`); every node keeps the small facts (the
//! serial, the master's URLs and its term, Ganeti's ssconf).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::kinds::ManagementState;

/// The kinds (plurals) whose objects make up the configuration.
pub const CONFIGURATION_KINDS: [&str; 6] = ["nodes", "clusterconfigs", "apps", "appclusters", "members", "commands"];

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
    let key = |v: &Value| (v["kind"].as_str().unwrap_or_default().to_string(), v["metadata"]["name"].to_string());
    objects.sort_by_key(key);
    let mut hasher = blake3::Hasher::new();
    hasher.update(&serde_json::to_vec(&objects).unwrap_or_default());
    hasher.update(&serde_json::to_vec(&secrets).unwrap_or_default());
    let digest = hasher.finalize().to_hex().to_string();
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

    #[test]
    fn a_settled_command_is_no_longer_intent() {
        let command = |state: &str| json!({"kind": "Command", "metadata": {"name": "c"}, "spec": {}, "status": {"stateByManagement": state}});
        assert!(intent_of(&command("PROCESSING")).is_some());
        assert!(intent_of(&command("COMPLETED")).is_none());
        assert!(intent_of(&json!({"kind": "Command", "metadata": {"name": "c"}, "spec": {}})).is_some());
    }
}
