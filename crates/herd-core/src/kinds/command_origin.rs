//! [`CommandOrigin`]: why the app-cluster controller gave a member a
//! Command, recorded in the Command's spec so that its outcome is read
//! back by what it was for (a configure's generation, a notify's
//! arguments), not from strings in its annotations. Commands an operator
//! creates have no origin.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Whose Command it is and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandOrigin {
    /// The AppCluster the member belongs (or belonged) to.
    pub cluster: String,
    /// The member it is for.
    pub member: String,
    pub purpose: Purpose,
    /// The App's generation the run it starts was made from (a start or
    /// a move): what the member runs once it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_revision: Option<i64>,
}

/// What a Command does for its member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "camelCase", rename_all_fields = "camelCase", deny_unknown_fields)]
pub enum Purpose {
    /// Start its process.
    Start,
    /// Give it the configmeta of the cluster's `generation` (whose
    /// document has `digest`), and run its setup when asked.
    Configure { generation: i64, digest: String },
    /// Tell it of other members' changes: its setup script's `arguments`.
    Notify { arguments: Vec<String> },
    /// Remove it from its node with its volumes.
    Remove,
    /// Move it with its data (on the target node).
    Migrate,
    /// Stop it for a restart in place.
    Restart,
    /// Make it its role's leader in `term` (its role's promote hook).
    Promote { term: u64 },
    /// Make it stand down as its role's leader of `term`, for a handover.
    Demote { term: u64 },
}

impl Purpose {
    /// The word a Command's name carries (`<member>.<word>.<id>`).
    pub fn word(&self) -> &'static str {
        match self {
            Purpose::Start => "start",
            Purpose::Configure { .. } => "configure",
            Purpose::Notify { .. } => "notify",
            Purpose::Remove => "remove",
            Purpose::Migrate => "migrate",
            Purpose::Restart => "restart",
            Purpose::Promote { .. } => "promote",
            Purpose::Demote { .. } => "demote",
        }
    }
}

impl super::CommandSpec {
    /// The member a Command of the app-cluster controller is for.
    pub fn origin_member(&self) -> Option<&str> {
        self.origin.as_ref().map(|origin| origin.member.as_str())
    }

    /// The cluster a Command of the app-cluster controller is for.
    pub fn origin_cluster(&self) -> Option<&str> {
        self.origin.as_ref().map(|origin| origin.cluster.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_origin_on_the_wire() {
        let origin = CommandOrigin {
            cluster: "etcd".into(),
            member: "etcd-node-0".into(),
            purpose: Purpose::Configure { generation: 3, digest: "d1".into() },
            app_revision: None,
        };
        let wire = serde_json::to_value(&origin).unwrap();
        assert_eq!(
            wire,
            serde_json::json!({"cluster": "etcd", "member": "etcd-node-0",
                "purpose": {"type": "configure", "generation": 3, "digest": "d1"}})
        );
        assert_eq!(serde_json::from_value::<CommandOrigin>(wire).unwrap(), origin);
        let start = serde_json::json!({"cluster": "c", "member": "m", "purpose": {"type": "start"}});
        assert_eq!(serde_json::from_value::<CommandOrigin>(start).unwrap().purpose, Purpose::Start);
        let bad = serde_json::json!({"cluster": "c", "member": "m", "purpose": {"type": "launch"}});
        assert!(serde_json::from_value::<CommandOrigin>(bad).is_err());
    }
}
