//! `POST /api/v1/join` and `POST /api/v1/nodes/{name}/heartbeat`.

use axum::Json;
use axum::extract::{ConnectInfo, State};
use axum::http::HeaderMap;
use herd_core::api::{AgentReport, JoinRequest, JoinResponse, Readmission};
use herd_core::api::{NodeRoleChanged, NodeRoleRequest, NodeRoleResponse};
use herd_core::authz::Verb;
use herd_core::configuration::Ssconf;
use herd_core::kinds::NodeSpec;
use herd_core::roles::RoleChange;

use axum::response::Response;
use herd_core::Resource;
use herd_core::kinds::CommandSpec;
use herd_core::kinds::command::NODE_LABEL;

use super::resources::{ListQuery, parse_body, serve_list};
use super::{ApiBody, ApiName, ApiQuery, AppState, Caller};
use crate::auth::bearer;
use crate::error::ApiError;
use crate::join_refusals::RemoteAddr;

/// `POST /api/v1/join`. A join refused for its token stores nothing (its
/// body is anyone's) and counts against its source's rate
/// (`crate::join_refusals`).
pub async fn join(
    State(state): State<AppState>,
    ConnectInfo(RemoteAddr(source)): ConnectInfo<RemoteAddr>,
    headers: HeaderMap,
    ApiBody(body): ApiBody,
) -> Result<Json<JoinResponse>, ApiError> {
    if let Err(limited) = state.join_refusals.admit(source.ip()) {
        state.metrics.join_refused(true);
        return Err(limited);
    }
    let join_token = match state.auth.check_join_token(bearer(&headers)).await {
        Ok(join_token) => join_token,
        Err(error) => {
            state.metrics.join_refused(false);
            state.join_refusals.refused(source.ip(), &error);
            return Err(error);
        }
    };
    let request: JoinRequest = parse_body(&body, NodeSpec::KIND, "")?;
    let (objects, certificates) = (&state.objects, &state.node_certificates);
    crate::nodes::join(objects, &state.config, &state.auth, &state.events, certificates, (request, join_token))
        .await
        .map(Json)
}

/// `GET /api/v1/nodes/{name}/commands` (list, or watch with `watch=true`):
/// the Commands for one node, readable with that node's token. Its watch
/// carries what the agent acts on (attempts to take up, abandons), not
/// the recording of its own reports nor deletions.
pub async fn commands(
    State(state): State<AppState>,
    caller: Caller,
    ApiName(name): ApiName,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Response, ApiError> {
    caller.may(Verb::ReadCommands, "nodes", Some(&name))?;
    if name.len() > herd_core::validation::MAX_NODE_NAME_LENGTH {
        return Err(ApiError::NotFound { kind: NodeSpec::KIND.into(), name });
    }
    let selector = query.selector_and(&format!("{NODE_LABEL}={name}"))?;
    let kind = state.registry.get(CommandSpec::PLURAL)?.info();
    serve_list(state, kind, selector, query, super::watch::Source::NodeCommands(name)).await
}

/// `POST /api/v1/nodes/{name}/role`: one change to a node's role or
/// master capability (`crate::node_roles`).
pub async fn change_role(
    State(state): State<AppState>,
    caller: Caller,
    ApiName(name): ApiName,
    ApiBody(body): ApiBody,
) -> Result<Json<NodeRoleResponse>, ApiError> {
    caller.may(Verb::Update, "nodes", Some(&name))?;
    let request: NodeRoleRequest = parse_body(&body, NodeSpec::KIND, &name)?;
    let change = match (request.role, request.master_capable) {
        (Some(role), None) => RoleChange::Role(role),
        (None, Some(capable)) => RoleChange::MasterCapable(capable),
        _ => {
            let errors = herd_core::ValidationErrors::single("role", "give exactly one of role and masterCapable");
            return Err(ApiError::invalid(NodeSpec::KIND, &name, errors));
        }
    };
    let pool = crate::nodes::cluster_config(&state.config).candidate_pool_size as usize;
    let updates =
        crate::node_roles::change(&state.objects, &state.events, pool, &name, change, request.auto_promote).await?;
    let changed = updates
        .into_iter()
        .map(|u| NodeRoleChanged { name: u.name, role: u.role, master_capable: u.master_capable, why: u.why })
        .collect();
    Ok(Json(NodeRoleResponse { changed }))
}

/// `POST /api/v1/nodes/{name}/readmit`: lets a deleted node's agent join again.
pub async fn readmit(
    State(state): State<AppState>,
    caller: Caller,
    ApiName(name): ApiName,
) -> Result<Json<Readmission>, ApiError> {
    caller.may(Verb::Update, "nodes", Some(&name))?;
    crate::nodes::readmit(&state.auth, &state.events, &name).await.map(Json)
}

pub async fn heartbeat(
    State(state): State<AppState>,
    caller: Caller,
    ApiName(name): ApiName,
    ApiBody(body): ApiBody,
) -> Result<Json<crate::nodes::HeartbeatAnswer>, ApiError> {
    caller.may(Verb::Heartbeat, "nodes", Some(&name))?;
    let report: AgentReport = parse_body(&body, NodeSpec::KIND, &name)?;
    // Only the leading replica takes heartbeats: it renews the members'
    // role leases, and a member may be granted one only on a node it has
    // heard from. A standby's answer would renew nothing, and the leader
    // would never hear the node; the agent asks the next server instead.
    // (A master a failover superseded still answers: it tells where to go.)
    let superseded = state.supersession.as_ref().is_some_and(|s| s.superseded().is_some());
    if !state.leader_health.is_leading() && !superseded {
        let why = "this replica does not lead: a node's heartbeats go to the leading replica".to_string();
        return Err(ApiError::Unavailable(why));
    }
    let certificates = &state.node_certificates;
    let services = crate::nodes::HeartbeatServices {
        objects: &state.objects,
        config: &state.config,
        nodes: &state.nodes,
        commands: &state.commands,
        configuration: &state.configuration,
        events: &state.events,
        metrics: &state.metrics,
        certificates,
        renewals: &state.renewals,
    };
    let crate::nodes::Heartbeat { response: mut answer, mut configuration_bytes } =
        crate::nodes::heartbeat(services, (&name, state.nodes.get(&name)), report).await?;
    if let Some(superseded) = state.supersession.as_ref().and_then(|s| s.superseded()) {
        // A superseded master tells the node where the master is now, and
        // acknowledges nothing: the new master records its journal.
        let serial = answer.ssconf.as_ref().map_or(0, |f| f.serial);
        answer.ssconf = Some(Ssconf { serial, master_urls: superseded.master_urls, term: superseded.term });
        answer.acknowledged.clear();
        answer.configuration = None;
        answer.configuration_deltas.clear();
        answer.drop_configuration = false;
        answer.superseded = true;
        configuration_bytes = 0;
    }
    state.metrics.configuration_bytes_sent.inc_by(configuration_bytes as u64);
    Ok(Json(answer))
}
