//! The CLI habits kubectl users bring, through the real binary
//! against a real server: `herd get` with no kind lists the kinds, `-o
//! name` prints `kind/name` lines, `-o jsonpath=...` kubectl's templates,
//! `herd logs -f` follows a log, `herd get all` every kind's objects (and is refused, naming why, where there
//! are no objects to name), `herd version` gives both versions, and `herd
//! get -w` shows the objects, then a change made after it started.

use crate::common;

use common::TestServer;
use herd_core::kinds::EventReason;

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn get_lists_the_kinds_names_only_output_and_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());

    let out = server.cli(&["get"]);
    assert!(out.status.success(), "{out:?}");
    let kinds = stdout(&out);
    assert!(kinds.starts_with("NAME"), "{kinds}");
    for row in ["disruptionbudgets  budget", "operations         op", "nodes              no"] {
        assert!(kinds.contains(row), "{row:?} in {kinds}");
    }
    let help = stdout(&server.cli(&["get", "--help"])).replace('\n', " ");
    for kind in kinds.lines().skip(1).filter_map(|row| row.split_whitespace().next()).filter(|k| *k != "all") {
        let singular = kind.trim_end_matches('s');
        assert!(help.contains(singular), "herd get --help names {singular}: {help}");
    }

    let out = server.cli(&["get", "clusterconfig", "-o", "name"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&out), "clusterconfig/cluster\n");
    let out = server.cli(&["get", "clusterconfig", "cluster", "-o", "jsonpath={.spec.candidatePoolSize}"]);
    assert_eq!(stdout(&out), "10", "{out:?}");
    let names = r#"jsonpath={range .items[*]}{.kind}/{.metadata.name}{"\n"}{end}"#;
    let out = server.cli(&["get", "leases", "-o", names]);
    assert_eq!(stdout(&out), "Lease/herd-leader\n", "{out:?}");
    let out = server.cli(&["get", "leases", "-o", "jsonpath={range .items[*]}"]);
    assert_eq!(out.status.code(), Some(2), "a bad template is a usage error: {out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("without {end}"), "{out:?}");
    let out = server.cli(&["get", "all", "-o", "name"]);
    assert!(out.status.success(), "{out:?}");
    let names = stdout(&out);
    for name in ["clusterconfig/cluster\n", "lease/herd-leader\n"] {
        assert!(names.contains(name), "{name:?} in {names}");
    }
    let out = server.cli(&["get", "all"]);
    assert!(stdout(&out).contains("clusterconfigs:\nNAME"), "a table per kind: {out:?}");
    let out = server.cli(&["get", "operations", "-o", "name"]);
    assert!(out.status.success() && stdout(&out).is_empty(), "{out:?}");
    let out = server.cli(&["token", "list", "-o", "name"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("-o name lists objects"), "{out:?}");

    let out = server.cli(&["version"]);
    assert!(out.status.success(), "{out:?}");
    let version = env!("CARGO_PKG_VERSION");
    assert!(stdout(&out).starts_with(&format!("client: herd {version}\nserver: herd {version} (replica ")), "{out:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn get_watch_shows_the_objects_then_each_change() {
    use std::time::Duration;

    use herd_core::kinds::ClusterConfigSpec;
    use herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME;

    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let mut command = common::herd();
    command.args(["--server", &server.url, "--token", common::ADMIN_TOKEN, "get", "clusterconfig", "-w"]);
    let mut watching = common::Proc::spawn(command);
    watching.wait_for_line("NAME", Duration::from_secs(10));
    watching.wait_for_line("cluster", Duration::from_secs(10));

    let admin = server.admin();
    let mut config = admin.get::<ClusterConfigSpec>(CLUSTER_CONFIG_NAME).await.unwrap();
    config.metadata.labels.insert("watched".into(), "yes".into());
    admin.update(&config).await.unwrap();
    let row = watching.wait_for_line("cluster", Duration::from_secs(10));
    assert!(!row.contains("NAME"), "a change is a row without the header: {row}");
    watching.kill9();
}

#[tokio::test(flavor = "multi_thread")]
async fn events_watch_shows_a_new_event_about_the_object_followed() {
    use std::time::Duration;

    use herd_core::kinds::{EventSpec, InvolvedObject};

    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let now = herd_core::Timestamp::from_system_time(std::time::SystemTime::now());
    let event = |node: &str, message: &str| EventSpec {
        reason: "Probe".into(),
        message: message.into(),
        involved_object: InvolvedObject { kind: "Node".into(), name: node.into(), uid: None },
        count: 1,
        first_timestamp: now,
        last_timestamp: now,
        ..Default::default()
    };
    let admin = server.admin();
    admin.create(&herd_core::Object::new("before", event("n9", "there before the watch"))).await.unwrap();
    let mut command = common::herd();
    command.args(["--server", &server.url, "--token", common::ADMIN_TOKEN, "events", "-w", "--for", "node/n9"]);
    let mut watching = common::Proc::spawn(command);
    watching.wait_for_line("there before the watch", Duration::from_secs(10));
    admin.create(&herd_core::Object::new("other", event("n8", "about another node"))).await.unwrap();
    admin.create(&herd_core::Object::new("probe", event("n9", "followed from the test"))).await.unwrap();
    let line = watching.wait_for_line("Probe", Duration::from_secs(10));
    assert!(line.contains("followed from the test"), "only events about node/n9: {line}");
    watching.kill9();
}

#[tokio::test(flavor = "multi_thread")]
async fn appcluster_wait_returns_once_configured_and_says_a_missing_one_is_missing() {
    let nodes = common::apps::nodes(2).await;
    let server = &nodes.server;
    let out = server.cli(&["appcluster", "wait", "nope", "--timeout", "5s"]);
    assert_eq!(out.status.code(), Some(3), "a missing object is exit code 3: {out:?}");
    let budget = common::budgets::budget_yaml("web-one", "herd.io/cluster=web", "maxUnavailable: 1");
    common::budgets::apply_web(server, nodes.dir.path(), "web", 2, &budget);
    let out = server.cli(&["appcluster", "wait", "web", "--for", "configured", "--timeout", "90s"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&out), "appcluster/web configured: 2 of 2 members ready, and counted healthy by its budgets\n");
    let members = common::apps::list_members(server, "web").await;
    assert!(members.iter().all(|m| m.status.ready), "it returned only once every member was ready");
    // What it said is what the budget says right after.
    let counted = common::budgets::budget(server, "web-one").await;
    assert_eq!((counted.status.current_healthy, counted.status.expected_members), (2, 2), "{:?}", counted.status);
}

/// The documented exit codes (README): 0 success, 1 error, 2 usage error,
/// 3 not found, 4 conflict; across get, describe, delete, logs, apply and
/// the Operations' commands.
#[tokio::test(flavor = "multi_thread")]
async fn exit_codes_are_the_documented_ones_in_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let invalid = dir.path().join("invalid.yaml");
    std::fs::write(
        &invalid,
        "apiVersion: herd/v1\nkind: DisruptionBudget\nmetadata: {name: b}\nspec: {selector: ''}\n",
    )
    .unwrap();
    let invalid = invalid.to_str().unwrap();
    for (args, code) in [
        (&["get", "clusterconfig", "cluster"][..], 0),
        (&["get", "node", "nope"], 3),
        (&["describe", "node", "nope"], 3),
        (&["delete", "node", "nope"], 3),
        (&["logs", "member/nope"], 3),
        (&["logs", "no-such-node/m1"], 3),
        (&["logs", "nope"], 2),
        (&["node", "drain", "nope", "--detach"], 3),
        (&["appcluster", "restart", "nope", "--role", "r"], 3),
        (&["operation", "cancel", "nope"], 3),
        (&["get", "nope"], 2),
        (&["events", "--for", "node"], 2),
        (&["get", "nodes", "--bogus"], 2),
        (&["delete", "clusterconfig", "cluster"], 4),
        (&["apply", "-f", invalid], 1),
        (&["apply", "-f", "/nonexistent.yaml"], 1),
    ] {
        let out = server.cli(args);
        assert_eq!(out.status.code(), Some(code), "herd {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    }
}

/// `herd logs -f` prints the end of the log, then what the member writes
/// afterwards, as it comes.
#[tokio::test(flavor = "multi_thread")]
async fn logs_follow_prints_what_the_member_writes_afterwards() {
    use std::time::Duration;

    use common::cluster::{member_run, quick_heartbeats, run};
    use herd_core::kinds::{Action, ManagementState, NodeSpec};

    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    quick_heartbeats(&server).await;
    let agent_dir = dir.path().join("agent");
    let _members = common::MemberReaper(agent_dir.clone());
    let _agent = common::start_agent(&server.url, &agent_dir, "n1");
    common::eventually(Duration::from_secs(15), "n1 Ready", || async {
        server.admin().get::<NodeSpec>("n1").await.ok().filter(|n| n.status.ready)
    })
    .await;
    let mut talker = member_run();
    talker.command[2] = "i=0; while true; do i=$((i+1)); echo line $i; sleep 0.1; done".into();
    let start = run(&server, "start-m1", "n1", Action::StartMember { member: "m1".into(), run: talker }).await;
    assert_eq!(start.status.state_by_management, ManagementState::Completed, "{:?}", start.status);

    // Where the log is now, read without -f.
    let last = common::eventually(Duration::from_secs(10), "a few lines logged", || async {
        let out = server.cli(&["logs", "n1/m1"]);
        let last: u64 = stdout(&out).lines().last()?.strip_prefix("line ")?.parse().ok()?;
        (last >= 3).then_some(last)
    })
    .await;
    let mut command = common::herd();
    command.args(["--server", &server.url, "--token", common::ADMIN_TOKEN, "logs", "n1/m1", "-f"]);
    let mut follow = common::Proc::spawn(command);
    let later = format!("line {}", last + 30);
    follow.wait_for_line(&later, Duration::from_secs(20));

    let out = server.cli(&["logs", "n1/nobody", "-f"]);
    assert_eq!(out.status.code(), Some(3), "a member the node does not have: {out:?}");
}

/// Logs written to a pipe (a file, a CI log) carry no colour codes.
#[test]
fn no_colour_codes_when_output_is_not_a_terminal() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let mut server = common::herd()
        .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .env("HERD_ADMIN_TOKEN", common::ADMIN_TOKEN)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read the log on its own thread so that a server that never leads
    // fails the test after the timeout instead of hanging it.
    let stderr = BufReader::new(server.stderr.take().unwrap());
    let (lines, logged_lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut logged = String::new();
    while !logged.contains("started leading") {
        let left = deadline.saturating_duration_since(Instant::now());
        match logged_lines.recv_timeout(left) {
            Ok(line) => {
                logged.push_str(&line);
                logged.push('\n');
            }
            Err(_) => break,
        }
    }
    server.kill().unwrap();
    server.wait().unwrap();
    logged.extend(logged_lines.try_iter().map(|line| line + "\n"));
    assert!(logged.contains("INFO") && logged.contains("started leading"), "{logged}");
    assert!(!logged.contains('\u{1b}'), "colour codes in logs to a pipe: {logged:?}");
}

/// `herd label` and `herd annotate` (a JSON merge patch through `PATCH`):
/// set, refuse to change without --overwrite, change, remove; a missing
/// object is exit code 3, a bad key names the field and changes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn label_and_annotate_patch_the_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let labels = || async {
        let config = server.admin().get_value("clusterconfigs", "cluster").await.unwrap();
        config["metadata"]["labels"].clone()
    };

    let out = server.cli(&["label", "clusterconfig", "cluster", "tier=gold", "zone=a"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&out), "clusterconfig/cluster labeled\n");
    let out = server.cli(&["get", "clusterconfigs", "-l", "tier=gold", "-o", "name"]);
    assert_eq!(stdout(&out), "clusterconfig/cluster\n", "{out:?}");

    let out = server.cli(&["label", "clusterconfig", "cluster", "tier=silver"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("labels set already: tier (--overwrite"), "{out:?}");
    assert_eq!(labels().await["tier"], "gold", "nothing changed");
    let out = server.cli(&["label", "clusterconfig", "cluster", "tier=silver", "zone-", "--overwrite"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(labels().await, serde_json::json!({ "tier": "silver" }));

    let out = server.cli(&["annotate", "clusterconfig", "cluster", "owner=ops team"]);
    assert_eq!(stdout(&out), "clusterconfig/cluster annotated\n", "{out:?}");
    let config = server.admin().get_value("clusterconfigs", "cluster").await.unwrap();
    assert_eq!(config["metadata"]["annotations"]["owner"], "ops team");

    let before = server.admin().get_value("clusterconfigs", "cluster").await.unwrap();
    let out = server.cli(&["label", "clusterconfig", "cluster", "bad key=x"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("metadata.labels"), "the field is named: {out:?}");
    let after = server.admin().get_value("clusterconfigs", "cluster").await.unwrap();
    assert_eq!(before["metadata"]["resourceVersion"], after["metadata"]["resourceVersion"], "nothing written");

    // A patch pinned to a revision that has passed is refused; unpinned, it applies.
    let stale = serde_json::json!({ "metadata": { "resourceVersion": "1", "labels": { "late": "x" } } });
    let error = server.admin().patch_value("clusterconfigs", "cluster", &stale).await.unwrap_err();
    assert_eq!(error.reason(), Some(herd_core::api::StatusReason::Conflict), "{error}");
    let fresh = serde_json::json!({ "metadata": { "labels": { "late": "x" } }, "spec": { "candidatePoolSize": 5 } });
    let patched = server.admin().patch_value("clusterconfigs", "cluster", &fresh).await.unwrap();
    assert_eq!(
        (patched["metadata"]["labels"]["late"].as_str(), patched["spec"]["candidatePoolSize"].as_u64()),
        (Some("x"), Some(5))
    );
    let status = serde_json::json!({ "status": {} });
    let error = server.admin().patch_value("clusterconfigs", "cluster", &status).await.unwrap_err();
    assert_eq!(error.reason(), Some(herd_core::api::StatusReason::Invalid), "{error}");

    let out = server.cli(&["label", "node", "nope", "a=b"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let out = server.cli(&["label", "clusterconfig", "cluster", "novalue"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn label_and_annotate_go_through_while_the_object_keeps_changing() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let app = serde_json::json!({"metadata": {"name": "busy"}, "spec": {"roles": [{"name": "r", "run": {"command": ["true"]}}]}});
    server.admin().create_value("apps", &app, Default::default()).await.unwrap();
    // Another writer changes the object all the time (as heartbeats change a Node).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (admin, stop) = (server.admin(), stop.clone());
        tokio::spawn(async move {
            let mut writes = 0u32;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let patch = serde_json::json!({"spec": {"description": format!("write {writes}")}});
                if admin.patch_value("apps", "busy", &patch).await.is_ok() {
                    writes += 1;
                }
                tokio::time::sleep(std::time::Duration::from_millis(15)).await;
            }
            writes
        })
    };
    let url = server.url.clone();
    let outcomes = tokio::task::spawn_blocking(move || {
        (0..20)
            .flat_map(|i| {
                let run = |args: Vec<String>| {
                    common::herd()
                        .args(["--server", &url, "--token", common::ADMIN_TOKEN])
                        .args(&args)
                        .output()
                        .unwrap()
                };
                [
                    run(vec!["label".into(), "app".into(), "busy".into(), format!("round={i}"), "--overwrite".into()]),
                    run(vec!["annotate".into(), "app".into(), "busy".into(), format!("note-{i}=x")]),
                ]
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let writes = writer.await.unwrap();
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed while {writes} other writes landed: {failed:?}",
        failed.len(),
        outcomes.len()
    );
    let app = server.admin().get_value("apps", "busy").await.unwrap();
    assert_eq!(app["metadata"]["labels"]["round"], "19");
    assert_eq!(app["metadata"]["annotations"].as_object().unwrap().len(), 20);
    // On a loaded machine (the integration tests run side by side) a
    // patch may take as long as two CLI runs: what matters is that the
    // other writer kept landing writes while the CLI wrote.
    assert!(writes >= 10, "the other writer wrote all along ({writes} writes)");
}

#[test]
fn help_says_what_the_commands_do() {
    let help = |args: &[&str]| {
        let out = common::herd().args(args).arg("--help").output().unwrap();
        String::from_utf8_lossy(&out.stdout).split_whitespace().collect::<Vec<_>>().join(" ")
    };
    let server = help(&["server"]);
    assert!(server.contains("https://<listen address>"), "--advertise-url's default: {server}");
    let replace = help(&["member", "replace"]);
    assert!(replace.contains("any member") && !replace.contains("whose node is lost"), "{replace}");
    let skip = help(&["member", "skip-notify"]);
    assert!(skip.contains(EventReason::NotifySkipped.as_str()) && skip.contains("fix the App's script"), "{skip}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_whose_server_hangs_says_so_and_does_not_tell_the_operator_to_look_first() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    common::cluster::quick_heartbeats(&server).await;
    let agent_dir = dir.path().join("n1");
    let log = dir.path().join("agent.log");
    let mut command = common::herd();
    command.args(["agent", "--server", &server.url, "--name", "n1"]).arg("--data-dir").arg(&agent_dir);
    command.env("HERD_JOIN_TOKEN", common::JOIN_TOKEN);
    command.stdout(std::process::Stdio::null()).stderr(std::fs::File::create(&log).unwrap());
    let mut agent = command.spawn().unwrap();
    common::eventually(Duration::from_secs(15), "n1 Ready", || async {
        server.admin().get::<herd_core::kinds::NodeSpec>("n1").await.ok().filter(|n| n.status.ready)
    })
    .await;
    // The server hangs (takes connections, answers nothing) a while.
    server.proc.signal("STOP");
    tokio::time::sleep(Duration::from_secs(8)).await;
    server.proc.signal("CONT");
    let _ = agent.kill();
    let _ = agent.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("heartbeat failed"), "{text}");
    assert!(!text.contains("look before you retry"), "a heartbeat may be sent again; the agent does: {text}");
}
