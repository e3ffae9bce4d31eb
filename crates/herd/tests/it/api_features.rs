//! The API's conventions end to end: watch with bookmarks and 410, label
//! selectors, paging, dry run, status subresource, OpenAPI, metrics; and
//! the CLI's apply/get/delete with its exit codes.

use crate::common;

use std::time::Duration;

use common::{ADMIN_TOKEN, TestServer};
use herd_client::WriteOptions;
use herd_core::Object;
use herd_core::api::WatchEventType;
use herd_core::kinds::{Action, CommandSpec, LeaseSpec, NodeSpec};
use serde_json::json;

fn lease(name: &str, labels: &[(&str, &str)]) -> Object<LeaseSpec> {
    let mut lease = Object::new(name, LeaseSpec { lease_duration_seconds: 10, ..Default::default() });
    lease.metadata.labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    lease
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_delivers_changes_after_the_list_revision() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let admin = server.admin();
    admin.create(&lease("before", &[])).await.unwrap();
    let list = admin.list_values("leases", "").await.unwrap();
    let mut watch = admin.watch("leases", Some(&list.metadata.resource_version), "").await.unwrap();

    let created = admin.create(&lease("l1", &[("team", "a")])).await.unwrap();
    let mut changed = created.clone();
    changed.spec.holder_identity = "me".into();
    admin.update(&changed).await.unwrap();
    admin.delete_value("leases", "l1", WriteOptions::default()).await.unwrap();
    admin.create(&Object::new("n1", NodeSpec::default())).await.unwrap();

    // The leader election's own Lease renews meanwhile; it is not ours.
    let is_leader_lease =
        |e: &herd_core::api::WatchEvent<serde_json::Value>| e.object["metadata"]["name"] == "herd-leader";
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let event = tokio::time::timeout(Duration::from_secs(10), watch.next()).await.unwrap().unwrap().unwrap();
        if event.type_ != WatchEventType::Bookmark && !is_leader_lease(&event) {
            seen.push((
                event.type_,
                event.object["metadata"]["name"].as_str().unwrap().to_string(),
                event.object["spec"]["holderIdentity"].clone(),
            ));
        }
    }
    assert_eq!(
        seen,
        vec![
            (WatchEventType::Added, "l1".into(), json!("")),
            (WatchEventType::Modified, "l1".into(), json!("me")),
            (WatchEventType::Deleted, "l1".into(), json!("me")),
        ],
        "only leases, in order, the delete carrying the last state"
    );
    // Quiet streams carry bookmarks with the revision reached.
    let bookmark = loop {
        let event = tokio::time::timeout(Duration::from_secs(10), watch.next()).await.unwrap().unwrap().unwrap();
        assert!(event.type_ == WatchEventType::Bookmark || is_leader_lease(&event), "unexpected {event:?}");
        if event.type_ == WatchEventType::Bookmark {
            break event;
        }
    };
    assert!(bookmark.object["metadata"]["resourceVersion"].as_str().unwrap().parse::<u64>().unwrap() > 0);
}

/// `batchMillis`: the changes that come within that long of one another
/// arrive as one chunk (a browser pays per chunk); without it, each write
/// is its own.
#[tokio::test(flavor = "multi_thread")]
async fn a_batched_watch_sends_changes_close_together_as_one_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let admin = server.admin();
    let url = |batch: &str| format!("{}/api/v1/nodes?watch=true{batch}", server.url);
    let refused = server.raw_http().get(url("&batchMillis=5000")).bearer_auth(ADMIN_TOKEN).send().await.unwrap();
    assert_eq!(refused.status().as_u16(), 400, "at most a second");
    for (batch, chunks) in [("&batchMillis=400", 1), ("", 3)] {
        // From now: the watch waits on new writes, not on the log.
        let mut answer = server.raw_http().get(url(batch)).bearer_auth(ADMIN_TOKEN).send().await.unwrap();
        assert_eq!(answer.status().as_u16(), 200);
        // Written 50 ms apart, each in its own commit.
        for i in 0..3 {
            let name = format!("b{i}{}", batch.len());
            admin.create_value("nodes", &json!({"metadata": {"name": name}}), Default::default()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut seen = Vec::new();
        while seen.iter().map(|c: &String| c.lines().count()).sum::<usize>() < 3 {
            let chunk = tokio::time::timeout(Duration::from_secs(5), answer.chunk()).await.unwrap().unwrap().unwrap();
            let text = String::from_utf8(chunk.to_vec()).unwrap();
            if !text.contains("BOOKMARK") {
                seen.push(text);
            }
        }
        assert_eq!(seen.len(), chunks, "{batch:?}: {seen:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_selector_watch_sees_objects_enter_and_leave_the_selection() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let admin = server.admin();
    let mut before = admin.create(&lease("l0", &[("team", "a")])).await.unwrap();
    let list = admin.list_values("leases", "team=a").await.unwrap();
    let mut watch = admin.watch("leases", Some(&list.metadata.resource_version), "team=a").await.unwrap();

    let mut l1 = admin.create(&lease("l1", &[("team", "a")])).await.unwrap();
    admin.create(&lease("other", &[("team", "b")])).await.unwrap();
    l1.metadata.labels.insert("team".into(), "b".into());
    let mut l1 = admin.update(&l1).await.unwrap();
    l1.spec.holder_identity = "unseen".into();
    let mut l1 = admin.update(&l1).await.unwrap();
    l1.metadata.labels.insert("team".into(), "a".into());
    admin.update(&l1).await.unwrap();
    before.metadata.labels.insert("team".into(), "c".into());
    admin.update(&before).await.unwrap();

    let mut seen = Vec::new();
    while seen.len() < 4 {
        let event = tokio::time::timeout(Duration::from_secs(10), watch.next()).await.unwrap().unwrap().unwrap();
        if event.type_ != WatchEventType::Bookmark {
            seen.push((event.type_, event.object["metadata"]["name"].as_str().unwrap().to_string()));
        }
    }
    assert_eq!(
        seen,
        vec![
            (WatchEventType::Added, "l1".into()),
            (WatchEventType::Deleted, "l1".into()),
            (WatchEventType::Added, "l1".into()),
            (WatchEventType::Deleted, "l0".into()),
        ],
        "objects leaving the selection are DELETED, entering it ADDED; the rest is not sent"
    );
}

/// The names of the objects a watch ADDED, until `count` of them; every
/// other change it sent must be about one of them (the server moves
/// Commands along meanwhile).
async fn added(watch: &mut herd_client::WatchStream, count: usize) -> Vec<String> {
    let mut added = Vec::new();
    while added.len() < count {
        let event = tokio::time::timeout(Duration::from_secs(10), watch.next()).await.unwrap().unwrap().unwrap();
        let name = event.object["metadata"]["name"].as_str().unwrap_or_default().to_string();
        match event.type_ {
            WatchEventType::Bookmark => {}
            WatchEventType::Added => added.push(name),
            _ => assert!(added.contains(&name), "a change to {name} before it was added: {event:?}"),
        }
    }
    added
}

/// A node's Commands watch (the agents' watch, routed by node inside the
/// server) sees that node's Commands only, whether it follows them live
/// or catches up from an older revision; its bookmarks move on with the
/// other nodes' Commands.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_commands_watch_sees_that_node_s_commands_only() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let admin = server.admin();
    for node in ["n1", "n2"] {
        admin.create(&Object::new(node, NodeSpec::default())).await.unwrap();
    }
    let start = admin.list_values("commands", "").await.unwrap().metadata.resource_version;
    let mut live = admin.watch_node_commands("n1", &start).await.unwrap();
    let command = |name: &str, node: &str| {
        let spec = CommandSpec {
            node: node.into(),
            timeout: None,
            action: Action::StopMember { member: name.into() },
            origin: None,
        };
        Object::new(name, spec)
    };
    admin.create(&command("c1", "n1")).await.unwrap();
    let after_c1 = admin.list_values("commands", "").await.unwrap().metadata.resource_version;
    admin.create(&command("c2", "n2")).await.unwrap();
    admin.create(&command("c3", "n1")).await.unwrap();

    assert_eq!(added(&mut live, 2).await, ["c1", "c3"], "live: n1's Commands, in order");
    let mut caught_up = admin.watch_node_commands("n1", &start).await.unwrap();
    assert_eq!(added(&mut caught_up, 2).await, ["c1", "c3"], "from an older revision: the same");
    let mut n2 = admin.watch_node_commands("n2", &after_c1).await.unwrap();
    assert_eq!(added(&mut n2, 1).await, ["c2"], "n2's, after c1");

    let elsewhere = admin.create(&command("c4", "n2")).await.unwrap();
    let elsewhere: u64 = elsewhere.metadata.resource_version.unwrap().parse().unwrap();
    let bookmark = loop {
        let event = tokio::time::timeout(Duration::from_secs(10), live.next()).await.unwrap().unwrap().unwrap();
        if event.type_ != WatchEventType::Bookmark {
            let name = &event.object["metadata"]["name"];
            assert!(name == "c1" || name == "c3", "n1's watch is told only of n1's Commands: {event:?}");
            continue;
        }
        let revision: u64 = event.object["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
        if revision >= elsewhere {
            break revision;
        }
    };
    assert!(bookmark >= elsewhere);
}

#[tokio::test(flavor = "multi_thread")]
async fn selectors_paging_dry_run_and_status() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let admin = server.admin();
    for i in 0..7 {
        admin.create(&lease(&format!("l{i}"), &[("team", if i % 2 == 0 { "a" } else { "b" })])).await.unwrap();
    }
    let team_a = admin.list_values("leases", "team=a").await.unwrap();
    assert_eq!(team_a.items.len(), 4);
    assert_eq!(admin.list_values("leases", "team in (a,b),team!=a").await.unwrap().items.len(), 3);
    let bad = admin.list_values("leases", "team in (a").await.unwrap_err();
    assert!(bad.to_string().contains("unbalanced"), "{bad}");

    // Paged through this test's leases (the election's own is not one).
    let first = admin.list_page("leases", "team", 3, None).await.unwrap();
    assert_eq!(first.items.len(), 3);
    let token = first.metadata.continue_token.clone().expect("a continue token");
    let second = admin.list_page("leases", "team", 3, Some(&token)).await.unwrap();
    let third = admin.list_page("leases", "team", 3, second.metadata.continue_token.as_deref()).await.unwrap();
    assert_eq!((second.items.len(), third.items.len(), third.metadata.continue_token), (3, 1, None));

    // Dry run: the answer of a create, nothing stored.
    let would =
        admin.create_value("leases", &lease("dry", &[]).to_json_value(), WriteOptions { dry_run: true }).await.unwrap();
    assert_eq!(would["metadata"]["name"], "dry");
    assert!(admin.get_value("leases", "dry").await.unwrap_err().is_not_found());
    let invalid = admin
        .create_value(
            "leases",
            &json!({"metadata": {"name": "x"}, "spec": {"leaseDurationSeconds": 0}}),
            WriteOptions { dry_run: true },
        )
        .await
        .unwrap_err();
    assert!(invalid.to_string().contains("spec.leaseDurationSeconds"), "{invalid}");

    // The main resource ignores status; the status subresource changes only status.
    let node = admin.create(&Object::new("n1", NodeSpec::default())).await.unwrap();
    let mut with_status = node.clone();
    with_status.status.ready = true;
    assert!(!admin.update(&with_status).await.unwrap().status.ready);
    let current = admin.get::<NodeSpec>("n1").await.unwrap();
    let mut with_status = current.clone();
    with_status.status.ready = true;
    with_status.spec.unschedulable = true;
    let updated = admin.update_status(&with_status).await.unwrap();
    assert!(updated.status.ready && !updated.spec.unschedulable);
    assert_eq!(updated.metadata.generation, 1, "a status write is not a spec change");
}

#[tokio::test(flavor = "multi_thread")]
async fn openapi_and_metrics_describe_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let openapi: serde_json::Value =
        serde_json::from_str(&server.anonymous().get_text("/openapi.json").await.unwrap()).unwrap();
    assert_eq!(openapi["openapi"], "3.0.3");
    for path in [
        "/api/v1/nodes",
        "/api/v1/nodes/{name}",
        "/api/v1/nodes/{name}/status",
        "/api/v1/clusterconfigs",
        "/api/v1/leases",
        "/api/v1/events",
        "/api/v1/join",
        "/healthz",
        "/metrics",
        "/api/v1/cluster/status",
        "/api/v1/nodes/{node}/members/{member}/logs",
        "/api/v1/commands/{name}/retry",
        "/api/v1/commands/{name}/abandon",
        "/api/v1/nodes/{name}/commands",
        "/api/v1/jointokens",
    ] {
        assert!(openapi["paths"][path].is_object(), "{path} missing from /openapi.json");
    }
    // Parameters are typed as the server checks them.
    let get_app = &openapi["paths"]["/api/v1/apps/{name}"]["get"];
    assert_eq!(get_app["parameters"][0]["schema"]["maxLength"], 253, "{get_app}");
    assert!(get_app["parameters"][0]["schema"]["pattern"].is_string(), "{get_app}");
    let list = openapi["paths"]["/api/v1/apps"]["get"]["parameters"].as_array().unwrap();
    let revision = list.iter().find(|p| p["name"] == "resourceVersion").unwrap();
    assert_eq!(revision["schema"]["pattern"], "^[0-9]{1,18}$");
    assert_eq!(openapi["paths"]["/healthz"]["get"]["security"], serde_json::json!([]), "public");
    assert!(openapi["paths"]["/api/v1/leases/{name}/status"].is_null(), "leases have no status subresource");
    assert!(openapi["components"]["schemas"].as_object().unwrap().keys().any(|k| k.contains("NodeSpec")));

    server.admin().list_values("nodes", "").await.unwrap();
    let refused = server.anonymous().get_text("/metrics").await.unwrap_err();
    assert_eq!(refused.reason(), Some(herd_core::api::StatusReason::Unauthorized), "metrics need a token");
    let metrics = server.admin().get_text("/metrics").await.unwrap();
    assert!(
        metrics.contains("herd_http_requests_total{method=\"GET\",route=\"/api/v1/nodes\",code=\"200\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("herd_store_commits_total{backend=\"sqlite\"}"), "{metrics}");
    assert!(metrics.contains("# TYPE herd_nodes gauge"));
}

#[tokio::test(flavor = "multi_thread")]
async fn cli_apply_get_delete_and_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    let run = |args: &[&str]| {
        let mut command = common::herd();
        command
            .args(args)
            .env("HERD_SERVER", &server.url)
            .env("HERD_TOKEN", ADMIN_TOKEN)
            .env("HERD_CONFIG", dir.path().join("none.yaml"));
        command.output().unwrap()
    };
    let manifest = dir.path().join("nodes.yaml");
    std::fs::write(&manifest, "kind: Node\nmetadata:\n  name: n1\n  labels:\n    zone: a\nspec:\n  role: drained\n---\napiVersion: herd/v1\nkind: Lease\nmetadata:\n  name: l1\nspec:\n  leaseDurationSeconds: 5\n").unwrap();
    let out = run(&["apply", "-f", manifest.to_str().unwrap()]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "node/n1 created\nlease/l1 created\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["apply", "-f", manifest.to_str().unwrap()]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "node/n1 unchanged\nlease/l1 unchanged\n");
    std::fs::write(&manifest, "kind: Node\nmetadata:\n  name: n1\nspec:\n  role: regular\n").unwrap();
    assert_eq!(
        String::from_utf8_lossy(&run(&["apply", "-f", manifest.to_str().unwrap()]).stdout),
        "node/n1 configured\n"
    );

    let out = run(&["get", "nodes", "-o", "wide"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.starts_with("NAME") && table.contains("n1") && table.contains("regular"), "{table}");
    let yaml = String::from_utf8_lossy(&run(&["get", "node", "n1", "-o", "yaml"]).stdout).to_string();
    assert!(yaml.contains("name: n1") && yaml.contains("role: regular"), "{yaml}");

    // Exit codes: 3 not found, 4 conflict, 2 usage, 1 other errors; bad input names the field.
    assert_eq!(run(&["get", "node", "nope"]).status.code(), Some(3));
    assert_eq!(run(&["delete", "node", "nope"]).status.code(), Some(3));
    assert_eq!(run(&["get"]).status.code(), Some(0), "with no kind: the kinds");
    assert_eq!(run(&["get", "pods"]).status.code(), Some(2), "an unknown kind is a usage error");
    std::fs::write(&manifest, "kind: Node\nmetadata:\n  name: n1\nspec:\n  role: boss\n").unwrap();
    let out = run(&["apply", "-f", manifest.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("spec.role"), "{}", String::from_utf8_lossy(&out.stderr));
    let conflict = server.admin().create(&Object::new("n1", NodeSpec::default())).await.unwrap_err();
    assert_eq!(conflict.reason(), Some(herd_core::api::StatusReason::AlreadyExists));
    let out = run(&["delete", "node", "n1", "--dry-run"]);
    assert_eq!(
        (out.status.code(), String::from_utf8_lossy(&out.stdout).to_string()),
        (Some(0), "node/n1 deleted (dry run)\n".into())
    );
    assert_eq!(run(&["delete", "node", "n1"]).status.code(), Some(0));
    assert_eq!(run(&["get", "node", "n1"]).status.code(), Some(3));
    let out = run(&["describe", "lease", "l1"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("Events:"));
}

#[tokio::test(flavor = "multi_thread")]
async fn every_example_applies_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut applied = 0;
    for entry in std::fs::read_dir(&examples).unwrap() {
        let path = entry.unwrap().path();
        if !matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json")) {
            continue;
        }
        let out = common::herd()
            .args(["apply", "--dry-run", "-f"])
            .arg(&path)
            .env("HERD_SERVER", &server.url)
            .env("HERD_TOKEN", ADMIN_TOKEN)
            .env("HERD_CONFIG", dir.path().join("none.yaml"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
        applied += 1;
    }
    assert!(applied > 0, "no examples found in {}", examples.display());
}

/// A first server that takes connections but never answers (SIGSTOP): the
/// CLI moves to the second for a read within the connect timeout plus a
/// second, instead of hanging for the whole request timeout.
#[tokio::test(flavor = "multi_thread")]
async fn the_cli_answers_from_the_second_server_when_the_first_is_paused() {
    let (first_dir, second_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let paused = TestServer::start(first_dir.path());
    let live = TestServer::start(second_dir.path());
    paused.proc.signal("STOP");
    let started = std::time::Instant::now();
    let output = common::herd()
        .args(["--server", &format!("{},{}", paused.url, live.url), "--token", common::ADMIN_TOKEN])
        .args(["cluster", "status"])
        .output()
        .unwrap();
    let took = started.elapsed();
    paused.proc.signal("CONT");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stdout).contains("Answered by:"), "{output:?}");
    let bound = herd_client::CONNECT_TIMEOUT + std::time::Duration::from_secs(1);
    assert!(took < bound, "the answer took {took:?} (bound {bound:?})");
}

/// The app-cluster kinds are served: an App and an AppCluster apply from
/// YAML and read back; a bad one is refused naming the field; a cluster
/// cannot be moved to another App.
#[tokio::test(flavor = "multi_thread")]
async fn apps_and_app_clusters_are_served_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let manifest = dir.path().join("etcd.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: herd/v1\nkind: App\nmetadata: {name: etcd}\nspec:\n  roles:\n  - name: member\n    run: {command: [etcd], volumes: [{name: data, persistent: true}]}\n    ports: [{name: client}, {name: peer}]\n    setup: {script: 'exec ./configure \"$@\"'}\n    notifies: [member]\n    readiness: {tcpPort: client}\n---\napiVersion: herd/v1\nkind: AppCluster\nmetadata: {name: db}\nspec:\n  appRef: etcd\n  roles: [{name: member, members: 3}]\n",
    )
    .unwrap();
    let herd = |args: &[&str]| {
        common::herd().args(["--server", &server.url, "--token", ADMIN_TOKEN]).args(args).output().unwrap()
    };
    let out = herd(&["apply", "-f", manifest.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = herd(&["get", "appclusters"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("db    etcd  creating  member=3"), "{text}");
    let out = herd(&["get", "apps"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("etcd  member"), "{out:?}");

    let admin = server.admin();
    let bad = json!({"apiVersion": "herd/v1", "kind": "App", "metadata": {"name": "bad"},
        "spec": {"roles": [{"name": "r", "run": {"command": ["x"]}, "readiness": {"tcpPort": "nope"}}]}});
    let error = admin.create_value("apps", &bad, WriteOptions::default()).await.unwrap_err();
    assert!(
        error.to_string().contains("spec.roles[0].readiness.tcpPort: no port of this role is named \"nope\""),
        "{error}"
    );
    let mut cluster = admin.get::<herd_core::kinds::AppClusterSpec>("db").await.unwrap();
    cluster.spec.app_ref = "redis".into();
    let error = admin.update(&cluster).await.unwrap_err();
    assert!(error.to_string().contains("spec.appRef: is immutable"), "{error}");

    // Admission end to end (a change waits for a pass over the last one and
    // for pending notifies) is in app_clusters.rs, with the controller.
}

#[tokio::test(flavor = "multi_thread")]
async fn every_change_to_an_app_is_a_revision_kept_to_ten_and_none_is_written_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let admin = server.admin();
    let app = json!({"metadata": {"name": "hist"},
        "spec": {"roles": [{"name": "db", "run": {"command": ["etcd"]}}]}});
    admin.create_value("apps", &app, WriteOptions::default()).await.unwrap();
    let patch = |patch: serde_json::Value| {
        let admin = server.admin();
        async move { admin.patch_value("apps", "hist", &patch).await.unwrap() }
    };
    patch(json!({"spec": {"description": "v2"}})).await;
    // Labels are no change to the spec: no revision.
    patch(json!({"metadata": {"labels": {"team": "a"}}})).await;
    patch(json!({"spec": {"roles": [{"name": "db", "run": {"command": ["etcd", "--v3"]}}]}})).await;
    let revisions = || async {
        let list = server.admin().list::<herd_core::kinds::AppRevisionSpec>("").await.unwrap();
        let mut names: Vec<(i64, String)> = list.iter().map(|r| (r.spec.revision, r.metadata.name.clone())).collect();
        names.sort();
        (names, list)
    };
    let (names, list) = revisions().await;
    assert_eq!(names.iter().map(|(_, n)| n.as_str()).collect::<Vec<_>>(), ["hist-1", "hist-2", "hist-3"]);
    let stored = admin.get::<herd_core::kinds::AppSpec>("hist").await.unwrap();
    let third = list.iter().find(|r| r.spec.revision == 3).unwrap();
    assert_eq!(third.spec.app_spec, stored.spec, "the revision is the spec as accepted");
    assert_eq!(stored.metadata.generation, 3);

    let herd = |args: &[&str]| {
        common::herd().args(["--server", &server.url, "--token", ADMIN_TOKEN]).args(args).output().unwrap()
    };
    let out = herd(&["app", "history", "hist"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("REVISION") && lines[1].starts_with("1 ") && lines[1].ends_with("(the oldest kept)"),
        "{text}"
    );
    assert!(lines[2].starts_with("2 ") && lines[2].ends_with(" description"), "{text}");
    assert!(lines[3].starts_with("3 ") && lines[3].ends_with(" roles[0].run.command"), "{text}");
    assert_eq!(herd(&["app", "history", "nope"]).status.code(), Some(3), "not found");

    // No revision is written, changed or deleted by hand.
    let forged = json!({"metadata": {"name": "hist-9"},
        "spec": {"app": "hist", "revision": 9, "appSpec": stored.spec}});
    let error = admin.create_value("apprevisions", &forged, WriteOptions::default()).await.unwrap_err();
    assert!(error.to_string().contains("written by herd"), "{error}");
    let mut changed = serde_json::to_value(third).unwrap();
    changed["spec"]["appSpec"]["description"] = json!("forged");
    let error = admin.replace_value("apprevisions", "hist-3", &changed, WriteOptions::default()).await.unwrap_err();
    assert!(error.to_string().contains("written by herd"), "{error}");
    assert!(admin.delete_value("apprevisions", "hist-3", WriteOptions::default()).await.is_err());

    // Ten kept: the oldest go.
    for i in 4..=13 {
        patch(json!({"spec": {"description": format!("v{i}")}})).await;
    }
    let (names, _) = revisions().await;
    assert_eq!(names.iter().map(|(r, _)| *r).collect::<Vec<_>>(), (4..=13).collect::<Vec<i64>>());

    // The revisions of a deleted App go with it; one of the same name made
    // again starts its own history.
    admin.delete_value("apps", "hist", WriteOptions::default()).await.unwrap();
    admin.create_value("apps", &app, WriteOptions::default()).await.unwrap();
    let (names, _) = revisions().await;
    assert_eq!(names.iter().map(|(_, n)| n.as_str()).collect::<Vec<_>>(), ["hist-1"]);
    admin.delete_value("apps", "hist", WriteOptions::default()).await.unwrap();
    assert!(revisions().await.0.is_empty(), "deleted with their App");
}
