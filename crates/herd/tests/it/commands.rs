//! Commands end to end: a real server and a real agent. The leader issues
//! each Command in its term, the agent journals and carries it out, and
//! its answer comes back with the heartbeats; bad Commands are refused
//! with the field or the Command named, and change nothing.

use crate::common;

use std::time::Duration;

use common::cluster::{TwoNodes, command, fill_volume, member_run, quick_heartbeats, run, settled, two_nodes};
use common::{MemberReaper, TestServer, eventually, start_agent};
use herd_core::Timestamp;
use herd_core::api::{AgentReport, CommandReport};
use herd_core::kinds::command::VolumeSpec;
use herd_core::kinds::{Action, AgentState, AnswerDetails, CommandSpec, EventReason, ManagementState, NodeSpec};

#[tokio::test(flavor = "multi_thread")]
async fn commands_run_on_their_node_and_their_answers_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    quick_heartbeats(&server).await;
    let agent_dir = dir.path().join("agent");
    let _members = MemberReaper(agent_dir.clone());
    let _agent = start_agent(&server.url, &agent_dir, "n1");
    eventually(Duration::from_secs(15), "n1 Ready", || async {
        server.admin().get::<NodeSpec>("n1").await.ok().filter(|n| n.status.ready)
    })
    .await;

    let start = run(&server, "start-m1", "n1", Action::StartMember { member: "m1".into(), run: member_run() }).await;
    assert_eq!(start.status.state_by_management, ManagementState::Completed, "{:?}", start.status);
    assert_eq!(start.status.state_by_agent, Some(AgentState::Completed));
    let issued = start.status.issued.clone().unwrap();
    assert_eq!((issued.attempt, issued.term), (1, 0), "issued once, in the first leader's term");
    let instance = start.status.answer.unwrap().details.instance_id().unwrap().to_string();
    let node = eventually(Duration::from_secs(10), "the member in the node's status", || async {
        let node = server.admin().get::<NodeSpec>("n1").await.ok()?;
        node.status.members.iter().any(|m| m.running).then_some(node)
    })
    .await;
    assert_eq!(node.status.members[0].instance_id.as_deref(), Some(instance.as_str()));
    eventually(Duration::from_secs(10), "the member's log through the server", || async {
        let out = server.cli(&["logs", "n1/m1"]);
        (out.status.success() && String::from_utf8_lossy(&out.stdout) == "hello\n").then_some(())
    })
    .await;
    let missing = server.cli(&["logs", "n1/nobody"]);
    assert!(String::from_utf8_lossy(&missing.stderr).contains("member nobody has no stdout log on n1"), "{missing:?}");

    let script = "echo \"$GREETING from $HERD_MEMBER\" | tee \"$HERD_VOLUME_DATA/greeting\"".to_string();
    let ran =
        run(&server, "script-ok", "n1", Action::RunScript { member: "m1".into(), script, expected_instance: None })
            .await;
    let answer = ran.status.answer.unwrap();
    assert!(answer.success, "{answer:?}");
    assert!(matches!(&answer.details, AnswerDetails::Script { stdout, .. } if stdout == "hi from m1\n"), "{answer:?}");
    assert_eq!(std::fs::read_to_string(agent_dir.join("volumes/m1/data/greeting")).unwrap(), "hi from m1\n");

    let failed = run(
        &server,
        "script-fails",
        "n1",
        Action::RunScript { member: "m1".into(), script: "exit 3".into(), expected_instance: None },
    )
    .await;
    assert_eq!(failed.status.state_by_management, ManagementState::Failed);
    let answer = failed.status.answer.unwrap();
    assert!(matches!(answer.details, AnswerDetails::Script { exit_code: 3, .. }), "{answer:?}");

    let delete = Action::DeleteVolume { member: "m1".into(), volume: "data".into() };
    let refused = run(&server, "delete-running", "n1", delete.clone()).await;
    assert_eq!(refused.status.state_by_management, ManagementState::Failed);
    assert!(refused.status.answer.unwrap().message.contains("is running"), "the volume of a running member stays");
    assert!(agent_dir.join("volumes/m1/data/greeting").exists());

    let stopped = run(&server, "stop-m1", "n1", Action::StopMember { member: "m1".into() }).await;
    assert_eq!(stopped.status.state_by_management, ManagementState::Completed);
    let missing = Action::DeleteVolume { member: "m1".into(), volume: "nothere".into() };
    let missing = run(&server, "delete-missing", "n1", missing).await;
    assert_eq!(missing.status.state_by_management, ManagementState::Failed);
    assert_eq!(
        missing.status.answer.unwrap().message,
        "volume m1/nothere does not exist on this node, nor a partial copy of it"
    );
    let deleted = run(&server, "delete-data", "n1", delete).await;
    assert_eq!(deleted.status.state_by_management, ManagementState::Completed, "{:?}", deleted.status);
    assert!(!agent_dir.join("volumes/m1/data").exists());

    // Every answer was acknowledged: the journal is empty.
    eventually(Duration::from_secs(10), "an empty journal", || async {
        (std::fs::read_dir(agent_dir.join("journal")).ok()?.count() == 0).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_commands_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    let admin = server.admin();

    // An unknown action, and names that would leave the data dir: 422 naming the field.
    let unknown = serde_json::json!({"apiVersion": "herd/v1", "kind": "Command", "metadata": {"name": "c1"},
        "spec": {"node": "n1", "action": {"type": "FormatDisk", "member": "m1"}}});
    let error = admin.create_value("commands", &unknown, Default::default()).await.unwrap_err();
    assert!(error.to_string().contains("spec.action.type"), "{error}");
    let escape = serde_json::json!({"apiVersion": "herd/v1", "kind": "Command", "metadata": {"name": "c2"},
        "spec": {"node": "n1", "action": {"type": "DeleteVolume", "member": "m1", "volume": "../../etc"}}});
    let error = admin.create_value("commands", &escape, Default::default()).await.unwrap_err();
    assert!(error.to_string().contains("spec.action.volume"), "{error}");
    assert!(admin.list::<CommandSpec>("").await.unwrap().is_empty(), "nothing was stored");

    // A member held by an unsettled Command (its node has no agent, so it
    // stays unsettled) refuses a conflicting one, naming the holder.
    admin.create(&command("first", "ghost", Action::StopMember { member: "m1".into() })).await.unwrap();
    let error = admin
        .create(&command("second", "ghost", Action::DeleteVolume { member: "m1".into(), volume: "data".into() }))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("held by command first"), "{error}");
    admin.create(&command("other-member", "ghost", Action::StopMember { member: "m2".into() })).await.unwrap();

    // A node answering another node's Command: the heartbeat is refused and
    // the Command is unchanged.
    let _agent = start_agent(&server.url, &dir.path().join("agent"), "intruder");
    let token = eventually(Duration::from_secs(15), "the agent's node token", || async {
        let text = std::fs::read_to_string(dir.path().join("agent/node-token.json")).ok()?;
        let value: serde_json::Value = serde_json::from_str(&text).ok()?;
        value["nodeToken"].as_str().map(str::to_string)
    })
    .await;
    // Issued first (by the leader's controller, which a loaded machine may
    // start after the agent joined), so that nothing else changes it below.
    let before = eventually(Duration::from_secs(30), "command first issued", || async {
        admin.get::<CommandSpec>("first").await.ok().filter(|c| c.status.issued.is_some())
    })
    .await;
    let forged = AgentReport {
        agent_boot_id: "forger".into(),
        commands: vec![CommandReport {
            name: "first".into(),
            uid: before.metadata.uid.clone().unwrap(),
            attempt: 1,
            state: AgentState::Completed,
            answer: None,
            updated: Timestamp::default(),
            progress: Default::default(),
        }],
        ..Default::default()
    };
    let node = server.client_for(vec![server.url.clone()], Some(token));
    let error = node.heartbeat("intruder", &forged).await.unwrap_err();
    assert!(error.to_string().contains("command first is for node ghost; node intruder may not answer it"), "{error}");
    let after = admin.get::<CommandSpec>("first").await.unwrap();
    assert_eq!(after.status, before.status, "the refused report changed nothing");
}

async fn running_instance(server: &TestServer, boot_id: Option<&str>) -> (String, u32, String) {
    eventually(Duration::from_secs(15), "a running member reported by the current agent", || async {
        let node = server.admin().get::<NodeSpec>("n1").await.ok()?;
        let boot = node.status.agent_boot_id.clone()?;
        if boot_id.is_some_and(|old| old == boot) {
            return None;
        }
        let member = node.status.members.iter().find(|m| m.running)?;
        Some((member.instance_id.clone()?, member.pid?, boot))
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_restart_keeps_members_and_a_host_reboot_restarts_them() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    quick_heartbeats(&server).await;
    let agent_dir = dir.path().join("agent");
    let _members = MemberReaper(agent_dir.clone());
    let mut agent = start_agent(&server.url, &agent_dir, "n1");
    run(&server, "start-m1", "n1", Action::StartMember { member: "m1".into(), run: member_run() }).await;
    let (first, pid, boot) = running_instance(&server, None).await;

    // kill -9 of the agent alone: the member keeps running and is adopted.
    agent.kill9();
    let mut agent = start_agent(&server.url, &agent_dir, "n1");
    let (adopted, same_pid, boot) = running_instance(&server, Some(&boot)).await;
    assert_eq!((adopted.as_str(), same_pid), (first.as_str(), pid), "the same instance, not restarted");

    // A host reboot: the agent and its members die; the member comes back
    // with a new instance id.
    agent.kill9();
    let status = std::process::Command::new("kill").args(["-s", "KILL", "--", &format!("-{pid}")]).status().unwrap();
    assert!(status.success());
    eventually(Duration::from_secs(5), "the member is dead", || async {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()).unwrap_or("Z");
        (state == "Z").then_some(())
    })
    .await;
    let _agent = start_agent(&server.url, &agent_dir, "n1");
    let (second, new_pid, _) = running_instance(&server, Some(&boot)).await;
    assert_ne!(second, first);
    assert_ne!(new_pid, pid);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_volume_is_copied_between_agents_and_verified() {
    let TwoNodes { server, a_dir, b_dir, .. } = &two_nodes(&[]).await;
    run(server, "start-m1", "n1", Action::StartMember { member: "m1".into(), run: member_run() }).await;
    let source = a_dir.join("volumes/m1/data");
    fill_volume(&source, 7, 12, 3 << 20);
    let copy = Action::CopyVolume { member: "m1".into(), volume: "data".into(), from_node: "n1".into() };
    let copied = run(server, "copy-data", "n2", copy).await;
    assert_eq!(copied.status.state_by_management, ManagementState::Completed, "{:?}", copied.status);
    let answer = copied.status.answer.unwrap();
    let expected = herd_agent::volumes::manifest(&source).unwrap();
    let got = herd_agent::volumes::manifest(&b_dir.join("volumes/m1/data")).unwrap();
    assert_eq!(got, expected, "the copy holds the same files");
    assert!(
        matches!(&answer.details, AnswerDetails::Copied { checksum, .. } if *checksum == expected.checksum),
        "{answer:?}"
    );
    assert!(!b_dir.join("volumes/.incoming/m1/data").exists(), "nothing left in staging");

    // A copy from a node without the volume fails and says why.
    let missing = Action::CopyVolume { member: "m1".into(), volume: "nothere".into(), from_node: "n1".into() };
    let failed = run(server, "copy-missing", "n2", missing).await;
    assert_eq!(failed.status.state_by_management, ManagementState::Failed);
    assert_eq!(failed.status.answer.unwrap().message, "volume m1/nothere does not exist on the source");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_operator_abandons_or_retries_a_stuck_command() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    let admin = server.admin();
    // Its node has no agent: issued, and stuck.
    admin.create(&command("stuck", "ghost", Action::StopMember { member: "m1".into() })).await.unwrap();
    eventually(Duration::from_secs(10), "the command issued", || async {
        admin.get::<CommandSpec>("stuck").await.ok()?.status.issued
    })
    .await;

    let out = server.cli(&["command", "abandon", "stuck"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stuck = admin.get::<CommandSpec>("stuck").await.unwrap();
    assert_eq!(stuck.status.state_by_management, ManagementState::Abandoned, "not taken up: ended at once");
    assert_eq!(stuck.status.reason, "abandoned by the operator");
    let events = admin.list::<herd_core::kinds::EventSpec>("").await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.spec.reason_is(EventReason::CommandAbandoned) && e.spec.involved_object.name == "stuck")
    );
    // What it held is free again.
    admin
        .create(&command("next", "ghost", Action::DeleteVolume { member: "m1".into(), volume: "data".into() }))
        .await
        .unwrap();

    let again = server.cli(&["command", "abandon", "stuck"]);
    assert_eq!(again.status.code(), Some(4), "a conflict");
    assert!(String::from_utf8_lossy(&again.stderr).contains("already settled"));

    admin.abandon_command("next", false).await.unwrap();
    let out = server.cli(&["command", "retry", "stuck"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let retried = eventually(Duration::from_secs(10), "issued again", || async {
        let command = admin.get::<CommandSpec>("stuck").await.ok()?;
        command.status.issued.as_ref().is_some_and(|i| i.attempt == 2).then_some(command)
    })
    .await;
    assert_eq!((retried.status.state_by_management, retried.status.retry_count), (ManagementState::Created, 1));
}

/// How the server disappears from the agent's view.
#[derive(Clone, Copy, Debug)]
enum CutOff {
    /// The server stops, and starts again on the same address.
    Stopped,
    /// The server is paused (SIGSTOP): connections are taken by the kernel
    /// but never answered, as when traffic is dropped; then it resumes.
    Unanswered,
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_cut_off_from_the_server_cancels_its_copy_and_reports_after_reconnecting() {
    cut_off_during_a_copy(CutOff::Stopped).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_whose_server_stops_answering_cancels_its_copy_and_reports_after_it_answers_again() {
    cut_off_during_a_copy(CutOff::Unanswered).await;
}

async fn cut_off_during_a_copy(how: CutOff) {
    let dir = tempfile::tempdir().unwrap();
    let server_dir = dir.path().join("server");
    let server = TestServer::start(&server_dir);
    quick_heartbeats(&server).await;
    let (a_dir, b_dir) = (dir.path().join("a"), dir.path().join("b"));
    let _reap = (MemberReaper(a_dir.clone()), MemberReaper(b_dir.clone()));
    let _a = common::start_agent_with(&server.url, &a_dir, "n1", &[]);
    let flags = ["--disconnect-grace", "1s", "--copy-mib-per-sec", "1"];
    let _b = common::start_agent_with(&server.url, &b_dir, "n2", &flags);
    for name in ["n1", "n2"] {
        eventually(Duration::from_secs(15), "both nodes Ready", || async {
            server.admin().get::<NodeSpec>(name).await.ok().filter(|n| n.status.ready)
        })
        .await;
    }
    let source = a_dir.join("volumes/m1/data");
    fill_volume(&source, 3, 4, 8 << 20);
    let copy = Action::CopyVolume { member: "m1".into(), volume: "data".into(), from_node: "n1".into() };
    server.admin().create(&command("copy", "n2", copy)).await.unwrap();
    eventually(Duration::from_secs(15), "the copy running in its worker", || async {
        let command = server.admin().get::<CommandSpec>("copy").await.ok()?;
        (command.status.state_by_agent == Some(AgentState::ProcessingInBackend)).then_some(())
    })
    .await;
    let journal_entry = || -> Option<serde_json::Value> {
        let text = std::fs::read_to_string(b_dir.join("journal/copy-1.json")).ok()?;
        serde_json::from_str(&text).ok()
    };
    let worker = journal_entry().unwrap()["worker"]["pid"].as_u64().unwrap();

    // The server goes away: after the grace period the hook cancels the copy.
    let listen = server.listen_addr();
    let pid = server.proc.child.id().to_string();
    let signal = |name: &str| {
        assert!(std::process::Command::new("kill").args(["-s", name, &pid]).status().unwrap().success());
    };
    let server = match how {
        CutOff::Stopped => {
            drop(server);
            None
        }
        CutOff::Unanswered => {
            signal("STOP");
            Some(server)
        }
    };
    let cut_at = std::time::Instant::now();
    let entry = eventually(Duration::from_secs(20), "the copy cancelled", || async {
        journal_entry().filter(|e| e["state"] == "INTERRUPTED")
    })
    .await;
    let cancelled_after = cut_at.elapsed();
    assert!(
        entry["answer"]["message"].as_str().unwrap().starts_with("cancelled (the server has been unreachable"),
        "{entry}"
    );
    assert!(
        std::fs::read_to_string(format!("/proc/{worker}/stat")).is_err() || {
            let stat = std::fs::read_to_string(format!("/proc/{worker}/stat")).unwrap_or_default();
            stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        },
        "the worker is gone"
    );
    // Unanswered requests take the agent's request timeout (5 s) to fail.
    assert!(cancelled_after < Duration::from_secs(20), "{how:?}: cancelled {cancelled_after:?} after the server went");

    // The server returns: the interruption is reported and reconciled, and
    // the copy is issued again and completes (resuming what it had).
    let server = match server {
        None => TestServer::start_at(&server_dir, &listen),
        Some(paused) => {
            signal("CONT");
            paused
        }
    };
    let copied = settled(&server, "copy").await;
    assert_eq!(copied.status.state_by_management, ManagementState::Completed, "{:?}", copied.status);
    assert!(copied.status.attempts >= 2, "issued again after the interruption: {:?}", copied.status);
    let expected = herd_agent::volumes::manifest(&source).unwrap();
    assert_eq!(herd_agent::volumes::manifest(&b_dir.join("volumes/m1/data")).unwrap(), expected);
}

#[tokio::test(flavor = "multi_thread")]
async fn commands_finish_or_are_reconciled_across_a_server_crash() {
    let dir = tempfile::tempdir().unwrap();
    let server_dir = dir.path().join("server");
    let mut server = TestServer::start(&server_dir);
    quick_heartbeats(&server).await;
    let (a_dir, b_dir) = (dir.path().join("a"), dir.path().join("b"));
    let _reap = (MemberReaper(a_dir.clone()), MemberReaper(b_dir.clone()));
    let _a = start_agent(&server.url, &a_dir, "n1");
    let _b = common::start_agent_with(&server.url, &b_dir, "n2", &["--copy-mib-per-sec", "8"]);
    for name in ["n1", "n2"] {
        eventually(Duration::from_secs(15), "both nodes Ready", || async {
            server.admin().get::<NodeSpec>(name).await.ok().filter(|n| n.status.ready)
        })
        .await;
    }
    for i in 0..4 {
        fill_volume(&a_dir.join(format!("volumes/m{i}/data")), i, 3, 4 << 20);
        let copy = Action::CopyVolume { member: format!("m{i}"), volume: "data".into(), from_node: "n1".into() };
        server.admin().create(&command(&format!("copy-{i}"), "n2", copy)).await.unwrap();
    }
    server
        .admin()
        .create(&command("start", "n1", Action::StartMember { member: "web".into(), run: member_run() }))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;

    // kill -9 of the server while the copies run; it comes back on the same address.
    let listen = server.listen_addr();
    server.proc.kill9();
    tokio::time::sleep(Duration::from_secs(1)).await;
    server = TestServer::start_at(&server_dir, &listen);

    for name in ["copy-0", "copy-1", "copy-2", "copy-3", "start"] {
        let command = settled(&server, name).await;
        let status = &command.status;
        assert!(
            matches!(status.state_by_management, ManagementState::Completed | ManagementState::Reconciled)
                && status.answer.as_ref().is_some_and(|a| a.success),
            "{name}: {status:?}"
        );
    }
    for i in 0..4 {
        let source = herd_agent::volumes::manifest(&a_dir.join(format!("volumes/m{i}/data"))).unwrap();
        let copy = herd_agent::volumes::manifest(&b_dir.join(format!("volumes/m{i}/data"))).unwrap();
        assert_eq!(copy.checksum, source.checksum, "m{i}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_member_migrates_with_its_volumes_and_the_source_copy_goes_only_after() {
    let TwoNodes { server, a_dir, b_dir, .. } = &two_nodes(&[]).await;
    let mut run_spec = member_run();
    // Two persistent volumes (each its own copy worker) and one that is not.
    run_spec.volumes.push(VolumeSpec { name: "scratch".into(), persistent: false });
    run_spec.volumes.push(VolumeSpec { name: "logs".into(), persistent: true });
    run(server, "start-m1", "n1", Action::StartMember { member: "m1".into(), run: run_spec.clone() }).await;
    fill_volume(&a_dir.join("volumes/m1/data"), 11, 6, 2 << 20);
    fill_volume(&a_dir.join("volumes/m1/logs"), 12, 3, 1 << 20);
    std::fs::write(a_dir.join("volumes/m1/logs/empty.err"), b"").unwrap();
    let expected = herd_agent::volumes::manifest(&a_dir.join("volumes/m1/data")).unwrap();
    let expected_logs = herd_agent::volumes::manifest(&a_dir.join("volumes/m1/logs")).unwrap();

    let migrate = Action::MigrateMember { member: "m1".into(), from_node: "n1".into(), run: run_spec };
    let moved = run(server, "move-m1", "n2", migrate).await;
    assert_eq!(moved.status.state_by_management, ManagementState::Completed, "{:?}", moved.status);
    let instance = moved.status.answer.unwrap().details.instance_id().unwrap().to_string();
    assert_eq!(herd_agent::volumes::manifest(&b_dir.join("volumes/m1/data")).unwrap(), expected);
    assert_eq!(herd_agent::volumes::manifest(&b_dir.join("volumes/m1/logs")).unwrap(), expected_logs);
    assert!(!a_dir.join("volumes/m1").exists(), "the source copy is gone");
    eventually(Duration::from_secs(10), "m1 runs on n2 only", || async {
        let n1 = server.admin().get::<NodeSpec>("n1").await.ok()?;
        let n2 = server.admin().get::<NodeSpec>("n2").await.ok()?;
        let here = n2.status.members.iter().find(|m| m.name == "m1" && m.running)?;
        (here.instance_id.as_deref() == Some(instance.as_str()) && n1.status.members.is_empty()).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn of_commands_created_at_once_on_one_member_exactly_one_is_admitted() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    let creations = (0..12).map(|i| {
        let admin = server.admin();
        tokio::spawn(async move {
            let action = Action::DeleteVolume { member: "m1".into(), volume: "data".into() };
            admin.create(&command(&format!("race-{i}"), "ghost", action)).await
        })
    });
    let mut admitted = 0;
    for outcome in futures_util::future::join_all(creations).await {
        match outcome.unwrap() {
            Ok(_) => admitted += 1,
            Err(error) => assert!(error.to_string().contains("is held by command race-"), "{error}"),
        }
    }
    assert_eq!(admitted, 1, "one Command holds the volume; the others were refused");
    assert_eq!(server.admin().list::<CommandSpec>("").await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn commands_for_different_members_created_at_once_are_all_admitted() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    let creations = (0..40).map(|i| {
        let admin = server.admin();
        tokio::spawn(async move {
            let action = Action::DeleteVolume { member: format!("m{i}"), volume: "data".into() };
            admin.create(&command(&format!("each-{i}"), "ghost", action)).await
        })
    });
    for outcome in futures_util::future::join_all(creations).await {
        outcome.unwrap().expect("a Command on a member of its own is admitted");
    }
    assert_eq!(server.admin().list::<CommandSpec>("").await.unwrap().len(), 40);
}

/// A store from before the per-member hold lists: its one guard key is
/// replaced at startup by lists naming the unsettled Commands.
#[tokio::test(flavor = "multi_thread")]
async fn an_unsettled_command_from_a_store_with_the_old_single_guard_still_holds_its_member() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("server");
    let server = TestServer::start(&data_dir);
    let action = || Action::DeleteVolume { member: "m1".into(), volume: "data".into() };
    server.admin().create(&command("first", "ghost", action())).await.unwrap();
    drop(server);
    {
        let store = herd_store::Store::open(&data_dir.join("herd.db").display().to_string()).await.unwrap();
        let old = herd_store::Txn::new().delete("/guards/command-holds/m1").put("/guards/command-holds", Vec::new());
        store.txn(old).await.unwrap();
    }
    let server = TestServer::start(&data_dir);
    let second = server.admin().create(&command("second", "ghost", action())).await;
    let error = second.expect_err("m1 is held by the first Command");
    assert!(error.to_string().contains("is held by command first"), "{error}");
}

/// A copy in progress says how far it got (bytes staged of the volume's
/// size, reported by the agent with each heartbeat), and `herd command
/// wait` follows it to its end.
#[tokio::test(flavor = "multi_thread")]
async fn a_copy_reports_its_progress_and_command_wait_follows_it() {
    let TwoNodes { server, a_dir, .. } = &two_nodes(&["--copy-mib-per-sec", "1"]).await;
    run(server, "start-m1", "n1", Action::StartMember { member: "m1".into(), run: member_run() }).await;
    let source = a_dir.join("volumes/m1/data");
    fill_volume(&source, 3, 4, 1 << 20);
    let size = herd_agent::volumes::manifest(&source).unwrap().size;
    let copy = Action::CopyVolume { member: "m1".into(), volume: "data".into(), from_node: "n1".into() };
    let mut spec = command("copy-slow", "n2", copy);
    spec.spec.timeout = Some(herd_core::HumanDuration(Duration::from_secs(120)));
    server.admin().create(&spec).await.unwrap();

    let (bytes, total) = eventually(Duration::from_secs(30), "a copy's progress part way", || async {
        let copying = server.admin().get::<CommandSpec>("copy-slow").await.ok()?;
        let progress = &copying.status.progress;
        let number = |key: &str| progress.get(key)?.parse::<u64>().ok();
        assert!(progress.is_empty() || progress["volume"] == "m1/data", "{progress:?}");
        let (bytes, total) = (number("bytes")?, number("totalBytes")?);
        (bytes > 0 && bytes < total).then_some((bytes, total))
    })
    .await;
    assert_eq!(total, size, "the volume's size, staged {bytes}");

    let out = server.cli(&["command", "wait", "copy-slow", "--timeout", "2m"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("command/copy-slow completed: CopyVolume on n2"),
        "{out:?}"
    );
    let done = server.admin().get::<CommandSpec>("copy-slow").await.unwrap();
    assert!(done.status.progress.is_empty(), "no progress once over: {:?}", done.status.progress);

    let out = server.cli(&["command", "wait", "nope"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
}
