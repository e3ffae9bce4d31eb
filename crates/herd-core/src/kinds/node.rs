//! `Node`: one host running a herd agent.
//!
//! The spec is the operator's wish (role, master capability, schedulability);
//! the status is what the agent and the node controller observed. "Master" is
//! not a field: it is the node whose server holds the lease.

use crate::descriptor::{Access, Cell, Column, NodeAccess};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::resource::{Object, Resource};
use crate::time::Timestamp;
use crate::validation::{FieldPath, ValidationErrors};

pub type Node = Object<NodeSpec>;

/// A node's one role (Ganeti's flags, made exclusive by construction).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum NodeRole {
    /// Master candidate: holds a copy of the configuration, may run a server.
    Candidate,
    #[default]
    Regular,
    /// No new members are placed here.
    Drained,
    /// Never contacted by the server.
    Offline,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeSpec {
    #[serde(default)]
    pub role: NodeRole,
    /// Whether this node may ever become a master candidate.
    #[serde(default = "yes")]
    pub master_capable: bool,
    /// Cordoned: no new members are scheduled here.
    #[serde(default)]
    pub unschedulable: bool,
}

fn yes() -> bool {
    true
}

impl Default for NodeSpec {
    fn default() -> Self {
        NodeSpec { role: NodeRole::Regular, master_capable: true, unschedulable: false }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConditionStatus {
    True,
    False,
    #[default]
    Unknown,
}

/// A named observation about the object, with why and since when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: ConditionStatus,
    pub reason: String,
    pub message: String,
    pub last_transition_time: Timestamp,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeStatus {
    #[serde(default)]
    pub ready: bool,
    /// Server time at which the last heartbeat arrived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat: Option<Timestamp>,
    /// Where the agent's own HTTP endpoint listens (`host:port`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Fresh at every start of the agent process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_boot_id: Option<String>,
    /// The host's kernel boot id: changes when the host reboots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_boot_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
    /// Serial of the configuration copy this node holds.
    #[serde(default)]
    pub config_serial: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Its server replica leads: this is the master's node (set by the
    /// leader; only a failover moves it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub master: bool,
    /// What the host has, as its agent reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<crate::resources::Amounts>,
    /// What members may request of it: its capacity less what its agent
    /// keeps back. None until its agent reports it: members that request
    /// anything are not placed here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocatable: Option<crate::resources::Amounts>,
    /// The members the agent runs, as of its last heartbeat.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<crate::api::MemberReport>,
}

impl NodeStatus {
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// Sets a condition; the transition time moves only when the status does.
    pub fn set_condition(&mut self, type_: &str, status: ConditionStatus, reason: &str, message: &str, now: Timestamp) {
        let new = |last_transition_time| Condition {
            type_: type_.to_string(),
            status,
            reason: reason.to_string(),
            message: message.to_string(),
            last_transition_time,
        };
        match self.conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(existing) => {
                let since = if existing.status == status { existing.last_transition_time } else { now };
                *existing = new(since);
            }
            None => self.conditions.push(new(now)),
        }
    }
}

impl Resource for NodeSpec {
    const KIND: &'static str = "Node";
    const PLURAL: &'static str = "nodes";
    const SHORT: &'static str = "no";
    const REPLICATED: bool = true;
    const ACCESS: Access = Access { node: NodeAccess::Own, viewer_reads: true };
    const COLUMNS: &'static [Column] = &[
        Column::NAME,
        Column::of("STATUS", Cell::NodeStatus),
        Column::of("ROLE", Cell::NodeRole),
        Column::of("ADDRESS", Cell::Text { path: "/status/address" }),
        Column::AGE,
        Column::wide("MASTER-CAPABLE", Cell::Text { path: "/spec/masterCapable" }),
        Column::wide("LAST-HEARTBEAT", Cell::Age { path: "/status/lastHeartbeat" }),
        Column::wide("AGENT-BOOT-ID", Cell::Text { path: "/status/agentBootId" }),
        Column::wide("VERSION", Cell::Text { path: "/status/agentVersion" }),
        Column::wide("CPU-ALLOCATABLE", Cell::Text { path: "/status/allocatable/cpu" }),
        Column::wide("MEMORY-ALLOCATABLE", Cell::Text { path: "/status/allocatable/memory" }),
        Column::LABELS,
    ];
    type Status = NodeStatus;

    fn validate_name(name: &str, errors: &mut ValidationErrors) {
        if name.len() > crate::validation::MAX_NODE_NAME_LENGTH {
            crate::validation::check_node_name(&FieldPath::root("metadata").child("name"), name, errors);
        }
    }

    fn validate_spec(&self, path: &FieldPath, errors: &mut ValidationErrors) {
        if self.role == NodeRole::Candidate && !self.master_capable {
            errors.add(&path.child("role"), "a node that is not masterCapable cannot be a master candidate");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_role_names_the_field() {
        let body = serde_json::json!({"metadata": {"name": "n1"}, "spec": {"role": "boss"}});
        let err = Node::from_json_value(body).unwrap_err();
        assert_eq!(err.errors[0].field, "spec.role");
        assert!(err.errors[0].reason.contains("unknown variant"), "{err}");
    }

    #[test]
    fn candidate_must_be_master_capable() {
        let mut node =
            Node::new("n1", NodeSpec { role: NodeRole::Candidate, master_capable: false, unschedulable: false });
        assert_eq!(node.validate().unwrap_err().errors[0].field, "spec.role");
        node.spec.master_capable = true;
        node.validate().unwrap();
    }

    #[test]
    fn condition_transition_time_moves_only_on_change() {
        let t0 = Timestamp::parse("2026-01-01T00:00:00Z").unwrap();
        let t1 = Timestamp::parse("2026-01-01T00:01:00Z").unwrap();
        let mut status = NodeStatus::default();
        status.set_condition("Ready", ConditionStatus::True, "Heartbeat", "", t0);
        status.set_condition("Ready", ConditionStatus::True, "Heartbeat", "", t1);
        assert_eq!(status.condition("Ready").unwrap().last_transition_time, t0);
        status.set_condition("Ready", ConditionStatus::False, "HeartbeatLost", "", t1);
        assert_eq!(status.condition("Ready").unwrap().last_transition_time, t1);
    }
}
