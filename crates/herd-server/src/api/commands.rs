//! `POST /api/v1/commands/{name}/retry` and `.../abandon`: the supported
//! ways out of a stuck Command (admins only).

use axum::Json;
use axum::extract::State;
use herd_core::authz::Verb;
use serde_json::Value;

use super::{ApiName, ApiQuery, AppState, Caller};
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
    ApiName(name): ApiName,
) -> Result<Json<Value>, ApiError> {
    act(state, caller, name, OperatorAction::Retry).await
}

/// `?keepStaging=true` keeps a copy's partial staging for a later copy.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AbandonQuery {
    #[serde(default)]
    keep_staging: bool,
}

pub async fn abandon(
    State(state): State<AppState>,
    caller: Caller,
    ApiName(name): ApiName,
    ApiQuery(query): ApiQuery<AbandonQuery>,
) -> Result<Json<Value>, ApiError> {
    act(state, caller, name, OperatorAction::Abandon { keep_staging: query.keep_staging }).await
}
