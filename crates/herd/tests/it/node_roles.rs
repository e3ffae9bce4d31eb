//! Node roles through the CLI against a real server (Ganeti's
//! rules): the leader fills the candidate pool; a demotion from a full pool
//! is refused with the reason unless `--auto-promote` promotes another node
//! in the same change; a larger pool promotes one more;
//! a node that is not master capable is never promoted; offline is refused while a node hosts members, naming them;
//! `herd apply` meets the same rules; only Ready nodes are promoted; every
//! change is an Event.

use crate::common;

use std::time::Duration;

use common::{TestServer, eventually};
use herd_client::Client;
use herd_core::Object;
use herd_core::api::MemberReport;
use herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME;
use herd_core::kinds::{ClusterConfigSpec, EventReason, EventSpec, LeaseSpec, NodeRole, NodeSpec};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn roles(admin: &Client) -> Vec<(String, NodeRole)> {
    let nodes = admin.list::<NodeSpec>("").await.unwrap();
    nodes.into_iter().map(|n| (n.metadata.name, n.spec.role)).collect()
}

async fn candidates(admin: &Client) -> Vec<String> {
    roles(admin).await.into_iter().filter(|(_, r)| *r == NodeRole::Candidate).map(|(n, _)| n).collect()
}

async fn set_pool(admin: &Client, size: u32) {
    let mut config = admin.get::<ClusterConfigSpec>(CLUSTER_CONFIG_NAME).await.unwrap();
    config.spec.candidate_pool_size = size;
    admin.update(&config).await.unwrap();
}

/// Sets a node's readiness as its agent's heartbeats would (retried: the
/// leader writes its status too).
async fn set_ready(admin: &Client, name: &str, ready: bool) {
    for _ in 0..20 {
        let mut node = admin.get::<NodeSpec>(name).await.unwrap();
        node.status.ready = ready;
        if admin.update_status(&node).await.is_ok() {
            return;
        }
    }
    panic!("could not set {name}'s readiness");
}

async fn wait_for_candidates(admin: &Client, expected: &[&str]) {
    let what = format!("candidates {expected:?}");
    eventually(Duration::from_secs(20), &what, || async { (candidates(admin).await == expected).then_some(()) }).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_pool_is_kept_full_and_demotions_follow_ganetis_rules() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    let admin = server.admin();
    // Nodes without agents here: Ready by hand, and kept so.
    let mut config = admin.get::<ClusterConfigSpec>(CLUSTER_CONFIG_NAME).await.unwrap();
    config.spec.node_grace_period = herd_core::HumanDuration::from_secs(3600);
    admin.update(&config).await.unwrap();
    set_pool(&admin, 3).await;
    for i in 1..=6 {
        admin.create(&Object::new(format!("n{i}"), NodeSpec::default())).await.unwrap();
        set_ready(&admin, &format!("n{i}"), i != 6).await;
    }
    // The leader promotes the first three eligible Ready nodes, and no more.
    wait_for_candidates(&admin, &["n1", "n2", "n3"]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(candidates(&admin).await, ["n1", "n2", "n3"]);

    // Ganeti 163: setting a candidate offline when the pool is exactly full.
    let refused = server.cli(&["node", "modify", "n2", "--role", "offline"]);
    assert_eq!(refused.status.code(), Some(4), "{}", text(&refused.stderr));
    let why = text(&refused.stderr);
    assert!(why.contains("would leave 2 candidates where 3 are wanted") && why.contains("--auto-promote"), "{why}");
    assert_eq!(candidates(&admin).await, ["n1", "n2", "n3"], "a refusal changes nothing");
    let done = server.cli(&["node", "modify", "n2", "--role", "offline", "--auto-promote"]);
    assert!(done.status.success(), "{}", text(&done.stderr));
    let said = text(&done.stdout);
    assert!(said.contains("node/n2 offline (asked)"), "{said}");
    assert!(said.contains("node/n4 candidate (promoted in place of n2"), "{said}");
    assert_eq!(candidates(&admin).await, ["n1", "n3", "n4"], "both in one change");

    // A larger pool: one more is promoted.
    set_pool(&admin, 4).await;
    wait_for_candidates(&admin, &["n1", "n3", "n4", "n5"]).await;

    // Ganeti 1682: a node that is not master capable is never promoted.
    let out = server.cli(&["node", "modify", "n5", "--master-capable", "false"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("node/n5 regular, not master capable"), "{}", text(&out.stdout));
    set_pool(&admin, 5).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(candidates(&admin).await, ["n1", "n3", "n4"], "n5 is not capable, n2 is offline, n6 not Ready");
    let out = server.cli(&["node", "modify", "n5", "--role", "candidate"]);
    assert_eq!(out.status.code(), Some(4));
    assert!(text(&out.stderr).contains("not master capable"), "{}", text(&out.stderr));

    // Offline is refused while the node hosts members, naming them.
    let mut n5 = admin.get::<NodeSpec>("n5").await.unwrap();
    n5.status.members = vec![MemberReport { name: "web-1".into(), wanted: true, running: true, ..Default::default() }];
    admin.update_status(&n5).await.unwrap();
    let out = server.cli(&["node", "modify", "n5", "--role", "offline"]);
    assert_eq!(out.status.code(), Some(4));
    assert!(text(&out.stderr).contains("still hosts members (web-1)"), "{}", text(&out.stderr));
    // Drained works with members; one change at a time; nothing to do is said.
    let out = server.cli(&["node", "modify", "n5", "--role", "drained"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = server.cli(&["node", "modify", "n5", "--role", "drained"]);
    assert_eq!(text(&out.stdout), "node/n5 unchanged\n");
    let out = server.cli(&["node", "modify", "n5"]);
    assert_eq!(out.status.code(), Some(2), "a role or a capability is required");

    // `herd apply` meets the same rules: demoting n1 to regular leaves the
    // pool short (all three eligible nodes are wanted).
    let manifest = dir.path().join("n1.yaml");
    std::fs::write(&manifest, "kind: Node\nmetadata:\n  name: n1\nspec:\n  role: regular\n").unwrap();
    let out = server.cli(&["apply", "-f", manifest.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stdout));
    assert!(text(&out.stderr).contains("would leave 2 candidates where 3 are wanted"), "{}", text(&out.stderr));

    // cluster verify: the leader runs on no node (a warning), n6 is not
    // Ready (a warning), n2 is offline (listed apart); then a candidate
    // down, and too few candidates (errors).
    let out = server.cli(&["cluster", "verify"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let said = text(&out.stdout);
    assert!(
        said.contains("WARNING: node n6 is unreachable (NotReady)") && said.contains("offline, not checked: n2"),
        "{said}"
    );
    // Every candidate's agent gone (as the node lifecycle marks them).
    for name in ["n1", "n3", "n4"] {
        set_ready(&admin, name, false).await;
    }
    let out = server.cli(&["cluster", "verify", "-o", "json"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let messages: Vec<&str> =
        report["findings"].as_array().unwrap().iter().filter_map(|f| f["message"].as_str()).collect();
    assert!(messages.iter().any(|m| m.contains("master candidate n3 is unreachable")), "{messages:?}");
    assert!(messages.iter().any(|m| m.contains("every master candidate is down (n1, n3, n4)")), "{messages:?}");

    // Each change is an Event on its node, saying why.
    let events = admin.list::<EventSpec>("").await.unwrap();
    let on = |node: &str| -> Vec<String> {
        events
            .iter()
            .filter(|e| e.spec.reason_is(EventReason::NodeRoleChanged) && e.spec.involved_object.name == node)
            .map(|e| e.spec.message.clone())
            .collect()
    };
    assert!(on("n4").iter().any(|m| m.contains("regular -> candidate: promoted in place of n2")), "{:?}", on("n4"));
    assert!(on("n2").iter().any(|m| m.contains("candidate -> offline: asked")), "{:?}", on("n2"));
    assert!(on("n1").iter().any(|m| m.contains("promoted: the pool had")), "{:?}", on("n1"));

    // Lowering the pool only warns: nobody is demoted.
    set_pool(&admin, 1).await;
    let warned = eventually(Duration::from_secs(20), "the pool-above-size warning", || async {
        let events = admin.list::<EventSpec>("").await.ok()?;
        events.into_iter().find(|e| e.spec.reason_is(EventReason::CandidatePoolAboveSize)).map(|e| e.spec.message)
    })
    .await;
    assert!(warned.contains("more than candidatePoolSize 1: none is demoted"), "{warned}");
    assert_eq!(candidates(&admin).await, ["n1", "n3", "n4"]);
}

/// The lease holder, as a replica's API shows it.
async fn holder(client: &Client) -> String {
    client.get::<LeaseSpec>("herd-leader").await.map(|l| l.spec.holder_identity).unwrap_or_default()
}

/// Server replicas belong to nodes (`herd server --node`): only a master
/// candidate's replica campaigns (the first one bootstraps, when no node
/// is a candidate yet); the leader's node is the master's, shown by `herd
/// get nodes`, and keeps its role.
#[tokio::test(flavor = "multi_thread")]
async fn only_a_candidates_replica_campaigns_and_the_masters_node_keeps_its_role() {
    const SHORT: [&str; 6] = ["--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "500ms"];
    let dir = tempfile::tempdir().unwrap();
    let on = |node: &'static str| SHORT.iter().copied().chain(["--node", node]).collect::<Vec<_>>();
    let mut r1 = TestServer::start_replica(dir.path(), "r1", None, &on("n1"));
    let admin = r1.admin();
    eventually(Duration::from_secs(20), "r1 bootstraps: no node is a candidate yet", || async {
        (holder(&admin).await == "r1").then_some(())
    })
    .await;
    let mut config = admin.get::<ClusterConfigSpec>(CLUSTER_CONFIG_NAME).await.unwrap();
    config.spec.node_grace_period = herd_core::HumanDuration::from_secs(3600);
    admin.update(&config).await.unwrap();
    for (name, capable) in [("n1", true), ("n2", false)] {
        let spec = NodeSpec { master_capable: capable, ..NodeSpec::default() };
        admin.create(&Object::new(name, spec)).await.unwrap();
        set_ready(&admin, name, true).await;
    }
    eventually(Duration::from_secs(20), "n1 is the master's node, a candidate", || async {
        let n1 = admin.get::<NodeSpec>("n1").await.ok()?;
        (n1.spec.role == NodeRole::Candidate && n1.status.master).then_some(())
    })
    .await;
    let table = text(&r1.cli(&["get", "nodes"]).stdout);
    assert!(table.lines().any(|l| l.starts_with("n1") && l.contains("candidate,master")), "{table}");
    let refused = r1.cli(&["node", "modify", "n1", "--role", "drained"]);
    assert_eq!(refused.status.code(), Some(4));
    assert!(text(&refused.stderr).contains("is the master's node"), "{}", text(&refused.stderr));

    // r2 runs on n2, a regular node: with r1 gone it does not take the lease.
    let r2 = TestServer::start_replica(dir.path(), "r2", None, &on("n2"));
    r1.proc.signal("TERM");
    r1.proc.wait_exit(Duration::from_secs(20));
    let admin = r2.admin();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_ne!(holder(&admin).await, "r2", "a regular node's replica took the lease");
    // Once n2 is a candidate, its replica campaigns and leads.
    for change in [["--master-capable", "true"], ["--role", "candidate"]] {
        let out = r2.cli(&[&["node", "modify", "n2"][..], &change[..]].concat());
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    eventually(Duration::from_secs(20), "r2 leads, and n2 is the master's node", || async {
        let n2 = admin.get::<NodeSpec>("n2").await.ok()?;
        let n1 = admin.get::<NodeSpec>("n1").await.ok()?;
        (holder(&admin).await == "r2" && n2.status.master && !n1.status.master).then_some(())
    })
    .await;
}

/// An offline node is never contacted: its agent's address (a listener
/// here that counts connections) receives none while the server is asked
/// for its logs and volumes, and Commands for it or from it are refused at
/// once; an unsettled Command left on it is given up; the refusals are
/// counted in /metrics.
#[tokio::test(flavor = "multi_thread")]
async fn an_offline_node_is_never_contacted_and_calls_to_it_fail_at_once() {
    use herd_core::kinds::{Action, CommandSpec, ManagementState};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    let admin = server.admin();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            counted.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });
    let mut n3 =
        admin.create(&Object::new("n3", NodeSpec { master_capable: false, ..NodeSpec::default() })).await.unwrap();
    n3.status.address = Some(address);
    admin.update_status(&n3).await.unwrap();
    let stop = Action::StopMember { member: "web-1".into() };
    let spec = CommandSpec { node: "n3".into(), timeout: None, action: stop.clone(), origin: None };
    admin.create(&Object::new("left-over", spec)).await.unwrap();
    let out = server.cli(&["node", "modify", "n3", "--role", "offline"]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    let started = std::time::Instant::now();
    let out = server.cli(&["logs", "n3/web-1"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("node n3 is offline"), "{}", text(&out.stderr));
    let volumes = admin.node_volumes("n3").await.unwrap_err().to_string();
    assert!(volumes.contains("node n3 is offline"), "{volumes}");
    assert!(started.elapsed() < Duration::from_secs(5), "at once, not after a timeout: {:?}", started.elapsed());
    let spec = CommandSpec { node: "n3".into(), timeout: None, action: stop, origin: None };
    let refused = admin.create(&Object::new("to-n3", spec)).await.unwrap_err().to_string();
    assert!(refused.contains("node n3 is offline"), "{refused}");
    let copy = Action::CopyVolume { member: "web-1".into(), volume: "data".into(), from_node: "n3".into() };
    let spec = CommandSpec { node: "n1".into(), timeout: None, action: copy, origin: None };
    let refused = admin.create(&Object::new("from-n3", spec)).await.unwrap_err().to_string();
    assert!(refused.contains("node n3 is offline"), "{refused}");
    let given_up = eventually(Duration::from_secs(20), "the left-over Command given up", || async {
        let command = admin.get::<CommandSpec>("left-over").await.ok()?;
        (command.status.state_by_management == ManagementState::ReconcileSkipped).then_some(command)
    })
    .await;
    assert!(given_up.status.reason.contains("node n3 is offline"), "{}", given_up.status.reason);
    let metrics = admin.get_text("/metrics").await.unwrap();
    assert!(metrics.contains("herd_offline_calls_refused_total 2"), "{metrics}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(connections.load(Ordering::SeqCst), 0, "the offline node's address was connected to");
}
