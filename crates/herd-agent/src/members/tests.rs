//! The members' tests: adoption, a reboot, a launch cut short, restarts and their backoff.

use super::*;
use herd_core::kinds::command::VolumeSpec;

fn run(script: &str, volumes: Vec<VolumeSpec>) -> MemberRun {
    MemberRun {
        command: vec!["sh".into(), "-c".into(), script.into()],
        env: BTreeMap::new(),
        volumes,
        readiness: None,
        drain: None,
        demote: None,
        position: None,
        ..Default::default()
    }
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..200 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn a_restarted_agent_adopts_running_members_and_a_reboot_starts_them_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let members = Members::open(dir.path(), MemberHost::bare("not in this test"), stop.clone()).await.unwrap();
    let volumes = vec![
        VolumeSpec { name: "data".into(), persistent: true },
        VolumeSpec { name: "scratch".into(), persistent: false },
    ];
    let script =
        "echo started >> \"$HERD_VOLUME_DATA/starts\"; touch \"$HERD_VOLUME_SCRATCH/x\"; echo out; exec sleep 60";
    let first = members.start("m1", run(script, volumes.clone())).await.unwrap();
    let starts = members.volume_dir("m1", "data").join("starts");
    let stdout = members.member_dir("m1").join("stdout.log");
    let log = || std::fs::read_to_string(&stdout).unwrap_or_default();
    eventually("the member ran its script", || log() == "out\n").await;
    assert_eq!(members.start("m1", run(script, volumes.clone())).await.unwrap(), first, "starting again is a no-op");

    // The agent stops (members keep running) and starts again: adopted.
    stop.cancel();
    let stop = CancellationToken::new();
    let members = Members::open(dir.path(), MemberHost::bare("not in this test"), stop.clone()).await.unwrap();
    let report = members.report();
    assert_eq!(report[0].instance_id.as_deref(), Some(first.as_str()));
    assert!(report[0].running);
    let pid = report[0].pid.unwrap();

    // A "host reboot": the agent and its members die; the member comes
    // back with a new instance id, its persistent volume kept and its
    // ephemeral one emptied.
    stop.cancel();
    procs::signal_group(pid, libc::SIGKILL).unwrap();
    eventually("the member died", || procs::start_ticks(pid).is_none()).await;
    let stop = CancellationToken::new();
    let members = Members::open(dir.path(), MemberHost::bare("not in this test"), stop.clone()).await.unwrap();
    let second = members.report()[0].instance_id.clone().unwrap();
    assert_ne!(second, first);
    eventually("both runs' output in one log", || log() == "out\nout\n").await;
    assert_eq!(std::fs::read_to_string(&starts).unwrap().lines().count(), 2);
    members.stop("m1").await.unwrap();
    assert!(!members.report()[0].running);
    assert!(members.volume_dir("m1", "data").join("starts").exists(), "stopping keeps volumes");
    stop.cancel();
}

#[tokio::test]
async fn a_member_started_just_before_the_agent_was_killed_is_found_not_started_twice() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let members = Members::open(dir.path(), MemberHost::bare("not in this test"), stop.clone()).await.unwrap();
    let volumes = vec![VolumeSpec { name: "data".into(), persistent: true }];
    let script = "echo started >> \"$HERD_VOLUME_DATA/starts\"; exec sleep 60";
    let first = members.start("m1", run(script, volumes)).await.unwrap();
    let starts = members.volume_dir("m1", "data").join("starts");
    let count = || std::fs::read_to_string(&starts).unwrap_or_default().lines().count();
    eventually("the first run started", || count() == 1).await;
    let first_pid = members.report()[0].pid.unwrap();
    stop.cancel();

    // The first run dies and the agent starts a second one, but is
    // killed after the spawn and before recording its pid: the record
    // holds only the new instance id, marked as being launched.
    procs::signal_group(first_pid, libc::SIGKILL).unwrap();
    eventually("the first run died", || procs::start_ticks(first_pid).is_none()).await;
    let mut record = members.record("m1").unwrap();
    let launching = Launching { instance_id: uuid::Uuid::now_v7().to_string(), started_at: crate::now() };
    record.launching = Some(launching.clone());
    write_atomic(&members.member_dir("m1").join("member.json"), &serde_json::to_vec(&record).unwrap(), 0o644).unwrap();
    let mut second = std::process::Command::new("sh")
        .args(["-c", script])
        .env("HERD_INSTANCE_ID", &launching.instance_id)
        .env("HERD_VOLUME_DATA", members.volume_dir("m1", "data"))
        .process_group(0)
        .spawn()
        .unwrap();
    eventually("the second run started", || count() == 2).await;

    let stop = CancellationToken::new();
    let members = Members::open(dir.path(), MemberHost::bare("not in this test"), stop.clone()).await.unwrap();
    let report = members.report()[0].clone();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let runs = count();
    let _ = second.kill();
    let _ = second.wait();
    stop.cancel();
    assert_eq!(report.instance_id.as_deref(), Some(launching.instance_id.as_str()), "{report:?}");
    assert_ne!(report.instance_id.as_deref(), Some(first.as_str()));
    assert_eq!(report.pid, Some(second.id()));
    assert!(report.running);
    assert_eq!(runs, 2, "no third run was started");
    assert_eq!(members.record("m1").unwrap().launching, None, "the record now holds the found run");
}

#[tokio::test]
async fn a_member_that_exits_is_started_again_with_a_new_instance_id() {
    let dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let members = Members::open(dir.path(), MemberHost::bare("not in this test"), stop.clone()).await.unwrap();
    let first = members.start("m1", run("sleep 0.2", vec![])).await.unwrap();
    eventually("a restart", || members.report()[0].restarts >= 1).await;
    let report = &members.report()[0];
    assert_ne!(report.instance_id.as_deref(), Some(first.as_str()));
    assert!(report.last_exit.as_deref().unwrap_or_default().contains("exit status: 0"), "{report:?}");
    members.stop("m1").await.unwrap();
    stop.cancel();
}

#[tokio::test]
async fn a_leader_not_renewed_by_its_deadline_is_demoted_then_ended_and_starts_again() {
    use herd_core::api::LeaseRenewal;
    use herd_core::kinds::command::DrainHook;
    use herd_core::time::HumanDuration;
    let dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let members = Members::open(dir.path(), MemberHost::bare("not in this test"), stop.clone()).await.unwrap();
    let volumes = vec![VolumeSpec { name: "herd".into(), persistent: true }];
    let mut spec = run("exec sleep 60", volumes);
    let demote = "echo \"demoted in $HERD_LEADER_TERM\" > \"$HERD_VOLUME_HERD/demoted\"";
    spec.demote = Some(DrainHook { script: demote.into(), timeout: HumanDuration::from_secs(5) });
    let first = members.start("m1", spec).await.unwrap();
    let renewal = |term| LeaseRenewal {
        member: "m1".into(),
        instance: first.clone(),
        term,
        renew_deadline: HumanDuration(Duration::from_millis(300)),
        lease_duration: HumanDuration(Duration::from_secs(1)),
        in_sync: Vec::new(),
    };
    let herd = members.volume_dir("m1", "herd");
    let term_file = || std::fs::read_to_string(herd.join("leader.json")).unwrap_or_default();

    members.leases_renewed(tokio::time::Instant::now(), &[renewal(4)]);
    assert_eq!(term_file(), r#"{"term":4,"leading":true,"inSync":[]}"#);
    let leader_term = || {
        let env = members.member_env(&members.record("m1").unwrap());
        env.into_iter().find(|(k, _)| k == "HERD_LEADER_TERM").map(|(_, v)| v)
    };
    assert_eq!(leader_term(), Some("4".into()), "a process started now has the term in its environment");
    members.fence_due().await;
    assert!(members.lead("m1").is_some() && members.is_running("m1"), "not due yet");
    // Renewed: the deadline moves on, and the term file names who herd
    // has on record as in sync.
    tokio::time::sleep(Duration::from_millis(200)).await;
    members.leases_renewed(tokio::time::Instant::now(), &[LeaseRenewal { in_sync: vec!["m2".into()], ..renewal(4) }]);
    assert_eq!(term_file(), r#"{"term":4,"leading":true,"inSync":["m2"]}"#);
    tokio::time::sleep(Duration::from_millis(200)).await;
    members.fence_due().await;
    assert!(members.lead("m1").is_some(), "renewed 200 ms ago, its deadline 300 ms after");

    tokio::time::sleep(Duration::from_millis(150)).await;
    members.fence_due().await;
    assert!(members.lead("m1").is_none(), "fenced");
    assert_eq!(leader_term(), None, "a leader no more");
    assert_eq!(std::fs::read_to_string(herd.join("demoted")).unwrap(), "demoted in 4\n");
    assert_eq!(term_file(), r#"{"term":4,"leading":false,"inSync":[]}"#, "a leader no more: no one on record");
    eventually("the member started again, a follower", || {
        members.report().first().is_some_and(|r| r.running && r.instance_id.as_deref() != Some(first.as_str()))
    })
    .await;
}

#[tokio::test]
async fn a_leaders_guard_ends_it_at_its_deadline_when_its_agent_does_not() {
    use herd_core::api::LeaseRenewal;
    use herd_core::time::HumanDuration;
    let dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let members = Members::open(dir.path(), MemberHost::bare("not in this test"), stop.clone()).await.unwrap();
    let volumes = vec![VolumeSpec { name: "herd".into(), persistent: true }];
    let first = members.start("m1", run("exec sleep 60", volumes)).await.unwrap();
    let pid = members.record("m1").unwrap().process.unwrap().pid;
    let renewal = LeaseRenewal {
        member: "m1".into(),
        instance: first.clone(),
        term: 1,
        renew_deadline: HumanDuration(Duration::from_millis(300)),
        lease_duration: HumanDuration(Duration::from_secs(1)),
        in_sync: Vec::new(),
    };
    let sent = tokio::time::Instant::now();
    members.leases_renewed(sent, std::slice::from_ref(&renewal));
    // The agent renews once more 200 ms on, then falls silent (it never
    // fences): the guard ends the leader (300 + 1000) / 2 ms after the
    // last renewal was sent, before the lease could be granted again.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let last = tokio::time::Instant::now();
    members.leases_renewed(last, &[renewal]);
    eventually("the guard ended the leader", || procs::start_ticks(pid).is_none()).await;
    let ended = last.elapsed();
    assert!(ended >= Duration::from_millis(600), "not before its deadline: {ended:?}");
    assert!(ended < Duration::from_millis(1000), "before the lease's end: {ended:?}");
    let guards = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c.windows(10).any(|w| w == b"herd-guard")))
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&members.member_dir("m1").display().to_string()))
        })
        .count();
    assert_eq!(guards, 0, "the guard went with its group");
}

/// Member m1, started leading in term 2 with `demote` as its demote hook
/// and a lease renewed now (`renew` and `lease` long); each run appends
/// to the lines [`LeaderRuns::starts`] reads whether its demote hook had
/// finished (`demoted`) when it started, or not (`leading`).
struct LeaderRuns {
    members: Members,
    starts: PathBuf,
    _stop: tokio_util::sync::DropGuard,
    _dir: tempfile::TempDir,
}

impl LeaderRuns {
    async fn start(demote: &str, renew: Duration, lease: Duration) -> LeaderRuns {
        use herd_core::api::LeaseRenewal;
        use herd_core::kinds::command::DrainHook;
        use herd_core::time::HumanDuration;
        let dir = tempfile::tempdir().unwrap();
        let stop = CancellationToken::new();
        let members = Members::open(dir.path(), MemberHost::bare("not in this test"), stop.clone()).await.unwrap();
        let volumes = vec![VolumeSpec { name: "herd".into(), persistent: true }];
        let script = "if [ -e \"$HERD_VOLUME_HERD/demoted\" ]; then echo demoted; else echo leading; fi \
            >> \"$HERD_VOLUME_HERD/starts\"; exec sleep 60";
        let mut spec = run(script, volumes);
        spec.demote = Some(DrainHook { script: demote.into(), timeout: HumanDuration::from_secs(5) });
        let instance = members.start("m1", spec).await.unwrap();
        let runs = LeaderRuns {
            starts: members.volume_dir("m1", "herd").join("starts"),
            members,
            _stop: stop.drop_guard(),
            _dir: dir,
        };
        eventually("the first run started", || runs.starts() == "leading\n").await;
        let renewal = LeaseRenewal {
            member: "m1".into(),
            instance,
            term: 2,
            renew_deadline: HumanDuration(renew),
            lease_duration: HumanDuration(lease),
            in_sync: Vec::new(),
        };
        runs.members.leases_renewed(tokio::time::Instant::now(), &[renewal]);
        runs
    }

    fn starts(&self) -> String {
        std::fs::read_to_string(&self.starts).unwrap_or_default()
    }

    async fn started_again(&self) -> String {
        eventually("the member started again", || self.starts().lines().count() == 2).await;
        self.starts()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leader_ended_while_its_fence_is_under_way_starts_again_only_once_demoted() {
    // Its guard's deadline (halfway to the lease's end) leaves the hook,
    // slower than the pause before a restart, its time.
    let demote = "sleep 1.2; touch \"$HERD_VOLUME_HERD/demoted\"";
    let runs = LeaderRuns::start(demote, Duration::from_millis(100), Duration::from_secs(4)).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    // The agent's fence loop takes the lapsed lease and runs the hook;
    // meanwhile the run ends (its guard, say) and waits to start again.
    let members = runs.members.clone();
    let fencing = tokio::spawn(async move { members.fence_due().await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    procs::signal_group(runs.members.report()[0].pid.unwrap(), libc::SIGKILL).unwrap();
    fencing.await.unwrap();
    assert_eq!(runs.started_again().await, "leading\ndemoted\n", "started again only once its demote hook had run");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leader_whose_lease_ran_out_while_its_agent_was_stopped_is_demoted_before_it_starts_again() {
    let demote = "touch \"$HERD_VOLUME_HERD/demoted\"";
    let runs = LeaderRuns::start(demote, Duration::from_millis(100), Duration::from_millis(200)).await;
    // Past the lease's end before the agent fences: no time is left to
    // demote it running, so it ends first, and is demoted then.
    tokio::time::sleep(Duration::from_millis(400)).await;
    runs.members.fence_due().await;
    assert_eq!(runs.started_again().await, "leading\ndemoted\n");
}

/// Makes `member`'s record file impossible to replace (as a full disk
/// does); its path, to be removed to free it.
fn block_record(members: &Members, member: &str) -> PathBuf {
    let record = members.member_dir(member).join("member.json");
    std::fs::remove_file(&record).unwrap();
    std::fs::create_dir_all(record.join("in-the-way")).unwrap();
    record
}

#[tokio::test]
async fn a_run_whose_record_cannot_be_written_leaves_the_record_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let members = Members::open(dir.path(), MemberHost::bare("not in this test"), stop).await.unwrap();
    let first = members.start("m1", run("exec sleep 60", Vec::new())).await.unwrap();
    let record = block_record(&members, "m1");
    let other =
        Running { instance_id: "other".into(), pid: 1, start_ticks: 1, started_at: crate::now(), oom_kills_before: 0 };
    assert!(members.record_run("m1", &other).is_err());
    let kept = members.record("m1").unwrap();
    assert_eq!(kept.process.map(|p| p.instance_id), Some(first), "still the run it had");
    assert_eq!(kept.restarts, 0);
    assert!(kept.last_exit.is_some_and(|e| e.starts_with("not started: ")));
    std::fs::remove_dir_all(&record).unwrap();
    members.stop("m1").await.unwrap();
}

#[tokio::test]
async fn a_member_whose_start_again_fails_is_tried_again_until_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let members = Members::open(dir.path(), MemberHost::bare("not in this test"), stop).await.unwrap();
    let first = members.start("m1", run("sleep 1", Vec::new())).await.unwrap();
    // Before it exits, its record can no longer be written.
    let record = block_record(&members, "m1");
    eventually("a start again that failed, said", || {
        members.record("m1").and_then(|r| r.last_exit).is_some_and(|e| e.starts_with("not started: "))
    })
    .await;
    let failed = members.record("m1").unwrap();
    assert!(failed.wanted && failed.next_start.is_some(), "{failed:?}");
    // Freed: the next try starts it.
    std::fs::remove_dir_all(&record).unwrap();
    eventually("started again once the disk was freed", || members.report()[0].running).await;
    let report = &members.report()[0];
    assert!(report.running && report.instance_id.as_deref() != Some(first.as_str()), "{report:?}");
    members.stop("m1").await.unwrap();
}
