//! The kinds of resource herd serves. One file per kind; each implements
//! [`crate::Resource`] on its spec type.

pub mod answer;
pub mod app;
pub mod app_cluster;
pub mod app_revision;
pub mod cluster_config;
pub mod command;
pub mod command_origin;
pub mod disruption_budget;
pub mod event;
pub mod event_reason;
pub mod lease;
pub mod member;
pub mod member_run;
pub mod node;
pub mod operation;
pub mod replica;
pub mod update_policy;

use crate::descriptor::Descriptor;

pub use answer::{Answer, AnswerDetails};
pub use app::{App, AppRole, AppSpec};
pub use app_cluster::{AppCluster, AppClusterSpec, AppClusterStatus, ClusterRole, ClusterState, MemberStateRollup};
pub use app_revision::{AppRevision, AppRevisionSpec};
pub use cluster_config::{ClusterConfig, ClusterConfigSpec, LeaderElectionOverrides, LeaderElectionSettings};
pub use command::{Action, AgentState, Command, CommandSpec, CommandStatus, ManagementState};
pub use command_origin::{CommandOrigin, Purpose};
pub use disruption_budget::{
    Amount, DisruptionBudget, DisruptionBudgetSpec, DisruptionBudgetStatus, UnhealthyEvictionPolicy, UnhealthyMember,
};
pub use event::{Event, EventSpec, EventType, InvolvedObject};
pub use event_reason::EventReason;
pub use lease::{Lease, LeaseSpec};
pub use member::{LastKnownState, Member, MemberSpec, MemberState, MemberStatus, Migration, RestartProgress};
pub use node::{Condition, ConditionStatus, Node, NodeRole, NodeSpec, NodeStatus};
pub use operation::{
    Blocker, OnDeadline, Operation, OperationAction, OperationPhase, OperationSpec, OperationStatus, OperationStep,
    StepState, TARGET_LABEL,
};
pub use replica::{Replica, ReplicaSpec, ReplicaState, ReplicaStatus};
pub use update_policy::{UpdatePolicy, UpdateType, UpgradePace};

/// Something done once for every kind (the server's registry, the CLI's
/// names): [`visit`] calls it with each kind's type.
pub trait KindVisitor {
    fn visit<S: crate::Resource>(&mut self);
}

/// Calls `visitor` with every kind herd serves: the one list of kinds.
pub fn visit(visitor: &mut impl KindVisitor) {
    visitor.visit::<CommandSpec>();
    visitor.visit::<NodeSpec>();
    visitor.visit::<ClusterConfigSpec>();
    visitor.visit::<LeaseSpec>();
    visitor.visit::<EventSpec>();
    visitor.visit::<ReplicaSpec>();
    visitor.visit::<AppSpec>();
    visitor.visit::<AppRevisionSpec>();
    visitor.visit::<AppClusterSpec>();
    visitor.visit::<MemberSpec>();
    visitor.visit::<DisruptionBudgetSpec>();
    visitor.visit::<OperationSpec>();
}

/// Every kind's descriptor, in the order of [`visit`].
pub fn descriptors() -> &'static [Descriptor] {
    static ALL: std::sync::LazyLock<Vec<Descriptor>> = std::sync::LazyLock::new(|| {
        struct Collect(Vec<Descriptor>);
        impl KindVisitor for Collect {
            fn visit<S: crate::Resource>(&mut self) {
                self.0.push(S::descriptor());
            }
        }
        let mut all = Collect(Vec::new());
        visit(&mut all);
        all.0
    });
    &ALL
}

/// The descriptor of the kind served at `/api/v1/<plural>`.
pub fn by_plural(plural: &str) -> Option<&'static Descriptor> {
    descriptors().iter().find(|d| d.plural == plural)
}

/// The descriptor of kind `kind` (`Node`).
pub fn by_kind(kind: &str) -> Option<&'static Descriptor> {
    descriptors().iter().find(|d| d.kind == kind)
}

/// No status: for kinds without a status subresource.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoStatus {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_names_and_a_name_column() {
        let all = descriptors();
        assert_eq!(all.len(), 12);
        let mut names = std::collections::BTreeSet::new();
        for kind in all {
            for name in [kind.kind.to_ascii_lowercase(), kind.plural.to_string(), kind.short.to_string()] {
                let taken = names.insert(name.clone());
                assert!(taken || name == kind.kind.to_ascii_lowercase() && name == kind.short, "{name} twice");
            }
            assert!(kind.columns.iter().any(|c| !c.wide), "{} has a column in its table", kind.kind);
        }
        assert_eq!(by_plural("nodes").map(|d| d.kind), Some("Node"));
        assert_eq!(by_kind("Member").map(|d| d.short), Some("mem"));
        let replicated: Vec<&str> = all.iter().filter(|d| d.replicated).map(|d| d.plural).collect();
        assert_eq!(
            replicated,
            [
                "commands",
                "nodes",
                "clusterconfigs",
                "apps",
                "apprevisions",
                "appclusters",
                "members",
                "disruptionbudgets",
                "operations"
            ]
        );
    }
}
