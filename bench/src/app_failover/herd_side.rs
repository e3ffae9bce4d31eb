//! herd's side: a server and three agents, host 0's agent (and so its
//! member) inside the benchmark's network namespace, running the
//! PostgreSQL example (`examples/apps/postgres/`) with the lease settings
//! given. Faults are injected as the tests do: the member's process
//! killed, its agent and process group killed (a lost host), or host 0's
//! link cut.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use anyhow::{Context, bail};
use herd_client::Client;
use herd_core::kinds::{AppClusterSpec, Member, MemberSpec, NodeSpec};

use crate::{LeaseSettings, signal_group};
use herd_bench::netns::NetNs;
use herd_bench::probe::Target;
use herd_bench::processes::{ADMIN, Killed, herd_binary, start, start_in, wait_for};

const CLUSTER: &str = "postgres";
const ROLE: &str = "db";

pub struct HerdSide {
    herd: PathBuf,
    url: String,
    admin: Client,
    /// Killed last, after the agents and their members.
    _server: Killed,
    agents: Vec<Option<Child>>,
    agent_dirs: Vec<PathBuf>,
    /// The member on each host (node `n1` is host 0).
    members: Vec<String>,
    pub netns: NetNs,
}

fn node_name(host: usize) -> String {
    format!("n{}", host + 1)
}

impl HerdSide {
    pub async fn start(dir: &Path, netns: NetNs, lease: &LeaseSettings) -> anyhow::Result<HerdSide> {
        let herd = herd_binary()?;
        let listen = format!("{}:0", netns.outside);
        let (server, url) = start(&herd, &["server", "--listen", &listen, "--insecure-http"], &dir.join("server"))?;
        let admin = Client::new(vec![url.clone()], Some(ADMIN.into()));
        let agent_dirs: Vec<PathBuf> = (0..3).map(|i| dir.join(node_name(i))).collect();
        let mut side = HerdSide {
            herd,
            url,
            admin,
            _server: Killed(vec![server]),
            agents: Vec::new(),
            agent_dirs,
            members: Vec::new(),
            netns,
        };
        for host in 0..3 {
            let agent = side.start_agent(host)?;
            side.agents.push(Some(agent));
        }
        wait_for("three Ready nodes", Duration::from_secs(30), async || {
            let nodes = side.admin.list::<NodeSpec>("").await.ok()?;
            (nodes.iter().filter(|n| n.status.ready).count() == 3).then_some(())
        })
        .await?;
        side.apply(lease).await?;
        Ok(side)
    }

    /// Starts host `host`'s agent: host 0's in the namespace, listening at
    /// its address inside; the others at the namespace's address outside,
    /// which both sides reach (so their members' addresses are too).
    fn start_agent(&self, host: usize) -> anyhow::Result<Child> {
        let name = node_name(host);
        let (netns, listen) = match host {
            0 => (Some(self.netns.name.as_str()), format!("{}:0", self.netns.inside())),
            _ => (None, format!("{}:0", self.netns.outside)),
        };
        let args = ["--server", &self.url, "agent", "--name", &name, "--listen", &listen];
        Ok(start_in(netns, &self.herd, &args, &self.agent_dirs[host])?.0)
    }

    /// The example's App with these lease times, a cluster of three, and
    /// the probe's table on its first primary.
    async fn apply(&mut self, lease: &LeaseSettings) -> anyhow::Result<()> {
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/apps/postgres/app.yaml");
        let text = std::fs::read_to_string(&example).with_context(|| format!("reading {}", example.display()))?;
        let mut app: serde_json::Value = serde_saphyr::from_str(&text)?;
        let leader = &mut app["spec"]["roles"][0]["leader"];
        leader["leaseDuration"] = format!("{}s", lease.duration.as_secs()).into();
        leader["renewDeadline"] = format!("{}s", lease.renew_deadline.as_secs()).into();
        leader["retryPeriod"] = format!("{}s", lease.retry_period.as_secs()).into();
        self.admin.create_value("apps", &app, Default::default()).await?;
        let cluster = serde_json::json!({
            "metadata": {"name": CLUSTER},
            "spec": {"appRef": "postgres", "roles": [{"name": ROLE, "members": 3}]}
        });
        self.admin.create_value("appclusters", &cluster, Default::default()).await?;
        let members = wait_for("three members ready", Duration::from_secs(180), async || {
            let members = self.admin.list::<MemberSpec>(&format!("herd.io/cluster={CLUSTER}")).await.ok()?;
            (members.len() == 3 && members.iter().all(|m| m.status.ready)).then_some(members)
        })
        .await?;
        for host in 0..3 {
            let on = members.iter().find(|m| m.spec.node.as_deref() == Some(node_name(host).as_str()));
            let Some(member) = on else { bail!("no member on {}: the three are not on three hosts", node_name(host)) };
            self.members.push(member.metadata.name.clone());
        }
        Ok(())
    }

    async fn member(&self, host: usize) -> anyhow::Result<Member> {
        Ok(self.admin.get::<MemberSpec>(&self.members[host]).await?)
    }

    /// Where each host's member is reached (host 0's from inside).
    pub async fn targets(&self) -> anyhow::Result<Vec<Target>> {
        let mut targets = Vec::new();
        for host in 0..3 {
            let member = self.member(host).await?;
            let port = *member.spec.ports.get("pg").context("the member's pg port")?;
            let (host, netns) = match host {
                0 => (self.netns.inside(), Some(self.netns.name.clone())),
                _ => (self.netns.outside.clone(), None),
            };
            targets.push(Target { host, port, netns });
        }
        Ok(targets)
    }

    /// The host whose member holds the lease, and how many standbys it
    /// reports in sync.
    pub async fn leader(&self) -> Option<(usize, usize)> {
        let cluster = self.admin.get::<AppClusterSpec>(CLUSTER).await.ok()?;
        let leader = cluster.status.leaders.into_iter().find(|l| l.role == ROLE && l.waiting.is_none())?;
        let host = self.members.iter().position(|m| Some(m) == leader.member.as_ref())?;
        Some((host, leader.in_sync.len()))
    }

    /// The pid the member's node reports for it: its postmaster.
    async fn pid(&self, host: usize) -> anyhow::Result<u32> {
        let node = self.admin.get::<NodeSpec>(&node_name(host)).await?;
        let report = node.status.members.iter().find(|r| r.name == self.members[host]);
        report.and_then(|r| r.pid).context("the member's pid")
    }

    pub async fn crash(&self, host: usize) -> anyhow::Result<()> {
        let pid = self.pid(host).await?;
        signal_group(pid, false)
    }

    /// Its agent and the member's whole process group die at once.
    pub async fn lose_host(&mut self, host: usize) -> anyhow::Result<()> {
        let pid = self.pid(host).await?;
        if let Some(mut agent) = self.agents[host].take() {
            agent.kill()?;
            agent.wait()?;
        }
        signal_group(pid, true)
    }

    pub fn restore_host(&mut self, host: usize) -> anyhow::Result<()> {
        self.agents[host] = Some(self.start_agent(host)?);
        Ok(())
    }

    /// Asks for a switchover to host `to`'s member.
    pub async fn switchover(&self, to: usize) -> anyhow::Result<()> {
        let stamp = herd_bench::probe::now_ns();
        let operation = serde_json::json!({
            "metadata": {"name": format!("switchover-{stamp}")},
            "spec": {
                "action": {"type": "Switchover", "cluster": CLUSTER, "role": ROLE, "to": self.members[to]},
                "deadline": "30s"
            }
        });
        self.admin.create_value("operations", &operation, Default::default()).await?;
        Ok(())
    }
}

impl Drop for HerdSide {
    /// Ends the server, the agents and every member they started (members
    /// outlive their agents).
    fn drop(&mut self) {
        for agent in self.agents.iter_mut().flatten() {
            let _ = agent.kill();
            let _ = agent.wait();
        }
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(async {
                for dir in &self.agent_dirs {
                    herd_agent::members::stop_processes(dir).await;
                }
            })
        });
    }
}
