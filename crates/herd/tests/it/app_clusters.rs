//! App clusters end to end on real agents: members placed on
//! nodes, set up once with their configmeta, told of joins, and brought
//! back through the three restarts; a failing setup is a config error
//! with its detail; deleting the cluster removes its members everywhere.
//! The app is a shell script, so that each rule is seen alone; the etcd
//! and redis examples run in `examples.rs`.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::apps::{Nodes, configured, instance, kill9, list_members, nodes, nodes_with_n1_apart, pid_of};
use common::{TestServer, eventually, start_agent};
use herd_core::kinds::app_cluster::ClusterState;
use herd_core::kinds::{AppClusterSpec, CommandSpec, EventReason, Member, MemberSpec, MemberState};

/// The setup script: `--configure` records the instance it set up (slowly
/// when the file `slow-setup` exists beside the log), notifies record
/// their arguments (and exit 120 on a member for which
/// `fail-notify-<member>` exists).
const SCRIPT: &str = r#"log="$SETUP_LOG/$HERD_MEMBER"
case "$1" in
--configure)
  test -s "$HERD_CONFIGMETA" || { echo "no configmeta" >&2; exit 2; }
  echo "setup $HERD_INSTANCE_ID" >>"$log.setups"
  if [ -e "$SETUP_LOG/slow-setup" ]; then sleep 5; fi ;;
*)
  if [ -e "$SETUP_LOG/fail-notify-$HERD_MEMBER" ]; then echo "notify refused by $HERD_MEMBER" >&2; exit 120; fi
  echo "$*" >>"$log.notifies" ;;
esac
"#;

async fn apply_app(server: &TestServer, script: &str) {
    let app = serde_json::json!({
        "metadata": {"name": "kv"},
        "spec": {"roles": [
            {"name": "db", "run": {"command": ["sleep", "600"], "volumes": [{"name": "data", "persistent": true}]},
             "ports": [{"name": "client"}], "setup": {"script": script}, "notifies": ["db"]},
            {"name": "cache", "run": {"command": ["sleep", "600"], "volumes": [{"name": "scratch"}]},
             "setup": {"script": script}}
        ]}
    });
    let admin = server.admin();
    match admin.get_value("apps", "kv").await {
        Ok(old) => {
            let mut app = app;
            app["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
            admin.replace_value("apps", "kv", &app, Default::default()).await.unwrap();
        }
        Err(_) => {
            admin.create_value("apps", &app, Default::default()).await.unwrap();
        }
    }
}

fn cluster(log: &Path, db: u32, cache: u32) -> serde_json::Value {
    let env = serde_json::json!({"SETUP_LOG": log});
    serde_json::json!({
        "metadata": {"name": "c"},
        "spec": {"appRef": "kv", "roles": [
            {"name": "db", "members": db, "env": env},
            {"name": "cache", "members": cache, "env": env}
        ]}
    })
}

/// Applies the App with `script` and creates cluster `c` with `db` and
/// `cache` members; returns the directory the script logs into.
async fn start_cluster(nodes: &Nodes, script: &str, db: u32, cache: u32) -> PathBuf {
    let log = nodes.dir.path().join("log");
    std::fs::create_dir_all(&log).unwrap();
    apply_app(&nodes.server, script).await;
    nodes.server.admin().create_value("appclusters", &cluster(&log, db, cache), Default::default()).await.unwrap();
    log
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn members_are_placed_set_up_once_told_of_joins_and_survive_restarts() {
    let nodes = nodes(3).await;
    let server = &nodes.server;
    let log = start_cluster(&nodes, SCRIPT, 3, 1).await;
    let members = configured(server, "c", 4, Duration::from_secs(60)).await;

    // Spread: the three db members on three nodes, each with its port.
    let db: Vec<&Member> = members.iter().filter(|m| m.spec.role == "db").collect();
    let mut db_nodes: Vec<_> = db.iter().map(|m| m.spec.node.clone().unwrap()).collect();
    db_nodes.sort();
    assert_eq!(db_nodes, ["n1", "n2", "n3"]);
    for member in &members {
        assert_eq!(member.metadata.labels["herd.io/role"], member.spec.role);
        assert_eq!(member.metadata.owner_references[0].kind, "AppCluster");
        assert_eq!(lines(&log.join(format!("{}.setups", member.metadata.name))).len(), 1, "{}", member.metadata.name);
        let node_dir = nodes.dir_of(member);
        let meta: serde_json::Value = serde_json::from_slice(
            &std::fs::read(node_dir.join(format!("volumes/{}/herd/configmeta.json", member.metadata.name))).unwrap(),
        )
        .unwrap();
        assert_eq!(meta["me"]["name"], member.metadata.name.as_str());
        assert_eq!(meta["roles"][0]["members"].as_array().unwrap().len(), 3, "{meta}");
        assert_eq!(meta["generation"], 1);
        // What it says of every member is what is: configured and ready,
        // not the state each was in when this member was first set up.
        let path = node_dir.join(format!("volumes/{}/herd/configmeta.json", member.metadata.name));
        eventually(Duration::from_secs(20), "each member's configmeta shows every member configured", || async {
            let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
            let listed: Vec<serde_json::Value> = meta["roles"]
                .as_array()?
                .iter()
                .flat_map(|r| r["members"].as_array().cloned().unwrap_or_default())
                .collect();
            (listed.len() == 4 && listed.iter().all(|m| m["state"] == "configured" && m["ready"] == true)).then_some(())
        })
        .await;
    }
    assert!(db.iter().all(|m| m.spec.ports.contains_key("client")));
    // A configured member is told of the members that join after it (the
    // others it found in its configmeta), never about itself; the first
    // to be configured hears of the other two.
    let all_db: Vec<String> = db.iter().map(|m| m.metadata.name.clone()).collect();
    let mut told_of = 0;
    for member in &db {
        for line in lines(&log.join(format!("{}.notifies", member.metadata.name))) {
            let named = line.strip_prefix("--addnodes --role db --members ").unwrap_or_else(|| panic!("{line}"));
            for other in named.split(',') {
                assert!(all_db.iter().any(|m| m == other) && other != member.metadata.name, "{line}");
                told_of += 1;
            }
        }
    }
    assert!(told_of >= 2, "the first member configured hears of the others");

    // kill -9 of a persistent member: a new instance, configured again, no second setup.
    let victim = db[0].clone();
    let notifies_before: usize = all_db.iter().map(|m| lines(&log.join(format!("{m}.notifies"))).len()).sum();
    kill9(pid_of(server, &victim).await);
    let back = eventually(Duration::from_secs(30), "the db member configured as a new instance", || async {
        let member = server.admin().get::<MemberSpec>(&victim.metadata.name).await.ok()?;
        (member.status.state == MemberState::Configured && instance(&member) != instance(&victim)).then_some(member)
    })
    .await;
    assert_eq!(lines(&log.join(format!("{}.setups", victim.metadata.name))).len(), 1, "persistent: no second setup");
    assert_eq!(back.status.state_detail.last_setup_generation, Some(1));
    // The cache member (no persistent storage) is set up again: clean slate.
    let cache = members.iter().find(|m| m.spec.role == "cache").unwrap().clone();
    kill9(pid_of(server, &cache).await);
    eventually(Duration::from_secs(30), "the cache member set up again", || async {
        let member = server.admin().get::<MemberSpec>(&cache.metadata.name).await.ok()?;
        let setups = lines(&log.join(format!("{}.setups", cache.metadata.name)));
        (member.status.state == MemberState::Configured && setups.len() == 2).then_some(())
    })
    .await;
    configured(server, "c", 4, Duration::from_secs(30)).await;
    let notifies_after: usize = all_db.iter().map(|m| lines(&log.join(format!("{m}.notifies"))).len()).sum();
    assert_eq!(notifies_before, notifies_after, "a restarting member is never announced as a new one");

    // Agent restart: nothing changes instance, nothing is set up again.
    let instances: Vec<String> = list_members(server, "c").await.iter().map(instance).collect();
    let notifies_before: usize = all_db.iter().map(|m| lines(&log.join(format!("{m}.notifies"))).len()).sum();
    let mut agents = nodes.agents;
    agents[1].kill9();
    agents[1] = start_agent(&server.url, &nodes.dirs[1], "n2");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = configured(server, "c", 4, Duration::from_secs(30)).await;
    assert_eq!(after.iter().map(instance).collect::<Vec<_>>(), instances, "an agent restart restarts no member");
    let setups: usize = after.iter().map(|m| lines(&log.join(format!("{}.setups", m.metadata.name))).len()).sum();
    assert_eq!(setups, 5, "four first setups and the cache member's clean slate");
    let notifies_after: usize = all_db.iter().map(|m| lines(&log.join(format!("{m}.notifies"))).len()).sum();
    assert_eq!(notifies_before, notifies_after, "an agent restart sends no notify");

    // Each member runs revision 1 of the App; a change to it is revision
    // 2, which the cluster's new members take and its running ones only
    // by an upgrade (updatePolicy Manual), and the operator is told so.
    assert!(
        after.iter().all(|m| m.status.app_revision == Some(1)),
        "{:?}",
        after.iter().map(|m| m.status.app_revision)
    );
    server.admin().patch_value("apps", "kv", &serde_json::json!({"spec": {"description": "v2"}})).await.unwrap();
    let described = eventually(Duration::from_secs(20), "the App's revision 2 seen", || async {
        let out = server.cli(&["describe", "appcluster", "c"]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        text.contains("App revision 2").then_some(text)
    })
    .await;
    assert!(
        described.contains("runs revision 1: c-")
            && described.contains("`herd appcluster upgrade c` brings it to revision 2"),
        "{described}"
    );
    let table = String::from_utf8_lossy(&server.cli(&["get", "members"]).stdout).to_string();
    assert!(table.lines().next().is_some_and(|header| header.contains("REVISION")), "{table}");

    // Deleting the cluster deletes its members, their processes and volumes.
    server.admin().delete_value("appclusters", "c", Default::default()).await.unwrap();
    eventually(Duration::from_secs(30), "every member gone", || async {
        let left = list_members(server, "c").await;
        let volumes = nodes.dirs.iter().any(|d| d.join("volumes/c-db-0").exists() || d.join("volumes/c-db-1").exists());
        (left.is_empty() && !volumes).then_some(())
    })
    .await;
    for dir in &nodes.dirs {
        assert!(common::member_processes(dir).is_empty(), "no member process is left in {}", dir.display());
    }
    // (A member goes before its settled Commands, in the same pass.)
    eventually(Duration::from_secs(10), "the controller's commands cleaned up", || async {
        server.admin().list::<CommandSpec>("").await.unwrap().is_empty().then_some(())
    })
    .await;
    drop(agents);
}

/// One node, and a cluster of one db member whose setup finds `marker`
/// (`slow-setup`).
async fn one_db_member_with(marker: &str) -> (Nodes, PathBuf) {
    let nodes = nodes(1).await;
    let log = nodes.dir.path().join("log");
    std::fs::create_dir_all(&log).unwrap();
    std::fs::write(log.join(marker), "").unwrap();
    apply_app(&nodes.server, SCRIPT).await;
    nodes.server.admin().create_value("appclusters", &cluster(&log, 1, 0), Default::default()).await.unwrap();
    (nodes, log)
}

/// A setup that records each attempt and fails.
const BROKEN: &str = r#"if [ "$1" = --configure ]; then
  echo "attempt $HERD_INSTANCE_ID" >>"$SETUP_LOG/$HERD_MEMBER.attempts"
  echo "cannot configure $HERD_MEMBER: broken script" >&2
  exit 1
fi
"#;

async fn config_error(server: &TestServer, instance_other_than: Option<&str>) -> Member {
    eventually(Duration::from_secs(30), "the member in config error", || async {
        let member = server.admin().get::<MemberSpec>("c-db-0").await.ok()?;
        let fresh = member.status.state_detail.configuring_instance.as_deref() != instance_other_than;
        (member.status.state == MemberState::ConfigError && fresh).then_some(member)
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_setup_is_a_config_error_until_the_app_is_fixed_and_the_member_restarted() {
    let nodes = nodes(1).await;
    let server = &nodes.server;
    let log = start_cluster(&nodes, BROKEN, 1, 0).await;
    let failed = config_error(server, None).await;
    let detail = failed.status.state_detail.config_error_detail.clone().unwrap();
    assert_eq!(detail, "configure failed with exit status 1: cannot configure c-db-0: broken script");
    let cluster = server.admin().get::<AppClusterSpec>("c").await.unwrap();
    assert_eq!(cluster.status.state, ClusterState::Error);
    assert!(cluster.status.member_state_rollup.config_errors);
    let described = String::from_utf8_lossy(&server.cli(&["describe", "member", "c-db-0"]).stdout).into_owned();
    assert!(described.contains("config error: configure failed with exit status 1"), "{described}");

    // A restart is an error-retry restart: setup runs again from scratch (and fails again).
    let first = failed.status.state_detail.configuring_instance.clone();
    kill9(pid_of(server, &failed).await);
    let again = config_error(server, first.as_deref()).await;
    assert_eq!(lines(&log.join("c-db-0.attempts")).len(), 2, "set up again after the restart");

    // The App's script fixed, and the member restarted: configured.
    apply_app(server, SCRIPT).await;
    kill9(pid_of(server, &again).await);
    let members = configured(server, "c", 1, Duration::from_secs(30)).await;
    assert_eq!(members[0].status.state_detail.config_error_detail, None);
    assert_eq!(lines(&log.join("c-db-0.setups")).len(), 1);
    assert_eq!(lines(&log.join("c-db-0.attempts")).len(), 2, "the broken script ran no more");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_member_killed_while_its_setup_runs_is_set_up_again() {
    let (nodes, log) = one_db_member_with("slow-setup").await;
    let server = &nodes.server;
    let creating = eventually(Duration::from_secs(30), "the setup running", || async {
        let member = server.admin().get::<MemberSpec>("c-db-0").await.ok()?;
        (lines(&log.join("c-db-0.setups")).len() == 1).then_some(member)
    })
    .await;
    std::fs::remove_file(log.join("slow-setup")).unwrap();
    kill9(pid_of(server, &creating).await);
    let members = configured(server, "c", 1, Duration::from_secs(40)).await;
    let setups = lines(&log.join("c-db-0.setups"));
    assert_eq!(setups.len(), 2, "set up again for the new instance: {setups:?}");
    assert_eq!(setups[1], format!("setup {}", instance(&members[0])));
}

/// Changes the cluster's spec to `db` and `cache` members: Ok, or the refusal.
/// (A status written meanwhile is read again, as `herd apply` does.)
async fn resize(server: &TestServer, log: &Path, db: u32, cache: u32) -> Result<(), String> {
    let admin = server.admin();
    for _ in 0..20 {
        let current = admin.get_value("appclusters", "c").await.unwrap();
        let mut wanted = cluster(log, db, cache);
        wanted["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
        match admin.replace_value("appclusters", "c", &wanted, Default::default()).await {
            Err(error) if error.to_string().contains("was modified") => continue,
            other => return other.map(|_| ()).map_err(|e| e.to_string()),
        }
    }
    Err("the cluster kept changing".into())
}

async fn seen(server: &TestServer) {
    eventually(Duration::from_secs(20), "a pass over the change", || async {
        let cluster = server.admin().get::<AppClusterSpec>("c").await.ok()?;
        (cluster.status.observed_generation == Some(cluster.metadata.generation)).then_some(())
    })
    .await;
}

/// Cluster `c` of two db members grown to three, c-db-0 refusing the
/// notify of c-db-2's join until it failed `attempts` times; returns the
/// log directory and that notify.
async fn refused_notify(nodes: &Nodes, attempts: u32) -> (PathBuf, herd_core::kinds::member::PendingNotify) {
    let server = &nodes.server;
    let log = start_cluster(nodes, SCRIPT, 2, 0).await;
    configured(server, "c", 2, Duration::from_secs(30)).await;
    std::fs::write(log.join("fail-notify-c-db-0"), "").unwrap();
    resize(server, &log, 3, 0).await.unwrap();
    let blocked = eventually(Duration::from_secs(30), "c-db-0's notify failing", || async {
        let member = server.admin().get::<MemberSpec>("c-db-0").await.ok()?;
        let notify = member.status.state_detail.pending_notify_cmds.first()?.clone();
        (notify.attempts >= attempts).then_some(notify)
    })
    .await;
    (log, blocked)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_notify_that_always_fails_blocks_changes_until_its_member_is_deleted() {
    let nodes = nodes(3).await;
    let server = &nodes.server;
    // c-db-0 is told of c-db-2 and refuses, again and again.
    let (log, blocked) = refused_notify(&nodes, 2).await;
    assert_eq!(blocked.arguments, ["--addnodes", "--role", "db", "--members", "c-db-2"]);
    let error = blocked.last_error.clone().unwrap();
    assert!(error.contains("exited with 120") && error.contains("notify refused by c-db-0"), "{error}");
    assert!(blocked.since.is_some());
    let described = String::from_utf8_lossy(&server.cli(&["describe", "appcluster", "c"]).stdout).into_owned();
    assert!(described.contains("Why not configured: waiting for c-db-0 (1 notifies pending)"), "{described}");
    assert!(described.contains("pending notify `--addnodes --role db --members c-db-2`"), "{described}");
    assert!(described.contains("notify refused by c-db-0") && described.contains(" ago)"), "{described}");
    // A spec change is refused, naming the member and its notify.
    let refused = resize(server, &log, 3, 1).await.unwrap_err();
    assert!(refused.contains("c-db-0") && refused.contains("--addnodes --role db --members c-db-2"), "{refused}");
    assert!(refused.contains("herd member skip-notify"), "the refusal says the way out: {refused}");

    // One way out: delete the member. Its process and volumes go from its
    // node, the slot is filled afresh, and the change is accepted.
    let old = server.admin().get::<MemberSpec>("c-db-0").await.unwrap();
    let out = server.cli(&["delete", "member", "c-db-0"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let members = configured(server, "c", 3, Duration::from_secs(30)).await;
    let fresh = members.iter().find(|m| m.metadata.name == "c-db-0").unwrap();
    assert_ne!(fresh.metadata.uid, old.metadata.uid);
    assert_ne!(instance(fresh), instance(&old));
    assert_eq!(lines(&log.join("c-db-0.setups")).len(), 2, "set up afresh");
    resize(server, &log, 3, 1).await.unwrap();
    configured(server, "c", 4, Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_notify_that_always_fails_is_skipped_by_the_operator_and_says_who_did() {
    let nodes = nodes(3).await;
    let server = &nodes.server;
    let (log, _) = refused_notify(&nodes, 1).await;
    // The failure is told in full by its Event, though its Command is gone.
    let failed = common::event_where(&server.admin(), "the notify's CommandFailed event", |e| {
        e.spec.reason_is(EventReason::CommandFailed) && e.spec.involved_object.name.starts_with("c-db-0.notify.")
    })
    .await;
    assert!(
        failed.spec.message.contains("of member c-db-0") && failed.spec.message.contains("notify refused by c-db-0")
    );
    assert!(resize(server, &log, 3, 1).await.is_err());

    let out = server.cli(&["member", "skip-notify", "c-db-0"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("skipped `--addnodes --role db --members c-db-2`"), "{said}");
    let member = server.admin().get::<MemberSpec>("c-db-0").await.unwrap();
    assert!(member.status.state_detail.pending_notify_cmds.is_empty());
    let skipped = common::event_where(&server.admin(), "a NotifySkipped event", |e| {
        e.spec.reason_is(EventReason::NotifySkipped) && e.spec.involved_object.name == "c-db-0"
    })
    .await;
    assert!(skipped.spec.message.starts_with("admin skipped the notify `--addnodes --role db --members c-db-2`"));
    assert!(skipped.spec.message.contains("notify refused by c-db-0"), "{}", skipped.spec.message);
    let again = server.cli(&["member", "skip-notify", "c-db-0"]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("no pending notify"), "{again:?}");
    // The change goes in now; the member was never told of c-db-2.
    eventually(Duration::from_secs(20), "the spec change accepted", || async { resize(server, &log, 3, 1).await.ok() })
        .await;
    configured(server, "c", 4, Duration::from_secs(30)).await;
    assert!(lines(&log.join("c-db-0.notifies")).iter().all(|l| !l.contains("c-db-2")));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_change_waits_for_a_down_member_s_notifies_and_is_accepted_once_they_are_delivered() {
    let nodes = nodes(3).await;
    let server = &nodes.server;
    let log = start_cluster(&nodes, SCRIPT, 2, 0).await;
    let members = configured(server, "c", 2, Duration::from_secs(30)).await;
    // c-db-0's node goes down (its agent killed): the member cannot be
    // reached, so the notify of c-db-2's join waits there.
    let down = members.iter().find(|m| m.metadata.name == "c-db-0").unwrap();
    let index = nodes.dirs.iter().position(|d| d == nodes.dir_of(down)).unwrap();
    let mut agents = nodes.agents;
    agents[index].kill9();
    resize(server, &log, 3, 0).await.unwrap();
    eventually(Duration::from_secs(30), "c-db-2 configured and c-db-0 told of it, pending", || async {
        let member = server.admin().get::<MemberSpec>("c-db-0").await.ok()?;
        let joined = server.admin().get::<MemberSpec>("c-db-2").await.ok()?;
        (joined.status.state == MemberState::Configured && !member.status.state_detail.pending_notify_cmds.is_empty())
            .then_some(())
    })
    .await;
    seen(server).await;
    let refused = resize(server, &log, 3, 1).await.unwrap_err();
    assert!(refused.contains("c-db-0") && refused.contains("has pending"), "{refused}");
    // Its node comes back: the notify is delivered, and the same change goes in.
    agents[index] = start_agent(&server.url, &nodes.dirs[index], &format!("n{}", index + 1));
    eventually(Duration::from_secs(30), "the notify delivered", || async {
        let member = server.admin().get::<MemberSpec>("c-db-0").await.ok()?;
        member.status.state_detail.pending_notify_cmds.is_empty().then_some(())
    })
    .await;
    let told = lines(&log.join("c-db-0.notifies"));
    assert_eq!(told.last().map(String::as_str), Some("--addnodes --role db --members c-db-2"), "{told:?}");
    resize(server, &log, 3, 1).await.unwrap();
    configured(server, "c", 4, Duration::from_secs(30)).await;
    drop(agents);
}

#[tokio::test(flavor = "multi_thread")]
async fn after_a_host_reboot_its_members_come_back_configured_and_are_not_announced_again() {
    let nodes = nodes(2).await;
    let server = &nodes.server;
    let log = start_cluster(&nodes, SCRIPT, 2, 1).await;
    let before = configured(server, "c", 3, Duration::from_secs(30)).await;
    let notifies = |name: &str| lines(&log.join(format!("{name}.notifies")));
    let told_before: Vec<Vec<String>> = ["c-db-0", "c-db-1"].iter().map(|m| notifies(m)).collect();
    // n1 "reboots": its agent and every member process killed, the agent started.
    let mut agents = nodes.agents;
    agents[0].kill9();
    for (pid, _) in common::member_processes(&nodes.dirs[0]) {
        let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    agents[0] = start_agent(&server.url, &nodes.dirs[0], "n1");
    let rebooted: Vec<&Member> = before.iter().filter(|m| m.spec.node.as_deref() == Some("n1")).collect();
    assert!(!rebooted.is_empty());
    let after = eventually(Duration::from_secs(30), "n1's members configured as new instances", || async {
        let members = configured(server, "c", 3, Duration::from_secs(30)).await;
        let renewed = rebooted
            .iter()
            .all(|old| members.iter().any(|m| m.metadata.name == old.metadata.name && instance(m) != instance(old)));
        renewed.then_some(members)
    })
    .await;
    for old in &rebooted {
        let setups = lines(&log.join(format!("{}.setups", old.metadata.name))).len();
        let expected = if old.spec.role == "db" { 1 } else { 2 };
        assert_eq!(setups, expected, "{}: persistent members are not set up again, others are", old.metadata.name);
    }
    let told_after: Vec<Vec<String>> = ["c-db-0", "c-db-1"].iter().map(|m| notifies(m)).collect();
    assert_eq!(told_before, told_after, "no member is told of a rebooted one as if it were new");
    assert_eq!(after.len(), 3);
    drop(agents);
}

/// The members of the cluster whose process runs in `dir` (an agent's data dir).
fn running_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = common::member_processes(dir).into_iter().map(|(_, m)| m).collect();
    names.sort();
    names.dedup();
    names
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cut_off_node_s_members_are_recovered_or_replaced_and_never_run_twice_once_it_heals() {
    let nodes = nodes_with_n1_apart(3).await;
    let server = &nodes.server;
    let admin = server.admin();
    let mut config = admin
        .get::<herd_core::kinds::ClusterConfigSpec>(herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME)
        .await
        .unwrap();
    config.spec.app_clusters.node_loss_grace = herd_core::HumanDuration(Duration::from_secs(2));
    admin.update(&config).await.unwrap();
    let log = start_cluster(&nodes, SCRIPT, 3, 1).await;
    let members = configured(server, "c", 4, Duration::from_secs(30)).await;
    // n1 takes c-db-0 and, the members being spread, c-cache-0.
    let on_n1: Vec<&Member> = members.iter().filter(|m| m.spec.node.as_deref() == Some("n1")).collect();
    let names: Vec<&str> = on_n1.iter().map(|m| m.metadata.name.as_str()).collect();
    assert_eq!(names, ["c-cache-0", "c-db-0"]);

    // n1 is cut off (its network namespace's link down): its agent and
    // members live on, unreachable.
    let netns = nodes.netns.as_ref().unwrap();
    netns.cut();
    let cache = eventually(Duration::from_secs(30), "c-cache-0 running configured elsewhere", || async {
        let member = admin.get::<MemberSpec>("c-cache-0").await.ok()?;
        let moved = member.spec.node.as_deref().is_some_and(|n| n != "n1");
        (moved && member.status.state == MemberState::Configured).then_some(member)
    })
    .await;
    assert_eq!(lines(&log.join("c-cache-0.setups")).len(), 2, "set up again where it went");
    let waiting = eventually(Duration::from_secs(20), "c-db-0 saying what a replace would do", || async {
        let member = admin.get::<MemberSpec>("c-db-0").await.ok()?;
        member.status.reason.clone().filter(|r| r.contains("herd member replace c-db-0"))
    })
    .await;
    assert!(waiting.contains("empty volumes data, herd") && waiting.contains("node n1 has been NotReady"), "{waiting}");
    assert_eq!(admin.get::<MemberSpec>("c-db-0").await.unwrap().spec.node.as_deref(), Some("n1"), "not moved silently");

    // Without --yes (and no terminal to ask on) nothing happens; with it,
    // the member is recreated elsewhere and the others hear it left.
    let out = server.cli(&["member", "replace", "c-db-0"]);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("empty volumes: data") && said.contains("n1 (NotReady)"), "{said}");
    let out = server.cli(&["member", "replace", "c-db-0", "--yes"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let replaced = eventually(Duration::from_secs(30), "c-db-0 configured on another node", || async {
        let member = admin.get::<MemberSpec>("c-db-0").await.ok()?;
        let moved = member.spec.node.as_deref().is_some_and(|n| n != "n1");
        (moved && member.status.state == MemberState::Configured).then_some(member)
    })
    .await;
    assert!(replaced.spec.requests.replace.is_none());
    assert_eq!(lines(&log.join("c-db-0.setups")).len(), 2, "set up afresh");
    for other in ["c-db-1", "c-db-2"] {
        // Told once what its configmeta already says (it goes first) is delivered.
        eventually(Duration::from_secs(20), &format!("{other} told c-db-0 left"), || async {
            let told = lines(&log.join(format!("{other}.notifies")));
            told.iter().any(|l| l == "--delnodes --role db --members c-db-0").then_some(())
        })
        .await;
    }
    assert_eq!(running_in(&nodes.dirs[0]), ["c-cache-0", "c-db-0"], "the cut-off node still runs its copies");

    // The cut heals: the copies on n1 are stopped there, and every slot runs once.
    netns.heal();
    eventually(Duration::from_secs(30), "n1's stale copies stopped", || async {
        running_in(&nodes.dirs[0]).is_empty().then_some(())
    })
    .await;
    let members = configured(server, "c", 4, Duration::from_secs(30)).await;
    let mut everywhere: Vec<String> = nodes.dirs.iter().flat_map(|d| running_in(d)).collect();
    everywhere.sort();
    assert_eq!(everywhere, ["c-cache-0", "c-db-0", "c-db-1", "c-db-2"], "each slot runs exactly once");
    assert!(members.iter().all(|m| m.spec.node.as_deref() != Some("n1")));
    assert_eq!(cache.spec.node, members.iter().find(|m| m.metadata.name == "c-cache-0").unwrap().spec.node);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_member_that_cannot_start_says_why_and_is_tried_again_with_pauses_until_its_app_is_fixed() {
    let nodes = nodes(1).await;
    let server = &nodes.server;
    let admin = server.admin();
    let log = nodes.dir.path().join("log");
    std::fs::create_dir_all(&log).unwrap();
    let broken = serde_json::json!({"metadata": {"name": "kv"}, "spec": {"roles": [
        {"name": "db", "run": {"command": ["/nonexistent/program"]}, "setup": {"script": SCRIPT}},
        {"name": "cache", "run": {"command": ["sleep", "600"]}}
    ]}});
    admin.create_value("apps", &broken, Default::default()).await.unwrap();
    admin.create_value("appclusters", &cluster(&log, 1, 0), Default::default()).await.unwrap();
    let why = eventually(Duration::from_secs(20), "the member saying why it does not start", || async {
        let member = admin.get::<MemberSpec>("c-db-0").await.ok()?;
        member.status.reason.filter(|r| r.starts_with("starting it failed"))
    })
    .await;
    assert!(why.contains("/nonexistent/program"), "{why}");
    // Tried again after pauses (1 s, 2 s, ...), not in a loop: count the Events.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let events = admin.list::<herd_core::kinds::EventSpec>("").await.unwrap();
    let failed_starts: u64 = events
        .iter()
        .filter(|e| {
            e.spec.reason_is(EventReason::CommandFailed) && e.spec.involved_object.name.starts_with("c-db-0.start.")
        })
        .map(|e| e.spec.count)
        .sum();
    assert!((2..=5).contains(&failed_starts), "{failed_starts} failed starts in about 6 s");
    apply_app(server, SCRIPT).await;
    configured(server, "c", 1, Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_loop_is_shown_where_an_operator_looks() {
    let nodes = nodes(1).await;
    let server = &nodes.server;
    let app = serde_json::json!({"metadata": {"name": "crashy"}, "spec": {"roles": [{
        "name": "db",
        "run": {"command": ["sh", "-c", "echo cannot start >&2; exit 3"]},
        "setup": {"script": "true"}
    }]}});
    server.admin().create_value("apps", &app, Default::default()).await.unwrap();
    let cluster = serde_json::json!({"metadata": {"name": "crashy"},
        "spec": {"appRef": "crashy", "roles": [{"name": "db", "members": 1}]}});
    server.admin().create_value("appclusters", &cluster, Default::default()).await.unwrap();
    let looping = eventually(Duration::from_secs(30), "the crash loop in the member's status", || async {
        let member = server.admin().get::<MemberSpec>("crashy-db-0").await.ok()?;
        member.status.state_detail.crash_loop.as_ref().filter(|c| c.runs >= 3)?;
        Some(member)
    })
    .await;
    let crash = looping.status.state_detail.crash_loop.clone().unwrap();
    assert_eq!(crash.last_exit, "exit status: 3");
    assert!(!looping.status.ready);
    let why = looping.status.not_ready_reason.clone().unwrap_or_default();
    assert!(why.contains("crash loop") && why.contains("exit status: 3"), "{why}");

    let get = server.cli(&["get", "members"]);
    let table = String::from_utf8_lossy(&get.stdout);
    assert!(table.contains("(crash loop, "), "{table}");
    let describe = server.cli(&["describe", "member", "crashy-db-0"]);
    let text = String::from_utf8_lossy(&describe.stdout);
    assert!(text.contains("crash loop:") && text.contains("exit status: 3") && text.contains("next start"), "{text}");
    let event = common::event_where(&server.admin(), "a MemberCrashLooping event", |e| {
        e.spec.reason_is(EventReason::MemberCrashLooping) && e.spec.involved_object.name == "crashy-db-0"
    })
    .await;
    assert_eq!(event.spec.type_, herd_core::kinds::EventType::Warning);
    assert!(
        event.spec.message.contains("exit status: 3") && event.spec.message.contains("next start in"),
        "{}",
        event.spec.message
    );
    server.admin().delete_value("appclusters", "crashy", Default::default()).await.unwrap();
}

/// A setup whose notifies take a while and log when each began and ended
/// (seconds since the epoch, with nanoseconds) into `$SETUP_LOG/notifies`.
const SLOW_NOTIFIES: &str = r#"case "$1" in
--configure) ;;
*)
  echo "start $HERD_MEMBER $(date +%s.%N)" >>"$SETUP_LOG/notifies"
  sleep 0.4
  echo "end $HERD_MEMBER $(date +%s.%N)" >>"$SETUP_LOG/notifies" ;;
esac
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_role_is_sent_its_notifies_one_member_at_a_time() {
    let nodes = nodes(3).await;
    let server = &nodes.server;
    let log = start_cluster(&nodes, SLOW_NOTIFIES, 4, 0).await;
    configured(server, "c", 4, Duration::from_secs(60)).await;
    let _ = std::fs::remove_file(log.join("notifies"));
    // A shrink: the three that stay are each told c-db-3 left.
    resize(server, &log, 3, 0).await.unwrap();
    let runs = eventually(Duration::from_secs(30), "three notifies delivered", || async {
        let lines = lines(&log.join("notifies"));
        (lines.iter().filter(|l| l.starts_with("end ")).count() >= 3).then_some(lines)
    })
    .await;
    // Between one start and the next, the one before ended.
    let mut running = 0;
    for line in &runs {
        running += if line.starts_with("start ") { 1 } else { -1 };
        assert!(running <= 1, "two notifies of role db ran at once: {runs:#?}");
    }
    let mut told: Vec<&str> =
        runs.iter().filter(|l| l.starts_with("end ")).map(|l| l.split(' ').nth(1).unwrap()).collect();
    told.sort();
    assert_eq!(told, ["c-db-0", "c-db-1", "c-db-2"], "each was told once");
    // The member the shrink removed has its Event, and the cluster's
    // description tells its members' story (the removed one's too).
    let removed = common::event_where(&server.admin(), "a MemberRemoved event for c-db-3", |e| {
        e.spec.reason_is(EventReason::MemberRemoved) && e.spec.involved_object.name == "c-db-3"
    })
    .await;
    assert!(removed.spec.message.contains("its cluster no longer asks for it"), "{}", removed.spec.message);
    let described = String::from_utf8_lossy(&server.cli(&["describe", "appcluster", "c"]).stdout).into_owned();
    let events = described.split("\nEvents:").nth(1).unwrap_or_default();
    assert!(events.contains(EventReason::MemberRemoved.as_str()) && events.contains("c-db-3"), "{described}");
    assert!(events.contains(EventReason::MemberConfigured.as_str()) && events.contains("c-db-0"), "{described}");
}
