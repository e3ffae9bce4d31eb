//! What the server fetches from a node's agent for the operator (admins
//! only; the server shows the agent a grant for that one read):
//! `GET /api/v1/nodes/{node}/members/{member}/logs`, a member's log, and
//! `GET /api/v1/nodes/{node}/volumes`, its volumes and partial copies, each
//! with what owns it.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use herd_client::PeerClient;
use herd_core::api::{LogStream, StoredVolume};
use herd_core::authz::Verb;
use herd_core::grant::Access;
use herd_core::kinds::command::volume_owner;
use herd_core::kinds::{CommandSpec, NodeSpec};
use serde::Deserialize;

use super::{ApiName, ApiQuery, AppState, Caller};
use crate::error::ApiError;

#[derive(Deserialize)]
pub struct LogQuery {
    stream: Option<String>,
    bytes: Option<u64>,
    offset: Option<u64>,
}

/// The most of a log one request may ask for.
pub const MAX_LOG_BYTES: u64 = 16 << 20;

/// A client for `node`'s agent, for an admin.
async fn agent_of(state: &AppState, caller: &Caller, node: &str, read: Access) -> Result<PeerClient, ApiError> {
    caller.may(Verb::Get, "nodes", None)?;
    let node_object = state.objects.require::<NodeSpec>(node).await?;
    if node_object.status.address.is_none() {
        return Err(ApiError::Conflict(format!(
            "node {node}'s agent has not reported its address yet: nothing to ask"
        )));
    }
    let purpose = format!("{read} for {}", caller.0);
    state.peers.agent(&node_object, vec![read], &purpose).map_err(asking(node))
}

fn asking(node: &str) -> impl Fn(herd_client::ClientError) -> ApiError + '_ {
    move |e| match e {
        offline @ herd_client::ClientError::Offline { .. } => ApiError::Conflict(offline.to_string()),
        other => ApiError::Unavailable(format!("asking node {node}'s agent: {other}")),
    }
}

/// Node and member names from the path are object names: checked before
/// anything is forwarded, so none can reach another path on the agent.
fn check_names(names: &[(&str, &str)]) -> Result<(), ApiError> {
    let mut errors = herd_core::ValidationErrors::new();
    for (field, name) in names {
        herd_core::validation::check_name(&herd_core::FieldPath::root(field), name, &mut errors);
    }
    errors.into_result().map_err(|errors| ApiError::Invalid { kind: "log request".into(), name: String::new(), errors })
}

pub async fn member_log(
    State(state): State<AppState>,
    caller: Caller,
    Path((node, member)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<LogQuery>,
) -> Result<Response, ApiError> {
    check_names(&[("node", &node), ("member", &member)])?;
    let stream = LogStream::of_query(query.stream.as_deref()).map_err(ApiError::BadRequest)?;
    if let Some(bytes) = query.bytes.filter(|b| *b > MAX_LOG_BYTES) {
        return Err(ApiError::BadRequest(format!("bytes must be at most {MAX_LOG_BYTES}, is {bytes}")));
    }
    let agent = agent_of(&state, &caller, &node, Access::ReadLogs { member: member.clone() }).await?;
    let chunk = match agent.member_log(&member, stream, query.bytes.unwrap_or(64 * 1024), query.offset).await {
        Ok(chunk) => chunk,
        // The agent's own word for a member it does not have.
        Err(herd_client::ClientError::Api(status)) if status.code == 404 => {
            return Err(ApiError::Missing(status.message));
        }
        Err(error) => return Err(asking(&node)(error)),
    };
    let headers = [
        (header::CONTENT_TYPE, "text/plain; charset=utf-8".to_string()),
        (header::HeaderName::from_static(herd_core::api::LOG_OFFSET_HEADER), chunk.offset.to_string()),
    ];
    Ok((headers, chunk.bytes).into_response())
}

pub async fn node_volumes(
    State(state): State<AppState>,
    caller: Caller,
    ApiName(node): ApiName,
) -> Result<Json<Vec<StoredVolume>>, ApiError> {
    let agent = agent_of(&state, &caller, &node, Access::ListVolumes).await?;
    let mut stored = agent.stored_volumes().await.map_err(asking(&node))?;
    let (commands, _) = state.objects.list::<CommandSpec>().await?;
    for entry in &mut stored {
        entry.owner = volume_owner(&node, entry, &commands);
    }
    Ok(Json(stored))
}
