//! Generic handlers for every kind: get, list (or watch), create, replace,
//! replace status, delete.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use herd_core::authz::Verb;
use herd_core::labels::LabelSelector;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{ApiBody, ApiQuery, AppState, Caller};
use crate::error::ApiError;
use crate::objects::Part;

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ListQuery {
    label_selector: Option<String>,
    limit: Option<usize>,
    #[serde(rename = "continue")]
    continue_token: Option<String>,
    watch: Option<bool>,
    resource_version: Option<String>,
}

/// Lists, or watches, the objects of `kind` that `selector` picks.
pub(super) async fn serve_list(
    state: AppState,
    kind: crate::registry::KindInfo,
    selector: LabelSelector,
    query: ListQuery,
) -> Result<Response, ApiError> {
    if query.watch.unwrap_or(false) {
        let from = query.resource_version.as_deref().map(parse_revision).transpose()?;
        return super::watch::stream(state, kind, selector, from).await;
    }
    let list = state
        .objects
        .list_values(kind.kind, kind.plural, &selector, query.limit.unwrap_or(0), query.continue_token)
        .await?;
    Ok(Json(list).into_response())
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct WriteQuery {
    dry_run: Option<String>,
    resource_version: Option<String>,
}

impl WriteQuery {
    fn dry_run(&self) -> Result<bool, ApiError> {
        match self.dry_run.as_deref() {
            None => Ok(false),
            Some("All" | "all" | "true") => Ok(true),
            Some(other) => Err(ApiError::BadRequest(format!("dryRun must be `All`, got {other:?}"))),
        }
    }
}

/// Parses a request body; anything unacceptable is a 422 naming the field.
/// A body that is not JSON is a 400 saying where it breaks; JSON that is
/// not the object is a 422 naming the field.
pub fn parse_body<T: DeserializeOwned>(body: &Bytes, kind: &str, name: &str) -> Result<T, ApiError> {
    if let Err(error) = serde_json::from_slice::<serde::de::IgnoredAny>(body) {
        return Err(ApiError::BadRequest(format!("the body is not JSON: {error}")));
    }
    herd_core::validation::from_json_slice(body).map_err(|e| ApiError::invalid(kind, name, e))
}

pub fn parse_revision(text: &str) -> Result<u64, ApiError> {
    text.parse().map_err(|_| ApiError::BadRequest(format!("resourceVersion {text:?} is not a number")))
}

pub async fn list_or_watch(
    State(state): State<AppState>,
    caller: Caller,
    Path(plural): Path<String>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Response, ApiError> {
    let kind = state.registry.get(&plural)?.info();
    let selector = LabelSelector::parse(query.label_selector.as_deref().unwrap_or(""))
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    caller.may(if query.watch.unwrap_or(false) { Verb::Watch } else { Verb::List }, &plural, None)?;
    serve_list(state, kind, selector, query).await
}

pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Path((plural, name)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let kind = state.registry.get(&plural)?.info();
    caller.may(Verb::Get, &plural, Some(&name))?;
    Ok(Json(state.objects.get_value(kind.kind, kind.plural, &name).await?))
}

pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    Path(plural): Path<String>,
    ApiQuery(query): ApiQuery<WriteQuery>,
    ApiBody(body): ApiBody,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let ops = state.registry.get(&plural)?;
    caller.may(Verb::Create, &plural, None)?;
    let body = parse_body(&body, ops.info().kind, "")?;
    let created = ops.create(&state.objects, body, query.dry_run()?).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

pub async fn replace(
    State(state): State<AppState>,
    caller: Caller,
    Path((plural, name)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<WriteQuery>,
    ApiBody(body): ApiBody,
) -> Result<Json<Value>, ApiError> {
    replace_part(state, caller, &plural, &name, query, body, Part::Spec).await
}

pub async fn replace_status(
    State(state): State<AppState>,
    caller: Caller,
    Path((plural, name)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<WriteQuery>,
    ApiBody(body): ApiBody,
) -> Result<Json<Value>, ApiError> {
    replace_part(state, caller, &plural, &name, query, body, Part::Status).await
}

async fn replace_part(
    state: AppState,
    caller: Caller,
    plural: &str,
    name: &str,
    query: WriteQuery,
    body: Bytes,
    part: Part,
) -> Result<Json<Value>, ApiError> {
    let ops = state.registry.get(plural)?;
    let verb = match part {
        Part::Spec => Verb::Update,
        Part::Status => Verb::UpdateStatus,
    };
    caller.may(verb, plural, Some(name))?;
    let body = parse_body(&body, ops.info().kind, name)?;
    ops.replace(&state.objects, name, body, part, query.dry_run()?).await.map(Json)
}

pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path((plural, name)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<WriteQuery>,
) -> Result<Json<Value>, ApiError> {
    let kind = state.registry.get(&plural)?.info();
    caller.may(Verb::Delete, &plural, Some(&name))?;
    if let Some(why) = kind.delete_refusal {
        return Err(ApiError::Conflict(format!("{} {name:?} cannot be deleted: {why}", kind.kind)));
    }
    let precondition = query.resource_version.as_deref().map(parse_revision).transpose()?;
    if kind.kind == "Node" {
        let (auth, events) = (&state.auth, &state.events);
        return Ok(Json(
            crate::nodes::delete(&state.objects, auth, events, &name, precondition, query.dry_run()?).await?,
        ));
    }
    Ok(Json(state.objects.delete_value(kind.kind, kind.plural, &name, precondition, query.dry_run()?).await?))
}
