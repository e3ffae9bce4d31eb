//! The HTTP API: routing, the caller extractor, request metrics. Handlers
//! are thin: they authorise, parse, and call [`crate::objects::Objects`].

mod agents;
mod commands;
mod eviction;
mod meta;
mod nodes;
mod notifies;
mod resources;
pub mod routes;
mod tokens;
mod watch;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use herd_core::authz::{self, Principal, Target, Verb};
use tokio_util::sync::CancellationToken;

use crate::auth::{Authenticator, bearer};
use crate::error::ApiError;
use crate::events::EventRecorder;
use crate::metrics::Metrics;
use crate::objects::Objects;
use crate::reflector::Reflector;
use crate::registry::Registry;
use herd_core::kinds::{ClusterConfigSpec, CommandSpec, NodeSpec};

#[derive(Clone)]
pub struct AppState {
    pub objects: Objects,
    /// The cluster settings, cached from the store.
    pub config: Reflector<ClusterConfigSpec>,
    /// The nodes, cached from the store (a heartbeat starts from its copy).
    pub nodes: Reflector<NodeSpec>,
    /// The Commands, cached from the store (a heartbeat's reports start from them).
    pub commands: Reflector<CommandSpec>,
    /// The configuration's document, deltas and facts, cached from the store.
    pub configuration: crate::reflector::RawCache,
    pub registry: Arc<Registry>,
    /// The Commands' events that ask something of an agent, split by
    /// node for the agents' watches (`commands::agent_to_tell`).
    pub node_commands: herd_store::Partitioned,
    pub auth: Arc<Authenticator>,
    /// Joins refused for their token, by source (`crate::join_refusals`).
    pub join_refusals: Arc<crate::join_refusals::JoinRefusals>,
    pub metrics: Arc<Metrics>,
    pub events: EventRecorder,
    pub openapi: Arc<serde_json::Value>,
    /// Whether this replica, if it leads, still renews its lease.
    pub leader_health: Arc<crate::elector::LeaderHealth>,
    /// The App role leader leases heartbeats renew.
    pub renewals: crate::role_leases::Renewals,
    /// This replica's name and URL, and the leader Lease's name.
    pub replica: Arc<crate::replicas::ReplicaIdentity>,
    /// When this replica saw the others' records change.
    pub replica_sightings: crate::replicas::ReplicaSightings,
    /// Signs nodes' certificates.
    pub node_certificates: Arc<crate::tls::NodeCertificates>,
    /// Grants and the server's certificate for calling agents.
    pub peers: Arc<crate::peers::PeerAuthority>,
    /// Whether a master failover superseded this server (SQLite only).
    pub supersession: Option<crate::supersession::Supersession>,
    /// Fires when the server shuts down; ends watch streams.
    pub shutdown: CancellationToken,
}

/// The authenticated caller of a request (401 without a valid token).
pub struct Caller(pub Principal);

impl Caller {
    pub fn may(&self, verb: Verb, plural: &str, name: Option<&str>) -> Result<(), ApiError> {
        authz::authorize(&self.0, verb, Target { plural, name }).map_err(|denied| ApiError::Forbidden(denied.0))
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        state.auth.principal(bearer(&parts.headers)).await.map(Caller)
    }
}

/// A request body, a body over the server's limit answered as a herd
/// `Status` (413) like every other error.
pub struct ApiBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for ApiBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Bytes::from_request(request, state).await {
            Ok(bytes) => Ok(ApiBody(bytes)),
            Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(ApiError::PayloadTooLarge(format!("the body is too large: {}", rejection.body_text())))
            }
            Err(rejection) => Err(ApiError::BadRequest(format!("reading the body: {}", rejection.body_text()))),
        }
    }
}

/// An unknown path: a herd `Status` (404) naming it.
async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::NotFound { kind: "route".into(), name: format!("{method} {}", uri.path()) }
}

/// A known path asked with a method it does not serve (405).
async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed(format!("{method} is not served at {}", uri.path()))
}

/// An object name from the path, checked as object names are
/// (`herd_core::validation::check_name`): 400 naming it otherwise, before
/// anything is looked up or forwarded.
pub struct ApiName(pub String);

impl<S: Send + Sync> FromRequestParts<S> for ApiName {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Path(name) = axum::extract::Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|rejection| ApiError::BadRequest(format!("the path: {}", rejection.body_text())))?;
        let mut errors = herd_core::ValidationErrors::new();
        herd_core::validation::check_name(&herd_core::FieldPath::root("name"), &name, &mut errors);
        match errors.into_result() {
            Ok(()) => Ok(ApiName(name)),
            Err(errors) => Err(ApiError::BadRequest(format!("{name:?} in the path is not a name: {errors}"))),
        }
    }
}

/// Query parameters, with bad ones answered as a herd `Status` (400) that
/// names the parameter, like every other error.
pub struct ApiQuery<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(ApiQuery(value)),
            Err(rejection) => Err(ApiError::BadRequest(format!("query parameters: {}", rejection.body_text()))),
        }
    }
}

/// The largest request body taken (what axum's body extractors allow).
const MAX_BODY_BYTES: usize = 2 << 20;

/// How much of a body over the limit is read and dropped so that its
/// sender hears the 413: a connection (HTTP/1.1) or stream (HTTP/2) closed
/// with a body still coming in is a broken pipe or a reset to the client,
/// not an answer. Past this the connection is closed after the answer.
const MAX_DRAINED_BYTES: usize = 64 << 20;

/// Reads every request's body before it is routed, so that a request
/// refused before its handler reads the body (401, 403, 404) leaves the
/// connection clean, and one over the limit is a 413 its sender hears.
async fn read_body_first(request: Request, next: Next) -> Response {
    use futures_util::StreamExt;
    let (parts, body) = request.into_parts();
    let mut chunks = body.into_data_stream();
    let (mut taken, mut read) = (Vec::new(), 0usize);
    while let Some(chunk) = chunks.next().await {
        let Ok(chunk) = chunk else {
            return ApiError::BadRequest("the body broke off before its end".into()).into_response();
        };
        read += chunk.len();
        if read > MAX_DRAINED_BYTES {
            break;
        }
        if read <= MAX_BODY_BYTES {
            taken.extend_from_slice(&chunk);
        }
    }
    if read > MAX_BODY_BYTES {
        return ApiError::PayloadTooLarge(format!("the body is too large: at most {MAX_BODY_BYTES} bytes are taken"))
            .into_response();
    }
    next.run(Request::from_parts(parts, axum::body::Body::from(taken))).await
}

/// What a POST that takes no body may carry: nothing, or `{}`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NoBody {}

/// A POST whose options are all query parameters (an eviction, a retry)
/// refuses a body with fields, as every other body refuses unknown ones.
async fn refuse_body(request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY_BYTES).await else {
        return ApiError::BadRequest("the body broke off before its end".into()).into_response();
    };
    if !bytes.trim_ascii().is_empty()
        && let Err(error) = resources::parse_body::<NoBody>(&bytes, "request", "")
    {
        return error.into_response();
    }
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes))).await
}

async fn record_metrics(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().to_string();
    let route = request.extensions().get::<MatchedPath>().map_or("unmatched".to_string(), |p| p.as_str().to_string());
    let response = next.run(request).await;
    state.metrics.observe_request(&method, &route, response.status().as_u16(), started.elapsed());
    response
}

/// The router, built from the route table ([`routes::routes`]).
pub fn router(state: AppState) -> Router {
    let mut generator = routes::schema_generator();
    let mut router = Router::new();
    for route in routes::routes(&state.registry, &mut generator) {
        let handler = match (&route.method, &route.body) {
            (&Method::POST, None) => route.handler.layer(middleware::from_fn(refuse_body)),
            _ => route.handler,
        };
        router = router.route(&route.path, handler);
    }
    router
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .route_layer(middleware::from_fn_with_state(state.clone(), record_metrics))
        .layer(middleware::from_fn(read_body_first))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_body_over_the_limit_is_a_413_status() {
        let request = Request::new(axum::body::Body::from(vec![b' '; 3 << 20]));
        let Err(error) = ApiBody::from_request(request, &()).await else { panic!("a 3 MB body was taken") };
        let status = error.status();
        assert_eq!(status.code, 413);
        assert!(status.message.starts_with("the body is too large"), "{}", status.message);
        let small = Request::new(axum::body::Body::from("{}"));
        assert!(ApiBody::from_request(small, &()).await.is_ok());
    }
}
