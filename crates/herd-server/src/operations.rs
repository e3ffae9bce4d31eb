//! Admission of Operations: what a new one names must exist, and one node
//! is drained (one role restarted) by one Operation at a time (the controller carries them
//! out: `controllers::operations`).

use herd_core::ValidationErrors;
use herd_core::kinds::{AppClusterSpec, NodeSpec, Operation, OperationAction, OperationSpec};

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
    };
    let (operations, _) = objects.list::<OperationSpec>().await?;
    if let Some(other) =
        operations.iter().find(|other| other.spec.action == operation.spec.action && !other.status.phase.is_finished())
    {
        return Err(ApiError::Conflict(format!(
            "{what} by operation {} already: follow it with `herd describe operation {0}`, \
             or cancel it with `herd operation cancel {0}`",
            other.metadata.name
        )));
    }
    Ok(())
}
