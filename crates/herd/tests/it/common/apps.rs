//! Helpers for app-cluster tests: a server with `n` Ready agents, members
//! listed and waited for, member processes killed.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use herd_core::kinds::app_cluster::ClusterState;
use herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME;
use herd_core::kinds::{AppClusterSpec, ClusterConfigSpec, Member, MemberSpec, MemberState, NodeSpec};

use super::cluster::quick_heartbeats;
use super::netns::NetNs;
use super::{MemberReaper, Proc, TestServer, eventually};

/// A server and `n` agents (n1.., data dirs `dirs[i]`), all Ready; their
/// members are killed on drop.
pub struct Nodes {
    pub server: TestServer,
    /// A second replica on the same store, for [`nodes_with_a_standby`]:
    /// it leads once the first is gone.
    pub standby: Option<TestServer>,
    pub dirs: Vec<PathBuf>,
    // Dropped in this order: the agents, then their members, then the
    // network namespace, then the files.
    pub agents: Vec<Proc>,
    _reapers: Vec<MemberReaper>,
    /// n1's network namespace, for [`nodes_with_n1_apart`].
    pub netns: Option<NetNs>,
    /// What every agent is started with besides the usual.
    agent_flags: Vec<String>,
    /// The server URLs every agent is given.
    agent_servers: String,
    pub dir: tempfile::TempDir,
}

/// How many servers of this test binary took a block of member ports.
static PORT_BLOCKS: AtomicU16 = AtomicU16::new(0);
/// The blocks lie in 10000-19999: apart from the default range
/// (20000-29999) that a server given no block hands out, and below the
/// kernel's ephemeral ports (32768 and up), which any test's connections
/// and listeners on port 0 may hold at any moment.
const FIRST_BLOCKED_PORT: u16 = 10000;
const PORTS_PER_BLOCK: u16 = 200;
const BLOCKS: u16 = 50;

/// Gives the server's members a block of ports of their own: the tests of
/// one binary run side by side on one host. Blocks are used again after
/// fifty servers, long after the test that had one has ended.
pub async fn own_member_ports(server: &TestServer) {
    let admin = server.admin();
    let mut config = admin.get::<ClusterConfigSpec>(CLUSTER_CONFIG_NAME).await.unwrap();
    let (first, last) = member_port_block();
    config.spec.app_clusters.first_member_port = first;
    config.spec.app_clusters.last_member_port = last;
    admin.update(&config).await.unwrap();
}

/// The next block of member ports (first, last), for a server of this test binary.
pub fn member_port_block() -> (u16, u16) {
    let block = PORT_BLOCKS.fetch_add(1, Ordering::SeqCst) % BLOCKS;
    let first = FIRST_BLOCKED_PORT + PORTS_PER_BLOCK * block;
    (first, first + PORTS_PER_BLOCK - 1)
}

/// Whether a second server replica runs, and where agents have it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Standby {
    None,
    /// After the leader in every agent's list of servers.
    Second,
    /// Before the leader: every agent asks it first.
    First,
}

pub async fn nodes(n: usize) -> Nodes {
    nodes_on(n, false, Standby::None, &[]).await
}

/// As [`nodes`], every agent started with `flags` too.
pub async fn nodes_with(n: usize, flags: &[&str]) -> Nodes {
    nodes_on(n, false, Standby::None, flags).await
}

/// As [`nodes`], with n1's agent (and so its members) in a network
/// namespace of its own, whose link to the server the test can cut.
pub async fn nodes_with_n1_apart(n: usize) -> Nodes {
    nodes_on(n, true, Standby::None, &[]).await
}

/// As [`nodes`], with a second server replica on the same SQLite store
/// (`standby`), which every agent knows too: the first leads, and the
/// second takes over once the first is gone.
pub async fn nodes_with_a_standby(n: usize) -> Nodes {
    nodes_on(n, false, Standby::Second, &[]).await
}

/// As [`nodes_with_a_standby`], every agent told of the standby first.
pub async fn nodes_told_of_the_standby_first(n: usize) -> Nodes {
    nodes_on(n, false, Standby::First, &[]).await
}

async fn nodes_on(n: usize, n1_apart: bool, standby: Standby, flags: &[&str]) -> Nodes {
    let dir = tempfile::tempdir().unwrap();
    let netns = n1_apart.then(|| NetNs::create(0));
    // Reached from the namespace at its outside address, from here on loopback.
    let listen = if n1_apart { "0.0.0.0:0" } else { "127.0.0.1:0" };
    let mut server = TestServer::start_at(&dir.path().join("server"), listen);
    server.url = server.url.replace("0.0.0.0", "127.0.0.1");
    quick_heartbeats(&server).await;
    own_member_ports(&server).await;
    let second = (standby != Standby::None).then(|| TestServer::start(&dir.path().join("server")));
    let agent_servers = match (&second, standby) {
        (Some(second), Standby::First) => format!("{},{}", second.url, server.url),
        (Some(second), _) => format!("{},{}", server.url, second.url),
        (None, _) => server.url.clone(),
    };
    let standby = second;
    let dirs: Vec<PathBuf> = (1..=n).map(|i| dir.path().join(format!("n{i}"))).collect();
    let reapers = dirs.iter().map(|d| MemberReaper(d.clone())).collect();
    let agent_flags: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
    let agents = dirs
        .iter()
        .enumerate()
        .map(|(i, d)| start_node_agent(&server, &agent_servers, netns.as_ref(), d, i, &agent_flags))
        .collect();
    for i in 1..=n {
        eventually(Duration::from_secs(15), "every node Ready", || async {
            server.admin().get::<NodeSpec>(&format!("n{i}")).await.ok().filter(|n| n.status.ready)
        })
        .await;
    }
    Nodes { server, standby, dirs, agents, _reapers: reapers, netns, agent_flags, agent_servers, dir }
}

/// Starts the agent of node `n<index + 1>`: with a namespace, n1's inside
/// it, listening (and so its members) at its address inside, and the
/// others at the namespace's address outside, which both sides reach (n1's
/// members can follow theirs). Every agent is given `flags` too.
fn start_node_agent(
    server: &TestServer,
    servers: &str,
    netns: Option<&NetNs>,
    dir: &std::path::Path,
    index: usize,
    flags: &[String],
) -> Proc {
    let name = format!("n{}", index + 1);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    match (netns, index) {
        (Some(ns), 0) => {
            let url = server.url.replace("127.0.0.1", &ns.outside);
            let mut command = ns.command(std::path::Path::new(env!("CARGO_BIN_EXE_herd")));
            let listen = format!("{}:0", ns.inside());
            command.args(["agent", "--server", &url, "--name", &name, "--listen", &listen]).arg("--data-dir").arg(dir);
            command.args(&flags).env("HERD_JOIN_TOKEN", super::JOIN_TOKEN);
            if let Some(hash) = &server.ca_hash {
                command.args(["--ca-hash", hash]);
            }
            Proc::spawn(command)
        }
        (Some(ns), _) => {
            let listen = format!("{}:0", ns.outside);
            super::start_agent_with(&server.url, dir, &name, &[&["--listen", &listen][..], &flags].concat())
        }
        (None, _) => super::start_agent_with(servers, dir, &name, &flags),
    }
}

impl Nodes {
    /// Starts node `n<index + 1>`'s agent again, where it ran before.
    pub fn restart_agent(&mut self, index: usize) {
        self.agents[index] = start_node_agent(
            &self.server,
            &self.agent_servers,
            self.netns.as_ref(),
            &self.dirs[index],
            index,
            &self.agent_flags,
        );
    }

    /// The address `member` is reached at from here: its node's.
    pub async fn host_of(&self, member: &Member) -> String {
        let node = self.server.admin().get::<NodeSpec>(member.spec.node.as_deref().unwrap()).await.unwrap();
        let address = node.status.address.unwrap();
        address.rsplit_once(':').unwrap().0.to_string()
    }

    /// The data dir of the node a member is bound to.
    pub fn dir_of(&self, member: &Member) -> &PathBuf {
        let node = member.spec.node.as_deref().unwrap();
        &self.dirs[node.trim_start_matches('n').parse::<usize>().unwrap() - 1]
    }
}

pub async fn list_members(server: &TestServer, cluster: &str) -> Vec<Member> {
    server.admin().list::<MemberSpec>(&format!("herd.io/cluster={cluster}")).await.unwrap()
}

/// Waits until `cluster` is configured with `count` members, all ready;
/// returns them. On time-out the panic shows the cluster and its members.
pub async fn configured(server: &TestServer, cluster: &str, count: usize, within: Duration) -> Vec<Member> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let object = server.admin().get::<AppClusterSpec>(cluster).await.ok();
        let members = list_members(server, cluster).await;
        let done = object.as_ref().is_some_and(|c| {
            c.status.state == ClusterState::Configured && c.status.observed_generation == Some(c.metadata.generation)
        }) && members.len() == count
            && members.iter().all(|m| m.status.state == MemberState::Configured && m.status.ready);
        if done {
            return members;
        }
        if tokio::time::Instant::now() > deadline {
            let statuses: Vec<String> =
                members.iter().map(|m| format!("{} on {:?}: {:?}", m.metadata.name, m.spec.node, m.status)).collect();
            panic!(
                "timed out after {within:?} waiting for cluster {cluster} configured with {count} ready members: \
                 {:?}\n{}",
                object.map(|c| c.status),
                statuses.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The instance a member was last configured as.
pub fn instance(member: &Member) -> String {
    member.status.state_detail.last_configured_instance.clone().unwrap()
}

pub fn kill9(pid: u32) {
    let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
}

/// Loses `member`'s host: its node's agent and the member's whole process
/// group die at once. Returns the node's index in `nodes.agents`.
pub async fn lose_host(nodes: &mut Nodes, member: &Member) -> usize {
    let node = nodes.dirs.iter().position(|d| d == nodes.dir_of(member)).unwrap();
    let pid = pid_of(&nodes.server, member).await;
    nodes.agents[node].kill9();
    let killed = std::process::Command::new("kill").args(["-KILL", "--", &format!("-{pid}")]).status().unwrap();
    assert!(killed.success(), "the member's group was there to kill");
    node
}

/// The pid the member's node reports for it.
pub async fn pid_of(server: &TestServer, member: &Member) -> u32 {
    let node = server.admin().get::<NodeSpec>(member.spec.node.as_deref().unwrap()).await.unwrap();
    node.status.members.iter().find(|r| r.name == member.metadata.name).and_then(|r| r.pid).unwrap()
}

/// An example under `examples/apps/`.
pub fn example(name: &str) -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/apps").join(name)
}

/// The tools the examples run; CI installs them (`.ci/run`), so a missing
/// one fails the test.
pub fn require(programs: &[&str]) {
    for program in programs {
        let found = std::process::Command::new("sh").args(["-c", &format!("command -v {program}")]).output().unwrap();
        assert!(
            found.status.success(),
            "{program} is missing: apt-get install -y etcd-server etcd-client redis-server"
        );
    }
}

/// Sets a node's `unschedulable` (cordon), reading it again when its
/// heartbeat wrote its status in between (a 409, as the server says to do).
pub async fn cordon(server: &TestServer, node: &str, unschedulable: bool) {
    let admin = server.admin();
    for _ in 0..20 {
        let mut object = admin.get::<NodeSpec>(node).await.unwrap();
        object.spec.unschedulable = unschedulable;
        match admin.update(&object).await {
            Ok(_) => return,
            Err(herd_client::ClientError::Api(status)) if status.code == 409 => continue,
            Err(error) => panic!("cordon {node}: {error}"),
        }
    }
    panic!("cordon {node}: still conflicting after 20 attempts");
}
