//! Admission of Operations: what a new one names must exist, and one node
//! is drained by one Operation at a time (the controller carries them
//! out: `controllers::operations`).

use herd_core::ValidationErrors;
use herd_core::kinds::{NodeSpec, Operation, OperationAction, OperationSpec};

use crate::error::ApiError;
use crate::objects::Objects;

pub async fn admit(objects: &Objects, operation: &Operation) -> Result<(), ApiError> {
    let OperationAction::Drain { node } = &operation.spec.action;
    let name = &operation.metadata.name;
    if objects.get::<NodeSpec>(node).await?.is_none() {
        let errors = ValidationErrors::single("spec.action.node", format!("there is no node named {node:?}"));
        return Err(ApiError::invalid(<OperationSpec as herd_core::Resource>::KIND, name, errors));
    }
    let (operations, _) = objects.list::<OperationSpec>().await?;
    if let Some(other) =
        operations.iter().find(|other| other.spec.action == operation.spec.action && !other.status.phase.is_finished())
    {
        return Err(ApiError::Conflict(format!(
            "node {node} is being drained by operation {} already: follow it with `herd describe operation {0}`, \
             or cancel it with `herd operation cancel {0}`",
            other.metadata.name
        )));
    }
    Ok(())
}
