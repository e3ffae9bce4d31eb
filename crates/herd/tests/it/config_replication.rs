//! The configuration goes to master candidates only: with three
//! real agents and a pool of two, the candidates keep a copy at the newest
//! serial (in their data dirs) and the regular node only the small facts;
//! a change raises the serial everywhere; a demoted node deletes its copy
//! and the node promoted in its place gets one; a candidate whose agent was
//! down while the configuration changed is reported by `herd cluster
//! verify` and catches up when it comes back.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{MemberReaper, TestServer, eventually, start_agent};
use herd_client::Client;
use herd_core::configuration::{Configuration, Ssconf};
use herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME;
use herd_core::kinds::{ClusterConfigSpec, NodeRole, NodeSpec};

fn copy_of(dir: &Path) -> Option<Configuration> {
    serde_json::from_slice(&std::fs::read(dir.join("config.json")).ok()?).ok()
}

fn facts_of(dir: &Path) -> Option<Ssconf> {
    serde_json::from_slice(&std::fs::read(dir.join("ssconf.json")).ok()?).ok()
}

async fn change_config(admin: &Client, change: impl Fn(&mut ClusterConfigSpec)) {
    let mut config = admin.get::<ClusterConfigSpec>(CLUSTER_CONFIG_NAME).await.unwrap();
    change(&mut config.spec);
    admin.update(&config).await.unwrap();
}

/// Waits until the candidates (by name) hold a copy at one serial, every
/// node's facts name that serial, and the others hold no copy; returns it.
async fn settled(admin: &Client, dirs: &[(&str, PathBuf)], candidates: &[&str], above: u64) -> u64 {
    let what = format!("copies on {candidates:?} only, past serial {above}");
    eventually(Duration::from_secs(30), &what, || async {
        let nodes = admin.list::<NodeSpec>("").await.ok()?;
        let now: Vec<&str> =
            nodes.iter().filter(|n| n.spec.role == NodeRole::Candidate).map(|n| n.metadata.name.as_str()).collect();
        if now != candidates {
            return None;
        }
        let serial = copy_of(&dirs.iter().find(|(n, _)| *n == candidates[0])?.1)?.serial;
        for (name, dir) in dirs {
            let copy = copy_of(dir).map(|c| c.serial);
            let expected = candidates.contains(name).then_some(serial);
            if copy != expected || facts_of(dir)?.serial != serial {
                return None;
            }
        }
        (serial > above).then_some(serial)
    })
    .await
}

/// What the server's metrics say it sent of the configuration.
async fn bytes_sent(admin: &Client) -> u64 {
    let metrics = admin.get_text("/metrics").await.unwrap();
    let line = metrics.lines().find(|l| l.starts_with("herd_configuration_sent_bytes_total ")).unwrap();
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn only_candidates_keep_the_configuration_and_it_follows_every_change() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    let admin = server.admin();
    change_config(&admin, |c| {
        c.candidate_pool_size = 2;
        c.heartbeat_period = herd_core::HumanDuration(Duration::from_millis(300));
        c.node_grace_period = herd_core::HumanDuration(Duration::from_secs(2));
    })
    .await;
    let dirs: Vec<(&str, PathBuf)> = ["n1", "n2", "n3"].iter().map(|n| (*n, dir.path().join(n))).collect();
    let _reapers: Vec<MemberReaper> = dirs.iter().map(|(_, d)| MemberReaper(d.clone())).collect();
    // n1 and n2 first, so that they are the two the leader promotes.
    let mut agents: Vec<_> = dirs[..2].iter().map(|(name, d)| start_agent(&server.url, d, name)).collect();
    eventually(Duration::from_secs(20), "n1 and n2 candidates", || async {
        let nodes = admin.list::<NodeSpec>("").await.ok()?;
        (nodes.iter().filter(|n| n.spec.role == NodeRole::Candidate).count() == 2).then_some(())
    })
    .await;
    agents.push(start_agent(&server.url, &dirs[2].1, "n3"));

    settled(&admin, &dirs, &["n1", "n2"], 0).await;
    // The joins are in the configuration once every node's address is.
    eventually(Duration::from_secs(20), "every node in the copies", || async {
        let copy = copy_of(&dirs[0].1)?;
        let nodes = copy.objects.iter().filter(|o| o["kind"] == "Node" && o["status"]["address"].is_string()).count();
        (nodes == 3).then_some(())
    })
    .await;
    let first = settled(&admin, &dirs, &["n1", "n2"], 0).await;
    let facts = facts_of(&dirs[2].1).unwrap();
    assert_eq!(facts.master_urls, std::slice::from_ref(&server.url), "the facts name where the leader serves");
    let copy = copy_of(&dirs[0].1).unwrap();
    assert!(copy.objects.iter().any(|o| o["kind"] == "ClusterConfig"), "the copy holds the intent objects");
    assert!(
        copy.objects.iter().all(|o| o
            .get("status")
            .is_none_or(|s| s.as_object().is_some_and(|s| s.len() == 1 && s.contains_key("address")))),
        "and of the status only a node's address"
    );
    let document_size = serde_json::to_vec(&copy).unwrap().len() as u64;

    // A change: every candidate holds the new serial, n3 only the facts.
    // It travels as a delta, checked against the document's digest.
    let sent_before = bytes_sent(&admin).await;
    change_config(&admin, |c| c.app_clusters.node_loss_grace = herd_core::HumanDuration::from_secs(600)).await;
    let second = settled(&admin, &dirs, &["n1", "n2"], first).await;
    let sent = bytes_sent(&admin).await - sent_before;
    assert!(sent > 0 && sent < document_size, "{sent} bytes sent for one change; the document is {document_size}");
    let (one, other) = (copy_of(&dirs[0].1).unwrap(), copy_of(&dirs[1].1).unwrap());
    assert_eq!(one, other, "both candidates hold the same configuration");
    assert!(one.objects.iter().any(|o| o["spec"]["appClusters"]["nodeLossGrace"] == "10m"), "with the change");

    // n2 drained: its copy goes, n3 (promoted in its place) gets one.
    let mut n2 = admin.get::<NodeSpec>("n2").await.unwrap();
    n2.spec.role = NodeRole::Drained;
    let error = admin.update(&n2).await.unwrap_err().to_string();
    assert!(error.contains("auto-promote"), "{error}");
    let client = server.admin();
    let request =
        herd_core::api::NodeRoleRequest { role: Some(NodeRole::Drained), master_capable: None, auto_promote: true };
    client.change_node_role("n2", &request).await.unwrap();
    let third = settled(&admin, &dirs, &["n1", "n3"], second).await;

    // n1's agent is down while the configuration changes; back, it catches up.
    agents[0].kill9();
    change_config(&admin, |c| c.app_clusters.node_loss_grace = herd_core::HumanDuration::from_secs(900)).await;
    eventually(Duration::from_secs(20), "n3 holds the newer serial", || async {
        copy_of(&dirs[2].1).filter(|c| c.serial > third).map(|_| ())
    })
    .await;
    assert_eq!(copy_of(&dirs[0].1).map(|c| c.serial), Some(third), "n1 was down: its copy is the old one");
    // `herd cluster verify` says so once the node is marked NotReady.
    let verify = eventually(Duration::from_secs(20), "verify reports the candidate down", || async {
        let out = common::herd()
            .args(["cluster", "verify"])
            .env("HERD_SERVER", &server.url)
            .env("HERD_TOKEN", common::ADMIN_TOKEN)
            .env("HERD_CONFIG", dir.path().join("none.yaml"))
            .output()
            .ok()?;
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        said.contains("master candidate n1 is unreachable").then_some((out.status.code(), said))
    })
    .await;
    assert_eq!(verify.0, Some(1), "a warning: {}", verify.1);
    agents[0] = start_agent(&server.url, &dirs[0].1, "n1");
    settled(&admin, &dirs, &["n1", "n3"], third).await;
}
