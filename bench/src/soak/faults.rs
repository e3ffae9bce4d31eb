//! The soak's faults, done to real processes: a member's process, an
//! agent or a server replica killed or paused, a host rebooted (its agent
//! and members killed, the agent started again) or cut off (its link
//! down), a host's disk filled and freed, a replica's wall clock skewed
//! (started again under libfaketime),
//! and the voluntary ones asked of herd (a drain, an eviction, a rolling
//! restart, a switchover, an upgrade). Each is undone after its length; a host, a
//! replica, and the voluntary ones together, have one fault at a time.

use std::time::{Duration, Instant};

use anyhow::Context;
use herd_core::api::{NodeRoleRequest, StatusReason};
use herd_core::kinds::{Member, MemberSpec, NodeRole, NodeSpec, Operation, OperationAction, OperationSpec};

use super::hosts::{Cluster, member_processes_of, signal_pid};
use crate::schedule::{Fault, FaultKind};

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

/// The wall-clock offsets a skewed replica runs with (libfaketime's syntax).
const SKEWS: [&str; 4] = ["+1h", "-1h", "+90s", "-90s"];

/// A member's process as its node reports it.
struct MemberProcess {
    pid: u32,
    host: usize,
    member: String,
    instance: String,
}

impl Cluster {
    /// The members of every cluster the soak runs, by name.
    async fn members(&self) -> anyhow::Result<Vec<Member>> {
        let mut members = self.admin().list::<MemberSpec>("").await?;
        members.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(members)
    }

    /// The process of member slot `target` (modulo their number).
    async fn member_process(&self, target: u32) -> anyhow::Result<Option<MemberProcess>> {
        let members = self.members().await?;
        let Some(member) = members.get(target as usize % members.len().max(1)) else { return Ok(None) };
        let Some(node) = member.spec.node.clone() else { return Ok(None) };
        let reported = self.admin().get::<NodeSpec>(&node).await?;
        let report = reported.status.members.iter().find(|r| r.name == member.metadata.name);
        let host = self.nodes.iter().position(|n| *n == node).context("a node of the soak")?;
        Ok(report.and_then(|r| {
            Some(MemberProcess {
                pid: r.pid?,
                host,
                member: member.metadata.name.clone(),
                instance: r.instance_id.clone()?,
            })
        }))
    }

    /// Does `fault`, waits its length, undoes it; what the cluster is whole
    /// again after. Ok(None): not done (its host has a fault on, or it has
    /// nothing to act on now).
    pub async fn run(&self, fault: &Fault) -> anyhow::Result<Option<Awaited>> {
        let (hosts, replicas) = (self.nodes.len(), self.urls().len());
        let host = match fault.kind {
            FaultKind::KillServer | FaultKind::PauseServer | FaultKind::SkewClock => {
                hosts + fault.target as usize % replicas
            }
            FaultKind::KillMember | FaultKind::PauseMember => match self.member_process(fault.target).await? {
                Some(process) => process.host,
                None => return Ok(None),
            },
            // Only the first host has a link of its own.
            FaultKind::CutHost => 0,
            _ if fault.kind.voluntary() => hosts + replicas,
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
        let replica = host.wrapping_sub(self.nodes.len());
        match fault.kind {
            FaultKind::KillMember => {
                let Some(process) = self.member_process(fault.target).await? else { return Ok(None) };
                signal_pid(process.pid, "KILL");
                return Ok(Some(Awaited::NewInstance { member: process.member, instance: process.instance }));
            }
            FaultKind::PauseMember => {
                let Some(process) = self.member_process(fault.target).await? else { return Ok(None) };
                signal_pid(process.pid, "STOP");
                tokio::time::sleep(length).await;
                signal_pid(process.pid, "CONT");
            }
            FaultKind::KillAgent => {
                signal_pid(self.agent_pid(host), "KILL");
                tokio::time::sleep(length).await;
                self.restart_agent(host)?;
            }
            FaultKind::PauseAgent => {
                signal_pid(self.agent_pid(host), "STOP");
                tokio::time::sleep(length).await;
                signal_pid(self.agent_pid(host), "CONT");
            }
            FaultKind::RebootHost => {
                signal_pid(self.agent_pid(host), "KILL");
                // Every member process the host ran goes with it.
                for pid in member_processes_of(&self.node_dir(host)) {
                    signal_pid(pid, "KILL");
                }
                tokio::time::sleep(length).await;
                self.restart_agent(host)?;
            }
            FaultKind::CutHost => {
                let netns = self.netns.as_ref().context("a cut link needs the first host in a namespace")?;
                netns.cut();
                tokio::time::sleep(length).await;
                netns.heal();
            }
            FaultKind::FillDisk => {
                let file = self.fill_disk(host)?;
                tokio::time::sleep(length).await;
                std::fs::remove_file(&file)?;
            }
            FaultKind::KillServer => {
                signal_pid(self.replica_pid(replica), "KILL");
                tokio::time::sleep(length).await;
                self.restart_replica(replica, None)?;
            }
            FaultKind::PauseServer => {
                signal_pid(self.replica_pid(replica), "STOP");
                tokio::time::sleep(length).await;
                signal_pid(self.replica_pid(replica), "CONT");
            }
            FaultKind::SkewClock => {
                let skew = SKEWS[(fault.target / 7) as usize % SKEWS.len()];
                self.restart_replica(replica, Some(skew))?;
                tokio::time::sleep(length).await;
                self.restart_replica(replica, None)?;
            }
            FaultKind::Drain => {
                let node = &self.nodes[fault.target as usize % self.nodes.len()];
                let action = OperationAction::Drain { node: node.clone() };
                let name = format!("soak-{}-drain", fault.number);
                self.operation(&name, action).await?;
                tokio::time::sleep(length).await;
                // Undrained as `herd node undrain` does: the drain cancelled
                // (one member per node: its members may have nowhere to go),
                // then the node regular. The servers may be down meanwhile,
                // with a fault of their own: the undo is asked again, for two
                // minutes at most.
                let started = Instant::now();
                while let Err(error) = self.undrain(&name, node).await {
                    if started.elapsed() > Duration::from_secs(120) {
                        return Err(error.into());
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                return Ok(Some(Awaited::Operation(name)));
            }
            FaultKind::Evict => {
                let members = self.members().await?;
                let Some(member) = members.get(fault.target as usize % members.len().max(1)) else { return Ok(None) };
                // A refusal by the budget is an answer, not a failure.
                let _ = self.admin().evict_member(&member.metadata.name, false).await;
            }
            FaultKind::RollingRestart => {
                let (cluster, role) = self.app_cluster(fault.target);
                let action = OperationAction::Restart { cluster: cluster.into(), role: role.into(), canary: 1 };
                let name = format!("soak-{}-restart", fault.number);
                return Ok(self.operation(&name, action).await?.then_some(Awaited::Operation(name)));
            }
            FaultKind::Switchover => {
                let (cluster, role) = (super::postgres::CLUSTER.into(), super::postgres::ROLE.into());
                let action = OperationAction::Switchover { cluster, role, to: None };
                let name = format!("soak-{}-switchover", fault.number);
                return Ok(self.operation(&name, action).await?.then_some(Awaited::Operation(name)));
            }
            FaultKind::Upgrade => {
                // Each cluster's App is named as the cluster.
                let (cluster, _) = self.app_cluster(fault.target);
                let patch = serde_json::json!({"spec": {"description": format!("soak fault {}", fault.number)}});
                let written = self.admin().patch_value("apps", cluster, &patch).await?;
                let to = written["metadata"]["generation"].as_i64().context("the App's generation")?;
                let action = OperationAction::Upgrade {
                    cluster: cluster.into(),
                    to_revision: to,
                    canary: 1,
                    min_healthy_time: herd_core::HumanDuration::from_secs(2),
                    healthy_deadline: herd_core::HumanDuration::from_secs(120),
                    auto_revert: true,
                };
                let name = format!("soak-{}-upgrade", fault.number);
                return Ok(self.operation(&name, action).await?.then_some(Awaited::Operation(name)));
            }
        }
        Ok(Some(Awaited::Whole))
    }

    /// The cluster (and role) a fault on a whole cluster acts on: etcd's,
    /// or, every other target, the PostgreSQL example's when it runs.
    fn app_cluster(&self, target: u32) -> (&'static str, &'static str) {
        match self.postgres_app && target % 2 == 1 {
            true => (super::postgres::CLUSTER, super::postgres::ROLE),
            false => ("etcd", "member"),
        }
    }

    /// Creates an Operation; whether it was (one refused because another
    /// of its kind runs is left: the soak goes on).
    async fn operation(&self, name: &str, action: OperationAction) -> anyhow::Result<bool> {
        let spec = OperationSpec { action, max_parallel: 1, ..Default::default() };
        match self.admin().create(&Operation::new(name, spec)).await {
            Ok(_) => Ok(true),
            Err(error) if error.reason() == Some(StatusReason::Conflict) => Ok(false),
            Err(error) => Err(error.into()),
        }
    }

    /// Drain `name` cancelled and `node` regular again.
    async fn undrain(&self, name: &str, node: &str) -> Result<(), herd_client::ClientError> {
        let cancel = serde_json::json!({"spec": {"cancel": true}});
        match self.admin().patch_value("operations", name, &cancel).await {
            Err(error) if error.reason() != Some(StatusReason::NotFound) => return Err(error),
            _ => {}
        }
        let request = NodeRoleRequest { role: Some(NodeRole::Regular), master_capable: None, auto_promote: false };
        self.admin().change_node_role(node, &request).await.map(drop)
    }
}
