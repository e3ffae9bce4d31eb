//! `/api/v1/jointokens`: join and viewer tokens an admin creates, lists
//! and revokes (`herd token create|list|delete`). Only admins; the secret
//! is shown once.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use herd_core::api::{JoinTokenInfo, JoinTokenList, JoinTokenRequest};
use herd_core::authz::Verb;
use herd_core::kinds::EventReason;
use herd_core::kinds::EventType;

use super::resources::parse_body;
use super::{ApiBody, AppState, Caller};
use crate::error::ApiError;

const PLURAL: &str = "jointokens";

fn about(id: &str) -> herd_core::kinds::InvolvedObject {
    herd_core::kinds::InvolvedObject { kind: "JoinToken".into(), name: id.into(), uid: None }
}

pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    ApiBody(body): ApiBody,
) -> Result<(StatusCode, Json<JoinTokenInfo>), ApiError> {
    caller.may(Verb::Create, PLURAL, None)?;
    let request: JoinTokenRequest = parse_body(&body, "JoinToken", "")?;
    let mut errors = herd_core::ValidationErrors::new();
    if request.ttl.is_some_and(|ttl| ttl.get() < std::time::Duration::from_secs(1)) {
        errors.add(
            &herd_core::FieldPath::root("ttl"),
            "must be at least 1s (leave it out for a token that lives until deleted)",
        );
    }
    if request.description.len() > 256 {
        errors.add(&herd_core::FieldPath::root("description"), "must be at most 256 characters");
    }
    errors.into_result().map_err(|e| ApiError::invalid("JoinToken", "", e))?;
    let (record, token) = state.auth.create_join_token(request.kind, request.ttl, request.description).await?;
    let until = record.expires.map_or("until deleted".to_string(), |at| format!("until {at}"));
    let message = format!("an admin created {} token {} (valid {until})", record.kind.word(), record.id);
    state.events.record_about(about(&record.id), EventType::Normal, EventReason::JoinTokenCreated, message).await;
    Ok((StatusCode::CREATED, Json(JoinTokenInfo { token: Some(token), ..JoinTokenInfo::from(&record) })))
}

pub async fn list(State(state): State<AppState>, caller: Caller) -> Result<Json<JoinTokenList>, ApiError> {
    caller.may(Verb::List, PLURAL, None)?;
    let items = state.auth.join_tokens().await?.iter().map(JoinTokenInfo::from).collect();
    Ok(Json(JoinTokenList { items }))
}

pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<JoinTokenInfo>, ApiError> {
    caller.may(Verb::Delete, PLURAL, Some(&id))?;
    if id.is_empty() || id.len() > 32 || !id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) {
        return Err(ApiError::BadRequest(format!("{id:?} is not a join token id (1-32 lowercase letters and digits)")));
    }
    let record = state.auth.delete_join_token(&id).await?;
    let message = format!("an admin deleted {} token {id}: it can no longer be used", record.kind.word());
    state.events.record_about(about(&id), EventType::Normal, EventReason::JoinTokenDeleted, message).await;
    Ok(Json(JoinTokenInfo::from(&record)))
}
