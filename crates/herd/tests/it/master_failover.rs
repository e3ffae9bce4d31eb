//! Master failover without a shared store (Ganeti's
//! `gnt-cluster master-failover`), through the real binary: a SQLite
//! master on n1 with three master candidates and an etcd cluster; the
//! master and n1's agent are killed. With two of three nodes unreachable
//! the vote is refused. Then `herd cluster master-failover` on n2 wins,
//! serves from the freshest configuration copy at a new term, every
//! living agent follows it, no member process restarts and every spec is
//! as it was. The old master started again does not lead, says why, and
//! sends its node's agent on to the new master.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::apps::{example, require};
use common::cluster::quick_heartbeats;
use common::{ADMIN_TOKEN, MemberReaper, Proc, TestServer, eventually, start_agent};
use herd_core::kinds::{
    AppClusterSpec, DisruptionBudgetSpec, EventReason, MemberSpec, MemberState, NodeRole, NodeSpec, ReplicaState,
};

/// `herd cluster master-failover` on node `node`, its new store in `dir`.
fn failover(dir: &Path, node: &str, agent_dir: &Path) -> std::process::Command {
    let mut command = common::herd();
    command
        .args(["cluster", "master-failover", "--node", node, "--identity", &format!("{node}-server")])
        .args(["--listen", "127.0.0.1:0"])
        .arg("--agent-data-dir")
        .arg(agent_dir)
        .arg("--data-dir")
        .arg(dir)
        .env("HERD_ADMIN_TOKEN", ADMIN_TOKEN)
        .env_remove("HERD_STORE");
    command
}

/// The server `herd cluster master-failover` starts on `node`, once it
/// serves.
fn new_master(dir: &Path, node: &str, agent_dir: &Path) -> TestServer {
    let mut proc = Proc::spawn(failover(dir, node, agent_dir));
    let line = proc.wait_for_line("listening on", Duration::from_secs(60));
    let url = line.rsplit(' ').next().unwrap().to_string();
    let hash =
        proc.wait_for_line("cluster CA: ", Duration::from_secs(5)).split_whitespace().nth(2).unwrap().to_string();
    TestServer { proc, url, data_dir: dir.to_path_buf(), ca_hash: Some(hash) }
}

/// Each node's members and the pids its agent reports, as `server` has them.
async fn member_pids(server: &TestServer) -> BTreeMap<String, u32> {
    let nodes = server.admin().list::<NodeSpec>("").await.unwrap();
    nodes.iter().flat_map(|n| n.status.members.iter().filter_map(|m| Some((m.name.clone(), m.pid?)))).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_candidate_takes_over_a_lost_sqlite_master_and_the_old_one_stands_aside() {
    require(&["etcd", "etcdctl"]);
    let dir = tempfile::tempdir().unwrap();
    let old_dir = dir.path().join("old-master");
    let old = TestServer::start_replica(&old_dir, "old-master", None, &["--node", "n1"]);
    quick_heartbeats(&old).await;
    common::apps::own_member_ports(&old).await;
    let dirs: Vec<PathBuf> = (1..=3).map(|i| dir.path().join(format!("n{i}"))).collect();
    let _reapers: Vec<MemberReaper> = dirs.iter().map(|d| MemberReaper(d.clone())).collect();
    let mut agents: Vec<Option<Proc>> =
        dirs.iter().enumerate().map(|(i, d)| Some(start_agent(&old.url, d, &format!("n{}", i + 1)))).collect();
    eventually(Duration::from_secs(30), "three ready candidates holding the configuration", || async {
        let nodes = old.admin().list::<NodeSpec>("").await.ok()?;
        let ready = nodes.iter().filter(|n| n.status.ready && n.spec.role == NodeRole::Candidate).count();
        (ready == 3 && dirs.iter().all(|d| d.join("config.json").exists())).then_some(())
    })
    .await;
    let out = old.cli(&["apply", "-f", example("etcd").to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let members = common::apps::configured(&old, "etcd", 3, Duration::from_secs(90)).await;
    let cluster_before = old.admin().get::<AppClusterSpec>("etcd").await.unwrap();
    let budget_before = old.admin().get::<DisruptionBudgetSpec>("etcd-quorum").await.unwrap();
    let pids_before = member_pids(&old).await;
    let old_term = old.admin().cluster_status().await.unwrap().leader.unwrap().term;
    // Agents started again listen where they did (the copies hold that address).
    let addresses: Vec<String> = {
        let nodes = old.admin().list::<NodeSpec>("").await.unwrap();
        nodes.into_iter().map(|n| n.status.address.unwrap()).collect()
    };
    let again = |i: usize, server: &str| {
        common::start_agent_with(server, &dirs[i], &format!("n{}", i + 1), &["--listen", &addresses[i]])
    };
    // The configuration copies catch up with the members' states.
    tokio::time::sleep(Duration::from_secs(3)).await;

    // The master's host is lost: its server and its agent.
    let (old_listen, old_url) = (old.listen_addr(), old.url.clone());
    drop(old);
    agents[0].take();
    // With n3's agent down too, only n2 answers: no majority.
    agents[2].take();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let refused = failover(&dir.path().join("refused"), "n2", &dirs[1]).output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&refused.stdout), String::from_utf8_lossy(&refused.stderr));
    assert!(!refused.status.success(), "{said}");
    assert!(said.contains("master failover refused") && said.contains("only 1 of 3"), "{said}");

    agents[2] = Some(again(2, &old_url));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let new = new_master(&dir.path().join("new-master"), "n2", &dirs[1]);
    eventually(Duration::from_secs(30), "n2 and n3 heartbeat the new master", || async {
        let nodes = new.admin().list::<NodeSpec>("").await.ok()?;
        let ready: Vec<&str> = nodes.iter().filter(|n| n.status.ready).map(|n| n.metadata.name.as_str()).collect();
        (ready == ["n2", "n3"]).then_some(())
    })
    .await;
    let status = new.admin().cluster_status().await.unwrap();
    assert_eq!(status.leader.as_ref().map(|l| (l.identity.as_str(), l.term)), Some(("n2-server", old_term + 1)));
    let cluster_after = new.admin().get::<AppClusterSpec>("etcd").await.unwrap();
    assert_eq!(cluster_after.spec, cluster_before.spec, "the app cluster's spec is as before");
    assert_eq!(cluster_after.metadata.uid, cluster_before.metadata.uid);
    let budget_after = new.admin().get::<DisruptionBudgetSpec>("etcd-quorum").await.unwrap();
    assert_eq!(
        (budget_after.spec, budget_after.metadata.uid),
        (budget_before.spec, budget_before.metadata.uid),
        "the example's budget came with the configuration"
    );
    for member in &members {
        let after = new.admin().get::<MemberSpec>(&member.metadata.name).await.unwrap();
        assert_eq!(after.spec, member.spec, "{}", member.metadata.name);
        assert_eq!(after.metadata.uid, member.metadata.uid);
    }
    let on_living: Vec<&herd_core::kinds::Member> =
        members.iter().filter(|m| m.spec.node.as_deref() != Some("n1")).collect();
    eventually(Duration::from_secs(30), "the living nodes' members configured, not restarted", || async {
        let pids = member_pids(&new).await;
        let mut settled = true;
        for member in &on_living {
            let name = &member.metadata.name;
            assert_eq!(pids.get(name).or(pids_before.get(name)), pids_before.get(name), "{name} restarted");
            let now = new.admin().get::<MemberSpec>(name).await.ok()?;
            settled &= pids.contains_key(name) && now.status.state == MemberState::Configured;
        }
        settled.then_some(())
    })
    .await;

    // The old master comes back on its old address: it does not lead and
    // says why, and its node's agent goes on to the new master.
    let back = TestServer::start_with(&old_dir, &old_listen, &["--identity", "old-master", "--node", "n1"]);
    let superseded = eventually(Duration::from_secs(20), "the old master knows it was superseded", || async {
        back.admin().cluster_status().await.ok()?.superseded
    })
    .await;
    assert!(superseded.contains(&new.url) && superseded.contains("does not lead"), "{superseded}");
    agents[0] = Some(again(0, &back.url));
    eventually(Duration::from_secs(30), "n1 heartbeats the new master", || async {
        new.admin().get::<NodeSpec>("n1").await.ok().filter(|n| n.status.ready)
    })
    .await;
    let status = back.admin().cluster_status().await.unwrap();
    let mine = status.replicas.iter().find(|r| r.name == "old-master").unwrap();
    assert_ne!(mine.state, ReplicaState::Leading, "{status:?}");
    assert_eq!(status.lease_transitions, old_term, "the old master never took its lease again");
    drop(agents);
}

/// The Operation draining `node`, as `server` has it.
async fn drain_of(server: &TestServer, node: &str) -> Option<herd_core::kinds::Operation> {
    let operations = server.admin().list::<herd_core::kinds::OperationSpec>(&format!("herd.io/target={node}")).await;
    operations.ok()?.into_iter().next()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_master_failover_in_the_middle_of_a_drain_goes_on_from_its_steps_and_a_finished_one_stays_finished() {
    use herd_core::kinds::{OperationPhase, StepState};
    let dir = tempfile::tempdir().unwrap();
    let old = TestServer::start_replica(&dir.path().join("old-master"), "old-master", None, &["--node", "n1"]);
    quick_heartbeats(&old).await;
    common::apps::own_member_ports(&old).await;
    let dirs: Vec<PathBuf> = (1..=4).map(|i| dir.path().join(format!("n{i}"))).collect();
    let _reapers: Vec<MemberReaper> = dirs.iter().map(|d| MemberReaper(d.clone())).collect();
    let _agents: Vec<Proc> =
        dirs.iter().enumerate().map(|(i, d)| start_agent(&old.url, d, &format!("n{}", i + 1))).collect();
    eventually(Duration::from_secs(30), "four ready candidates", || async {
        let nodes = old.admin().list::<NodeSpec>("").await.ok()?;
        let ready = nodes.iter().filter(|n| n.status.ready && n.spec.role == NodeRole::Candidate).count();
        (ready == 4 && dirs.iter().all(|d| d.join("config.json").exists())).then_some(())
    })
    .await;
    // The master's node takes no members: they go to n2-n4.
    common::apps::cordon(&old, "n1", true).await;
    let log = dir.path().join("log");
    std::fs::create_dir_all(&log).unwrap();
    let setup = format!("if [ -e {}/slow ]; then sleep 4; fi", log.display());
    let budget = common::budgets::budget_yaml("web-one", "herd.io/cluster=web", "maxUnavailable: 1");
    let manifest = dir.path().join("web.yaml");
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: herd/v1\nkind: App\nmetadata: {{name: web}}\nspec:\n  roles:\n  - name: w\n    run: {{command: [sleep, '600']}}\n    setup: {{script: '{setup}'}}\n\
             ---\napiVersion: herd/v1\nkind: AppCluster\nmetadata: {{name: web}}\nspec:\n  appRef: web\n  roles: [{{name: w, members: 4}}]\n{budget}"
        ),
    )
    .unwrap();
    let out = old.cli(&["apply", "-f", manifest.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    common::apps::configured(&old, "web", 4, Duration::from_secs(60)).await;
    common::budgets::counted(&old, "web-one", 4, 1).await;

    // A drain that finishes: n3's members go, and n3 takes members again.
    let out = old.cli(&["node", "drain", "n3"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = old.cli(&["node", "undrain", "n3"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let finished = drain_of(&old, "n3").await.unwrap();
    assert_eq!(finished.status.phase, OperationPhase::Succeeded);
    common::apps::configured(&old, "web", 4, Duration::from_secs(60)).await;
    let on_n4: Vec<String> = common::apps::list_members(&old, "web")
        .await
        .into_iter()
        .filter(|m| m.spec.node.as_deref() == Some("n4"))
        .map(|m| m.metadata.name)
        .collect();
    assert_eq!(on_n4.len(), 2, "n4 holds two members");

    // A drain of n4, slow: the master dies when one member is moved and
    // the next is on its way.
    std::fs::write(log.join("slow"), "").unwrap();
    let out = old.cli(&["node", "drain", "n4", "--detach"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let midway = eventually(Duration::from_secs(60), "the n4 drain at 1 of 2, the second on its way", || async {
        let op = drain_of(&old, "n4").await?;
        let evicted = op.status.steps.iter().filter(|s| s.state == StepState::Evicted).count();
        (op.status.done == 1 && evicted == 1).then_some(op)
    })
    .await;
    // The copies catch up with the drain's progress (a heartbeat or two).
    eventually(Duration::from_secs(10), "n2's copy holds the drain at 1 of 2", || async {
        let copy: serde_json::Value = serde_json::from_slice(&std::fs::read(dirs[1].join("config.json")).ok()?).ok()?;
        let objects = copy["objects"].as_array()?;
        let drain = objects.iter().find(|o| o["metadata"]["name"] == midway.metadata.name.as_str())?;
        (drain["status"]["done"] == 1).then_some(())
    })
    .await;
    drop(old);
    // Its agents see it gone (the vote needs that no node still reaches it).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let new = new_master(&dir.path().join("new-master"), "n2", &dirs[1]);

    // The n4 drain goes on from where it was and ends with each member
    // evicted once; the n3 drain stays finished and n3 stays regular.
    let done = eventually(Duration::from_secs(90), "the n4 drain succeeded under the new master", || async {
        let op = drain_of(&new, "n4").await?;
        (op.status.phase == OperationPhase::Succeeded).then_some(op)
    })
    .await;
    assert_eq!((done.status.done, done.status.total), (2, 2), "{:?}", done.status);
    let evicted = done.status.history.iter().filter(|h| h.message.contains(" evicted: ")).count();
    assert_eq!(evicted, 2, "each member evicted once: {:?}", done.status.history);
    let again = drain_of(&new, "n3").await.unwrap();
    assert_eq!(again.status.phase, OperationPhase::Succeeded, "{:?}", again.status);
    assert_eq!(again.status.steps, finished.status.steps, "the finished drain did nothing more");
    let n3 = new.admin().get::<NodeSpec>("n3").await.unwrap();
    assert_ne!(n3.spec.role, NodeRole::Drained, "n3 is not drained again");
    let evictions: Vec<String> = new
        .admin()
        .list::<herd_core::kinds::EventSpec>("")
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.spec.reason_is(EventReason::MemberEvicted))
        .map(|e| e.spec.involved_object.name)
        .collect();
    assert!(evictions.is_empty(), "the new master evicted no member again: {evictions:?}");
    common::apps::configured(&new, "web", 4, Duration::from_secs(60)).await;
}
