//! `AppCluster`: an instance of an App: which App, and per role how many
//! members and what to change for them. Its status carries
//! `memberStateRollup` (KubeDirector's flags: membership changing, members
//! down, initializing, waiting, restarting, config errors) and
//! `specGenerationToProcess`; [`rollup`] computes the rollup from the
//! members' statuses, one flag per member condition.

use crate::descriptor::{Cell, Column};
use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::member::{LastKnownState, MemberState, MemberStatus};
use super::update_policy::UpdatePolicy;
use crate::resource::{Object, Resource};
use crate::time::{HumanDuration, Timestamp};
use crate::validation::{FieldPath, ValidationErrors, check_env, check_name, check_unique_names};

pub type AppCluster = Object<AppClusterSpec>;

/// The most members one role may ask for.
pub const MAX_MEMBERS_PER_ROLE: u32 = 1000;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AppClusterSpec {
    /// The App this is an instance of.
    pub app_ref: String,
    pub roles: Vec<ClusterRole>,
    /// The revision of its App it runs (`herd app history`): new members
    /// start as it, and an upgrade brings running ones to it. None: the
    /// App's latest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_revision: Option<i64>,
    /// How running members take a new revision.
    #[serde(default, skip_serializing_if = "UpdatePolicy::is_default")]
    pub update_policy: UpdatePolicy,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterRole {
    /// One of the App's roles.
    pub name: String,
    pub members: u32,
    /// Added to (and winning over) the App's environment for this role.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Members go only to nodes with these labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
}

/// Where the cluster as a whole stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ClusterState {
    /// Its first members are being placed and set up.
    #[default]
    Creating,
    /// Every member is configured and nothing is pending.
    Configured,
    /// A change (members added or removed, a spec change, restarts) is
    /// being carried into the members.
    Updating,
    /// Some member is in config error.
    Error,
}

/// memberStateRollup: what is going on with members, at a glance.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberStateRollup {
    /// Members being added (create pending or creating, never configured
    /// before) or removed (delete pending or deleting).
    pub membership_changing: bool,
    /// Members terminated, unresponsive or absent, not counting those
    /// create pending or deleting.
    pub members_down: bool,
    /// Members waiting for their persistent volumes to be set up.
    pub members_initializing: bool,
    /// Members waiting for something else before they can start.
    pub members_waiting: bool,
    /// Members coming back up (create pending or creating, configured before).
    pub members_restarting: bool,
    /// Members in config error.
    pub config_errors: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AppClusterStatus {
    #[serde(default)]
    pub state: ClusterState,
    /// The generation whose spec is to be carried into the members (set
    /// when a spec change still has to reach them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_generation_to_process: Option<i64>,
    #[serde(default)]
    pub member_state_rollup: MemberStateRollup,
    /// The generation the last reconcile pass saw (admission waits for a
    /// pass over a spec change before it accepts the next one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Why the cluster cannot make progress (its App is missing), or which
    /// members keep it from being configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The leader of each role that has one (its App says `leader:`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leaders: Vec<RoleLeader>,
    /// The revision of its App the cluster runs (its `appRevision`, or the
    /// App's latest) as the last pass read it: what new members start as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_revision: Option<i64>,
}

/// A role's leader lease as granted: renewals are not written (the leader
/// renews it in its heartbeat answers and judges its expiry on its own
/// monotonic clock), only grants and what the operator needs to know.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RoleLeader {
    pub role: String,
    /// The member that leads, and its run (none: the role has no leader).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// Only rises: each grant is the term before plus one.
    pub term: u64,
    /// The role's lease times as its App says now: how long a lease
    /// holds unrenewed, and how long a renewal holds on the leader's side.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_duration: Option<HumanDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_deadline: Option<HumanDuration>,
    /// When the holder was granted its term.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
    /// Why the role has no leader, or why its leader's lease is not renewed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    /// Its holder's lease is not renewed any more (its promote hook
    /// failed): the next leader is chosen once it has expired.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub revoked: bool,
    /// The members the leader last reported in sync (every write it
    /// acknowledged is on them): with `synchronous`, only they may be the
    /// next leader.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_sync: Vec<String>,
    /// The last grants, oldest first (at most [`KEPT_TRANSITIONS`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transitions: Vec<LeaderTransition>,
}

/// How many of a role's leader transitions its status keeps.
pub const KEPT_TRANSITIONS: usize = 10;

/// A term granted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaderTransition {
    pub term: u64,
    pub member: String,
    pub at: Timestamp,
    pub reason: String,
}

/// The rollup of these member statuses (computed at the end of every pass).
pub fn rollup<'a>(members: impl IntoIterator<Item = &'a MemberStatus>) -> MemberStateRollup {
    use LastKnownState as K;
    use MemberState as S;
    let mut rollup = MemberStateRollup::default();
    for member in members {
        let adding_or_back = matches!(member.state, S::CreatePending | S::Creating);
        let removing = matches!(member.state, S::DeletePending | S::Deleting);
        let known = member.state_detail.last_known_state;
        rollup.membership_changing |= (adding_or_back && !member.was_configured()) || removing;
        rollup.members_restarting |= adding_or_back && member.was_configured();
        rollup.members_down |= matches!(known, K::Terminated | K::Unresponsive | K::Absent)
            && !matches!(member.state, S::CreatePending | S::Deleting);
        rollup.members_initializing |= known == K::Initializing;
        rollup.members_waiting |= known == K::Waiting;
        rollup.config_errors |= member.state == S::ConfigError;
    }
    rollup
}

/// The cluster's status after a pass over `members` at `generation`:
/// the rollup, the state, and the members that keep it from configured.
pub fn cluster_status(spec: &AppClusterSpec, generation: i64, members: &[super::member::Member]) -> AppClusterStatus {
    let statuses: Vec<&MemberStatus> = members.iter().map(|m| &m.status).collect();
    let member_state_rollup = rollup(statuses.iter().copied());
    let wanted: u32 = spec.roles.iter().map(|r| r.members).sum();
    let stale = |s: &MemberStatus| {
        s.state == MemberState::Configured && s.state_detail.last_config_data_generation != Some(generation)
    };
    let mut blocking: Vec<String> = members
        .iter()
        .filter_map(|m| {
            let s = &m.status;
            let notifies = s.state_detail.pending_notify_cmds.len();
            let why = match s.state {
                MemberState::Configured if notifies > 0 => format!("{notifies} notifies pending"),
                MemberState::Configured if stale(s) => "its configmeta is being updated".to_string(),
                MemberState::Configured => return None,
                state => format!("{state:?}"),
            };
            let reason = s.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
            Some(format!("{} ({why}{reason})", m.metadata.name))
        })
        .collect();
    blocking.sort();
    let all_configured = blocking.is_empty() && members.len() == wanted as usize;
    let state = if member_state_rollup.config_errors {
        ClusterState::Error
    } else if all_configured {
        ClusterState::Configured
    } else if members.iter().any(|m| m.status.was_configured()) {
        ClusterState::Updating
    } else {
        ClusterState::Creating
    };
    AppClusterStatus {
        state,
        spec_generation_to_process: statuses.iter().any(|s| stale(s)).then_some(generation),
        member_state_rollup,
        observed_generation: Some(generation),
        reason: (!blocking.is_empty()).then(|| format!("waiting for {}", blocking.join(", "))),
        leaders: Vec::new(),
        app_revision: None,
    }
}

impl AppClusterSpec {
    pub fn role(&self, name: &str) -> Option<&ClusterRole> {
        self.roles.iter().find(|r| r.name == name)
    }
}

impl Resource for AppClusterSpec {
    const KIND: &'static str = "AppCluster";
    const PLURAL: &'static str = "appclusters";
    const SHORT: &'static str = "ac";
    const REPLICATED: bool = true;
    const COLUMNS: &'static [Column] = &[
        Column::NAME,
        Column::of("APP", Cell::Text { path: "/spec/appRef" }),
        Column::of("STATE", Cell::TextOr { path: "/status/state", otherwise: "creating" }),
        Column::of("MEMBERS", Cell::EachPair { path: "/spec/roles", key: "/name", value: "/members" }),
        Column::of("ROLLUP", Cell::TrueKeys { path: "/status/memberStateRollup" }),
        Column::AGE,
    ];
    const HAS_STATUS: bool = true;
    type Status = AppClusterStatus;

    fn validate_spec(&self, path: &FieldPath, errors: &mut ValidationErrors) {
        check_name(&path.child("appRef"), &self.app_ref, errors);
        if self.roles.is_empty() {
            errors.add(&path.child("roles"), "a cluster needs at least one role");
        }
        check_unique_names(&path.child("roles"), self.roles.iter().map(|r| r.name.as_str()), errors);
        for (i, role) in self.roles.iter().enumerate() {
            let path = path.child("roles").key(&i.to_string());
            if role.members > MAX_MEMBERS_PER_ROLE {
                errors.add(
                    &path.child("members"),
                    format!("must be at most {MAX_MEMBERS_PER_ROLE}, is {}", role.members),
                );
            }
            check_env(&path.child("env"), &role.env, errors);
        }
        if let Some(revision) = self.app_revision
            && revision < 1
        {
            errors
                .add(&path.child("appRevision"), format!("must be at least 1 (revisions count from 1), is {revision}"));
        }
        self.update_policy.validate(&path.child("updatePolicy"), errors);
    }

    fn validate_spec_update(&self, old: &Self, path: &FieldPath, errors: &mut ValidationErrors) {
        if self.app_ref != old.app_ref {
            errors.add(&path.child("appRef"), format!("is immutable (was {:?}): create a new cluster", old.app_ref));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::member::StateDetail;

    fn member(state: MemberState, known: LastKnownState, configured_before: bool) -> MemberStatus {
        MemberStatus {
            state,
            state_detail: StateDetail {
                last_known_state: known,
                last_configured_instance: configured_before.then(|| "i-1".to_string()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn rule_a_new_member_or_a_leaving_one_is_membership_changing() {
        use LastKnownState as K;
        use MemberState as S;
        assert!(rollup([&member(S::CreatePending, K::Absent, false)]).membership_changing);
        assert!(rollup([&member(S::Creating, K::Running, false)]).membership_changing);
        assert!(rollup([&member(S::DeletePending, K::Running, true)]).membership_changing);
        assert!(rollup([&member(S::Deleting, K::Running, true)]).membership_changing);
        assert!(!rollup([&member(S::Creating, K::Running, true)]).membership_changing, "a restart is not");
    }

    #[test]
    fn rule_a_member_configured_before_and_coming_back_is_restarting() {
        use LastKnownState as K;
        use MemberState as S;
        assert!(rollup([&member(S::CreatePending, K::Running, true)]).members_restarting);
        assert!(rollup([&member(S::Creating, K::Running, true)]).members_restarting);
        assert!(!rollup([&member(S::Creating, K::Running, false)]).members_restarting);
        assert!(!rollup([&member(S::Configured, K::Running, true)]).members_restarting);
    }

    #[test]
    fn rule_down_is_terminated_unresponsive_or_absent_except_create_pending_and_deleting() {
        use LastKnownState as K;
        use MemberState as S;
        for known in [K::Terminated, K::Unresponsive, K::Absent] {
            assert!(rollup([&member(S::Configured, known, true)]).members_down, "{known:?}");
            assert!(rollup([&member(S::Creating, known, false)]).members_down, "{known:?}");
            assert!(!rollup([&member(S::CreatePending, known, false)]).members_down, "{known:?}");
            assert!(!rollup([&member(S::Deleting, known, true)]).members_down, "{known:?}");
        }
        assert!(!rollup([&member(S::Configured, K::Running, true)]).members_down);
    }

    #[test]
    fn rule_initializing_waiting_and_config_errors() {
        use LastKnownState as K;
        use MemberState as S;
        assert!(rollup([&member(S::Creating, K::Initializing, false)]).members_initializing);
        assert!(rollup([&member(S::Creating, K::Waiting, false)]).members_waiting);
        assert!(rollup([&member(S::ConfigError, K::Running, false)]).config_errors);
        let calm = rollup([&member(S::Configured, K::Running, true), &member(S::Configured, K::Running, true)]);
        assert_eq!(calm, MemberStateRollup::default(), "a configured cluster is quiet");
    }

    #[test]
    fn a_cluster_names_its_app_and_roles_and_keeps_its_app() {
        let cluster = AppCluster::from_json_value(serde_json::json!({
            "metadata": {"name": "db"},
            "spec": {"appRef": "etcd", "roles": [{"name": "member", "members": 3, "env": {"1X": "y"}},
                                                 {"name": "member", "members": 5000}]}
        }))
        .unwrap();
        let error = cluster.validate().unwrap_err();
        let fields: Vec<_> = error.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["spec.roles[1].name", "spec.roles[0].env[1X]", "spec.roles[1].members"]);
        let other = AppClusterSpec { app_ref: "redis".into(), ..cluster.spec.clone() };
        let mut errors = ValidationErrors::new();
        other.validate_spec_update(&cluster.spec, &FieldPath::root("spec"), &mut errors);
        assert!(errors.to_string().starts_with("spec.appRef: is immutable"), "{errors}");
    }
}
