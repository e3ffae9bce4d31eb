//! The cluster configuration, Ganeti's `config.data`: every intent object
//! (Nodes, the ClusterConfig, Apps, AppClusters, and Commands not yet
//! settled), each without its status, with a serial that rises whenever
//! any of them changes. Master candidates keep a copy; every node keeps
//! the small facts (the serial and the master's URLs, Ganeti's ssconf).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::kinds::ManagementState;

/// The kinds (plurals) whose objects make up the configuration.
pub const CONFIGURATION_KINDS: [&str; 5] = ["nodes", "clusterconfigs", "apps", "appclusters", "commands"];

/// A configuration and its serial.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Configuration {
    pub serial: u64,
    /// blake3 of the objects, as written.
    pub digest: String,
    pub objects: Vec<Value>,
}

/// What every node is told: the serial and where the master serves.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Ssconf {
    pub serial: u64,
    pub master_urls: Vec<String>,
}

/// An object as the configuration keeps it: kind, name, labels,
/// generation and spec; no status, no revision (they change without the
/// intent changing). None for a settled Command (no longer intent).
pub fn intent_of(object: &Value) -> Option<Value> {
    let kind = object.get("kind")?.as_str()?;
    if kind == "Command" {
        let state = object.pointer("/status/stateByManagement").cloned().unwrap_or_default();
        if serde_json::from_value::<ManagementState>(state).is_ok_and(ManagementState::is_settled) {
            return None;
        }
    }
    let metadata = object.get("metadata")?;
    Some(serde_json::json!({
        "kind": kind,
        "metadata": {
            "name": metadata.get("name"),
            "labels": metadata.get("labels"),
            "generation": metadata.get("generation"),
        },
        "spec": object.get("spec"),
    }))
}

/// The configuration made of `objects` (in a stable order), with the
/// serial after `previous`: the same when nothing changed, one more when
/// anything did.
pub fn next(previous: Option<&Configuration>, mut objects: Vec<Value>) -> Configuration {
    let key = |v: &Value| (v["kind"].as_str().unwrap_or_default().to_string(), v["metadata"]["name"].to_string());
    objects.sort_by_key(key);
    let digest = blake3::hash(&serde_json::to_vec(&objects).unwrap_or_default()).to_hex().to_string();
    let serial = match previous {
        Some(previous) if previous.digest == digest => previous.serial,
        Some(previous) => previous.serial + 1,
        None => 1,
    };
    Configuration { serial, digest, objects }
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
        let first = next(None, intent(vec![node("n1", "candidate", true)]));
        assert_eq!(first.serial, 1);
        let same = next(Some(&first), intent(vec![node("n1", "candidate", false)]));
        assert_eq!((same.serial, &same.digest), (1, &first.digest), "status is not intent");
        let changed = next(Some(&first), intent(vec![node("n1", "drained", true)]));
        assert_eq!(changed.serial, 2);
        let reordered = next(Some(&first), intent(vec![node("n2", "regular", true), node("n1", "candidate", true)]));
        let again = next(Some(&reordered), intent(vec![node("n1", "candidate", true), node("n2", "regular", true)]));
        assert_eq!(again.serial, reordered.serial, "order does not matter");
    }

    #[test]
    fn a_settled_command_is_no_longer_intent() {
        let command = |state: &str| json!({"kind": "Command", "metadata": {"name": "c"}, "spec": {}, "status": {"stateByManagement": state}});
        assert!(intent_of(&command("PROCESSING")).is_some());
        assert!(intent_of(&command("COMPLETED")).is_none());
        assert!(intent_of(&json!({"kind": "Command", "metadata": {"name": "c"}, "spec": {}})).is_some());
    }
}
