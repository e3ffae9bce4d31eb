//! Every route of the route table, called by every kind of caller, gets
//! the status this table says. The table is written by hand, apart from
//! the code it checks, for the routes of their own; each kind's own
//! routes (list, create, get, replace, patch, delete, status) get their
//! rows from what its descriptor grants, by this test's own reading of
//! it (`kind_rows`). A route without a row, or a row without a route,
//! fails the test.
//!
//! `P` means the caller passes authentication and authorization (any
//! status but 401 and 403: the request may still be refused for its
//! content); `401` and `403` are exact. Path names are node-a's.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use herd_core::descriptor::NodeAccess;
use herd_core::kinds::LeaderElectionOverrides;
use herd_server::api::routes::routes;
use herd_server::registry::Registry;
use herd_server::{Server, ServerConfig};
use serde_json::{Value, json};

const ADMIN: &str = "matrix-admin-token";
const JOIN: &str = "matrix-join-token";

/// Callers, in column order.
const CALLERS: [&str; 7] = ["admin", "node-a", "node-b", "viewer", "join", "garbage", "none"];

const MATRIX: &str = "
GET    /healthz                                     P    P    P    P    P    P    P
GET    /metrics                                     P    403  403  P    401  401  401
GET    /openapi.json                                P    P    P    P    P    P    P
GET    /api/v1/cluster/status                       P    403  403  P    401  401  401
POST   /api/v1/join                                 401  401  401  401  P    401  401
POST   /api/v1/nodes/{name}/heartbeat               P    P    403  403  401  401  401
GET    /api/v1/nodes/{name}/commands                P    P    403  403  401  401  401
POST   /api/v1/nodes/{name}/readmit                 P    403  403  403  401  401  401
POST   /api/v1/nodes/{name}/role                    P    403  403  403  401  401  401
GET    /api/v1/nodes/{node}/members/{member}/logs   P    403  403  P    401  401  401
GET    /api/v1/nodes/{node}/volumes                 P    403  403  P    401  401  401
POST   /api/v1/commands/{name}/retry                P    403  403  403  401  401  401
POST   /api/v1/commands/{name}/abandon              P    403  403  403  401  401  401
GET    /api/v1/jointokens                           P    403  403  403  401  401  401
POST   /api/v1/jointokens                           P    403  403  403  401  401  401
DELETE /api/v1/jointokens/{id}                      P    403  403  403  401  401  401
POST   /api/v1/members/{name}/eviction              P    403  403  403  401  401  401
POST   /api/v1/members/{name}/notifies/skip         P    403  403  403  401  401  401
GET    /api/v1/cluster/verify                       P    403  403  P    401  401  401
GET    /api/v1/kinds                                P    403  403  P    401  401  401
GET    /                                            P    P    P    P    P    P    P
GET    /ui                                          P    P    P    P    P    P    P
GET    /ui/app.js                                   P    P    P    P    P    P    P
GET    /ui/pages.js                                 P    P    P    P    P    P    P
GET    /ui/style.css                                P    P    P    P    P    P    P
";

/// Each kind's own routes, as its descriptor's access reads: an admin
/// does everything; a node lists and writes nothing but what it owns (its
/// own object, `node-a`'s in the paths, and that object's status) and
/// gets what it is let get; a viewer reads what it is let read; the join
/// token, a garbage token and none are not authenticated.
fn kind_rows() -> Vec<String> {
    let mut rows = Vec::new();
    for kind in herd_core::kinds::descriptors() {
        let (own, any) = match kind.access.node {
            NodeAccess::Own => (true, false),
            NodeAccess::Get => (true, true),
            NodeAccess::None => (false, false),
        };
        let p = |allowed: bool| if allowed { "P" } else { "403" };
        let reads = p(kind.access.viewer_reads);
        let collection = format!("/api/v1/{}", kind.plural);
        let one = format!("{collection}/{{name}}");
        let mut row = |method: &str, path: &str, node_a: &str, node_b: &str, viewer: &str| {
            rows.push(format!("{method} {path} P {node_a} {node_b} {viewer} 401 401 401"));
        };
        row("GET", &collection, "403", "403", reads);
        row("POST", &collection, "403", "403", "403");
        row("GET", &one, p(own), p(any), reads);
        for method in ["PUT", "PATCH", "DELETE"] {
            row(method, &one, "403", "403", "403");
        }
        if kind.has_status {
            row("PUT", &format!("{one}/status"), p(own && !any), "403", "403");
        }
    }
    rows
}

fn matrix() -> BTreeMap<(String, String), Vec<String>> {
    let mut rows = BTreeMap::new();
    let generated = kind_rows();
    for line in MATRIX.lines().filter(|l| !l.trim().is_empty()).chain(generated.iter().map(String::as_str)) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            fields.len(),
            2 + CALLERS.len(),
            "a matrix row has a method, a path and a column per caller: {line}"
        );
        let key = (fields[0].to_string(), fields[1].to_string());
        let previous = rows.insert(key, fields[2..].iter().map(|s| s.to_string()).collect());
        assert!(previous.is_none(), "two rows for {line}");
    }
    rows
}

async fn join(http: &reqwest::Client, base: &str, node: &str) -> String {
    let answer: Value = http
        .post(format!("{base}/api/v1/join"))
        .bearer_auth(JOIN)
        .json(&json!({ "nodeName": node, "agentBootId": format!("boot-{node}") }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    answer["nodeToken"].as_str().expect("a node token").to_string()
}

#[tokio::test]
async fn every_route_answers_every_caller_as_the_matrix_says() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(ServerConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        store_url: dir.path().join("herd.db").display().to_string(),
        admin_token: ADMIN.into(),
        join_token: JOIN.into(),
        identity: "matrix".into(),
        advertise_url: None,
        election: LeaderElectionOverrides::default(),
        fencing_probe: None,
        insecure_http: false,
        node: None,
        agent_cert_lifetime: herd_server::DEFAULT_AGENT_CERT_LIFETIME,
        restore: None,
    })
    .await
    .unwrap();
    let base = server.url().to_string();
    herd_tls::install_provider();
    let trust = herd_tls::Trust::Pinned(vec![server.ca_hash().expect("a TLS server")]);
    let http =
        reqwest::Client::builder().tls_backend_preconfigured(herd_tls::client_config(&trust).unwrap()).build().unwrap();
    let node_a = join(&http, &base, "node-a").await;
    let node_b = join(&http, &base, "node-b").await;
    let viewer: Value = http
        .post(format!("{base}/api/v1/jointokens"))
        .bearer_auth(ADMIN)
        .json(&json!({ "kind": "viewer" }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let viewer = viewer["token"].as_str().expect("a viewer token").to_string();
    let tokens: [Option<&str>; 7] =
        [Some(ADMIN), Some(&node_a), Some(&node_b), Some(&viewer), Some(JOIN), Some("herdnode.node-a.garbage"), None];

    let mut generator = herd_server::api::routes::schema_generator();
    let table = routes(&Registry::standard(), &mut generator);
    let mut expected = matrix();
    let mut wrong = Vec::new();
    for route in &table {
        let key = (route.method.to_string(), route.path.clone());
        let Some(row) = expected.remove(&key) else {
            panic!("route {} {} has no row in the authorization matrix: add one", key.0, key.1);
        };
        let viewer_passes = row[3] == "P" && route.access != herd_server::api::routes::Access::Public;
        if route.viewer != viewer_passes {
            wrong.push(format!(
                "{} {}: documented for viewers {}, the matrix says {}",
                key.0, key.1, route.viewer, row[3]
            ));
        }
        let path = route.path.replace("{name}", "node-a").replace("{node}", "node-a").replace("{member}", "m1");
        let path = path.replace("{id}", "abc123");
        // Writes are dry runs where the route has them, so that the admin's
        // calls change nothing that later rows rely on.
        let dry = route.params.iter().any(|p| p["name"] == "dryRun");
        for ((caller, token), want) in CALLERS.iter().zip(tokens).zip(&row) {
            let mut request = http.request(route.method.clone(), format!("{base}{path}"));
            if dry {
                request = request.query(&[("dryRun", "All")]);
            }
            if route.body.is_some() {
                request = request.json(&json!({}));
            }
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let passed = !matches!(status, 401 | 403);
            let as_expected = match want.as_str() {
                "P" => passed,
                code => code.parse::<u16>().ok() == Some(status),
            };
            if !as_expected {
                wrong.push(format!("{} {path} as {caller}: {status}, the matrix says {want}", route.method));
            } else if !passed {
                let body: Value = response.json().await.unwrap_or_default();
                if body["kind"] != "Status" || body["code"] != status {
                    wrong.push(format!("{} {path} as {caller}: {status} without a Status body: {body}", route.method));
                }
            }
        }
    }
    assert!(
        expected.is_empty(),
        "rows for routes the server does not serve: {:?}",
        expected.keys().collect::<Vec<_>>()
    );
    assert!(wrong.is_empty(), "{} answers differ from the matrix:\n{}", wrong.len(), wrong.join("\n"));
    server.stop().await.unwrap();
}
