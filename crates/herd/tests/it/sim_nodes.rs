//! Simulated nodes (`herd sim-nodes`) against a real server: forty nodes
//! in one process join and stay Ready, the pool keeper makes ten of them
//! master candidates, which hold the configuration's serial while the
//! others hold none, and an app cluster of sixty members is placed over
//! them, started and configured through real Commands.

use crate::common;

use std::time::Duration;

use common::cluster::quick_heartbeats;
use common::{JOIN_TOKEN, Proc, TestServer, eventually};
use herd_core::kinds::{NodeRole, NodeSpec};

/// A server with quick heartbeats and `count` simulated nodes (sim-1..).
async fn simulated(count: usize) -> (tempfile::TempDir, TestServer, Proc) {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    quick_heartbeats(&server).await;
    let mut command = common::herd();
    command.args(["sim-nodes", "--count", &count.to_string(), "--prefix", "sim", "--server", &server.url]);
    command.env("HERD_JOIN_TOKEN", JOIN_TOKEN);
    let mut sim = Proc::spawn(command);
    sim.wait_for_line(&format!("running {count} simulated nodes"), Duration::from_secs(10));
    (dir, server, sim)
}

#[tokio::test(flavor = "multi_thread")]
async fn forty_simulated_nodes_join_keep_the_configuration_and_run_an_app_cluster() {
    let (dir, server, _sim) = simulated(40).await;
    let admin = server.admin();
    eventually(Duration::from_secs(30), "40 Ready nodes, 10 candidates holding the serial", || async {
        let nodes = admin.list::<NodeSpec>("").await.ok()?;
        let ready = nodes.iter().filter(|n| n.status.ready).count();
        let candidates: Vec<&NodeSpec> =
            nodes.iter().filter(|n| n.spec.role == NodeRole::Candidate).map(|n| &n.spec).collect();
        let serials: Vec<u64> =
            nodes.iter().filter(|n| n.spec.role == NodeRole::Candidate).map(|n| n.status.config_serial).collect();
        let newest = serials.iter().copied().max().unwrap_or(0);
        (ready == 40 && candidates.len() == 10 && newest > 0 && serials.iter().all(|s| *s == newest)).then_some(())
    })
    .await;
    let nodes = admin.list::<NodeSpec>("").await.unwrap();
    assert!(
        nodes.iter().filter(|n| n.spec.role != NodeRole::Candidate).all(|n| n.status.config_serial == 0),
        "only candidates hold the configuration"
    );

    let app = dir.path().join("app.yaml");
    std::fs::write(
        &app,
        "apiVersion: herd/v1\nkind: App\nmetadata: {name: web}\nspec:\n  roles:\n  - name: web\n    run: {command: [sleep, '3600']}\n    setup: {script: 'true'}\n    notifies: [web]\n---\napiVersion: herd/v1\nkind: AppCluster\nmetadata: {name: web}\nspec:\n  appRef: web\n  roles: [{name: web, members: 60}]\n",
    )
    .unwrap();
    let out = server.cli(&["apply", "-f", app.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let members = common::apps::configured(&server, "web", 60, Duration::from_secs(60)).await;
    let used: std::collections::BTreeSet<&str> = members.iter().filter_map(|m| m.spec.node.as_deref()).collect();
    assert!(used.len() >= 20, "spread over the nodes: {used:?}");
}

/// Clusters are worked on side by side; the ports their members are given
/// on one node still never repeat.
#[tokio::test(flavor = "multi_thread")]
async fn members_of_clusters_placed_side_by_side_never_share_a_port() {
    let (dir, server, _sim) = simulated(2).await;
    let mut yaml = "apiVersion: herd/v1\nkind: App\nmetadata: {name: kv}\nspec:\n  roles:\n  - name: kv\n    run: {command: [sleep, '3600']}\n    ports: [{name: client}, {name: peer}]\n".to_string();
    for i in 0..20 {
        yaml += &format!(
            "---\napiVersion: herd/v1\nkind: AppCluster\nmetadata: {{name: kv-{i}}}\nspec:\n  appRef: kv\n  roles: [{{name: kv, members: 3}}]\n"
        );
    }
    let file = dir.path().join("clusters.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = server.cli(&["apply", "-f", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let admin = server.admin();
    let members = eventually(Duration::from_secs(60), "60 members bound", || async {
        let members = admin.list::<herd_core::kinds::MemberSpec>("").await.ok()?;
        (members.len() == 60 && members.iter().all(|m| m.spec.node.is_some())).then_some(members)
    })
    .await;
    let mut seen = std::collections::BTreeMap::new();
    for member in &members {
        let node = member.spec.node.as_deref().unwrap();
        for port in member.spec.ports.values() {
            if let Some(other) = seen.insert((node, *port), &member.metadata.name) {
                panic!("port {port} on {node} given to {other} and {}", member.metadata.name);
            }
        }
    }
    assert_eq!(seen.len(), 120, "two ports each");
}
