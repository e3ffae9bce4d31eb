//! Health and the OpenAPI document (no authentication needed), and the
//! metrics, the cluster status and verify findings (admins and viewers).

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use herd_core::Resource;
use herd_core::authz::Verb;
use herd_core::kinds::ClusterConfigSpec;
use herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME;

use super::{AppState, Caller};
use crate::error::ApiError;

/// Healthy when the store answers, and this replica, if it believes it
/// leads, has renewed its lease within the lease duration.
pub async fn healthz(State(state): State<AppState>) -> impl IntoResponse {
    if let Some(reason) = state.leader_health.stale() {
        return (axum::http::StatusCode::SERVICE_UNAVAILABLE, reason);
    }
    match state.objects.store().get("/healthz").await {
        Ok(_) => (axum::http::StatusCode::OK, "ok".to_string()),
        Err(error) => (axum::http::StatusCode::SERVICE_UNAVAILABLE, format!("store unavailable: {error}")),
    }
}

/// The metrics, for the admin or a viewer token (a Prometheus scrape
/// config's `authorization`): they name nodes, replicas and routes.
pub async fn metrics(State(state): State<AppState>, caller: Caller) -> Result<impl IntoResponse, ApiError> {
    caller.may(Verb::Get, "metrics", None)?;
    let content_type = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;
    Ok(([(header::CONTENT_TYPE, content_type)], state.metrics.render()))
}

pub async fn openapi(State(state): State<AppState>) -> impl IntoResponse {
    Json(state.openapi.as_ref().clone())
}

/// The leader and the replicas, as this replica sees them.
pub async fn cluster_status(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<herd_core::api::ClusterStatus>, ApiError> {
    caller.may(Verb::Get, "replicas", None)?;
    let mut status = crate::replicas::cluster_status(
        &state.objects,
        &state.replica,
        &state.replica_sightings,
        state.leader_health.is_leading(),
    )
    .await?;
    status.superseded = state.supersession.as_ref().and_then(|s| s.superseded()).map(|s| s.to_string());
    Ok(Json(status))
}

/// What is wrong with the nodes' roles (`herd_core::verify`), from the
/// nodes and the pool size as stored now.
/// Every kind's descriptor, for the dashboard.
pub async fn kinds(caller: Caller) -> Result<Json<&'static [herd_core::descriptor::Descriptor]>, ApiError> {
    caller.may(Verb::Get, "kinds", None)?;
    Ok(Json(herd_core::kinds::descriptors()))
}

pub async fn cluster_verify(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<herd_core::verify::Report>, ApiError> {
    caller.may(Verb::List, herd_core::kinds::NodeSpec::PLURAL, None)?;
    let (nodes, _) = state.objects.list::<herd_core::kinds::NodeSpec>().await?;
    let config = state.objects.get::<ClusterConfigSpec>(CLUSTER_CONFIG_NAME).await?;
    let pool_size =
        config.map_or_else(|| ClusterConfigSpec::default().candidate_pool_size, |c| c.spec.candidate_pool_size);
    Ok(Json(herd_core::verify::verify(&nodes, pool_size as usize)))
}
