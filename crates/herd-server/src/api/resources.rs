//! Generic handlers for every kind: get, list (or watch), create, replace,
//! patch, replace status, delete.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use herd_core::Resource;
use herd_core::authz::Verb;
use herd_core::backoff::Contention;
use herd_core::kinds::NodeSpec;
use herd_core::labels::LabelSelector;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{ApiBody, ApiQuery, AppState, Caller};
use crate::error::ApiError;
use crate::objects::{Part, try_again};

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ListQuery {
    label_selector: Option<String>,
    limit: Option<usize>,
    #[serde(rename = "continue")]
    continue_token: Option<String>,
    watch: Option<bool>,
    resource_version: Option<String>,
    timeout_seconds: Option<u64>,
    batch_millis: Option<u64>,
}

/// The longest label selector (and continue token) taken.
pub const MAX_SELECTOR_LENGTH: usize = 1024;
/// The most items one list page may ask for.
pub const MAX_LIMIT: usize = 100_000;
/// The longest a watch may ask to last before it ends by itself.
pub const MAX_WATCH_SECONDS: u64 = 3600;
/// The longest a watch may ask to gather changes into one chunk.
pub const MAX_BATCH_MILLIS: u64 = 1000;

impl ListQuery {
    pub(super) fn selector(&self) -> Result<LabelSelector, ApiError> {
        self.selector_and("")
    }

    /// The selector asked for, with `requirement` added.
    pub(super) fn selector_and(&self, requirement: &str) -> Result<LabelSelector, ApiError> {
        let asked = self.label_selector.as_deref().unwrap_or("");
        if asked.len() > MAX_SELECTOR_LENGTH {
            let why = format!("labelSelector is {} bytes long, more than {MAX_SELECTOR_LENGTH}", asked.len());
            return Err(ApiError::BadRequest(why));
        }
        LabelSelector::parse(asked).map_err(|e| ApiError::BadRequest(e.to_string()))?;
        let text = match (asked.trim_matches(' ').is_empty(), requirement.is_empty()) {
            (true, _) => requirement.to_string(),
            (false, true) => asked.to_string(),
            (false, false) => format!("{requirement},{asked}"),
        };
        LabelSelector::parse(&text).map_err(|e| ApiError::BadRequest(e.to_string()))
    }
}

/// Lists, or watches, the objects of `kind` that `selector` picks.
pub(super) async fn serve_list(
    state: AppState,
    kind: crate::registry::KindInfo,
    selector: LabelSelector,
    query: ListQuery,
    source: super::watch::Source,
) -> Result<Response, ApiError> {
    let limit = query.limit.unwrap_or(0);
    if limit > MAX_LIMIT {
        return Err(ApiError::BadRequest(format!("limit must be at most {MAX_LIMIT}, is {limit}")));
    }
    if query.continue_token.as_ref().is_some_and(|t| t.len() > MAX_SELECTOR_LENGTH) {
        return Err(ApiError::BadRequest(format!("continue must be at most {MAX_SELECTOR_LENGTH} bytes")));
    }
    let timeout = match query.timeout_seconds {
        Some(secs @ 1..=MAX_WATCH_SECONDS) => Some(std::time::Duration::from_secs(secs)),
        Some(other) => {
            return Err(ApiError::BadRequest(format!("timeoutSeconds must be 1 to {MAX_WATCH_SECONDS}, is {other}")));
        }
        None => None,
    };
    let batch = match query.batch_millis {
        None | Some(0) => None,
        Some(millis @ 1..=MAX_BATCH_MILLIS) => Some(std::time::Duration::from_millis(millis)),
        Some(other) => {
            return Err(ApiError::BadRequest(format!("batchMillis must be 0 to {MAX_BATCH_MILLIS}, is {other}")));
        }
    };
    if query.watch.unwrap_or(false) {
        let from = query.resource_version.as_deref().map(parse_revision).transpose()?;
        let options = super::watch::WatchOptions { from, timeout, batch };
        return super::watch::stream(state, kind, selector, options, source).await;
    }
    if let Some(revision) = &query.resource_version {
        parse_revision(revision)?;
    }
    let list = state.objects.list_values(kind.kind, kind.plural, &selector, limit, query.continue_token).await?;
    Ok(Json(list).into_response())
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct WriteQuery {
    dry_run: Option<String>,
    resource_version: Option<String>,
}

impl WriteQuery {
    pub(super) fn dry_run(&self) -> Result<bool, ApiError> {
        match self.dry_run.as_deref() {
            None => Ok(false),
            Some("All") => Ok(true),
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

/// A resourceVersion: 1 to 18 decimal digits (`routes::revision_schema`).
pub fn parse_revision(text: &str) -> Result<u64, ApiError> {
    let digits = !text.is_empty() && text.len() <= 18 && text.bytes().all(|b| b.is_ascii_digit());
    match text.parse() {
        Ok(revision) if digits => Ok(revision),
        _ => Err(ApiError::BadRequest(format!("resourceVersion {text:?} is not a number of at most 18 digits"))),
    }
}

pub async fn list_or_watch(
    State(state): State<AppState>,
    caller: Caller,
    plural: &'static str,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Response, ApiError> {
    let kind = state.registry.get(plural)?.info();
    let selector = query.selector()?;
    caller.may(if query.watch.unwrap_or(false) { Verb::Watch } else { Verb::List }, plural, None)?;
    serve_list(state, kind, selector, query, super::watch::Source::Collection).await
}

pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    plural: &'static str,
    name: String,
) -> Result<Json<Value>, ApiError> {
    let kind = state.registry.get(plural)?.info();
    caller.may(Verb::Get, plural, Some(&name))?;
    Ok(Json(state.objects.get_value(kind.kind, kind.plural, &name).await?))
}

pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    plural: &'static str,
    ApiQuery(query): ApiQuery<WriteQuery>,
    ApiBody(body): ApiBody,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let ops = state.registry.get(plural)?;
    caller.may(Verb::Create, plural, None)?;
    let body = parse_body(&body, ops.info().kind, "")?;
    let created = ops.create(&state.objects, body, query.dry_run()?).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

/// Replaces metadata and spec, or the status.
pub async fn replace(
    State(state): State<AppState>,
    caller: Caller,
    plural: &'static str,
    name: String,
    ApiQuery(query): ApiQuery<WriteQuery>,
    ApiBody(body): ApiBody,
    part: Part,
) -> Result<Json<Value>, ApiError> {
    let ops = state.registry.get(plural)?;
    let verb = match part {
        Part::Spec => Verb::Update,
        Part::Status => Verb::UpdateStatus,
    };
    caller.may(verb, plural, Some(&name))?;
    let body = parse_body(&body, ops.info().kind, &name)?;
    ops.replace(&state.objects, &name, body, part, query.dry_run()?).await.map(Json)
}

/// Applies a JSON merge patch (RFC 7386, `herd_core::merge_patch`) to an
/// object's metadata and spec, then writes it as a replace would (the same
/// admission and validation). Without a `metadata.resourceVersion` in the
/// patch, an object changed in between is read and patched again (for as
/// long as [`Contention::PATIENCE`]); with one,
/// it must still be at that revision (409 otherwise). The status is not
/// patched (`PUT .../status` writes it).
pub async fn patch(
    State(state): State<AppState>,
    caller: Caller,
    plural: &'static str,
    name: String,
    ApiQuery(query): ApiQuery<WriteQuery>,
    ApiBody(body): ApiBody,
) -> Result<Json<Value>, ApiError> {
    let ops = state.registry.get(plural)?;
    let kind = ops.info().kind;
    caller.may(Verb::Update, plural, Some(&name))?;
    let patch: Value = parse_body(&body, kind, &name)?;
    let mut errors = herd_core::ValidationErrors::new();
    if !patch.is_object() {
        errors.add(&herd_core::FieldPath::root("patch"), "must be a JSON object (a merge patch)");
    } else if patch.get("status").is_some() {
        errors
            .add(&herd_core::FieldPath::root("status"), "is not patched: it is written through the status subresource");
    }
    errors.into_result().map_err(|e| ApiError::invalid(kind, &name, e))?;
    let pinned = patch.pointer("/metadata/resourceVersion").is_some();
    let dry_run = query.dry_run()?;
    let mut contention = Contention::new(std::time::Instant::now());
    loop {
        let mut object = state.objects.get_value(kind, plural, &name).await?;
        herd_core::merge_patch::apply(&mut object, &patch);
        match ops.replace(&state.objects, &name, object, Part::Spec, dry_run).await {
            Err(ApiError::Conflict(_)) if !pinned && try_again(&mut contention).await => continue,
            written => return written.map(Json),
        }
    }
}

pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    plural: &'static str,
    name: String,
    ApiQuery(query): ApiQuery<WriteQuery>,
) -> Result<Json<Value>, ApiError> {
    let kind = state.registry.get(plural)?.info();
    caller.may(Verb::Delete, plural, Some(&name))?;
    if let Some(why) = kind.delete_refusal {
        return Err(ApiError::Conflict(format!("{} {name:?} cannot be deleted: {why}", kind.kind)));
    }
    let precondition = query.resource_version.as_deref().map(parse_revision).transpose()?;
    if kind.kind == herd_core::kinds::AppSpec::KIND {
        let dry_run = query.dry_run()?;
        return Ok(Json(crate::app_revisions::delete(&state.objects, &name, precondition, dry_run).await?));
    }
    if kind.kind == NodeSpec::KIND {
        let (auth, events) = (&state.auth, &state.events);
        return Ok(Json(
            crate::nodes::delete(&state.objects, auth, events, &name, precondition, query.dry_run()?).await?,
        ));
    }
    Ok(Json(state.objects.delete_value(kind.kind, kind.plural, &name, precondition, query.dry_run()?).await?))
}
