//! Authentication and authorisation, bad input, stale writes: against a
//! real server process.

use crate::common;

use common::{JOIN_TOKEN, TestServer};
use herd_client::{Client, ClientError};
use herd_core::api::{AgentReport, JoinRequest, StatusReason};
use herd_core::kinds::{EventReason, NodeRole, NodeSpec};
use serde_json::json;

pub async fn join(server: &TestServer, name: &str) -> Client {
    let joined = server
        .anonymous()
        .with_token(Some(JOIN_TOKEN.into()))
        .join(&JoinRequest {
            node_name: name.into(),
            previous_node_token: None,
            report: AgentReport { agent_boot_id: format!("boot-{name}"), ..Default::default() },
        })
        .await
        .unwrap();
    server.anonymous().with_token(Some(joined.node_token))
}

fn reason(result: Result<impl Sized, ClientError>) -> StatusReason {
    match result {
        Err(error) => error.reason().unwrap_or_else(|| panic!("not an API error: {error}")),
        Ok(_) => panic!("expected an error, got success"),
    }
}

#[tokio::test]
async fn requests_without_a_valid_token_get_401() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    assert_eq!(reason(server.anonymous().list_values("nodes", "").await), StatusReason::Unauthorized);
    let wrong = server.anonymous().with_token(Some("not-a-token".into()));
    assert_eq!(reason(wrong.list_values("nodes", "").await), StatusReason::Unauthorized);
    let forged = server.anonymous().with_token(Some("herdnode.n1.0000".into()));
    assert_eq!(reason(forged.get_value("nodes", "n1").await), StatusReason::Unauthorized);
    // The join token is only good for joining.
    let join_only = server.anonymous().with_token(Some(JOIN_TOKEN.into()));
    assert_eq!(reason(join_only.list_values("nodes", "").await), StatusReason::Unauthorized);
    let bad_join = server.anonymous().with_token(Some("wrong".into()));
    let request = JoinRequest {
        node_name: "n9".into(),
        previous_node_token: None,
        report: AgentReport { agent_boot_id: "b".into(), ..Default::default() },
    };
    assert_eq!(reason(bad_join.join(&request).await), StatusReason::Unauthorized);
    // Health, metrics and the OpenAPI document are public.
    assert_eq!(server.anonymous().get_text("/healthz").await.unwrap(), "ok");
}

#[tokio::test]
async fn a_node_may_write_only_its_own_status() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let node_a = join(&server, "node-a").await;
    let node_b = join(&server, "node-b").await;

    let mut b = server.admin().get::<NodeSpec>("node-b").await.unwrap();
    b.status.address = Some("10.9.9.9:1".into());
    let refused = node_a.update_status(&b).await.unwrap_err();
    assert_eq!(refused.reason(), Some(StatusReason::Forbidden));
    assert!(refused.to_string().contains("node node-a may not UpdateStatus nodes node-b"), "{refused}");
    assert_eq!(
        reason(node_a.heartbeat("node-b", &AgentReport { agent_boot_id: "x".into(), ..Default::default() }).await),
        StatusReason::Forbidden
    );
    assert_ne!(server.admin().get::<NodeSpec>("node-b").await.unwrap().status.address.as_deref(), Some("10.9.9.9:1"));

    // Its own status: allowed. Its own spec, other kinds, listing: refused.
    let mut a = node_a.get::<NodeSpec>("node-a").await.unwrap();
    a.status.config_serial = 7;
    assert_eq!(node_a.update_status(&a).await.unwrap().status.config_serial, 7);
    let mut a = node_a.get::<NodeSpec>("node-a").await.unwrap();
    a.spec.role = NodeRole::Drained;
    assert_eq!(reason(node_a.update(&a).await), StatusReason::Forbidden);
    assert_eq!(reason(node_a.list_values("nodes", "").await), StatusReason::Forbidden);
    assert_eq!(reason(node_b.delete_value("nodes", "node-b", Default::default()).await), StatusReason::Forbidden);
    assert_eq!(reason(node_a.get_value("leases", "x").await), StatusReason::Forbidden);
}

#[tokio::test]
async fn malformed_bodies_get_422_with_the_field_and_store_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let admin = server.admin();
    let before = admin.list_values("nodes", "").await.unwrap().metadata.resource_version;

    let cases = [
        (json!({"metadata": {"name": "n1"}, "spec": {"role": "boss"}}), "spec.role", "unknown variant"),
        (
            json!({"metadata": {"name": "n1"}, "spec": {"rol": "regular"}}),
            "spec.rol",
            "unknown field `rol`, expected one of `role`",
        ),
        (json!({"metadata": {"name": "N_1"}}), "metadata.name", "lowercase"),
        (
            json!({"metadata": {"name": "n1"}, "spec": {"role": "candidate", "masterCapable": false}}),
            "spec.role",
            "masterCapable",
        ),
        (json!({"kind": "Lease", "metadata": {"name": "n1"}}), "kind", "must be \"Node\""),
        (json!({"metadata": {"name": "n1", "labels": {"bad key": "v"}}}), "metadata.labels", "bad key"),
    ];
    for (body, field, reason_text) in cases {
        let error = admin.create_value("nodes", &body, Default::default()).await.unwrap_err();
        let ClientError::Api(status) = error else { panic!("not an API error") };
        assert_eq!(status.code, 422, "{body}");
        assert_eq!(status.causes[0].field, field, "{body}: {:?}", status.causes);
        assert!(status.causes[0].reason.contains(reason_text), "{body}: {}", status.causes[0].reason);
    }

    // Not JSON at all: a 400 saying where it breaks.
    let raw = server
        .raw_http()
        .post(format!("{}/api/v1/nodes", server.url))
        .bearer_auth(common::ADMIN_TOKEN)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status().as_u16(), 400);
    let status: serde_json::Value = raw.json().await.unwrap();
    assert!(
        status["message"].as_str().unwrap().contains("the body is not JSON: key must be a string at line 1 column 2"),
        "{status}"
    );

    // A bad query parameter is a Status too, naming the parameter.
    let raw = server
        .raw_http()
        .get(format!("{}/api/v1/nodes?limit=many", server.url))
        .bearer_auth(common::ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status().as_u16(), 400);
    let status: serde_json::Value = raw.json().await.unwrap();
    assert!(status["message"].as_str().unwrap().contains("limit"), "{status}");

    let after = admin.list_values("nodes", "").await.unwrap();
    assert!(after.items.is_empty(), "nothing was stored");
    // Not even a refused half: no Node change at all since before the requests.
    let mut watch = admin.watch("nodes", Some(&before), "").await.unwrap();
    let next = tokio::time::timeout(std::time::Duration::from_millis(500), watch.next()).await;
    assert!(next.is_err(), "a Node changed: {next:?}");
}

#[tokio::test]
async fn a_stale_resource_version_gets_409_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let admin = server.admin();
    let created = admin.create(&herd_core::Object::new("n1", NodeSpec::default())).await.unwrap();
    let mut first = created.clone();
    first.metadata.labels.insert("zone".into(), "a".into());
    let updated = admin.update(&first).await.unwrap();

    let mut stale = created.clone();
    stale.spec.role = NodeRole::Drained;
    let error = admin.update(&stale).await.unwrap_err();
    assert_eq!(error.reason(), Some(StatusReason::Conflict));
    assert!(error.to_string().contains("read it again"), "{error}");
    let now = admin.get::<NodeSpec>("n1").await.unwrap();
    assert_eq!(now.spec.role, NodeRole::Regular);
    assert_eq!(now.metadata.resource_version, updated.metadata.resource_version);

    // Creating what exists is a conflict too; so is a delete at an old revision.
    assert_eq!(
        reason(admin.create(&herd_core::Object::new("n1", NodeSpec::default())).await),
        StatusReason::AlreadyExists
    );
    let error = server
        .raw_http()
        .delete(format!(
            "{}/api/v1/nodes/n1?resourceVersion={}",
            server.url,
            created.metadata.resource_version.unwrap()
        ))
        .bearer_auth(common::ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(error.status().as_u16(), 409);
    admin.get::<NodeSpec>("n1").await.unwrap();
}

/// An attacker with the join token tries to take a live node's name.
#[tokio::test]
async fn a_join_cannot_take_a_joined_name_and_the_real_node_keeps_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let real = join(&server, "node-3").await;
    let hijack = JoinRequest {
        node_name: "node-3".into(),
        previous_node_token: None,
        report: AgentReport {
            agent_boot_id: "attacker".into(),
            address: Some("127.0.0.9:1".into()),
            ..Default::default()
        },
    };
    let refused = server.anonymous().with_token(Some(JOIN_TOKEN.into())).join(&hijack).await.unwrap_err();
    assert_eq!(refused.reason(), Some(StatusReason::Conflict), "{refused}");
    assert!(refused.to_string().contains("herd delete node node-3"), "{refused}");
    // The real agent's token still works, its address is its own.
    let node = real.get::<NodeSpec>("node-3").await.expect("the real node's token is still valid");
    assert_ne!(node.status.address.as_deref(), Some("127.0.0.9:1"));
    let events = server.admin().list::<herd_core::kinds::EventSpec>("").await.unwrap();
    assert!(
        events.iter().any(|e| e.spec.reason_is(EventReason::JoinRefused) && e.spec.involved_object.name == "node-3")
    );
    // The same agent run retrying its join (its answer lost) is let in.
    let retry = JoinRequest {
        node_name: "node-3".into(),
        previous_node_token: None,
        report: AgentReport { agent_boot_id: "boot-node-3".into(), ..Default::default() },
    };
    server.anonymous().with_token(Some(JOIN_TOKEN.into())).join(&retry).await.expect("a retry of the same run");
    // Once an admin deletes the node, its name may be joined again.
    server.admin().delete_value("nodes", "node-3", Default::default()).await.unwrap();
    server.anonymous().with_token(Some(JOIN_TOKEN.into())).join(&hijack).await.expect("the name is free again");
}

#[tokio::test]
async fn a_command_is_a_record_its_spec_and_node_label_cannot_be_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let admin = server.admin();
    let command = json!({"apiVersion": "herd/v1", "kind": "Command", "metadata": {"name": "c1"},
        "spec": {"node": "node-1", "action": {"type": "StopMember", "member": "web-1"}}});
    let created = admin.create_value("commands", &command, Default::default()).await.unwrap();
    assert_eq!(created["metadata"]["labels"]["herd.io/node"], "node-1");
    // Another action or node is refused, naming spec. (The leader issues
    // it meanwhile: each write reads it again, as `herd apply` does.)
    let admin = &admin;
    let write = move |change: fn(&mut serde_json::Value)| async move {
        loop {
            let mut object = admin.get_value("commands", "c1").await.unwrap();
            change(&mut object);
            match admin.replace_value("commands", "c1", &object, Default::default()).await {
                Err(error) if error.to_string().contains("was modified") => continue,
                other => return other,
            }
        }
    };
    let error = write(|c| c["spec"]["node"] = json!("node-2")).await.unwrap_err();
    assert_eq!(error.reason(), Some(StatusReason::Invalid), "{error}");
    assert!(error.to_string().contains("spec: is immutable once the Command is created"), "{error}");
    // Re-applying without the label keeps it; setting it to another node is refused.
    let kept = write(|c| c["metadata"]["labels"] = json!({"team": "db"})).await.unwrap();
    assert_eq!(kept["metadata"]["labels"]["herd.io/node"], "node-1");
    assert_eq!(kept["metadata"]["labels"]["team"], "db");
    let error = write(|c| c["metadata"]["labels"]["herd.io/node"] = json!("node-2")).await.unwrap_err();
    assert!(error.to_string().contains("metadata.labels[herd.io/node]: is set by the server"), "{error}");
}

#[tokio::test]
async fn the_cluster_config_cannot_be_deleted_and_log_names_are_checked_before_forwarding() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let admin = server.admin();
    let error = admin.delete_value("clusterconfigs", "cluster", Default::default()).await.unwrap_err();
    assert_eq!(error.reason(), Some(StatusReason::Conflict), "{error}");
    assert!(error.to_string().contains("cannot be deleted"), "{error}");
    admin.get_value("clusterconfigs", "cluster").await.expect("still there");
    // A member name that would leave the agent's path is refused here.
    let error = admin.get_text("/api/v1/nodes/node-1/members/..%2F..%2Fetc/logs").await.unwrap_err();
    assert_eq!(error.reason(), Some(StatusReason::Invalid), "{error}");
    assert!(error.to_string().contains("member: may contain only"), "{error}");
    // And the CLI checks them before asking.
    let out = common::herd()
        .args(["--server", &server.url, "--token", common::ADMIN_TOKEN, "logs", "node-1/web-1?x="])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("member: may contain only"), "{out:?}");
}

/// Every error is a `Status` JSON body: an unknown route, a method a route
/// does not serve, a body that is not JSON (a body over the limit: the
/// unit test of `ApiBody`, since a client still sending it sees the
/// connection close).
#[tokio::test]
async fn every_error_is_a_status_body_and_a_body_that_is_not_json_is_a_400_saying_where() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let http = server.raw_http();
    let send = |request: reqwest::RequestBuilder| async move {
        let response = request.bearer_auth(common::ADMIN_TOKEN).send().await.unwrap();
        let code = response.status().as_u16();
        let body: serde_json::Value = response.json().await.expect("a Status JSON body");
        assert_eq!(body["kind"], "Status", "{body}");
        assert_eq!(body["code"], code, "{body}");
        (code, body["message"].as_str().unwrap_or_default().to_string())
    };
    let url = |path: &str| format!("{}{path}", server.url);
    // The dashboard's page answers at `/` too, not a 404.
    let page = |path: &'static str| {
        let request = http.get(url(path));
        async move {
            let response = request.send().await.unwrap();
            assert_eq!(response.status().as_u16(), 200, "{path}");
            assert!(response.headers().contains_key("content-security-policy"), "{path}");
            response.text().await.unwrap()
        }
    };
    let root = page("/").await;
    assert!(root.contains("/ui/app.js"), "{root}");
    assert_eq!(root, page("/ui").await);
    let (code, message) = send(http.get(url("/api/v2/nothing"))).await;
    assert_eq!((code, message.as_str()), (404, "route \"GET /api/v2/nothing\" not found"));
    let (code, message) = send(http.delete(url("/api/v1/join"))).await;
    assert_eq!((code, message.as_str()), (405, "DELETE is not served at /api/v1/join"));
    let (code, message) = send(http.post(url("/api/v1/nodes")).body("{\"metadata\": {")).await;
    assert_eq!(code, 400, "{message}");
    assert!(
        message.starts_with("the body is not JSON: EOF while parsing") && message.contains("column 14"),
        "{message}"
    );
    let (code, message) = send(http.post(url("/api/v1/nodes")).body("{\"apiVersion\": 3}")).await;
    assert_eq!(code, 422, "JSON that is not a Node names the field: {message}");

    // A request refused before its handler reads the body (a node may not
    // write Commands) gets its answer over TLS, and the connection stays
    // usable for the next ones (the server reads every body first).
    let joined = server
        .anonymous()
        .with_token(Some(common::JOIN_TOKEN.into()))
        .join(&JoinRequest {
            node_name: "n-big".into(),
            previous_node_token: None,
            report: AgentReport { agent_boot_id: "b".into(), ..Default::default() },
        })
        .await
        .unwrap();
    let big = format!("{{\"padding\": \"{}\"}}", "x".repeat(1 << 20));
    for _ in 0..3 {
        let response =
            http.put(url("/api/v1/commands/c1")).bearer_auth(&joined.node_token).body(big.clone()).send().await;
        assert_eq!(response.expect("an answer, not a broken connection").status().as_u16(), 403);
    }
}

/// A dry run shows what would be stored, with no identity that never existed.
#[tokio::test]
async fn a_dry_run_create_answers_without_a_uid_or_resource_version() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let admin = server.admin();
    let node = json!({"apiVersion": "herd/v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"zone": "a"}}});
    let dry = herd_client::WriteOptions { dry_run: true };
    let answer = admin.create_value("nodes", &node, dry).await.unwrap();
    assert_eq!(answer["metadata"]["labels"]["zone"], "a");
    for field in ["uid", "resourceVersion", "creationTimestamp"] {
        assert!(answer["metadata"].get(field).is_none(), "{field} in {answer}");
    }
    assert!(admin.get_value("nodes", "n1").await.unwrap_err().is_not_found(), "nothing was stored");
    // A real create still says who it is.
    let created = admin.create_value("nodes", &node, Default::default()).await.unwrap();
    assert!(created["metadata"]["uid"].is_string() && created["metadata"]["resourceVersion"].is_string());
}

#[test]
fn a_server_on_postgresql_logs_no_store_password() {
    let Some(schema) = common::PostgresSchema::create() else { return };
    let password =
        schema.url.split("://").nth(1).and_then(|rest| rest.split('@').next()).and_then(|u| u.split(':').nth(1));
    let Some(password) = password.filter(|p| !p.is_empty()) else {
        panic!("the test database URL has no password to look for: {}", schema.url);
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let mut command = common::herd();
    command.args(["server", "--listen", "127.0.0.1:0", "--identity", "r1"]).arg("--data-dir").arg(dir.path());
    command.env("HERD_STORE", &schema.url).env("HERD_ADMIN_TOKEN", common::ADMIN_TOKEN);
    command.stdout(std::process::Stdio::piped()).stderr(std::fs::File::create(&log).unwrap());
    let mut child = command.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    let listening = lines.by_ref().map_while(Result::ok).any(|l| l.contains("listening on"));
    let _ = child.kill();
    let _ = child.wait();
    assert!(listening, "the server started");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("backend=postgres"), "the log names its store: {text}");
    assert!(!text.contains(&format!(":{password}@")), "the store password is in the log:\n{text}");
    let help = common::herd().args(["server", "--help"]).env("HERD_STORE", &schema.url).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(!help.contains(&format!(":{password}@")), "--help shows HERD_STORE's value:\n{help}");
}
