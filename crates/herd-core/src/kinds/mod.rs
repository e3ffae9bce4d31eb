//! The kinds of resource herd serves. One file per kind; each implements
//! [`crate::Resource`] on its spec type.

pub mod answer;
pub mod app;
pub mod app_cluster;
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

pub use answer::{Answer, AnswerDetails};
pub use app::{App, AppRole, AppSpec};
pub use app_cluster::{AppCluster, AppClusterSpec, AppClusterStatus, ClusterRole, ClusterState, MemberStateRollup};
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

/// No status: for kinds without a status subresource.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoStatus {}
