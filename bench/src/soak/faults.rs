//! The soak's faults, done to real processes: a member's process or an
//! agent killed or paused, a host rebooted (its agent and members killed,
//! the agent started again), the server killed or paused, and the
//! voluntary ones asked of herd (a drain, an eviction, a rolling restart,
//! an upgrade). Each is undone after its length; one host (or the
//! server) has one fault at a time.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};
use herd_bench::schedule::{Fault, FaultKind};
use herd_client::Client;
use herd_core::api::NodeRoleRequest;
use herd_core::kinds::{Member, MemberSpec, NodeRole, NodeSpec, Operation, OperationAction, OperationSpec};

use crate::processes::{self, ADMIN};

/// The kinds this soak does (the others need network namespaces, a
/// filesystem of their own, a skewed clock or a leader role).
pub const SUPPORTED: [FaultKind; 11] = [
    FaultKind::KillMember,
    FaultKind::PauseMember,
    FaultKind::KillAgent,
    FaultKind::PauseAgent,
    FaultKind::RebootHost,
    FaultKind::KillServer,
    FaultKind::PauseServer,
    FaultKind::Drain,
    FaultKind::Evict,
    FaultKind::RollingRestart,
    FaultKind::Upgrade,
];

/// What the cluster is whole again after, besides every member configured
/// and ready and every node Ready.
#[derive(Clone, Debug)]
pub enum Awaited {
    Whole,
    /// The member runs another instance than the one the fault killed.
    NewInstance {
        member: String,
        instance: String,
    },
    /// The Operation the fault started has ended.
    Operation(String),
}

/// The processes the soak runs, to be faulted.
pub struct Cluster {
    pub herd: PathBuf,
    pub dir: PathBuf,
    pub server: Mutex<(Child, String)>,
    /// The server's address, to start it again on.
    pub listen: String,
    pub nodes: Vec<String>,
    pub agents: Mutex<Vec<Child>>,
    /// Hosts (by index, and `nodes.len()` for the server) with a fault on now.
    busy: Mutex<BTreeSet<usize>>,
    pub cluster: String,
}

impl Cluster {
    pub fn new(
        herd: PathBuf,
        dir: PathBuf,
        server: (Child, String),
        listen: String,
        nodes: Vec<String>,
        agents: Vec<Child>,
        cluster: &str,
    ) -> Arc<Self> {
        Arc::new(Cluster {
            herd,
            dir,
            server: Mutex::new(server),
            listen,
            nodes,
            agents: Mutex::new(agents),
            busy: Mutex::default(),
            cluster: cluster.to_string(),
        })
    }

    pub fn url(&self) -> String {
        self.server.lock().unwrap_or_else(|p| p.into_inner()).1.clone()
    }

    pub fn admin(&self) -> Client {
        Client::new(vec![self.url()], Some(ADMIN.into()))
    }

    fn take(&self, host: usize) -> bool {
        self.busy.lock().unwrap_or_else(|p| p.into_inner()).insert(host)
    }

    fn give_back(&self, host: usize) {
        self.busy.lock().unwrap_or_else(|p| p.into_inner()).remove(&host);
    }

    pub fn start_agent(&self, index: usize) -> anyhow::Result<Child> {
        let data = self.dir.join(&self.nodes[index]);
        let args = ["--server", &self.url(), "agent", "--name", &self.nodes[index]];
        Ok(processes::start(&self.herd, &args, &data)?.0)
    }

    fn signal_agent(&self, index: usize, signal: &str) {
        let pid = self.agents.lock().unwrap_or_else(|p| p.into_inner())[index].id();
        signal_pid(pid, signal);
    }

    async fn members(&self) -> anyhow::Result<Vec<Member>> {
        Ok(self.admin().list::<MemberSpec>(&format!("herd.io/cluster={}", self.cluster)).await?)
    }

    /// The pid the member's node reports for it, the node's index, the
    /// member and the instance it runs.
    async fn member_process(&self, target: u32) -> anyhow::Result<Option<(u32, usize, String, String)>> {
        let mut members = self.members().await?;
        members.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let Some(member) = members.get(target as usize % members.len().max(1)) else { return Ok(None) };
        let Some(node) = member.spec.node.clone() else { return Ok(None) };
        let reported = self.admin().get::<NodeSpec>(&node).await?;
        let report = reported.status.members.iter().find(|r| r.name == member.metadata.name);
        let index = self.nodes.iter().position(|n| *n == node).context("a node of the soak")?;
        Ok(report.and_then(|r| Some((r.pid?, index, member.metadata.name.clone(), r.instance_id.clone()?))))
    }

    /// Does `fault`, waits its length, undoes it; what the cluster is whole
    /// again after. Ok(None): not done (its host has a fault on, or it has
    /// nothing to act on now).
    pub async fn run(&self, fault: &Fault) -> anyhow::Result<Option<Awaited>> {
        let hosts = self.nodes.len();
        let host = match fault.kind {
            FaultKind::KillServer | FaultKind::PauseServer => hosts,
            FaultKind::KillMember | FaultKind::PauseMember => match self.member_process(fault.target).await? {
                Some((_, index, ..)) => index,
                None => return Ok(None),
            },
            _ if fault.kind.voluntary() => hosts + 1,
            _ => fault.target as usize % hosts,
        };
        if !self.take(host) {
            return Ok(None);
        }
        let done = self.carry_out(fault, host).await;
        self.give_back(host);
        done
    }

    async fn carry_out(&self, fault: &Fault, host: usize) -> anyhow::Result<Option<Awaited>> {
        let length = fault.length;
        match fault.kind {
            FaultKind::KillMember => {
                let Some((pid, _, member, instance)) = self.member_process(fault.target).await? else {
                    return Ok(None);
                };
                signal_pid(pid, "KILL");
                return Ok(Some(Awaited::NewInstance { member, instance }));
            }
            FaultKind::PauseMember => {
                let Some((pid, ..)) = self.member_process(fault.target).await? else { return Ok(None) };
                signal_pid(pid, "STOP");
                tokio::time::sleep(length).await;
                signal_pid(pid, "CONT");
            }
            FaultKind::KillAgent => {
                self.signal_agent(host, "KILL");
                tokio::time::sleep(length).await;
                self.restart_agent(host)?;
            }
            FaultKind::PauseAgent => {
                self.signal_agent(host, "STOP");
                tokio::time::sleep(length).await;
                self.signal_agent(host, "CONT");
            }
            FaultKind::RebootHost => {
                self.signal_agent(host, "KILL");
                // Every member process the host ran goes with it.
                for pid in member_processes_of(&self.dir.join(&self.nodes[host])) {
                    signal_pid(pid, "KILL");
                }
                tokio::time::sleep(length).await;
                self.restart_agent(host)?;
            }
            FaultKind::KillServer => {
                let pid = self.server.lock().unwrap_or_else(|p| p.into_inner()).0.id();
                signal_pid(pid, "KILL");
                tokio::time::sleep(length).await;
                self.restart_server()?;
            }
            FaultKind::PauseServer => {
                let pid = self.server.lock().unwrap_or_else(|p| p.into_inner()).0.id();
                signal_pid(pid, "STOP");
                tokio::time::sleep(length).await;
                signal_pid(pid, "CONT");
            }
            FaultKind::Drain => {
                let node = &self.nodes[fault.target as usize % self.nodes.len()];
                let action = OperationAction::Drain { node: node.clone() };
                let name = format!("soak-{}-drain", fault.number);
                self.operation(&name, action).await?;
                tokio::time::sleep(length).await;
                // Undrained as `herd node undrain` does: the drain cancelled
                // (one member per node: its members may have nowhere to go),
                // then the node regular.
                // (The server may be down meanwhile, with a fault of its
                // own: the undo is asked again, for two minutes at most.)
                let started = std::time::Instant::now();
                while let Err(error) = self.undrain(&name, node).await {
                    if started.elapsed() > std::time::Duration::from_secs(120) {
                        return Err(error.into());
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
                return Ok(Some(Awaited::Operation(name)));
            }
            FaultKind::Evict => {
                let mut members = self.members().await?;
                members.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
                let Some(member) = members.get(fault.target as usize % members.len().max(1)) else { return Ok(None) };
                // A refusal by the budget is an answer, not a failure.
                let _ = self.admin().evict_member(&member.metadata.name, false).await;
            }
            FaultKind::RollingRestart => {
                let action =
                    OperationAction::Restart { cluster: self.cluster.clone(), role: "member".into(), canary: 1 };
                let name = format!("soak-{}-restart", fault.number);
                return Ok(self.operation(&name, action).await?.then_some(Awaited::Operation(name)));
            }
            FaultKind::Upgrade => {
                let patch = serde_json::json!({"spec": {"description": format!("soak fault {}", fault.number)}});
                let written = self.admin().patch_value("apps", "etcd", &patch).await?;
                let to = written["metadata"]["generation"].as_i64().context("the App's generation")?;
                let action = OperationAction::Upgrade {
                    cluster: self.cluster.clone(),
                    to_revision: to,
                    canary: 1,
                    min_healthy_time: herd_core::HumanDuration::from_secs(2),
                    healthy_deadline: herd_core::HumanDuration::from_secs(120),
                    auto_revert: true,
                };
                let name = format!("soak-{}-upgrade", fault.number);
                return Ok(self.operation(&name, action).await?.then_some(Awaited::Operation(name)));
            }
            other => bail!("{other:?} is not done by this soak yet"),
        }
        Ok(Some(Awaited::Whole))
    }

    /// Creates an Operation; whether it was (one refused because another
    /// of its kind runs is left: the soak goes on).
    async fn operation(&self, name: &str, action: OperationAction) -> anyhow::Result<bool> {
        let spec = OperationSpec { action, max_parallel: 1, ..Default::default() };
        match self.admin().create(&Operation::new(name, spec)).await {
            Ok(_) => Ok(true),
            Err(error) if error.reason() == Some(herd_core::api::StatusReason::Conflict) => Ok(false),
            Err(error) => Err(error.into()),
        }
    }

    /// Drain `name` cancelled and `node` regular again.
    async fn undrain(&self, name: &str, node: &str) -> Result<(), herd_client::ClientError> {
        let cancel = serde_json::json!({"spec": {"cancel": true}});
        match self.admin().patch_value("operations", name, &cancel).await {
            Err(error) if error.reason() != Some(herd_core::api::StatusReason::NotFound) => return Err(error),
            _ => {}
        }
        let request = NodeRoleRequest { role: Some(NodeRole::Regular), master_capable: None, auto_promote: false };
        self.admin().change_node_role(node, &request).await.map(drop)
    }

    fn restart_agent(&self, index: usize) -> anyhow::Result<()> {
        let child = self.start_agent(index)?;
        let mut agents = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        let mut old = std::mem::replace(&mut agents[index], child);
        let _ = old.kill();
        let _ = old.wait();
        Ok(())
    }

    fn restart_server(&self) -> anyhow::Result<()> {
        let args = ["server", "--listen", &self.listen, "--insecure-http"];
        let (child, url) = processes::start(&self.herd, &args, &self.dir.join("server"))?;
        let mut server = self.server.lock().unwrap_or_else(|p| p.into_inner());
        let _ = server.0.kill();
        let _ = server.0.wait();
        *server = (child, url);
        Ok(())
    }

    /// Every paused process let go and every agent running: the end of a run.
    pub fn heal(&self) -> anyhow::Result<()> {
        let pid = self.server.lock().unwrap_or_else(|p| p.into_inner()).0.id();
        signal_pid(pid, "CONT");
        for index in 0..self.nodes.len() {
            self.signal_agent(index, "CONT");
        }
        Ok(())
    }
}

fn signal_pid(pid: u32, signal: &str) {
    // A pid already gone is no matter: its fault is moot.
    let quiet = std::process::Stdio::null;
    let _ = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).stderr(quiet()).status();
}

/// The processes of the members of the agent whose data dir is `dir`:
/// those whose `HERD_VOLUME_HERD` lies under it.
fn member_processes_of(dir: &std::path::Path) -> Vec<u32> {
    let under = dir.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                env.split(|b| *b == 0).any(|var| {
                    let var = String::from_utf8_lossy(var);
                    var.strip_prefix("HERD_VOLUME_HERD=").is_some_and(|path| path.starts_with(&under))
                })
            })
        })
        .collect()
}
