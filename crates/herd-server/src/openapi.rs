//! The OpenAPI 3 document served at `/openapi.json`, built from the kind
//! registry so that it always lists exactly what the server serves.

use herd_core::api::{AgentReport, HeartbeatResponse, JoinRequest, JoinResponse, Status, collection_path, object_path};
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use crate::registry::Registry;

fn op(summary: &str, ok: &str, schema: &Value, body: Option<&Value>, params: &[Value]) -> Value {
    let mut operation = json!({
        "summary": summary,
        "parameters": params,
        "responses": {
            ok: { "description": "success", "content": { "application/json": { "schema": schema } } },
            "default": { "description": "error", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Status" } } } }
        },
        "security": [ { "bearer": [] } ]
    });
    if let Some(body) = body {
        operation["requestBody"] = json!({ "required": true, "content": { "application/json": { "schema": body } } });
    }
    operation
}

fn query(name: &str, description: &str, type_: &str) -> Value {
    json!({ "name": name, "in": "query", "required": false, "description": description, "schema": { "type": type_ } })
}

pub fn document(registry: &Registry) -> Value {
    let mut generator = SchemaSettings::openapi3().into_generator();
    let mut paths = Map::new();
    let list_params = [
        query("labelSelector", "only objects whose labels match, e.g. app=web,tier!=db", "string"),
        query("limit", "at most this many items; a continue token follows when more exist", "integer"),
        query("continue", "the continue token of the previous page", "string"),
        query("watch", "stream changes as JSON lines instead of listing", "boolean"),
        query("resourceVersion", "with watch: changes after this revision (410 if compacted)", "string"),
    ];
    let dry_run = [query("dryRun", "`All`: validate and answer, store nothing", "string")];
    for ops in registry.iter() {
        let info = ops.info();
        let schema = serde_json::to_value(ops.schema(&mut generator)).unwrap_or_default();
        let list_schema = json!({ "type": "object", "properties": { "items": { "type": "array", "items": schema } } });
        let name = json!({ "name": "name", "in": "path", "required": true, "schema": { "type": "string" } });
        let kind = info.kind;
        paths.insert(
            collection_path(info.plural),
            json!({
                "get": op(&format!("List or watch {kind} objects"), "200", &list_schema, None, &list_params),
                "post": op(&format!("Create a {kind}"), "201", &schema, Some(&schema), &dry_run),
            }),
        );
        let with_name: Vec<Value> = dry_run.iter().cloned().chain([name.clone()]).collect();
        let delete_params: Vec<Value> = with_name
            .iter()
            .cloned()
            .chain([query("resourceVersion", "delete only at this revision", "string")])
            .collect();
        let item = json!({
            "get": op(&format!("Read a {kind}"), "200", &schema, None, std::slice::from_ref(&name)),
            "put": op(&format!("Replace a {kind}'s metadata and spec (send its resourceVersion)"), "200", &schema, Some(&schema), &with_name),
            "delete": op(&format!("Delete a {kind}"), "200", &schema, None, &delete_params),
        });
        paths.insert(object_path(info.plural, "{name}"), item);
        if info.has_status {
            paths.insert(
                format!("{}/status", object_path(info.plural, "{name}")),
                json!({ "put": op(&format!("Replace a {kind}'s status"), "200", &schema, Some(&schema), &with_name) }),
            );
        }
    }
    let join_req = serde_json::to_value(generator.subschema_for::<JoinRequest>()).unwrap_or_default();
    let join_resp = serde_json::to_value(generator.subschema_for::<JoinResponse>()).unwrap_or_default();
    let report = serde_json::to_value(generator.subschema_for::<AgentReport>()).unwrap_or_default();
    let hb_resp = serde_json::to_value(generator.subschema_for::<HeartbeatResponse>()).unwrap_or_default();
    generator.subschema_for::<Status>();
    paths.insert("/api/v1/join".into(), json!({ "post": op("Register a node with the join token; returns its node token", "200", &join_resp, Some(&join_req), &[]) }));
    paths.insert(
        "/api/v1/nodes/{name}/heartbeat".into(),
        json!({ "post": op("A node's heartbeat (node token of that node)", "200", &hb_resp, Some(&report), &[json!({ "name": "name", "in": "path", "required": true, "schema": { "type": "string" } })]) }),
    );
    json!({
        "openapi": "3.0.3",
        "info": { "title": "herd", "version": env!("CARGO_PKG_VERSION") },
        "paths": paths,
        "components": {
            "schemas": generator.take_definitions(true),
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } }
        }
    })
}
