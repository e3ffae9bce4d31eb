//! `Member`: one slot of one role of an AppCluster, named
//! `<cluster>-<role>-<index>`, owned by its cluster, labelled with cluster
//! and role, bound to one node. Its status is KubeDirector's member state
//! and `stateDetail` (how members survive host and member restarts).

use crate::descriptor::{Cell, Column};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::resource::{Object, Resource};
use crate::time::Timestamp;
use crate::validation::{FieldPath, ValidationErrors, check_name};

pub type Member = Object<MemberSpec>;

/// The label every Member carries with its cluster's name.
pub const CLUSTER_LABEL: &str = "herd.io/cluster";
/// The label every Member carries with its role's name.
pub const ROLE_LABEL: &str = "herd.io/role";

/// The name of the member in slot `index` of `role` in `cluster`.
pub fn member_name(cluster: &str, role: &str, index: u32) -> String {
    format!("{cluster}-{role}-{index}")
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemberSpec {
    pub cluster: String,
    pub role: String,
    pub index: u32,
    /// The node it is bound to (None: not placed yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Its named ports on that node, allocated with the binding.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub ports: std::collections::BTreeMap<String, u16>,
    /// What has been asked of it that its cluster's controller carries
    /// out (and clears once done).
    #[serde(default, skip_serializing_if = "MemberRequests::is_empty")]
    pub requests: MemberRequests,
    /// What it takes of its node: its role's requests when it was bound,
    /// counted against the node's allocatable.
    #[serde(default, skip_serializing_if = "crate::resources::Amounts::is_zero")]
    pub resources: crate::resources::Amounts,
    /// The revision of its App it is to run: its cluster's when it was
    /// made, changed only by an upgrade (which restarts it as the new one)
    /// or its revert. Its status says which one it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_revision: Option<i64>,
}

/// Disruptions asked of a member, each with when it was asked: an
/// eviction approved by its budgets, a drain past its deadline, a rolling
/// restart, or an operator's `herd member replace`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemberRequests {
    /// Start it over as a new member on another node (it keeps no data,
    /// or the operator gives its data up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace: Option<Timestamp>,
    /// Move it to another node with its persistent volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migrate: Option<Timestamp>,
    /// Restart it where it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<Timestamp>,
}

impl MemberRequests {
    pub fn is_empty(&self) -> bool {
        self.replace.is_none() && self.migrate.is_none() && self.restart.is_none()
    }

    /// Whether it is asked to leave its node (replaced or moved).
    pub fn to_leave(&self) -> bool {
        self.replace.is_some() || self.migrate.is_some()
    }
}

/// A member's states: created, set up, in config error, or on its way out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum MemberState {
    #[default]
    CreatePending,
    Creating,
    Configured,
    ConfigError,
    DeletePending,
    Deleting,
}

/// What herd last saw of the member's process (KubeDirector's
/// lastKnownContainerState).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum LastKnownState {
    /// Running, and herd can run commands in it and its readiness check passes.
    Running,
    /// Running, but its readiness check fails or herd cannot run commands in it.
    Unresponsive,
    /// Its persistent volumes are being set up (copied in).
    Initializing,
    /// Waiting for something else before it can start.
    Waiting,
    /// Its process ended.
    Terminated,
    /// No process exists for it.
    Absent,
    #[default]
    Unknown,
}

/// A notify queued for a configured member: the setup script's arguments,
/// and how delivering it has gone.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PendingNotify {
    /// `--addnodes --role R --members a,b` or `--delnodes ...`.
    pub arguments: Vec<String>,
    #[serde(default)]
    pub attempts: u32,
    /// The last attempt's exit code and the tail of its standard error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When it was queued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
    /// When the last attempt failed (the next waits: see `notifies::notify_due`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt: Option<Timestamp>,
}

/// KubeDirector's stateDetail, with instance ids for container ids.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StateDetail {
    /// Set while in config error, and kept after a restart from it until
    /// setup is tried again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_error_detail: Option<String>,
    /// The cluster generation whose configmeta the member was last given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_config_data_generation: Option<i64>,
    /// `ConfigMeta::digest` of the configmeta it was last given.
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "configDataTopology")]
    pub config_data_digest: Option<String>,
    /// The generation its setup script last processed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_setup_generation: Option<i64>,
    /// The instance being set up, while creating.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuring_instance: Option<String>,
    /// The instance that last reached configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_configured_instance: Option<String>,
    /// The instance whose setup herd launched (its status file may not
    /// have been reported yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup_launched_instance: Option<String>,
    #[serde(default)]
    pub last_known_state: LastKnownState,
    /// Its process keeps exiting within seconds of starting (its node's
    /// word), while it does: how many runs in a row, how the last ended,
    /// when the agent starts it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crash_loop: Option<crate::api::CrashLoop>,
    /// The last time the kernel killed its process for want of memory,
    /// as its node reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_oom_kill: Option<crate::api::OomKill>,
    /// Its persistent volumes that its node had and lost (its node's
    /// word): it is not started on empty ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost_volumes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_notify_cmds: Vec<PendingNotify>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemberStatus {
    #[serde(default)]
    pub state: MemberState,
    /// The revision of its App its run was made from, as of its last
    /// start or move.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_revision: Option<i64>,
    #[serde(default)]
    pub state_detail: StateDetail,
    /// Configured, running on a Ready node and passing its readiness
    /// check (what budgets count).
    #[serde(default)]
    pub ready: bool,
    /// When `ready` last changed (or was first judged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_changed_at: Option<Timestamp>,
    /// Why it is not ready, while it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_ready_reason: Option<String>,
    /// Why it waits, or what went wrong last (a placement no node can
    /// take, a refused or failed command).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Its start, configure or remove Commands that failed in a row, and
    /// when the last did: the next waits (`member_sync::command_due`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failed_commands: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<Timestamp>,
    /// The node it was replaced or evicted from: it is not placed there
    /// again (it would find its old process there and take it back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_from: Option<String>,
    /// Its instances from before it was replaced or evicted: one may still
    /// run where it was, being removed there, and is never taken as the
    /// new member's own (the last few are kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired_instances: Vec<String>,
    /// A move with its data under way (an eviction of a member with
    /// persistent volumes): `crate::migration` says each step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<Migration>,
    /// A restart in place under way (a rolling restart): `crate::restart`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<RestartProgress>,
    /// The revision it ran before it was restarted as another (an upgrade,
    /// or its revert), until it is configured as that one: its setup runs
    /// the upgrade's hooks (`crate::upgrade_hooks`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgraded_from: Option<i64>,
    /// Why it was not restarted as the revision it is to run (its node
    /// has no room for what that revision requests): an upgrade stops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_refused: Option<String>,
    /// It leads its role now: its lease is held and renewed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub leader: bool,
    /// The term it leads in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_term: Option<u64>,
    /// The term it was last promoted in (its promote hook succeeded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoted_in: Option<u64>,
    /// The term whose promote hook failed on it: it is not that term's
    /// leader (its lease goes unrenewed), and another is chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promote_failed: Option<u64>,
    /// It stood down as its role's leader for a handover (its Demote
    /// Command succeeded): its lease ends at once, and the next leader
    /// catches up to where it stood down first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stood_down: Option<StoodDown>,
}

/// Where a leader stood down for a handover.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StoodDown {
    pub term: u64,
    /// What its `position` command printed after its demote hook (none:
    /// no command, or no answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<String>,
}

/// A member being restarted in place: the instance it replaces (its
/// node's report says whether that one still runs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RestartProgress {
    pub instance: String,
}

/// Where a member moves with its data, and how far it got.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Migration {
    pub from: String,
    pub to: String,
    /// Its ports on `to`, allocated when the target was chosen.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub ports: std::collections::BTreeMap<String, u16>,
    /// The MigrateMember Command succeeded: it runs on `to` with its data.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub done: bool,
    /// The MigrateMember Command failed, with why: it stays on `from`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

/// Member `db-r-<index>` of cluster `db`, role `r`, bound to `node`: the
/// core's tests' fixture.
#[cfg(test)]
pub(crate) fn bound_member(index: u32, node: &str) -> Member {
    slot_member("r", index, Some(node))
}

/// For tests: the member of slot `index` of `role` in cluster `db`.
#[cfg(test)]
pub(crate) fn slot_member(role: &str, index: u32, node: Option<&str>) -> Member {
    let spec = MemberSpec {
        cluster: "db".into(),
        role: role.into(),
        index,
        node: node.map(str::to_string),
        ..Default::default()
    };
    Member::new(member_name("db", role, index), spec)
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl MemberStatus {
    /// It reached configured before (so coming back now is a restart).
    pub fn was_configured(&self) -> bool {
        self.state_detail.last_configured_instance.is_some()
    }
}

impl Resource for MemberSpec {
    const KIND: &'static str = "Member";
    const PLURAL: &'static str = "members";
    const SHORT: &'static str = "mem";
    const REPLICATED: bool = true;
    const COLUMNS: &'static [Column] = &[
        Column::NAME,
        Column::of("CLUSTER", Cell::Text { path: "/spec/cluster" }),
        Column::of("ROLE", Cell::Text { path: "/spec/role" }),
        Column::of("STATE", Cell::MemberState),
        Column::of("READY", Cell::YesNo { path: "/status/ready" }),
        Column::of("NODE", Cell::Text { path: "/spec/node" }),
        Column::of("LEADER", Cell::YesNo { path: "/status/leader" }),
        Column::of("TERM", Cell::Text { path: "/status/leaderTerm" }),
        Column::of(
            "INSTANCE",
            Cell::FirstOf {
                paths: &["/status/stateDetail/lastConfiguredInstance", "/status/stateDetail/configuringInstance"],
            },
        ),
        Column::of("REVISION", Cell::Text { path: "/status/appRevision" }),
        Column::AGE,
        Column::wide("LAST-KNOWN", Cell::Text { path: "/status/stateDetail/lastKnownState" }),
        Column::wide("REASON", Cell::FirstOf { paths: &["/status/notReadyReason", "/status/reason"] }),
    ];
    const HAS_STATUS: bool = true;
    type Status = MemberStatus;

    fn validate_spec(&self, path: &FieldPath, errors: &mut ValidationErrors) {
        check_name(&path.child("cluster"), &self.cluster, errors);
        check_name(&path.child("role"), &self.role, errors);
        if let Some(node) = &self.node {
            check_name(&path.child("node"), node, errors);
        }
        if let Some(revision) = self.app_revision
            && revision < 1
        {
            errors
                .add(&path.child("appRevision"), format!("must be at least 1 (revisions count from 1), is {revision}"));
        }
    }

    fn owned_labels(&self) -> Vec<(&'static str, String)> {
        vec![(CLUSTER_LABEL, self.cluster.clone()), (ROLE_LABEL, self.role.clone())]
    }

    fn validate_name_for_spec(&self, name: &str, errors: &mut ValidationErrors) {
        let expected = member_name(&self.cluster, &self.role, self.index);
        if name != expected {
            errors.add(
                &FieldPath::root("metadata").child("name"),
                format!("must be {expected:?}, the name of the slot its spec names (<cluster>-<role>-<index>)"),
            );
        }
    }

    fn validate_spec_update(&self, old: &Self, path: &FieldPath, errors: &mut ValidationErrors) {
        for (field, same) in [
            ("cluster", self.cluster == old.cluster),
            ("role", self.role == old.role),
            ("index", self.index == old.index),
        ] {
            if !same {
                errors.add(&path.child(field), "is immutable: a member keeps its slot");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_reads_with_its_defaults_and_keeps_its_slot() {
        let member = Member::from_json_value(serde_json::json!({
            "metadata": {"name": "db-member-0"},
            "spec": {"cluster": "db", "role": "member", "index": 0}
        }))
        .unwrap();
        member.validate().unwrap();
        let misnamed = Member::new("db-member-7", member.spec.clone());
        assert_eq!(
            misnamed.validate().unwrap_err().to_string(),
            "metadata.name: must be \"db-member-0\", the name of the slot its spec names (<cluster>-<role>-<index>)"
        );
        assert_eq!(member.status.state, MemberState::CreatePending);
        assert_eq!(member.status.state_detail.last_known_state, LastKnownState::Unknown);
        let moved = MemberSpec { index: 1, node: Some("n1".into()), ..member.spec.clone() };
        assert!(moved.ports.is_empty());
        let mut errors = ValidationErrors::new();
        moved.validate_spec_update(&member.spec, &FieldPath::root("spec"), &mut errors);
        assert_eq!(errors.to_string(), "spec.index: is immutable: a member keeps its slot");
    }

    #[test]
    fn states_are_written_in_camel_case_on_the_wire() {
        let json =
            serde_json::to_value(MemberStatus { state: MemberState::ConfigError, ..Default::default() }).unwrap();
        assert_eq!(json["state"], "configError");
        assert_eq!(json["stateDetail"]["lastKnownState"], "unknown");
    }
}
