//! The full-disk fault test: the destination agent's data dir is a small
//! tmpfs, and the test fills it at random moments (and frees it again)
//! during copies and member migrations. Afterwards every Command has
//! settled: COMPLETED or RECONCILED with the source's checksum, or FAILED
//! saying that the disk was full; nothing is stuck, every migrated member
//! runs in exactly one place (the target when it moved, the source when
//! its move failed), no partial copy is left that nothing reported, and the
//! journal empties.
//!
//! `HERD_DISK_FAULT_COMMANDS` sets the number of Commands (default 20);
//! `HERD_DISK_FAULT_SEED` the seed.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::cluster::{fill_volume, quick_heartbeats};
use common::{MemberReaper, TestServer, eventually, start_agent};
use herd_core::kinds::command::{MemberRun, VolumeSpec};
use herd_core::kinds::{Action, CommandSpec, ManagementState, NodeSpec};
use herd_core::{HumanDuration, Object};

struct Random(u64);

impl Random {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }
}

/// Fills what is left of the disk at `dir` but `leave` bytes, in a file of
/// its own; writing stops quietly when the disk is full.
fn fill_disk(dir: &Path, name: &str, leave: u64) {
    use std::io::Write;
    let free = herd_agent::fsutil::disk_space(dir).map(|(free, _)| free).unwrap_or(0);
    let Ok(mut file) = std::fs::File::create(dir.join(name)) else { return };
    let chunk = vec![0u8; 1 << 20];
    let mut left = free.saturating_sub(leave);
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        if file.write_all(&chunk[..n]).is_err() {
            break;
        }
        left -= n as u64;
    }
}

fn fillers(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.to_string_lossy().contains("filler-")).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn copies_and_migrations_onto_a_disk_that_fills_at_random_moments_settle_truthfully() {
    let count: usize = std::env::var("HERD_DISK_FAULT_COMMANDS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let seed: u64 = std::env::var("HERD_DISK_FAULT_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(20261201);
    eprintln!("disk fault test: {count} commands, seed {seed}");
    let mut random = Random(seed);
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    quick_heartbeats(&server).await;
    let admin = server.admin();
    let (source_dir, target_dir) = (dir.path().join("source"), dir.path().join("target"));
    // Unmounted last: after the agents, and after the reapers have ended
    // the members that run from it.
    let _disk = common::SmallDisk::mount(&target_dir, 40);
    let _reapers = (MemberReaper(source_dir.clone()), MemberReaper(target_dir.clone()));
    let _source = start_agent(&server.url, &source_dir, "source");
    let _target = common::start_agent_with(&server.url, &target_dir, "target", &["--copy-mib-per-sec", "8"]);
    for name in ["source", "target"] {
        eventually(Duration::from_secs(15), "both nodes Ready", || async {
            admin.get::<NodeSpec>(name).await.ok().filter(|n| n.status.ready)
        })
        .await;
    }

    // One in three moves a running member with a persistent volume.
    let migrates = |i: usize| i % 3 == 1;
    let run = MemberRun {
        command: vec!["sleep".into(), "600".into()],
        env: Default::default(),
        volumes: vec![VolumeSpec { name: "data".into(), persistent: true }],
        readiness: None,
        drain: None,
        demote: None,
        position: None,
        ..Default::default()
    };
    let command = |name: String, node: &str, action| {
        let spec = CommandSpec {
            node: node.into(),
            timeout: Some(HumanDuration(Duration::from_secs(60))),
            action,
            origin: None,
        };
        Object::new(name, spec)
    };
    for i in (0..count).filter(|i| migrates(*i)) {
        let start = Action::StartMember { member: format!("m{i}"), run: run.clone() };
        admin.create(&command(format!("start-{i}"), "source", start)).await.unwrap();
    }
    let mut checksums = Vec::new();
    for i in 0..count {
        let volume = source_dir.join(format!("volumes/m{i}/data"));
        fill_volume(&volume, seed + i as u64, 1 + random.below(4) as usize, 3 << 20);
        checksums.push(herd_agent::volumes::manifest(&volume).unwrap().checksum);
    }
    eventually(Duration::from_secs(60), "the members to migrate run", || async {
        let commands = admin.list::<CommandSpec>("").await.ok()?;
        commands.iter().all(|c| c.status.state_by_management == ManagementState::Completed).then_some(())
    })
    .await;

    let mut fills = 0;
    for i in 0..count {
        let (member, from_node) = (format!("m{i}"), "source".to_string());
        let action = if migrates(i) {
            Action::MigrateMember { member, from_node, run: run.clone() }
        } else {
            Action::CopyVolume { member, volume: "data".into(), from_node }
        };
        admin.create(&command(format!("copy-{i}"), "target", action)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(random.below(300))).await;
        match random.below(3) {
            // The disk fills up, to the last few hundred KB or entirely.
            0 => {
                fill_disk(&target_dir, &format!("filler-{i}"), random.below(2) * random.below(400_000));
                fills += 1;
            }
            // Space comes back.
            1 => fillers(&target_dir).into_iter().for_each(|f| drop(std::fs::remove_file(f))),
            _ => {}
        }
    }
    fillers(&target_dir).into_iter().for_each(|f| drop(std::fs::remove_file(f)));

    // Everything settles, and says what happened.
    let commands = eventually(Duration::from_secs(120), "every command settles", || async {
        let commands = admin.list::<CommandSpec>("").await.ok()?;
        commands.iter().all(|c| c.status.state_by_management.is_settled()).then_some(commands)
    })
    .await;
    let (mut moved, mut stayed, mut failed) = (Vec::new(), Vec::new(), 0);
    for command in commands.iter().filter(|c| c.metadata.name.starts_with("copy-")) {
        let name = &command.metadata.name;
        let status = &command.status;
        let answer = status.answer.clone().unwrap_or_default();
        let member = command.spec.action.member().to_string();
        let i: usize = member[1..].parse().unwrap();
        match status.state_by_management {
            ManagementState::Completed | ManagementState::Reconciled => {
                assert!(answer.success, "{name}: {answer:?}");
                let copy = herd_agent::volumes::manifest(&target_dir.join(format!("volumes/{member}/data")))
                    .unwrap_or_else(|e| panic!("{name} says it is done, but the copy of {member} is missing: {e}"));
                assert_eq!(copy.checksum, checksums[i], "{name}: the copy of {member} differs from its source");
                if migrates(i) {
                    moved.push(member);
                }
            }
            ManagementState::Failed => {
                failed += 1;
                assert!(answer.message.to_lowercase().contains("no space left"), "{name} failed: {}", answer.message);
                if migrates(i) {
                    assert!(answer.message.contains("was started again on source"), "{name}: {}", answer.message);
                    stayed.push(member);
                }
            }
            other => panic!("{name} ended {other:?}: {}; answer {answer:?}", status.reason),
        }
    }

    // No member lost: each migrated one runs in exactly one place.
    let misplaced = || async {
        let (Ok(target), Ok(source)) = (admin.get::<NodeSpec>("target").await, admin.get::<NodeSpec>("source").await)
        else {
            return vec!["the nodes could not be read".to_string()];
        };
        let runs = |node: &herd_core::Object<NodeSpec>, m: &str| {
            node.status.members.iter().any(|x| x.name == m && x.wanted && x.running)
        };
        let wrong = |m: &String, on: &herd_core::Object<NodeSpec>, off: &herd_core::Object<NodeSpec>| {
            (!runs(on, m) || runs(off, m)).then(|| {
                format!(
                    "{m}: should run on {} only; runs on target {}, on source {}",
                    on.metadata.name,
                    runs(&target, m),
                    runs(&source, m)
                )
            })
        };
        let moved = moved.iter().filter_map(|m| wrong(m, &target, &source));
        moved.chain(stayed.iter().filter_map(|m| wrong(m, &source, &target))).collect::<Vec<_>>()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let wrong = misplaced().await;
        if wrong.is_empty() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "after 20s, as the nodes report them: {wrong:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut processes: Vec<String> = common::member_processes(&target_dir)
        .into_iter()
        .chain(common::member_processes(&source_dir))
        .map(|(_, member)| member)
        .collect();
    processes.sort();
    let mut expected: Vec<String> = moved.iter().chain(&stayed).cloned().collect();
    expected.sort();
    assert_eq!(processes, expected, "each migrated member runs once, somewhere");

    // No partial copy is left that its Command did not report as kept.
    let kept: Vec<String> = commands
        .iter()
        .filter(|c| c.status.answer.as_ref().is_some_and(|a| a.message.contains("kept for a retry")))
        .map(|c| c.spec.action.member().to_string())
        .collect();
    let stored = admin.node_volumes("target").await.unwrap();
    let unreported: Vec<_> =
        stored.iter().filter(|v| v.kind == herd_core::api::StoredKind::Staging && !kept.contains(&v.member)).collect();
    assert!(unreported.is_empty(), "partial copies nothing reported: {unreported:?}");
    let journal = || std::fs::read_dir(target_dir.join("journal")).map(|d| d.count()).unwrap_or(0);
    eventually(Duration::from_secs(20), "the journal empties", || async { (journal() == 0).then_some(()) }).await;
    eprintln!(
        "disk fault test: {count} commands, {fills} fills, {failed} failed for want of space, {} migrated, {} stayed on the source",
        moved.len(),
        stayed.len()
    );
}
