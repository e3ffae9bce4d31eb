//! App clusters end to end on real agents (seed 000): members placed on
//! nodes, set up once with their configmeta, told of joins, and brought
//! back through the seed's restarts; a failing setup is a config error
//! with its detail; deleting the cluster removes its members everywhere.
//! The app is a shell script, so that each rule is seen alone; the etcd
//! and redis examples run in `examples.rs`.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::apps::{Nodes, configured, instance, kill9, list_members, nodes, pid_of};
use common::{TestServer, eventually, start_agent};
use herd_core::kinds::app_cluster::ClusterState;
use herd_core::kinds::{AppClusterSpec, CommandSpec, Member, MemberSpec, MemberState};

/// The setup script: `--configure` records the instance it set up (and
/// fails with exit 1 when the file `fail-setup` exists beside the log),
/// notifies record their arguments.
const SCRIPT: &str = r#"log="$SETUP_LOG/$HERD_MEMBER"
case "$1" in
--configure)
  test -s "$HERD_CONFIGMETA" || { echo "no configmeta" >&2; exit 2; }
  if [ -e "$SETUP_LOG/fail-setup" ]; then echo "refusing to configure $HERD_MEMBER" >&2; exit 1; fi
  echo "setup $HERD_INSTANCE_ID" >>"$log.setups"
  if [ -e "$SETUP_LOG/slow-setup" ]; then sleep 5; fi ;;
*) echo "$*" >>"$log.notifies" ;;
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

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn members_are_placed_set_up_once_told_of_joins_and_survive_restarts() {
    let nodes = nodes(3).await;
    let server = &nodes.server;
    let log = nodes.dir.path().join("log");
    std::fs::create_dir_all(&log).unwrap();
    apply_app(server, SCRIPT).await;
    server.admin().create_value("appclusters", &cluster(&log, 3, 1), Default::default()).await.unwrap();
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
    let mut agents = nodes.agents;
    agents[1].kill9();
    agents[1] = start_agent(&server.url, &nodes.dirs[1], "n2");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = configured(server, "c", 4, Duration::from_secs(30)).await;
    assert_eq!(after.iter().map(instance).collect::<Vec<_>>(), instances, "an agent restart restarts no member");
    let setups: usize = after.iter().map(|m| lines(&log.join(format!("{}.setups", m.metadata.name))).len()).sum();
    assert_eq!(setups, 5, "four first setups and the cache member's clean slate");

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
    let commands = server.admin().list::<CommandSpec>("").await.unwrap();
    assert!(
        commands.is_empty(),
        "the controller's commands are cleaned up: {:?}",
        commands.iter().map(|c| &c.metadata.name).collect::<Vec<_>>()
    );
    drop(agents);
}

/// One node, and a cluster of one db member whose setup finds `marker`.
async fn one_db_member_with(marker: &str) -> (Nodes, PathBuf) {
    let nodes = nodes(1).await;
    let log = nodes.dir.path().join("log");
    std::fs::create_dir_all(&log).unwrap();
    std::fs::write(log.join(marker), "").unwrap();
    apply_app(&nodes.server, SCRIPT).await;
    nodes.server.admin().create_value("appclusters", &cluster(&log, 1, 0), Default::default()).await.unwrap();
    (nodes, log)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_setup_is_a_config_error_until_a_restart_sets_it_up_again() {
    let (nodes, log) = one_db_member_with("fail-setup").await;
    let server = &nodes.server;
    let failed = eventually(Duration::from_secs(30), "the member in config error", || async {
        let member = server.admin().get::<MemberSpec>("c-db-0").await.ok()?;
        (member.status.state == MemberState::ConfigError).then_some(member)
    })
    .await;
    let detail = failed.status.state_detail.config_error_detail.clone().unwrap();
    assert_eq!(detail, "configure failed with exit status 1: refusing to configure c-db-0");
    let cluster = server.admin().get::<AppClusterSpec>("c").await.unwrap();
    assert_eq!(cluster.status.state, ClusterState::Error);
    assert!(cluster.status.member_state_rollup.config_errors);

    // Fixed, and the member restarted: an error-retry restart sets it up again.
    std::fs::remove_file(log.join("fail-setup")).unwrap();
    kill9(pid_of(server, &failed).await);
    let members = configured(server, "c", 1, Duration::from_secs(30)).await;
    assert_eq!(members[0].status.state_detail.config_error_detail, None);
    assert_eq!(lines(&log.join("c-db-0.setups")).len(), 1);
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
    assert_eq!(creating.status.state, MemberState::Creating);
    std::fs::remove_file(log.join("slow-setup")).unwrap();
    kill9(pid_of(server, &creating).await);
    let members = configured(server, "c", 1, Duration::from_secs(40)).await;
    let setups = lines(&log.join("c-db-0.setups"));
    assert_eq!(setups.len(), 2, "set up again for the new instance: {setups:?}");
    assert_eq!(setups[1], format!("setup {}", instance(&members[0])));
}
