//! `POST /api/v1/commands/{name}/retry` and `.../abandon`: the supported
//! ways out of a stuck Command (admins only).

use axum::Json;
use axum::extract::{Path, State};
use herd_core::authz::Verb;
use serde_json::Value;

use super::{AppState, Caller};
use crate::commands::{OperatorAction, operator_action};
use crate::error::ApiError;

async fn act(state: AppState, caller: Caller, name: String, action: OperatorAction) -> Result<Json<Value>, ApiError> {
    caller.may(Verb::UpdateStatus, "commands", Some(&name))?;
    let command = operator_action(&state.objects, &state.events, &name, action).await?;
    Ok(Json(command.to_json_value()))
}

pub async fn retry(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    act(state, caller, name, OperatorAction::Retry).await
}

pub async fn abandon(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    act(state, caller, name, OperatorAction::Abandon).await
}
