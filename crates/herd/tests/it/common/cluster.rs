//! Helpers for tests of Commands on real agents: a server with quick
//! heartbeats, two Ready nodes, Commands run to their end, volumes filled.

use std::time::Duration;

use herd_core::HumanDuration;
use herd_core::Object;
use herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME;
use herd_core::kinds::command::{MemberRun, VolumeSpec};
use herd_core::kinds::{Action, ClusterConfigSpec, Command, CommandSpec, NodeSpec};

use super::{MemberReaper, Proc, TestServer, eventually, start_agent, start_agent_with};

pub async fn quick_heartbeats(server: &TestServer) {
    let admin = server.admin();
    let mut config = admin.get::<ClusterConfigSpec>(CLUSTER_CONFIG_NAME).await.unwrap();
    config.spec.heartbeat_period = HumanDuration(Duration::from_millis(300));
    config.spec.node_grace_period = HumanDuration(Duration::from_secs(3));
    admin.update(&config).await.unwrap();
}

pub fn command(name: &str, node: &str, action: Action) -> Command {
    Object::new(
        name,
        CommandSpec { node: node.into(), timeout: Some(HumanDuration(Duration::from_secs(20))), action, origin: None },
    )
}

pub fn member_run() -> MemberRun {
    MemberRun {
        command: vec!["sh".into(), "-c".into(), "echo hello; exec sleep 300".into()],
        env: [("GREETING".to_string(), "hi".to_string())].into(),
        volumes: vec![VolumeSpec { name: "data".into(), persistent: true }],
        readiness: None,
        drain: None,
        demote: None,
        position: None,
        ..Default::default()
    }
}

/// Waits until the Command is settled; returns it.
pub async fn settled(server: &TestServer, name: &str) -> Command {
    eventually(Duration::from_secs(40), &format!("command {name} settles"), || async {
        let command = server.admin().get::<CommandSpec>(name).await.ok()?;
        command.status.state_by_management.is_settled().then_some(command)
    })
    .await
}

pub async fn run(server: &TestServer, name: &str, node: &str, action: Action) -> Command {
    server.admin().create(&command(name, node, action)).await.unwrap();
    settled(server, name).await
}

/// Fills `dir` with `files` files of pseudo-random content and sizes.
pub fn fill_volume(dir: &std::path::Path, seed: u64, files: usize, max_size: usize) {
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        state >> 33
    };
    for i in 0..files {
        let size = (next() as usize) % max_size;
        let bytes: Vec<u8> = (0..size).map(|_| next() as u8).collect();
        let path = if i % 2 == 0 { dir.join(format!("f{i}")) } else { dir.join("sub").join(format!("f{i}")) };
        std::fs::write(path, bytes).unwrap();
    }
}

/// A server and two agents, n1 (data dir `a`) and n2 (data dir `b`, with
/// `b_flags`), both Ready; members they start are killed on drop.
pub struct TwoNodes {
    pub server: TestServer,
    pub a_dir: std::path::PathBuf,
    pub b_dir: std::path::PathBuf,
    // Dropped in this order: the agents, then their members, then the files.
    pub agents: (Proc, Proc),
    _reapers: (MemberReaper, MemberReaper),
    _dir: tempfile::TempDir,
}

pub async fn two_nodes(b_flags: &[&str]) -> TwoNodes {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    quick_heartbeats(&server).await;
    let (a_dir, b_dir) = (dir.path().join("a"), dir.path().join("b"));
    let reapers = (MemberReaper(a_dir.clone()), MemberReaper(b_dir.clone()));
    let agents = (start_agent(&server.url, &a_dir, "n1"), start_agent_with(&server.url, &b_dir, "n2", b_flags));
    for name in ["n1", "n2"] {
        eventually(Duration::from_secs(15), "both nodes Ready", || async {
            server.admin().get::<NodeSpec>(name).await.ok().filter(|n| n.status.ready)
        })
        .await;
    }
    TwoNodes { _dir: dir, server, a_dir, b_dir, agents, _reapers: reapers }
}
