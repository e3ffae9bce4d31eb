//! `POST /api/v1/members/{name}/notifies/skip`: the operator's way out of
//! a notify that keeps failing (fixing the App's script is the other): the
//! member's first pending notify (every one, with `all=true`) is dropped
//! unsent, and a NotifySkipped Event on the Member says who dropped what;
//! admins only. 409 when none is pending.

use axum::Json;
use axum::extract::State;
use herd_core::authz::Verb;
use herd_core::kinds::{EventReason, EventType, MemberSpec};
use herd_core::notifies;
use serde_json::Value;

use super::{ApiName, ApiQuery, AppState, Caller};
use crate::error::ApiError;
use crate::objects::Part;

/// `?all=true` drops every pending notify of the member.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SkipQuery {
    #[serde(default)]
    all: bool,
}

pub async fn skip(
    State(state): State<AppState>,
    caller: Caller,
    ApiName(name): ApiName,
    ApiQuery(query): ApiQuery<SkipQuery>,
) -> Result<Json<Value>, ApiError> {
    caller.may(Verb::UpdateStatus, "members", Some(&name))?;
    let mut skipped = Vec::new();
    let member = state
        .objects
        .modify::<MemberSpec, ApiError>(&name, Part::Status, |member| {
            skipped = notifies::skip(&mut member.status, query.all);
            if skipped.is_empty() {
                return Err(ApiError::Conflict(format!("member {name} has no pending notify to skip")));
            }
            Ok(true)
        })
        .await?;
    for notify in &skipped {
        let error = notify.last_error.as_deref().map(|e| format!(", last error: {}", e.trim())).unwrap_or_default();
        let message = format!(
            "{} skipped the notify `{}` ({} attempts{error}): it is not sent",
            caller.0,
            notify.arguments.join(" "),
            notify.attempts
        );
        state.events.record(&member, EventType::Warning, EventReason::NotifySkipped, message).await;
    }
    Ok(Json(member.to_json_value()))
}
