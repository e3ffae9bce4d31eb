//! The Commands the app-cluster controller gives members, and what their
//! outcomes mean for the members' statuses.
//!
//! Each Command's spec says whose it is and why (its [`CommandOrigin`]:
//! the cluster, the member, and the purpose with what it was decided on,
//! a configure's generation, a notify's arguments); a member has at most
//! one unsettled Command at a time. A settled one is read once, its
//! outcome written into the member's status (`herd_core::outcomes`), and
//! then deleted.

use herd_core::kinds::app::{AppRole, HERD_VOLUME};
use herd_core::kinds::app_cluster::{AppCluster, ClusterRole};
use herd_core::kinds::command::{MemberRun, VolumeSpec};
use herd_core::kinds::{Action, Command, CommandOrigin, CommandSpec, Member, Purpose};

/// How a member of `role` runs: the App's process with the cluster's
/// overrides, herd's variables (`HERD_CLUSTER`, `HERD_ROLE`, a
/// `HERD_PORT_<NAME>` per named port) and herd's own volume (persistent
/// when any of the role's volumes is).
pub fn member_run(cluster: &AppCluster, app_role: &AppRole, cluster_role: &ClusterRole, member: &Member) -> MemberRun {
    let mut run = app_role.run.clone();
    run.env.extend(cluster_role.env.clone());
    run.env.insert("HERD_CLUSTER".into(), cluster.metadata.name.clone());
    run.env.insert("HERD_ROLE".into(), app_role.name.clone());
    for port in &app_role.ports {
        if let Some(number) = member.spec.ports.get(&port.name) {
            run.env.insert(port.variable(), number.to_string());
        }
    }
    let persistent = app_role.run.volumes.iter().any(|v| v.persistent);
    run.volumes.push(VolumeSpec { name: HERD_VOLUME.into(), persistent });
    run.readiness = app_role.readiness.clone();
    run
}

/// A new Command for `member` on its node, with its origin.
pub fn command_for(cluster: &str, member: &Member, purpose: Purpose, action: Action) -> Option<Command> {
    let node = member.spec.node.clone()?;
    let name = format!("{}.{}.{}", member.metadata.name, purpose.word(), uuid::Uuid::now_v7().simple());
    let timeout = match &action {
        Action::RunScript { .. } => Some(herd_core::HumanDuration::from_secs(300)),
        _ => None,
    };
    let origin = CommandOrigin { cluster: cluster.to_string(), member: member.metadata.name.clone(), purpose };
    Some(Command::new(name, CommandSpec { node, timeout, action, origin: Some(origin) }))
}

/// Whether a Command concerns the member's node: it runs there, or moves
/// the member away from there.
pub fn concerns(command: &Command, node: Option<&String>) -> bool {
    let from = match &command.spec.action {
        Action::MigrateMember { from_node, .. } => Some(from_node),
        _ => None,
    };
    node.is_some_and(|node| *node == command.spec.node || from == Some(node))
}

/// Why a Command of this controller exists.
pub fn purpose_of(command: &Command) -> Option<&Purpose> {
    command.spec.origin.as_ref().map(|origin| &origin.purpose)
}

/// The member a Command of this controller is for.
pub fn member_of(command: &Command) -> Option<&str> {
    command.spec.origin.as_ref().map(|origin| origin.member.as_str())
}

/// The cluster a Command of this controller is for.
pub fn cluster_of(command: &Command) -> Option<&str> {
    command.spec.origin.as_ref().map(|origin| origin.cluster.as_str())
}
