//! Agents join and heartbeat; a killed agent's node goes NotReady within
//! the grace period plus one heartbeat, with an Event; a restarted agent
//! makes it Ready again with a new boot id. Real server and agent processes.

use crate::common;

use std::time::{Duration, Instant};

use common::{TestServer, event_where, eventually, start_agent};
use herd_core::HumanDuration;
use herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME;
use herd_core::kinds::{ClusterConfigSpec, EventReason, Node, NodeSpec};

async fn node(server: &TestServer, name: &str) -> Option<Node> {
    server.admin().get::<NodeSpec>(name).await.ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_agent_goes_not_ready_and_comes_back_with_a_new_boot_id() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    let admin = server.admin();

    // Short periods keep the test quick; the rule is the same at defaults.
    let heartbeat = Duration::from_millis(500);
    let grace = Duration::from_secs(3);
    let mut config = admin.get::<ClusterConfigSpec>(CLUSTER_CONFIG_NAME).await.unwrap();
    config.spec.heartbeat_period = HumanDuration(heartbeat);
    config.spec.node_grace_period = HumanDuration(grace);
    admin.update(&config).await.unwrap();

    let mut a = start_agent(&server.url, &dir.path().join("a"), "node-a");
    let _b = start_agent(&server.url, &dir.path().join("b"), "node-b");
    for name in ["node-a", "node-b"] {
        eventually(Duration::from_secs(15), "both nodes Ready", || async {
            node(&server, name).await.filter(|n| n.status.ready)
        })
        .await;
    }
    let first_boot = node(&server, "node-a").await.unwrap().status.agent_boot_id.unwrap();
    assert!(dir.path().join("a/node-token.json").exists(), "the agent keeps its node token");

    a.kill9();
    let killed_at = Instant::now();
    let not_ready = eventually(Duration::from_secs(20), "node-a NotReady", || async {
        node(&server, "node-a").await.filter(|n| !n.status.ready)
    })
    .await;
    let took = killed_at.elapsed();
    // Measured from the kill, the last heartbeat may have been up to one
    // period earlier; the controller looks twice a second.
    assert!(took <= grace + heartbeat + Duration::from_secs(1), "NotReady took {took:?}");
    assert!(took >= grace - heartbeat, "NotReady came early: {took:?}");
    let condition = not_ready.status.condition("Ready").unwrap();
    assert_eq!(condition.reason, "HeartbeatLost");
    let event = event_where(&admin, "a NodeNotReady event", |e| {
        e.spec.reason_is(EventReason::NodeNotReady) && e.spec.involved_object.name == "node-a"
    })
    .await;
    assert!(event.spec.message.contains("no heartbeat for"), "{}", event.spec.message);
    assert!(node(&server, "node-b").await.unwrap().status.ready, "the other node is unaffected");

    // Restarted with the same data dir: no join token needed, new boot id.
    let mut restart = common::herd();
    restart.args(["agent", "--server", &server.url, "--name", "node-a", "--data-dir"]).arg(dir.path().join("a"));
    let _a = common::Proc::spawn(restart);
    let back = eventually(Duration::from_secs(10), "node-a Ready again", || async {
        node(&server, "node-a").await.filter(|n| n.status.ready)
    })
    .await;
    assert_ne!(back.status.agent_boot_id.unwrap(), first_boot);
    for reason in [EventReason::NodeReady, EventReason::AgentRestarted] {
        event_where(&admin, &format!("a {reason} event"), |e| {
            e.spec.reason_is(reason) && e.spec.involved_object.name == "node-a"
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn agents_ride_out_a_server_restart_and_use_the_next_server_url() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    let listen = server.listen_addr();
    // The first URL points at nothing: the agent must move on to the second.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let mut command = common::herd();
    command
        .args(["agent", "--server", &format!("{dead_url},{}", server.url), "--name", "node-a", "--data-dir"])
        .arg(dir.path().join("a"));
    command.env("HERD_JOIN_TOKEN", common::JOIN_TOKEN);
    let _agent = common::Proc::spawn(command);
    eventually(Duration::from_secs(15), "node-a Ready", || async {
        node(&server, "node-a").await.filter(|n| n.status.ready)
    })
    .await;

    let mut server = server;
    server.proc.kill9();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let server = TestServer::start_at(&dir.path().join("server"), &listen);
    let before = node(&server, "node-a").await.unwrap().status.last_heartbeat;
    eventually(Duration::from_secs(15), "a heartbeat after the restart", || async {
        node(&server, "node-a").await.filter(|n| n.status.last_heartbeat != before && n.status.ready)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_leaves_a_hung_server_for_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let first = TestServer::start(&dir.path().join("first"));
    let second = TestServer::start(&dir.path().join("second"));
    let mut command = common::herd();
    command.args(["agent", "--server", &format!("{},{}", first.url, second.url), "--name", "node-a", "--data-dir"]);
    command.arg(dir.path().join("a")).env("HERD_JOIN_TOKEN", common::JOIN_TOKEN);
    let _agent = common::Proc::spawn(command);
    eventually(Duration::from_secs(15), "node-a Ready on the first server", || async {
        node(&first, "node-a").await.filter(|n| n.status.ready)
    })
    .await;

    // The first server hangs (its connections stay open, nothing answers).
    first.proc.signal("STOP");
    let stopped_at = Instant::now();
    let moved = eventually(Duration::from_secs(30), "node-a Ready on the second server", || async {
        node(&second, "node-a").await.filter(|n| n.status.ready)
    })
    .await;
    first.proc.signal("CONT");
    assert!(moved.status.agent_boot_id.is_some());
    // One request timeout (5s), a backoff step and a join.
    assert!(stopped_at.elapsed() < Duration::from_secs(12), "took {:?}", stopped_at.elapsed());
}
