//! The agent's own HTTP endpoint. Today it answers who it is; the volume
//! data plane and command answers will live here.

use std::net::SocketAddr;

use axum::Json;
use axum::Router;
use axum::routing::get;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::{AgentError, Identity};

/// Starts serving; returns the address actually bound.
pub async fn serve(listen: SocketAddr, identity: Identity, stop: CancellationToken) -> Result<SocketAddr, AgentError> {
    let listener =
        tokio::net::TcpListener::bind(listen).await.map_err(|source| AgentError::Listen { addr: listen, source })?;
    let addr = listener.local_addr().map_err(|source| AgentError::Listen { addr: listen, source })?;
    let router = Router::new().route(
        "/healthz",
        get(move || {
            let identity = identity.clone();
            async move { Json(json!({ "nodeName": identity.node_name, "agentBootId": identity.agent_boot_id })) }
        }),
    );
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router).with_graceful_shutdown(stop.cancelled_owned()).await {
            tracing::error!(%error, "agent endpoint failed");
        }
    });
    Ok(addr)
}
