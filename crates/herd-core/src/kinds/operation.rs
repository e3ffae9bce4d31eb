//! `Operation`: durable server-side work that takes a while and must
//! survive a leader failover: the drain of a node, the
//! rolling restart of a role, the switchover of a role's leader, the
//! upgrade of a cluster to another revision of its App. The
//! spec says what to do and how (a deadline and what happens at it, how
//! many members move at once); only `cancel` and `paused` may change
//! afterwards. The
//! status is the leader's record of every step (`crate::operation`
//! decides them), so a new leader goes on where the old one stopped.

use crate::descriptor::{Cell, Column};
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::update_policy::UpgradePace;
use crate::resource::{Object, Resource};
use crate::time::{HumanDuration, Timestamp};
use crate::validation::{FieldPath, ValidationErrors, check_duration, check_name};

pub type Operation = Object<OperationSpec>;

/// The label every Operation carries with the node or cluster it works on.
pub const TARGET_LABEL: &str = "herd.io/target";

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperationSpec {
    pub action: OperationAction,
    /// How long it may take; what then is `onDeadline`. None: no deadline
    /// (a budget that can never allow is still reported at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<HumanDuration>,
    #[serde(default)]
    pub on_deadline: OnDeadline,
    /// How many members may be on their way at once (evicted and not
    /// ready again yet); the budgets may allow fewer.
    #[serde(default = "one")]
    pub max_parallel: u32,
    /// Set by `herd operation cancel`: nothing more is started; what was
    /// approved already goes on (a member half moved is not left so).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cancel: bool,
    /// Set by `herd operation pause` (and cleared by `resume`): nothing
    /// more is started meanwhile; what was asked for goes on, and is
    /// followed (an upgrade's member that misses its deadline still
    /// stops it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

fn one() -> u32 {
    1
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", deny_unknown_fields)]
pub enum OperationAction {
    /// Mark the node drained (no new members) and evict every member it
    /// hosts, under the disruption budgets.
    Drain { node: String },
    /// Restart every member of one role of an AppCluster in place, each
    /// asked of its budgets first: `canary` of them first, alone, and the
    /// rest only once those came back configured (BOSH's canaries).
    Restart {
        cluster: String,
        role: String,
        #[serde(default)]
        canary: u32,
    },
    /// Hand the lease of a leader role of an AppCluster to another member
    /// (`to`, or the most advanced that may lead): the leader is demoted
    /// first, and the next leader promoted once it has every write the
    /// old one had (`crate::switchover`).
    Switchover {
        cluster: String,
        role: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        to: Option<String>,
    },
    /// Restart every member of an AppCluster as revision `toRevision` of
    /// its App (`crate::upgrade`), each asked of its budgets first:
    /// `canary` of them first and alone, a leader role's leader last;
    /// a member is done once ready for `minHealthyTime`, and one not so
    /// within `healthyDeadline` of its restart, or in config error, stops
    /// the upgrade (and with `autoRevert` returns every member it touched
    /// to the revision it ran before).
    Upgrade {
        cluster: String,
        #[serde(rename = "toRevision")]
        to_revision: i64,
        #[serde(default)]
        canary: u32,
        #[serde(rename = "minHealthyTime", default = "super::update_policy::min_healthy_time")]
        min_healthy_time: HumanDuration,
        #[serde(rename = "healthyDeadline", default = "super::update_policy::healthy_deadline")]
        healthy_deadline: HumanDuration,
        #[serde(rename = "autoRevert", default = "super::update_policy::yes")]
        auto_revert: bool,
    },
}

impl Default for OperationAction {
    fn default() -> Self {
        OperationAction::Drain { node: String::new() }
    }
}

impl OperationAction {
    /// The node or cluster it works on.
    pub fn target(&self) -> &str {
        match self {
            OperationAction::Drain { node } => node,
            OperationAction::Restart { cluster, .. }
            | OperationAction::Switchover { cluster, .. }
            | OperationAction::Upgrade { cluster, .. } => cluster,
        }
    }

    /// How an upgrade goes (None: not an upgrade).
    pub fn pace(&self) -> Option<UpgradePace> {
        match self {
            OperationAction::Upgrade { canary, min_healthy_time, healthy_deadline, auto_revert, .. } => {
                Some(UpgradePace {
                    canary: *canary,
                    min_healthy_time: *min_healthy_time,
                    healthy_deadline: *healthy_deadline,
                    auto_revert: *auto_revert,
                })
            }
            _ => None,
        }
    }
}

/// What happens to the members still waiting when the deadline passes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OnDeadline {
    /// The Operation ends Failed, naming what blocked it; the members
    /// left stay where they are.
    #[default]
    Fail,
    /// The Operation ends Stopped (given up, not an error); the members
    /// left stay where they are.
    Stop,
    /// The members left are evicted without asking their budgets (Nomad's
    /// deadline): a disruption the budgets count like a crash.
    Force,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum OperationPhase {
    /// Not begun: the leader has not taken it up yet.
    #[default]
    Pending,
    Running,
    Succeeded,
    Failed,
    /// Ended at its deadline with `onDeadline: stop`.
    Stopped,
    Cancelled,
    /// An upgrade stopped by a member that did not come back healthy,
    /// every member it touched returned to the revision it ran before.
    Reverted,
}

impl OperationPhase {
    pub fn is_finished(self) -> bool {
        !matches!(self, OperationPhase::Pending | OperationPhase::Running)
    }
}

/// Where one member is in an Operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum StepState {
    /// Not asked for yet.
    #[default]
    Waiting,
    /// Its eviction was refused; asked again after a pause.
    Refused,
    /// Evicted (approved, or forced at the deadline): on its way elsewhere.
    Evicted,
    /// Its move failed and was dropped (it stays on the node); asked again
    /// after a pause that grows with each failure.
    MoveFailed,
    /// Off the node and ready elsewhere, or gone (an upgrade's: runs its
    /// revision and is healthy).
    Done,
    /// Left as it was: an upgrade stopped before it was asked for.
    Skipped,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperationStep {
    pub member: String,
    pub state: StepState,
    /// Since when it is in this state.
    pub since: Timestamp,
    /// Evictions asked for it so far, and when the last was.
    #[serde(default)]
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tried_at: Option<Timestamp>,
    /// Evicted without asking the budgets (the deadline's `force`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forced: bool,
    /// The last refusal, or where it stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The instance it ran as when asked for (a restart is done once
    /// another runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// An upgrade's: the revision it is to run once done, and the one it
    /// ran when first asked for (what a revert returns it to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_revision: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_revision: Option<i64>,
}

/// What keeps an Operation from going on, and since when.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Blocker {
    pub message: String,
    pub since: Timestamp,
    /// A budget that can never allow an eviction as it stands (waiting
    /// will not help: the budget or the members must change).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub never: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HistoryEntry {
    pub at: Timestamp,
    pub message: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperationStatus {
    #[serde(default)]
    pub phase: OperationPhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Timestamp>,
    /// Members done, of those it works on.
    #[serde(default)]
    pub done: u32,
    #[serde(default)]
    pub total: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<OperationStep>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocker: Option<Blocker>,
    /// How it ended, or what it does now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// What happened, oldest first (the last `HISTORY_KEPT`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<HistoryEntry>,
    /// A switchover's handover, once taken up: from whom, in which term,
    /// to whom.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handover: Option<Handover>,
    /// An upgrade's: the revision the cluster ran before it, and why it
    /// is being reverted, once it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeProgress>,
}

/// Where an upgrade stands beyond its steps.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpgradeProgress {
    /// The cluster's `appRevision` before the upgrade pinned it (None: it
    /// followed the App's latest), and the revision that was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_before: Option<i64>,
    pub from_revision: i64,
    /// Why it stopped, once a member did not come back healthy: its steps
    /// then return the members they touched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reverting: Option<String>,
}

/// A switchover as taken up: `from` leads in `term`, and `to` (none: the
/// most advanced member that may lead) is to lead in the next.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Handover {
    pub from: String,
    pub term: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
}

/// How many history entries an Operation keeps.
pub const HISTORY_KEPT: usize = 50;

/// An Operation's deadline: a second at least (it must be able to start),
/// thirty days at most (a drain of terabytes takes days, not years).
pub const DEADLINE_RANGE: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(30 * 24 * 3600));

impl Resource for OperationSpec {
    const KIND: &'static str = "Operation";
    const PLURAL: &'static str = "operations";
    const SHORT: &'static str = "op";
    const REPLICATED: bool = true;
    const COLUMNS: &'static [Column] = &[
        Column::NAME,
        Column::of("ACTION", Cell::OperationAction),
        Column::of("PHASE", Cell::TextOr { path: "/status/phase", otherwise: "Pending" }),
        Column::of("DONE", Cell::Ratio { a: "/status/done", b: "/status/total" }),
        Column::of("BLOCKER", Cell::TextOr { path: "/status/blocker/message", otherwise: "-" }),
        Column::AGE,
        Column::wide("DEADLINE", Cell::TextOr { path: "/spec/deadline", otherwise: "-" }),
        Column::wide("MESSAGE", Cell::TextOr { path: "/status/message", otherwise: "-" }),
    ];
    const HAS_STATUS: bool = true;
    type Status = OperationStatus;

    fn validate_spec(&self, path: &FieldPath, errors: &mut ValidationErrors) {
        match &self.action {
            OperationAction::Drain { node } => check_name(&path.child("action").child("node"), node, errors),
            OperationAction::Restart { cluster, role, .. } => {
                check_name(&path.child("action").child("cluster"), cluster, errors);
                check_name(&path.child("action").child("role"), role, errors);
            }
            OperationAction::Switchover { cluster, role, to } => {
                check_name(&path.child("action").child("cluster"), cluster, errors);
                check_name(&path.child("action").child("role"), role, errors);
                if let Some(to) = to {
                    check_name(&path.child("action").child("to"), to, errors);
                }
            }
            OperationAction::Upgrade { cluster, to_revision, .. } => {
                let action = path.child("action");
                check_name(&action.child("cluster"), cluster, errors);
                if *to_revision < 1 {
                    errors.add(
                        &action.child("toRevision"),
                        format!("must be at least 1 (revisions count from 1), is {to_revision}"),
                    );
                }
                if let Some(pace) = self.action.pace() {
                    pace.validate(&action, errors);
                }
            }
        }
        if self.max_parallel == 0 {
            errors.add(&path.child("maxParallel"), "must be at least 1 (how many members may move at once)");
        }
        if let Some(deadline) = self.deadline {
            check_duration(&path.child("deadline"), deadline, DEADLINE_RANGE, errors);
        }
    }

    fn owned_labels(&self) -> Vec<(&'static str, String)> {
        vec![(TARGET_LABEL, self.action.target().to_string())]
    }

    /// Only `cancel` changes, and only to true, and `paused`: the rest is
    /// what the steps recorded so far were decided on.
    fn validate_spec_update(&self, old: &Self, path: &FieldPath, errors: &mut ValidationErrors) {
        if self.action != old.action {
            errors.add(&path.child("action"), "is immutable: start another Operation instead");
        }
        if self.deadline != old.deadline || self.on_deadline != old.on_deadline {
            errors.add(&path.child("deadline"), "is immutable (with onDeadline): cancel and start another Operation");
        }
        if self.max_parallel != old.max_parallel {
            errors.add(&path.child("maxParallel"), "is immutable: cancel and start another Operation");
        }
        if old.cancel && !self.cancel {
            errors.add(&path.child("cancel"), "cannot be taken back: start another Operation");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> OperationSpec {
        serde_json::from_value(json).unwrap()
    }

    fn errors(spec: &OperationSpec, old: Option<&OperationSpec>) -> String {
        let mut errors = ValidationErrors::default();
        spec.validate_spec(&FieldPath::root("spec"), &mut errors);
        if let Some(old) = old {
            spec.validate_spec_update(old, &FieldPath::root("spec"), &mut errors);
        }
        errors.to_string()
    }

    #[test]
    fn a_drain_reads_with_its_defaults() {
        let drain = spec(serde_json::json!({"action": {"type": "Drain", "node": "n1"}}));
        assert_eq!(drain.max_parallel, 1);
        assert_eq!(drain.on_deadline, OnDeadline::Fail);
        assert_eq!(drain.deadline, None);
        assert_eq!(errors(&drain, None), "");
        assert_eq!(drain.owned_labels(), vec![(TARGET_LABEL, "n1".to_string())]);
        let json = serde_json::to_value(&drain).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"action": {"type": "Drain", "node": "n1"}, "onDeadline": "fail", "maxParallel": 1})
        );
    }

    #[test]
    fn bad_fields_are_named() {
        let bad =
            spec(serde_json::json!({"action": {"type": "Drain", "node": "N 1"}, "maxParallel": 0, "deadline": "0s"}));
        let said = errors(&bad, None);
        assert!(said.contains("spec.action.node: "), "{said}");
        assert!(said.contains("spec.maxParallel: must be at least 1"), "{said}");
        assert!(said.contains("spec.deadline: must be from 1s to 30days, is 0s"), "{said}");
        let unknown = serde_json::from_value::<OperationSpec>(serde_json::json!({"action": {"type": "Explode"}}));
        assert!(unknown.is_err());
    }

    #[test]
    fn only_cancel_changes_and_only_to_true() {
        let old = spec(serde_json::json!({"action": {"type": "Drain", "node": "n1"}}));
        let cancelled = OperationSpec { cancel: true, ..old.clone() };
        assert_eq!(errors(&cancelled, Some(&old)), "");
        assert!(errors(&old, Some(&cancelled)).contains("spec.cancel: cannot be taken back"));
        let other = spec(serde_json::json!({"action": {"type": "Drain", "node": "n2"}, "maxParallel": 2}));
        let said = errors(&other, Some(&old));
        assert!(
            said.contains("spec.action: is immutable") && said.contains("spec.maxParallel: is immutable"),
            "{said}"
        );
    }
}
