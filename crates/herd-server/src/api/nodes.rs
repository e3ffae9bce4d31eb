//! `POST /api/v1/join` and `POST /api/v1/nodes/{name}/heartbeat`.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use bytes::Bytes;
use herd_core::api::{AgentReport, HeartbeatResponse, JoinRequest, JoinResponse};
use herd_core::authz::Verb;

use super::resources::parse_body;
use super::{AppState, Caller};
use crate::auth::bearer;
use crate::error::ApiError;

pub async fn join(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<JoinResponse>, ApiError> {
    state.auth.check_join_token(bearer(&headers))?;
    let request: JoinRequest = parse_body(&body, "Node", "")?;
    crate::nodes::join(&state.objects, &state.config, &state.auth, &state.events, request).await.map(Json)
}

pub async fn heartbeat(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Json<HeartbeatResponse>, ApiError> {
    caller.may(Verb::Heartbeat, "nodes", Some(&name))?;
    let report: AgentReport = parse_body(&body, "Node", &name)?;
    crate::nodes::heartbeat(&state.objects, &state.config, &state.events, &name, report).await.map(Json)
}
