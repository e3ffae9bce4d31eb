//! Commands end to end: a real server and a real agent. The leader issues
//! each Command in its term, the agent journals and carries it out, and
//! its answer comes back with the heartbeats; bad Commands are refused
//! with the field or the Command named, and change nothing.

mod common;

use std::time::Duration;

use common::{MemberReaper, TestServer, eventually, start_agent};
use herd_core::HumanDuration;
use herd_core::api::{AgentReport, CommandReport};
use herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME;
use herd_core::kinds::command::{MemberRun, VolumeSpec};
use herd_core::kinds::{Action, AgentState, ClusterConfigSpec, Command, CommandSpec, ManagementState, NodeSpec};
use herd_core::{Object, Timestamp};

async fn quick_heartbeats(server: &TestServer) {
    let admin = server.admin();
    let mut config = admin.get::<ClusterConfigSpec>(CLUSTER_CONFIG_NAME).await.unwrap();
    config.spec.heartbeat_period = HumanDuration(Duration::from_millis(300));
    config.spec.node_grace_period = HumanDuration(Duration::from_secs(3));
    admin.update(&config).await.unwrap();
}

fn command(name: &str, node: &str, action: Action) -> Command {
    Object::new(name, CommandSpec { node: node.into(), timeout: Some(HumanDuration(Duration::from_secs(20))), action })
}

fn member_run() -> MemberRun {
    MemberRun {
        command: vec!["sh".into(), "-c".into(), "echo hello; exec sleep 300".into()],
        env: [("GREETING".to_string(), "hi".to_string())].into(),
        volumes: vec![VolumeSpec { name: "data".into(), persistent: true }],
    }
}

/// Waits until the Command is settled; returns it.
async fn settled(server: &TestServer, name: &str) -> Command {
    eventually(Duration::from_secs(20), &format!("command {name} settles"), || async {
        let command = server.admin().get::<CommandSpec>(name).await.ok()?;
        command.status.state_by_management.is_settled().then_some(command)
    })
    .await
}

async fn run(server: &TestServer, name: &str, node: &str, action: Action) -> Command {
    server.admin().create(&command(name, node, action)).await.unwrap();
    settled(server, name).await
}

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
    let instance = start.status.answer.unwrap().details["instanceId"].clone();
    let node = eventually(Duration::from_secs(10), "the member in the node's status", || async {
        let node = server.admin().get::<NodeSpec>("n1").await.ok()?;
        node.status.members.iter().any(|m| m.running).then_some(node)
    })
    .await;
    assert_eq!(node.status.members[0].instance_id.as_deref(), Some(instance.as_str()));

    let script = "echo \"$GREETING from $HERD_MEMBER\" | tee \"$HERD_VOLUME_DATA/greeting\"".to_string();
    let ran = run(&server, "script-ok", "n1", Action::RunScript { member: "m1".into(), script }).await;
    let answer = ran.status.answer.unwrap();
    assert!(answer.success, "{answer:?}");
    assert_eq!(answer.details["stdout"], "hi from m1\n");
    assert_eq!(std::fs::read_to_string(agent_dir.join("volumes/m1/data/greeting")).unwrap(), "hi from m1\n");

    let failed =
        run(&server, "script-fails", "n1", Action::RunScript { member: "m1".into(), script: "exit 3".into() }).await;
    assert_eq!(failed.status.state_by_management, ManagementState::Failed);
    assert_eq!(failed.status.answer.unwrap().details["exitCode"], "3");

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
    assert_eq!(missing.status.answer.unwrap().message, "volume m1/nothere does not exist on this node");
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
    let before = admin.get::<CommandSpec>("first").await.unwrap();
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
    let node = herd_client::Client::new(vec![server.url.clone()], Some(token));
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
