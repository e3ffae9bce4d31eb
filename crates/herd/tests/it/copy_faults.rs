//! The fault test of the command journal: the copying agent is killed
//! (kill -9) at random moments during volume copies and member migrations
//! (one in three) of random sizes, sometimes together with its copy worker
//! (a host going down), and started again. Afterwards every Command has
//! settled in a state that matches reality, every copy is complete and
//! verified by checksum, every migrated member runs on the target only,
//! and nothing is left half-done.
//!
//! `HERD_FAULT_COPIES` sets the number of copies (default 30); the long
//! run in docs/BENCHMARKS.md used 300.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{MemberReaper, Proc, TestServer, eventually, start_agent};
use herd_core::HumanDuration;
use herd_core::Object;
use herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME;
use herd_core::kinds::{Action, ClusterConfigSpec, CommandSpec, ManagementState, NodeSpec};

/// A small deterministic generator: the run can be repeated from its seed.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn fill(dir: &Path, random: &mut Random) {
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    for i in 0..(1 + random.below(5)) {
        let size = random.below(3 << 20) as usize;
        let bytes: Vec<u8> = (0..size).map(|_| random.next() as u8).collect();
        let name = if i % 2 == 0 { dir.join(format!("f{i}")) } else { dir.join("sub").join(format!("f{i}")) };
        std::fs::write(name, bytes).unwrap();
    }
}

/// The pids of copy workers the journal in `agent_dir` records.
fn worker_pids(agent_dir: &Path) -> Vec<u64> {
    let Ok(entries) = std::fs::read_dir(agent_dir.join("journal")) else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .filter_map(|entry| entry.pointer("/worker/pid").and_then(serde_json::Value::as_u64))
        .collect()
}

fn kill_group(pid: u64) {
    let _ = std::process::Command::new("kill").args(["-s", "KILL", "--", &format!("-{pid}")]).status();
}

/// Kills copy workers on drop, as the members' reaper does for members.
struct WorkerReaper(PathBuf);

impl Drop for WorkerReaper {
    fn drop(&mut self) {
        worker_pids(&self.0).into_iter().for_each(kill_group);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn copies_survive_agent_kills_at_random_moments() {
    let copies: usize = std::env::var("HERD_FAULT_COPIES").ok().and_then(|v| v.parse().ok()).unwrap_or(30);
    let seed: u64 = std::env::var("HERD_FAULT_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(20261129);
    eprintln!("copy fault test: {copies} copies, seed {seed}");
    let mut random = Random(seed);
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    let admin = server.admin();
    let mut config = admin.get::<ClusterConfigSpec>(CLUSTER_CONFIG_NAME).await.unwrap();
    config.spec.heartbeat_period = HumanDuration(Duration::from_millis(300));
    config.spec.node_grace_period = HumanDuration(Duration::from_secs(3));
    config.spec.commands.reconcile_interval = HumanDuration(Duration::from_millis(500));
    config.spec.commands.answer_grace = HumanDuration(Duration::from_secs(2));
    admin.update(&config).await.unwrap();

    let (source_dir, target_dir) = (dir.path().join("source"), dir.path().join("target"));
    let _reapers =
        (MemberReaper(source_dir.clone()), MemberReaper(target_dir.clone()), WorkerReaper(target_dir.clone()));
    let _source = start_agent(&server.url, &source_dir, "source");
    let mut target: Proc = start_agent(&server.url, &target_dir, "target");
    for name in ["source", "target"] {
        eventually(Duration::from_secs(15), "both nodes Ready", || async {
            admin.get::<NodeSpec>(name).await.ok().filter(|n| n.status.ready)
        })
        .await;
    }
    // One in three moves a running member; its run has a persistent volume.
    let migrates = |i: usize| i % 3 == 2;
    let run = herd_core::kinds::command::MemberRun {
        command: vec!["sleep".into(), "600".into()],
        env: Default::default(),
        volumes: vec![herd_core::kinds::command::VolumeSpec { name: "data".into(), persistent: true }],
        readiness: None,
        drain: None,
        demote: None,
        position: None,
        ..Default::default()
    };
    for i in (0..copies).filter(|i| migrates(*i)) {
        let start = Action::StartMember { member: format!("m{i}"), run: run.clone() };
        admin
            .create(&Object::new(
                format!("start-{i}"),
                CommandSpec { node: "source".into(), timeout: None, action: start, origin: None },
            ))
            .await
            .unwrap();
    }
    eventually(Duration::from_secs(60), "the members to migrate run", || async {
        let commands = admin.list::<CommandSpec>("").await.ok()?;
        commands.iter().all(|c| c.status.state_by_management == ManagementState::Completed).then_some(())
    })
    .await;
    let mut expected = Vec::new();
    for i in 0..copies {
        let volume = source_dir.join(format!("volumes/m{i}/data"));
        fill(&volume, &mut random);
        expected.push(herd_agent::volumes::manifest(&volume).unwrap().checksum);
    }

    let started = Instant::now();
    let (mut agent_kills, mut host_kills) = (0, 0);
    for i in 0..copies {
        let (member, from_node) = (format!("m{i}"), "source".to_string());
        let action = if migrates(i) {
            Action::MigrateMember { member, from_node, run: run.clone() }
        } else {
            Action::CopyVolume { member, volume: "data".into(), from_node }
        };
        let spec = CommandSpec {
            node: "target".into(),
            timeout: Some(HumanDuration(Duration::from_secs(120))),
            action,
            origin: None,
        };
        admin.create(&Object::new(format!("copy-{i}"), spec)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(random.below(150))).await;
        // Kill the agent, and one time in three its workers too (the host went down).
        target.kill9();
        agent_kills += 1;
        if random.below(3) == 0 {
            worker_pids(&target_dir).into_iter().for_each(kill_group);
            host_kills += 1;
        }
        tokio::time::sleep(Duration::from_millis(random.below(200))).await;
        target = start_agent(&server.url, &target_dir, "target");
    }

    // Every Command settles; migrated members run on the target only.
    let deadline = Duration::from_secs(60 + 3 * copies as u64);
    let commands = eventually(deadline, "every copy settles", || async {
        let commands = admin.list::<CommandSpec>("").await.ok()?;
        commands.iter().all(|c| c.status.state_by_management.is_settled()).then_some(commands)
    })
    .await;
    let elapsed = started.elapsed();
    let moved = (0..copies).filter(|i| migrates(*i)).count();
    let placement = || async {
        let target = admin.get::<NodeSpec>("target").await.unwrap();
        let source = admin.get::<NodeSpec>("source").await.unwrap();
        let not_running: Vec<_> = target.status.members.iter().filter(|m| !m.running).map(|m| m.name.clone()).collect();
        let left: Vec<_> = source.status.members.iter().map(|m| m.name.clone()).collect();
        (target.status.members.len() - not_running.len(), not_running, left)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (running, not_running, left) = placement().await;
        if running == moved && left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "migrated members: {running} of {moved} run on the target; not running there: {not_running:?}; still on the source: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // No member runs twice (an agent killed between starting a member and
    // recording it must find that process again, not start another), and
    // none is left running on the source.
    let mut on_target: Vec<String> =
        common::member_processes(&target_dir).into_iter().map(|(_, member)| member).collect();
    on_target.sort();
    let distinct = on_target.iter().collect::<std::collections::BTreeSet<_>>().len();
    assert_eq!(distinct, moved, "members with a process on the target: {on_target:?}");
    assert_eq!(on_target.len(), moved, "a member runs more than once on the target: {on_target:?}");
    let on_source = common::member_processes(&source_dir);
    assert!(on_source.is_empty(), "processes of moved members still on the source: {on_source:?}");
    if std::env::var_os("HERD_FAULT_DEBUG").is_some() {
        for event in admin.list::<herd_core::kinds::EventSpec>("").await.unwrap() {
            eprintln!(
                "{} {} {} x{}: {}",
                event.spec.involved_object.name,
                event.spec.reason,
                event.spec.last_timestamp,
                event.spec.count,
                event.spec.message
            );
        }
    }

    // ... in a state that matches reality: a copy that says it is done is
    // there, whole, with the source's checksum.
    let mut reconciled = 0;
    for command in &commands {
        let status = &command.status;
        let name = &command.metadata.name;
        assert!(
            matches!(status.state_by_management, ManagementState::Completed | ManagementState::Reconciled),
            "{name} ended {:?}: {}; answer {:?}",
            status.state_by_management,
            status.reason,
            status.answer
        );
        assert!(status.answer.as_ref().is_some_and(|a| a.success), "{name}: {:?}", status.answer);
        reconciled += usize::from(status.state_by_management == ManagementState::Reconciled || status.attempts > 1);
        let member = command.spec.action.member();
        let Some(i) = member.strip_prefix('m').and_then(|i| i.parse::<usize>().ok()) else { continue };
        let copy = herd_agent::volumes::manifest(&target_dir.join(format!("volumes/{member}/data")))
            .unwrap_or_else(|e| panic!("{name}: the copy of {member} is missing: {e}"));
        assert_eq!(copy.checksum, expected[i], "{name}: the copy of {member} differs from its source");
        if migrates(i) {
            assert!(!source_dir.join(format!("volumes/{member}")).exists(), "{name}: the source still has {member}");
        }
    }
    // Nothing half-done is left: no staging copies or their locks, no
    // running workers, and the journal empties once everything is
    // acknowledged.
    let leftovers: Vec<_> = (0..copies)
        .flat_map(|i| ["data", "data.lock"].map(|name| target_dir.join(format!("volumes/.incoming/m{i}/{name}"))))
        .filter(|staging| staging.exists())
        .collect();
    assert!(leftovers.is_empty(), "staging copies left: {leftovers:?}");
    let journal = || -> Vec<String> {
        let entries =
            std::fs::read_dir(target_dir.join("journal")).map(|d| d.flatten().collect()).unwrap_or(Vec::new());
        entries.iter().map(|e| std::fs::read_to_string(e.path()).unwrap_or_default()).collect()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !journal().is_empty() {
        assert!(Instant::now() < deadline, "the journal did not empty: {:#?}", journal());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "copy fault test: {copies} copies, {agent_kills} agent kills ({host_kills} with their workers), {reconciled} reconciled or issued more than once, all settled {elapsed:?} after the first"
    );
}
