//! `GET /api/v1/nodes/{node}/members/{member}/logs`: a member's log, fetched
//! from its node's agent (admins only; the server shows the agent the peer
//! token).

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use herd_client::PeerClient;
use herd_core::authz::Verb;
use herd_core::kinds::NodeSpec;
use serde::Deserialize;

use super::{ApiQuery, AppState, Caller};
use crate::error::ApiError;

#[derive(Deserialize)]
pub struct LogQuery {
    stream: Option<String>,
    bytes: Option<u64>,
}

pub async fn member_log(
    State(state): State<AppState>,
    caller: Caller,
    Path((node, member)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<LogQuery>,
) -> Result<Response, ApiError> {
    caller.may(Verb::Get, "nodes", None)?;
    let node_object = state.objects.require::<NodeSpec>(&node).await?;
    let address = node_object
        .status
        .address
        .ok_or_else(|| ApiError::Unavailable(format!("node {node}'s agent has not reported its address")))?;
    let token = crate::auth::peer_token(state.objects.store()).await?;
    let stream = query.stream.as_deref().unwrap_or("stdout");
    let text = PeerClient::new(&address, &token)
        .member_log(&member, stream, query.bytes.unwrap_or(64 * 1024))
        .await
        .map_err(|e| ApiError::Unavailable(format!("asking node {node}'s agent: {e}")))?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response())
}
