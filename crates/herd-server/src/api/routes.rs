//! The route table: every route the server serves, each with its handler
//! and its description. The router and `/openapi.json` are both built from
//! it, so no route can be served undocumented or documented unserved, and
//! the authorization matrix test walks it.

use axum::extract::State;
use axum::http::Method;
use axum::routing::{MethodRouter, delete, get, patch, post, put};
use herd_core::Resource;
use herd_core::api::{
    AgentReport, CLUSTER_STATUS_PATH, CLUSTER_VERIFY_PATH, ClusterStatus, Eviction, HeartbeatResponse,
    JOIN_TOKENS_PATH, JoinRequest, JoinResponse, JoinTokenInfo, JoinTokenList, JoinTokenRequest, StoredVolume,
};
use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{Value, json};

use super::resources::{ListQuery, WriteQuery};
use super::{
    ApiBody, ApiName, ApiQuery, AppState, Caller, agents, commands, eviction, meta, nodes, notifies, resources, tokens,
};
use crate::objects::Part;
use crate::registry::Registry;

/// Who may call a route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Anyone, without a token.
    Public,
    /// A join token (the server's own or one made with `herd token create`).
    JoinToken,
    /// The admin token.
    Admin,
    /// The admin, or the node named in the path with its own node token.
    AdminOrOwnNode,
    /// The admin, or any node (the ClusterConfig).
    AdminOrAnyNode,
}

/// What a route answers on success.
#[derive(Clone, Debug)]
pub enum Answer {
    /// JSON of this schema, with this status.
    Json(u16, Value),
    /// Plain text.
    Text,
    /// A dashboard file of this content type.
    Asset(&'static str),
}

/// One route: method, path (`{param}` as in OpenAPI and axum), handler and
/// description.
pub struct Route {
    pub method: Method,
    pub path: String,
    pub summary: String,
    pub access: Access,
    /// Whether a viewer token may call it too (a read of anything but
    /// tokens: `herd_core::authz`).
    pub viewer: bool,
    /// OpenAPI parameter objects (path and query).
    pub params: Vec<Value>,
    pub body: Option<Value>,
    pub answer: Answer,
    pub handler: MethodRouter<AppState>,
}

/// Names as `herd_core::validation::check_name` accepts them.
pub const NAME_PATTERN: &str = "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$";
pub const NAME_MAX_LENGTH: usize = 253;

fn name_schema() -> Value {
    json!({ "type": "string", "pattern": NAME_PATTERN, "minLength": 1, "maxLength": NAME_MAX_LENGTH })
}

fn path_param(name: &str, description: &str) -> Value {
    json!({ "name": name, "in": "path", "required": true, "description": description, "schema": name_schema() })
}

/// A node's name in the path: at most 63 characters
/// (`herd_core::validation::check_node_name`).
fn node_param(name: &str, description: &str) -> Value {
    let mut param = path_param(name, description);
    param["schema"]["maxLength"] = json!(herd_core::validation::MAX_NODE_NAME_LENGTH);
    param
}

fn query(name: &str, description: &str, schema: Value) -> Value {
    json!({ "name": name, "in": "query", "required": false, "description": description, "schema": schema })
}

fn revision_schema() -> Value {
    json!({ "type": "string", "pattern": "^[0-9]{1,18}$" })
}

fn list_params() -> Vec<Value> {
    vec![
        query(
            "labelSelector",
            "only objects whose labels match: comma-separated `key=value`, `key!=value`, `key`, `!key`",
            json!({ "type": "string", "pattern": herd_core::labels::SELECTOR_PATTERN, "maxLength": 1024 }),
        ),
        query(
            "limit",
            "at most this many items (0: all); a continue token follows when more exist",
            json!({ "type": "integer", "minimum": 0, "maximum": 100_000 }),
        ),
        query(
            "continue",
            "the continue token of the previous page (opaque)",
            json!({ "type": "string", "maxLength": 1024 }),
        ),
        query("watch", "stream changes as JSON lines instead of listing", json!({ "type": "boolean" })),
        query("resourceVersion", "with watch: changes after this revision (410 if compacted)", revision_schema()),
        query(
            "timeoutSeconds",
            "with watch: end the stream after this many seconds [default: never]",
            json!({ "type": "integer", "minimum": 1, "maximum": 3600 }),
        ),
        query(
            "batchMillis",
            "with watch: send the changes that come within this many milliseconds of one another as one chunk [default: 0, each as it comes]",
            json!({ "type": "integer", "minimum": 0, "maximum": 1000 }),
        ),
    ]
}

fn dry_run() -> Value {
    query("dryRun", "`All`: validate and answer, store nothing", json!({ "type": "string", "enum": ["All"] }))
}

fn schema_of<T: JsonSchema>(generator: &mut SchemaGenerator) -> Value {
    serde_json::to_value(generator.subschema_for::<T>()).unwrap_or_default()
}

fn list_of(schema: &Value) -> Value {
    json!({
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "items"],
        "properties": {
            "apiVersion": { "type": "string" },
            "kind": { "type": "string" },
            "metadata": { "$ref": "#/components/schemas/ListMeta" },
            "items": { "type": "array", "items": schema }
        }
    })
}

/// Integers bounded by their Rust type, so that a schema-valid number is
/// one the server can read (schemars states only the format).
#[derive(Clone)]
struct IntegerBounds;

impl schemars::transform::Transform for IntegerBounds {
    fn transform(&mut self, schema: &mut schemars::Schema) {
        let bounds: Option<(Value, Value)> = match schema.get("format").and_then(Value::as_str) {
            Some("uint8") => Some((json!(0), json!(u8::MAX))),
            Some("uint16") => Some((json!(0), json!(u16::MAX))),
            Some("uint32") => Some((json!(0), json!(u32::MAX))),
            Some("uint64" | "uint") => Some((json!(0), json!(u64::MAX))),
            Some("int32") => Some((json!(i32::MIN), json!(i32::MAX))),
            Some("int64" | "int") => Some((json!(i64::MIN), json!(i64::MAX))),
            _ => None,
        };
        if let (Some((min, max)), Some(object)) = (bounds, schema.as_object_mut()) {
            object.entry("minimum").or_insert(min);
            object.entry("maximum").or_insert(max);
        }
        schemars::transform::transform_subschemas(self, schema);
    }
}

/// The schema generator every part of the document is made with.
pub fn schema_generator() -> SchemaGenerator {
    schemars::generate::SchemaSettings::openapi3().with_transform(IntegerBounds).into_generator()
}

/// Every route, in the order they are documented.
pub fn routes(registry: &Registry, generator: &mut SchemaGenerator) -> Vec<Route> {
    let mut routes = fixed_routes(generator);
    routes.extend(crate::ui::ASSETS.iter().map(|asset| Route {
        method: Method::GET,
        path: asset.path.into(),
        summary: "The dashboard (log in with a viewer or admin token)".into(),
        access: Access::Public,
        viewer: false,
        params: vec![],
        body: None,
        answer: Answer::Asset(asset.content_type),
        handler: get(move || async move { crate::ui::serve(asset) }),
    }));
    generator.subschema_for::<herd_core::api::ListMeta>();
    for ops in registry.iter() {
        routes.extend(kind_routes(ops.info(), &serde_json::to_value(ops.schema(generator)).unwrap_or_default()));
    }
    routes
}

/// `PUT` of an object's metadata and spec, or of its status.
fn replace_handler(plural: &'static str, part: Part) -> MethodRouter<AppState> {
    put(
        move |state: State<AppState>,
              caller: Caller,
              ApiName(name): ApiName,
              query: ApiQuery<WriteQuery>,
              body: ApiBody| { resources::replace(state, caller, plural, name, query, body, part) },
    )
}

fn kind_routes(info: crate::registry::KindInfo, schema: &Value) -> Vec<Route> {
    let (kind, plural) = (info.kind, info.plural);
    let collection = herd_core::api::collection_path(plural);
    let item = herd_core::api::object_path(plural, "{name}");
    let name = || match plural {
        herd_core::kinds::NodeSpec::PLURAL => node_param("name", "the node's name"),
        _ => path_param("name", &format!("the {kind}'s name")),
    };
    let with_name = |mut params: Vec<Value>| {
        params.insert(0, name());
        params
    };
    let reads =
        if plural == herd_core::kinds::ClusterConfigSpec::PLURAL { Access::AdminOrAnyNode } else { Access::Admin };
    let own = if plural == herd_core::kinds::NodeSpec::PLURAL { Access::AdminOrOwnNode } else { Access::Admin };
    let mut routes = vec![
        Route {
            method: Method::GET,
            path: collection.clone(),
            summary: format!("List or watch {kind} objects"),
            access: Access::Admin,
            viewer: true,
            params: list_params(),
            body: None,
            answer: Answer::Json(200, list_of(schema)),
            handler: get(move |state: State<AppState>, caller: Caller, query: ApiQuery<ListQuery>| {
                resources::list_or_watch(state, caller, plural, query)
            }),
        },
        Route {
            method: Method::POST,
            path: collection,
            summary: format!("Create a {kind}"),
            access: Access::Admin,
            viewer: false,
            params: vec![dry_run()],
            body: Some(schema.clone()),
            answer: Answer::Json(201, schema.clone()),
            handler: post(move |state: State<AppState>, caller: Caller, query: ApiQuery<WriteQuery>, body: ApiBody| {
                resources::create(state, caller, plural, query, body)
            }),
        },
        Route {
            method: Method::GET,
            path: item.clone(),
            summary: format!("Read a {kind}"),
            access: if own == Access::AdminOrOwnNode { own } else { reads },
            viewer: true,
            params: vec![name()],
            body: None,
            answer: Answer::Json(200, schema.clone()),
            handler: get(move |state: State<AppState>, caller: Caller, ApiName(name): ApiName| {
                resources::get(state, caller, plural, name)
            }),
        },
        Route {
            method: Method::PUT,
            path: item.clone(),
            summary: format!("Replace a {kind}'s metadata and spec (send its resourceVersion)"),
            access: Access::Admin,
            viewer: false,
            params: with_name(vec![dry_run()]),
            body: Some(schema.clone()),
            answer: Answer::Json(200, schema.clone()),
            handler: replace_handler(plural, Part::Spec),
        },
        Route {
            method: Method::PATCH,
            path: item.clone(),
            summary: format!(
                "Change a {kind}'s metadata or spec by a JSON merge patch (RFC 7386); with metadata.resourceVersion only at that revision"
            ),
            access: Access::Admin,
            viewer: false,
            params: with_name(vec![dry_run()]),
            body: Some(json!({ "type": "object", "description": "a JSON merge patch of the object (not its status)" })),
            answer: Answer::Json(200, schema.clone()),
            handler: patch(
                move |state: State<AppState>,
                      caller: Caller,
                      ApiName(name): ApiName,
                      query: ApiQuery<WriteQuery>,
                      body: ApiBody| { resources::patch(state, caller, plural, name, query, body) },
            ),
        },
        Route {
            method: Method::DELETE,
            path: item.clone(),
            summary: match info.delete_refusal {
                Some(why) => format!("Delete a {kind}: always refused (409), {why}"),
                None => format!("Delete a {kind}"),
            },
            access: Access::Admin,
            viewer: false,
            params: with_name(vec![
                dry_run(),
                query("resourceVersion", "delete only at this revision", revision_schema()),
            ]),
            body: None,
            answer: Answer::Json(200, schema.clone()),
            handler: delete(
                move |state: State<AppState>, caller: Caller, ApiName(name): ApiName, query: ApiQuery<WriteQuery>| {
                    resources::delete(state, caller, plural, name, query)
                },
            ),
        },
    ];
    if info.has_status {
        routes.push(Route {
            method: Method::PUT,
            path: format!("{item}/status"),
            summary: format!("Replace a {kind}'s status"),
            access: own,
            viewer: false,
            params: with_name(vec![dry_run()]),
            body: Some(schema.clone()),
            answer: Answer::Json(200, schema.clone()),
            handler: replace_handler(plural, Part::Status),
        });
    }
    routes
}

fn fixed_routes(generator: &mut SchemaGenerator) -> Vec<Route> {
    let node = || node_param("name", "the node's name");
    let command = || path_param("name", "the Command's name");
    let command_schema = json!({ "$ref": "#/components/schemas/Object_for_CommandSpec" });
    vec![
        Route {
            method: Method::GET,
            path: "/healthz".into(),
            summary: "Whether this replica can serve: its store answers, and, if it leads, it renews its lease (503 otherwise)".into(),
            access: Access::Public,
            viewer: false,
            params: vec![],
            body: None,
            answer: Answer::Text,
            handler: get(meta::healthz),
        },
        Route {
            method: Method::GET,
            path: "/metrics".into(),
            summary: "Prometheus metrics (text exposition format); scrape with a viewer token".into(),
            access: Access::Admin,
            viewer: true,
            params: vec![],
            body: None,
            answer: Answer::Text,
            handler: get(meta::metrics),
        },
        Route {
            method: Method::GET,
            path: "/openapi.json".into(),
            summary: "This document".into(),
            access: Access::Public,
            viewer: false,
            params: vec![],
            body: None,
            answer: Answer::Json(200, json!({ "type": "object" })),
            handler: get(meta::openapi),
        },
        Route {
            method: Method::GET,
            path: CLUSTER_STATUS_PATH.into(),
            summary: "The leader and the replicas, as the answering replica sees them".into(),
            access: Access::Admin,
            viewer: true,
            params: vec![],
            body: None,
            answer: Answer::Json(200, schema_of::<ClusterStatus>(generator)),
            handler: get(meta::cluster_status),
        },
        Route {
            method: Method::GET,
            path: CLUSTER_VERIFY_PATH.into(),
            summary: "What is wrong with the nodes' roles and the candidate pool (`herd cluster verify`)".into(),
            access: Access::Admin,
            viewer: true,
            params: vec![],
            body: None,
            answer: Answer::Json(200, schema_of::<herd_core::verify::Report>(generator)),
            handler: get(meta::cluster_verify),
        },
        Route {
            method: Method::GET,
            path: herd_core::api::KINDS_PATH.into(),
            summary: "Every kind served: its names, who may touch it, the columns of its table".into(),
            access: Access::Admin,
            viewer: true,
            params: vec![],
            body: None,
            answer: Answer::Json(200, schema_of::<Vec<herd_core::descriptor::Descriptor>>(generator)),
            handler: get(meta::kinds),
        },
        Route {
            method: Method::POST,
            path: "/api/v1/join".into(),
            summary: "Register a node with a join token; returns its node token (409 for a name that has joined)".into(),
            access: Access::JoinToken,
            viewer: false,
            params: vec![],
            body: Some(schema_of::<JoinRequest>(generator)),
            answer: Answer::Json(200, schema_of::<JoinResponse>(generator)),
            handler: post(nodes::join),
        },
        Route {
            method: Method::POST,
            path: "/api/v1/nodes/{name}/heartbeat".into(),
            summary: "A node's heartbeat: its status and its Command reports".into(),
            access: Access::AdminOrOwnNode,
            viewer: false,
            params: vec![node()],
            body: Some(schema_of::<AgentReport>(generator)),
            answer: Answer::Json(200, schema_of::<HeartbeatResponse>(generator)),
            handler: post(nodes::heartbeat),
        },
        Route {
            method: Method::GET,
            path: herd_core::api::node_commands_path("{name}"),
            summary: "List the Commands for one node, or watch those that ask something of its agent (an attempt to take up, an abandon)".into(),
            access: Access::AdminOrOwnNode,
            viewer: false,
            params: [node()].into_iter().chain(list_params()).collect(),
            body: None,
            answer: Answer::Json(200, list_of(&command_schema)),
            handler: get(nodes::commands),
        },
        Route {
            method: Method::POST,
            path: "/api/v1/nodes/{name}/role".into(),
            summary: "Change a node's role or master capability under the pool's rules (409 with the reason)".into(),
            access: Access::Admin,
            viewer: false,
            params: vec![node()],
            body: Some(schema_of::<herd_core::api::NodeRoleRequest>(generator)),
            answer: Answer::Json(200, schema_of::<herd_core::api::NodeRoleResponse>(generator)),
            handler: post(nodes::change_role),
        },
        Route {
            method: Method::POST,
            path: "/api/v1/nodes/{name}/readmit".into(),
            summary: "Let the agent of a deleted node join again, saying whether it can with its join token (404 if nothing is kept out)".into(),
            access: Access::Admin,
            viewer: false,
            params: vec![node()],
            body: None,
            answer: Answer::Json(200, schema_of::<herd_core::api::Readmission>(generator)),
            handler: post(nodes::readmit),
        },
        Route {
            method: Method::GET,
            path: "/api/v1/nodes/{node}/members/{member}/logs".into(),
            summary: "The end of a member's log, fetched from its node's agent".into(),
            access: Access::Admin,
            viewer: true,
            params: vec![
                node_param("node", "the node the member runs on"),
                path_param("member", "the member's name"),
                query("stream", "which log [default: stdout]", json!({ "type": "string", "enum": ["stdout", "stderr", "setup"] })),
                query(
                    "bytes",
                    "at most this many bytes: the last ones, or those from `offset` [default: 65536]",
                    json!({ "type": "integer", "minimum": 0, "maximum": agents::MAX_LOG_BYTES }),
                ),
                query(
                    "offset",
                    "from this byte of the log on (the `herd-log-offset` header of an answer says where its text starts)",
                    json!({ "type": "integer", "minimum": 0, "maximum": i64::MAX }),
                ),
            ],
            body: None,
            answer: Answer::Text,
            handler: get(agents::member_log),
        },
        Route {
            method: Method::GET,
            path: "/api/v1/nodes/{node}/volumes".into(),
            summary: "A node's volumes and partial copies, each with what owns it".into(),
            access: Access::Admin,
            viewer: true,
            params: vec![node_param("node", "the node's name")],
            body: None,
            answer: Answer::Json(200, json!({ "type": "array", "items": schema_of::<StoredVolume>(generator) })),
            handler: get(agents::node_volumes),
        },
        Route {
            method: Method::POST,
            path: "/api/v1/members/{name}/eviction".into(),
            summary: "Evict a member if every budget that selects it allows (429 naming each that does not)".into(),
            access: Access::Admin,
            viewer: false,
            params: vec![path_param("name", "the Member's name"), dry_run()],
            body: None,
            answer: Answer::Json(200, schema_of::<Eviction>(generator)),
            handler: post(eviction::evict),
        },
        Route {
            method: Method::POST,
            path: "/api/v1/members/{name}/notifies/skip".into(),
            summary: "Drop a member's first pending notify unsent (every one with all=true): 409 if none is pending"
                .into(),
            access: Access::Admin,
            viewer: false,
            params: vec![
                path_param("name", "the Member's name"),
                query("all", "drop every pending notify of the member", json!({ "type": "boolean" })),
            ],
            body: None,
            answer: Answer::Json(200, json!({ "$ref": "#/components/schemas/Object_for_MemberSpec" })),
            handler: post(notifies::skip),
        },
        Route {
            method: Method::POST,
            path: "/api/v1/commands/{name}/retry".into(),
            summary: "Issue a failed, interrupted or abandoned Command again (409 if it is not settled)".into(),
            access: Access::Admin,
            viewer: false,
            params: vec![command()],
            body: None,
            answer: Answer::Json(200, command_schema.clone()),
            handler: post(commands::retry),
        },
        Route {
            method: Method::POST,
            path: "/api/v1/commands/{name}/abandon".into(),
            summary: "Give a Command up: its agent ends the work".into(),
            access: Access::Admin,
            viewer: false,
            params: vec![
                command(),
                query("keepStaging", "keep a copy's partial staging for a later copy", json!({ "type": "boolean" })),
            ],
            body: None,
            answer: Answer::Json(200, command_schema),
            handler: post(commands::abandon),
        },
        Route {
            method: Method::GET,
            path: JOIN_TOKENS_PATH.into(),
            summary: "The join tokens made through the API, expired ones included (never their secrets)".into(),
            access: Access::Admin,
            viewer: false,
            params: vec![],
            body: None,
            answer: Answer::Json(200, schema_of::<JoinTokenList>(generator)),
            handler: get(tokens::list),
        },
        Route {
            method: Method::POST,
            path: JOIN_TOKENS_PATH.into(),
            summary: "Create a join token; its secret is in this answer only".into(),
            access: Access::Admin,
            viewer: false,
            params: vec![],
            body: Some(schema_of::<JoinTokenRequest>(generator)),
            answer: Answer::Json(201, schema_of::<JoinTokenInfo>(generator)),
            handler: post(tokens::create),
        },
        Route {
            method: Method::DELETE,
            path: format!("{JOIN_TOKENS_PATH}/{{id}}"),
            summary: "Revoke a join token".into(),
            access: Access::Admin,
            viewer: false,
            params: vec![json!({
                "name": "id", "in": "path", "required": true, "description": "the token's id",
                "schema": { "type": "string", "pattern": "^[a-z0-9]{1,32}$" }
            })],
            body: None,
            answer: Answer::Json(200, schema_of::<JoinTokenInfo>(generator)),
            handler: delete(tokens::delete),
        },
    ]
}
