//! Commands that fail or are given up, end to end:
//! abandoning a copy ends its worker before what it holds is released; a
//! failed migration leaves its member running where it was; a copy onto a
//! full disk fails at once with the reason, leaves nothing behind, and the
//! agent keeps working on the full disk and says so.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::cluster::{TwoNodes, command, fill_volume, member_run, run, settled, two_nodes};
use common::{event_where, eventually};
use herd_core::kinds::{Action, AgentState, CommandSpec, EventReason, ManagementState, NodeSpec};

/// The pid of the copy worker an agent journaled for `attempt` of `name`.
fn journaled_worker(agent_dir: &Path, name: &str, attempt: u32) -> Option<u64> {
    let text = std::fs::read_to_string(agent_dir.join(format!("journal/{name}-{attempt}.json"))).ok()?;
    serde_json::from_str::<serde_json::Value>(&text).ok()?["worker"]["pid"].as_u64()
}

/// The worker of Command `name`'s first attempt, once journaled: the
/// server hears Processing as the attempt starts, and the worker's pid is
/// journaled a moment later (CI's loaded run looked in between).
async fn worker_of(agent_dir: &Path, name: &str) -> u64 {
    eventually(Duration::from_secs(10), &format!("{name}'s worker journaled"), || async {
        journaled_worker(agent_dir, name, 1)
    })
    .await
}

fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit(") ").next().is_some_and(|rest| !rest.starts_with('Z')))
}

#[tokio::test(flavor = "multi_thread")]
async fn abandoning_a_copy_ends_its_worker_and_a_following_copy_runs_alone() {
    let TwoNodes { server, a_dir, b_dir, .. } = &two_nodes(&["--copy-mib-per-sec", "1"]).await;
    fill_volume(&a_dir.join("volumes/m1/data"), 5, 4, 8 << 20);
    let copy = Action::CopyVolume { member: "m1".into(), volume: "data".into(), from_node: "n1".into() };
    server.admin().create(&command("slow", "n2", copy.clone())).await.unwrap();
    eventually(Duration::from_secs(15), "the copy running in its worker", || async {
        let command = server.admin().get::<CommandSpec>("slow").await.ok()?;
        (command.status.state_by_management == ManagementState::Processing).then_some(())
    })
    .await;
    let worker = worker_of(b_dir, "slow").await;
    let staging = b_dir.join("volumes/.incoming/m1/data");
    eventually(Duration::from_secs(10), "bytes staged", || async { staging.exists().then_some(()) }).await;

    let out = server.cli(&["command", "abandon", "slow"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("ABANDONING"), "{out:?}");
    // Until the worker has ended, the volume stays held (seen by a dry run).
    let dry = herd_client::WriteOptions { dry_run: true };
    let early = command("early", "n2", copy.clone()).to_json_value();
    if let Err(error) = server.admin().create_value("commands", &early, dry).await {
        assert!(error.to_string().contains("held by command slow (CopyVolume, ABANDONING"), "{error}");
    }
    let abandoned = settled(server, "slow").await;
    assert_eq!(abandoned.status.state_by_management, ManagementState::Abandoned, "{:?}", abandoned.status);
    assert!(!alive(worker), "the worker {worker} was ended");
    let answer = abandoned.status.answer.unwrap().message;
    assert!(answer.contains("abandoned by the operator; its partial copy"), "{answer}");
    assert!(!staging.exists(), "the partial copy is removed");
    event_where(&server.admin(), "a CommandAbandoned event", |e| {
        e.spec.reason_is(EventReason::CommandAbandoned) && e.spec.involved_object.name == "slow"
    })
    .await;

    // The next copy of the volume runs alone and completes.
    let next = run(server, "next", "n2", copy).await;
    assert_eq!(next.status.state_by_management, ManagementState::Completed, "{:?}", next.status);
    let expected = herd_agent::volumes::manifest(&a_dir.join("volumes/m1/data")).unwrap();
    assert_eq!(herd_agent::volumes::manifest(&b_dir.join("volumes/m1/data")).unwrap(), expected);
    assert_eq!(next.status.state_by_agent, Some(AgentState::Completed));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_migration_whose_source_data_vanished_starts_its_member_on_no_empty_volume_and_says_so() {
    let TwoNodes { server, a_dir, b_dir, .. } = &two_nodes(&["--copy-mib-per-sec", "1"]).await;
    run(server, "start-m1", "n1", Action::StartMember { member: "m1".into(), run: member_run() }).await;
    let source = a_dir.join("volumes/m1/data");
    fill_volume(&source, 9, 4, 8 << 20);
    let migrate = Action::MigrateMember { member: "m1".into(), from_node: "n1".into(), run: member_run() };
    server.admin().create(&command("move", "n2", migrate)).await.unwrap();
    let staging = b_dir.join("volumes/.incoming/m1/data");
    eventually(Duration::from_secs(15), "the copy under way", || async { staging.exists().then_some(()) }).await;
    // The source's files go while they are copied: the copy cannot finish.
    std::fs::remove_dir_all(&source).unwrap();

    let failed = settled(server, "move").await;
    assert_eq!(failed.status.state_by_management, ManagementState::Failed, "{:?}", failed.status);
    let message = failed.status.answer.unwrap().message;
    // Its data is gone from n1 too: it is not started there on an empty
    // volume as if it were its data, and the answer says so.
    assert!(message.contains("starting it again there failed"), "{message}");
    assert!(message.contains("persistent volume data of member m1 was lost on this node"), "{message}");
    let n1 = eventually(Duration::from_secs(10), "n1 says it lost m1's volume", || async {
        let n1 = server.admin().get::<NodeSpec>("n1").await.ok()?;
        let m1 = n1.status.members.iter().find(|m| m.name == "m1")?.clone();
        (m1.lost_volumes == ["data"]).then_some(m1)
    })
    .await;
    assert!(!n1.running, "{n1:?}");
    assert!(n1.last_exit.as_deref().unwrap_or_default().contains("not started"), "{n1:?}");
    assert!(!source.exists(), "no empty volume was made in its place");
    let n2 = server.admin().get::<NodeSpec>("n2").await.unwrap();
    assert!(!n2.status.members.iter().any(|m| m.name == "m1" && m.running));
    let failure = event_where(&server.admin(), "a CommandFailed event", |e| {
        e.spec.reason_is(EventReason::CommandFailed) && e.spec.involved_object.name == "move"
    })
    .await;
    assert!(failure.spec.message.contains("was lost on this node"), "{failure:?}");
    assert!(!staging.exists(), "the partial copy that cannot be resumed is removed");
}

/// Reads the DiskPressure condition of a node: (status, message).
async fn disk_pressure(server: &common::TestServer, node: &str) -> Option<(String, String)> {
    let node = server.admin().get::<NodeSpec>(node).await.ok()?;
    let condition = node.status.condition("DiskPressure")?;
    Some((format!("{:?}", condition.status), condition.message.clone()))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_copy_onto_a_full_disk_fails_with_the_reason_and_the_agent_works_on_the_full_disk() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::TestServer::start(&dir.path().join("server"));
    common::cluster::quick_heartbeats(&server).await;
    let (a_dir, b_dir) = (dir.path().join("a"), dir.path().join("b"));
    // Unmounted last: after the agents, and after the reapers have ended
    // the members that run from it.
    let _disk = common::SmallDisk::mount(&b_dir, 24);
    let _reapers = (common::MemberReaper(a_dir.clone()), common::MemberReaper(b_dir.clone()));
    let _a = common::start_agent(&server.url, &a_dir, "n1");
    let mut b = common::start_agent_with(&server.url, &b_dir, "n2", &["--copy-mib-per-sec", "2"]);
    for name in ["n1", "n2"] {
        eventually(Duration::from_secs(15), "both nodes Ready", || async {
            server.admin().get::<NodeSpec>(name).await.ok().filter(|n| n.status.ready)
        })
        .await;
    }
    let (state, message) =
        eventually(Duration::from_secs(10), "n2 reports its disk", || async { disk_pressure(&server, "n2").await })
            .await;
    assert_eq!(state, "False", "{message}");

    // Too big to fit: refused before a byte is copied, with the figures.
    std::fs::create_dir_all(a_dir.join("volumes/m1/big")).unwrap();
    std::fs::write(a_dir.join("volumes/m1/big/blob"), vec![7u8; 40_000_000]).unwrap();
    let started = std::time::Instant::now();
    let big = Action::CopyVolume { member: "m1".into(), volume: "big".into(), from_node: "n1".into() };
    let failed = run(&server, "big", "n2", big).await;
    assert_eq!(failed.status.state_by_management, ManagementState::Failed, "{:?}", failed.status);
    let message = failed.status.answer.unwrap().message;
    assert!(message.starts_with("no space left on n2's data dir for volume m1/big: needs 40 MB, "), "{message}");
    assert!(started.elapsed() < Duration::from_secs(10), "it took {:?}", started.elapsed());

    // It fits when it starts, but the disk fills up under it: it fails
    // with the reason, and the partial copy goes.
    fill_volume(&a_dir.join("volumes/m1/data"), 3, 4, 6 << 20);
    let copy = Action::CopyVolume { member: "m1".into(), volume: "data".into(), from_node: "n1".into() };
    server.admin().create(&command("squeezed", "n2", copy)).await.unwrap();
    let staging = b_dir.join("volumes/.incoming/m1/data");
    eventually(Duration::from_secs(15), "the copy under way", || async { staging.exists().then_some(()) }).await;
    let filler = b_dir.join("filler");
    let _ = std::fs::write(&filler, vec![0u8; 24_000_000]);
    let squeezed = settled(&server, "squeezed").await;
    assert_eq!(squeezed.status.state_by_management, ManagementState::Failed, "{:?}", squeezed.status);
    let message = squeezed.status.answer.unwrap().message;
    assert!(message.starts_with("no space left on n2's data dir"), "{message}");
    assert!(!staging.exists(), "the partial copy is removed: {message}");
    assert!(a_dir.join("volumes/m1/data").is_dir(), "the source is intact");
    event_where(&server.admin(), "a CommandFailed event for the full disk", |e| {
        e.spec.reason_is(EventReason::CommandFailed) && e.spec.message.contains("no space left")
    })
    .await;

    // The agent restarts on the full disk, and says the disk is full.
    let _ = std::fs::write(b_dir.join("filler-2"), vec![0u8; 24_000_000]);
    b.kill9();
    let _b = common::start_agent_with(&server.url, &b_dir, "n2", &[]);
    let (_, message) = eventually(Duration::from_secs(20), "n2 reports DiskPressure", || async {
        disk_pressure(&server, "n2").await.filter(|(state, _)| state == "True")
    })
    .await;
    assert!(message.contains("free of 25 MB on the agent's data dir"), "{message}");
    let node = server.admin().get::<NodeSpec>("n2").await.unwrap();
    assert!(node.status.ready, "the agent runs on the full disk");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_partial_copy_nothing_owns_is_listed_and_a_delete_volume_removes_it() {
    let TwoNodes { server, a_dir, b_dir, .. } = &two_nodes(&["--copy-mib-per-sec", "1"]).await;
    fill_volume(&a_dir.join("volumes/m1/data"), 6, 4, 8 << 20);
    let copy = Action::CopyVolume { member: "m1".into(), volume: "data".into(), from_node: "n1".into() };
    server.admin().create(&command("kept", "n2", copy)).await.unwrap();
    let staging = b_dir.join("volumes/.incoming/m1/data");
    eventually(Duration::from_secs(15), "bytes staged", || async { staging.exists().then_some(()) }).await;
    // While the copy runs, its partial copy is the Command's.
    let out = server.cli(&["node", "volumes", "n2"]);
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(listing.contains("partial copy") && listing.contains("command kept (CopyVolume"), "{listing}");

    let out = server.cli(&["command", "abandon", "kept", "--keep-staging"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let abandoned = settled(server, "kept").await;
    assert!(abandoned.status.answer.unwrap().message.contains("kept for a later copy"), "kept as asked");
    assert!(staging.exists());
    let out = server.cli(&["node", "volumes", "n2"]);
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let row = listing.lines().find(|l| l.contains("partial copy")).unwrap_or_default().to_string();
    assert!(row.starts_with("m1") && row.ends_with("none"), "{listing}");
    assert!(listing.contains("type: DeleteVolume, member: m1, volume: data"), "{listing}");

    let delete = Action::DeleteVolume { member: "m1".into(), volume: "data".into() };
    let deleted = run(server, "delete-partial", "n2", delete).await;
    assert_eq!(deleted.status.state_by_management, ManagementState::Completed, "{:?}", deleted.status);
    let message = deleted.status.answer.unwrap().message;
    assert!(message.starts_with("deleted the partial copy of m1/data ("), "{message}");
    assert!(!staging.exists());
    let stored = server.admin().node_volumes("n2").await.unwrap();
    assert!(stored.is_empty(), "{stored:?}");
}

/// The agent restarts while its copy worker runs on (it re-attaches), and
/// then the copy is abandoned: the re-attached worker is ended and its
/// partial copy removed, as for one the agent started itself.
#[tokio::test(flavor = "multi_thread")]
async fn abandoning_a_copy_whose_worker_outlived_its_agent_ends_it_too() {
    let flags = ["--copy-mib-per-sec", "1"];
    let mut nodes = two_nodes(&flags).await;
    fill_volume(&nodes.a_dir.join("volumes/m1/data"), 8, 4, 8 << 20);
    let copy = Action::CopyVolume { member: "m1".into(), volume: "data".into(), from_node: "n1".into() };
    nodes.server.admin().create(&command("orphaned", "n2", copy)).await.unwrap();
    let staging = nodes.b_dir.join("volumes/.incoming/m1/data");
    eventually(Duration::from_secs(15), "bytes staged", || async { staging.exists().then_some(()) }).await;
    let worker = worker_of(&nodes.b_dir, "orphaned").await;
    nodes.agents.1.kill9();
    assert!(alive(worker), "the worker outlives its agent");
    nodes.agents.1 = common::start_agent_with(&nodes.server.url, &nodes.b_dir, "n2", &flags);
    let server = &nodes.server;
    eventually(Duration::from_secs(15), "the restarted agent re-attached", || async {
        let command = server.admin().get::<CommandSpec>("orphaned").await.ok()?;
        let node = server.admin().get::<NodeSpec>("n2").await.ok()?;
        (node.status.ready && command.status.state_by_agent == Some(AgentState::ProcessingInBackend)).then_some(())
    })
    .await;

    let out = server.cli(&["command", "abandon", "orphaned"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let abandoned = settled(server, "orphaned").await;
    assert_eq!(abandoned.status.state_by_management, ManagementState::Abandoned, "{:?}", abandoned.status);
    let message = abandoned.status.answer.unwrap().message;
    assert!(message.contains("abandoned by the operator; its partial copy"), "{message}");
    assert!(!alive(worker), "the re-attached worker {worker} was ended");
    assert!(!staging.exists(), "its partial copy is removed");
}
