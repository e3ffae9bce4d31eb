//! Admission of Operations: what a new one names must exist (a
//! switchover's role must have a leader, and the member it names must be
//! of that role), and one node is drained (one role restarted or switched
//! over) by one Operation at a time (the controller carries them out:
//! `controllers::operations`).

use herd_core::ValidationErrors;
use herd_core::kinds::{AppClusterSpec, AppSpec, MemberSpec, NodeSpec, Operation, OperationAction, OperationSpec};

use crate::error::ApiError;
use crate::objects::Objects;

pub async fn admit(objects: &Objects, operation: &Operation) -> Result<(), ApiError> {
    let name = &operation.metadata.name;
    let invalid = |field: &str, why: String| {
        ApiError::invalid(<OperationSpec as herd_core::Resource>::KIND, name, ValidationErrors::single(field, why))
    };
    let what = match &operation.spec.action {
        OperationAction::Drain { node } => {
            if objects.get::<NodeSpec>(node).await?.is_none() {
                return Err(invalid("spec.action.node", format!("there is no node named {node:?}")));
            }
            format!("node {node} is being drained")
        }
        OperationAction::Restart { cluster, role, .. } => {
            let Some(found) = objects.get::<AppClusterSpec>(cluster).await? else {
                return Err(invalid("spec.action.cluster", format!("there is no AppCluster named {cluster:?}")));
            };
            if found.spec.role(role).is_none() {
                let roles: Vec<&str> = found.spec.roles.iter().map(|r| r.name.as_str()).collect();
                let why = format!("AppCluster {cluster} has no role {role:?} (its roles: {})", roles.join(", "));
                return Err(invalid("spec.action.role", why));
            }
            format!("role {role} of {cluster} is being restarted")
        }
        OperationAction::Switchover { cluster, role, to } => {
            let Some(found) = objects.get::<AppClusterSpec>(cluster).await? else {
                return Err(invalid("spec.action.cluster", format!("there is no AppCluster named {cluster:?}")));
            };
            let app = objects.get::<AppSpec>(&found.spec.app_ref).await?;
            let leads = app.as_ref().and_then(|a| a.spec.role(role)).map(|r| r.leader.is_some());
            let leader_roles: Vec<&str> = app
                .as_ref()
                .map(|a| a.spec.roles.iter().filter(|r| r.leader.is_some()).map(|r| r.name.as_str()).collect())
                .unwrap_or_default();
            let roles = match leader_roles.is_empty() {
                true => "it has none".to_string(),
                false => format!("its leader roles: {}", leader_roles.join(", ")),
            };
            match leads {
                None => {
                    let why = format!("AppCluster {cluster} has no role {role:?} ({roles})");
                    return Err(invalid("spec.action.role", why));
                }
                Some(false) => {
                    let why = format!(
                        "role {role} of {cluster} has no leader to switch over: its App says no `leader:` ({roles})"
                    );
                    return Err(invalid("spec.action.role", why));
                }
                Some(true) => {}
            }
            if let Some(to) = to {
                match objects.get::<MemberSpec>(to).await? {
                    Some(member) if member.spec.cluster == *cluster && member.spec.role == *role => {}
                    Some(member) if member.spec.cluster == *cluster => {
                        let why = format!("member {to} is of role {}, not {role}", member.spec.role);
                        return Err(invalid("spec.action.to", why));
                    }
                    _ => {
                        let why = format!("AppCluster {cluster} has no member named {to:?}");
                        return Err(invalid("spec.action.to", why));
                    }
                }
            }
            format!("role {role} of {cluster} is being switched over")
        }
    };
    // One switchover of a role at a time, whichever member each asks for.
    let same = |other: &OperationAction| match (other, &operation.spec.action) {
        (
            OperationAction::Switchover { cluster: c, role: r, .. },
            OperationAction::Switchover { cluster, role, .. },
        ) => c == cluster && r == role,
        (other, action) => other == action,
    };
    let (operations, _) = objects.list::<OperationSpec>().await?;
    if let Some(other) = operations.iter().find(|other| same(&other.spec.action) && !other.status.phase.is_finished()) {
        return Err(ApiError::Conflict(format!(
            "{what} by operation {} already: follow it with `herd describe operation {0}`, \
             or cancel it with `herd operation cancel {0}`",
            other.metadata.name
        )));
    }
    Ok(())
}
