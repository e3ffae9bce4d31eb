//! The OpenAPI 3 document served at `/openapi.json`, built from the route
//! table (`api::routes`) that also builds the router, so that it lists
//! exactly what the server serves.

use herd_core::api::Status;
use serde_json::{Map, Value, json};

use crate::api::routes::{Access, Answer, Route, routes, schema_generator};
use crate::registry::Registry;

fn error_body() -> Value {
    json!({ "description": "error", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Status" } } } })
}

fn operation(route: &Route) -> Value {
    let mut responses = Map::new();
    match &route.answer {
        Answer::Json(code, schema) => {
            let mut content = json!({ "application/json": { "schema": schema } });
            if route.params.iter().any(|p| p["name"] == "watch") {
                // With watch=true: JSON lines of watch events.
                content["application/x-ndjson"] = json!({ "schema": { "type": "string" } });
            }
            responses.insert(code.to_string(), json!({ "description": "success", "content": content }));
        }
        Answer::Text => {
            let content = json!({ "text/plain": { "schema": { "type": "string" } } });
            responses.insert("200".into(), json!({ "description": "success", "content": content }));
        }
        Answer::Asset(content_type) => {
            let media = content_type.split(';').next().unwrap_or(content_type);
            let content = json!({ media: { "schema": { "type": "string" } } });
            responses.insert("200".into(), json!({ "description": "success", "content": content }));
        }
    }
    responses.insert("default".into(), error_body());
    let who = match route.access {
        Access::Public => "Anyone, without a token.",
        Access::JoinToken => "A join token.",
        Access::Admin => "The admin token.",
        Access::AdminOrOwnNode => "The admin token, or the named node's own node token.",
        Access::AdminOrAnyNode => "The admin token, or any node token.",
    };
    let mut operation = json!({
        "operationId": format!("{} {}", route.method, route.path),
        "summary": route.summary,
        "description": if route.viewer {
            format!("Who may call it: {who} A viewer token may read it too.")
        } else {
            format!("Who may call it: {who}")
        },
        "parameters": route.params,
        "responses": responses,
    });
    operation["security"] = match route.access {
        Access::Public => json!([]),
        _ => json!([{ "bearer": [] }]),
    };
    if let Some(body) = &route.body {
        operation["requestBody"] = json!({ "required": true, "content": { "application/json": { "schema": body } } });
    }
    operation
}

pub fn document(registry: &Registry) -> Value {
    let mut generator = schema_generator();
    let mut paths: Map<String, Value> = Map::new();
    for route in routes(registry, &mut generator) {
        let entry = paths.entry(route.path.clone()).or_insert_with(|| json!({}));
        entry[route.method.as_str().to_ascii_lowercase()] = operation(&route);
    }
    generator.subschema_for::<Status>();
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
