//! The soak's PostgreSQL workload: the postgres example (a primary elected
//! by herd's role lease, standbys in synchronous mode) under a write probe
//! (`crate::probe`): a writer per member where it runs now, each value
//! unique across the run, a member on the first host written to from
//! inside its network namespace (so a cut-off primary that acknowledges a
//! write alone is heard). Checked at the end: every acknowledged commit is
//! on the last primary (none lost, none acknowledged by a deposed primary
//! alone), and no two members took writes at once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use herd_client::Client;
use herd_core::kinds::{AppClusterSpec, MemberSpec, NodeSpec};

use crate::probe::{self, Ack, Probe, Target};

pub const CLUSTER: &str = "postgres";
/// What the example runs (Debian's postgresql-15).
pub const SERVER: &str = "/usr/lib/postgresql/15/bin/postgres";
pub const ROLE: &str = "db";

/// The example App with shorter leases (more failovers in a run) and a
/// readiness check given longer, and a cluster of three.
pub async fn set_up(admin: &Client) -> anyhow::Result<()> {
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/apps/postgres");
    let text = std::fs::read_to_string(examples.join("app.yaml"))?;
    let mut app: serde_json::Value = serde_saphyr::from_str(&text)?;
    quick_failovers(&mut app);
    admin.create_value("apps", &app, Default::default()).await?;
    let cluster = serde_json::json!({"metadata": {"name": CLUSTER}, "spec": {"appRef": "postgres", "roles": [{"name": ROLE, "members": 3}]}});
    admin.create_value("appclusters", &cluster, Default::default()).await?;
    Ok(())
}

/// The example App (as JSON) set for many failovers: shorter lease times,
/// and a readiness check given 2 s and two failed runs in a row (a leader
/// not ready is not renewed: a check late on a loaded machine would fail
/// it over). The PostgreSQL tests use it too.
pub fn quick_failovers(app: &mut serde_json::Value) {
    let role = &mut app["spec"]["roles"][0];
    role["leader"]["leaseDuration"] = "5s".into();
    role["leader"]["renewDeadline"] = "3s".into();
    role["leader"]["retryPeriod"] = "1s".into();
    role["readiness"]["period"] = "2s".into();
    role["readiness"]["timeout"] = "2s".into();
    role["readiness"]["failureThreshold"] = 2.into();
}

/// The leader of role `db` as herd has it (member, term), if one leads.
pub async fn leader(admin: &Client) -> Option<(String, u64)> {
    leader_or_why(admin).await.ok()
}

/// Why role `db` has no leader as herd has it (`None` when one leads).
pub async fn no_leader(admin: &Client) -> Option<String> {
    leader_or_why(admin).await.err()
}

async fn leader_or_why(admin: &Client) -> Result<(String, u64), String> {
    let cluster =
        admin.get::<AppClusterSpec>(CLUSTER).await.map_err(|error| format!("cluster {CLUSTER} not read: {error}"))?;
    let Some(leader) = cluster.status.leaders.into_iter().find(|l| l.role == ROLE) else {
        return Err(format!("no {CLUSTER} leader: role {ROLE} not in its status"));
    };
    match (leader.member, leader.waiting) {
        (Some(member), None) => Ok((member, leader.term)),
        (_, waiting) => Err(format!("no {CLUSTER} leader: {}", waiting.unwrap_or_default())),
    }
}

/// Where one member runs now: its name, node, and how it is reached.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Placement {
    member: String,
    node: String,
    host: String,
    port: u16,
}

/// The probes, one per placement a member has had; running until
/// [`Workload::finish`].
pub struct Workload {
    shared: Arc<Shared>,
    follower: tokio::task::JoinHandle<()>,
}

struct Shared {
    admin: Client,
    next_value: Arc<AtomicI64>,
    /// The first host's node and its namespace.
    netns: Option<(String, String)>,
    running: Mutex<BTreeMap<Placement, Probe>>,
    /// The acknowledged writes of placements stopped, by placement.
    stopped: Mutex<Vec<(Placement, Vec<Ack>)>>,
}

impl Workload {
    /// Creates the probe's table on the primary, then follows the members:
    /// a probe for each member where it runs, stopped when it runs there
    /// no more.
    pub async fn start(admin: &Client, netns: Option<(String, String)>) -> anyhow::Result<Workload> {
        let (primary, _) = leader(admin).await.context("no primary")?;
        let placement = placements(admin).await?.into_iter().find(|p| p.member == primary).context("its placement")?;
        let client = probe::connect(&placement.host, placement.port).await.context("connecting to the primary")?;
        client.execute("create table if not exists probe (v bigint primary key)", &[]).await?;
        let shared = Arc::new(Shared {
            admin: admin.clone(),
            next_value: Arc::new(AtomicI64::new(1)),
            netns,
            running: Mutex::default(),
            stopped: Mutex::default(),
        });
        shared.follow_once().await;
        let following = shared.clone();
        let follower = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                following.follow_once().await;
            }
        });
        Ok(Workload { shared, follower })
    }

    /// Stops every probe and checks what they saw against the last
    /// primary: how many commits were acknowledged, or the violation.
    pub async fn finish(self) -> anyhow::Result<usize> {
        self.follower.abort();
        let shared = &self.shared;
        let mut timelines = std::mem::take(&mut *shared.stopped.lock().unwrap_or_else(|p| p.into_inner()));
        let running = std::mem::take(&mut *shared.running.lock().unwrap_or_else(|p| p.into_inner()));
        for (placement, mut probe) in running {
            timelines.push((placement, probe.finish()));
        }
        let acks: Vec<Vec<Ack>> = timelines.iter().map(|(_, acks)| acks.clone()).collect();
        let acknowledged: usize = acks.iter().map(Vec::len).sum();
        let stored = shared.stored().await?;
        let lost = probe::lost(&acks, &stored);
        if let Some(first) = lost.first() {
            bail!(
                "violation: {} acknowledged commits are not on the last primary; the first, {}, acknowledged by {:?} at {} ns",
                lost.len(),
                first.value,
                timelines[first.instance].0,
                first.at
            );
        }
        // Two placements of one member never overlap unless it ran twice:
        // that counts as two writable too.
        if let Some(&(a, b, at)) = probe::two_writable(&acks).first() {
            bail!("violation: {:?} and {:?} both took writes at {at} ns", timelines[a].0, timelines[b].0);
        }
        Ok(acknowledged)
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        self.follower.abort();
    }
}

impl Shared {
    /// Starts a probe for each placement not probed yet, and stops those
    /// of placements gone (a member moved or removed).
    async fn follow_once(&self) {
        let Ok(now) = placements(&self.admin).await else { return };
        let now: BTreeSet<Placement> = now.into_iter().collect();
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let gone: Vec<Placement> = running.keys().filter(|p| !now.contains(p)).cloned().collect();
        for placement in gone {
            if let Some(mut probe) = running.remove(&placement) {
                let acks = probe.finish();
                self.stopped.lock().unwrap_or_else(|p| p.into_inner()).push((placement, acks));
            }
        }
        for placement in now {
            running.entry(placement.clone()).or_insert_with(|| {
                let netns = self.netns.as_ref().filter(|(node, _)| *node == placement.node).map(|(_, ns)| ns.clone());
                let target = Target { host: placement.host.clone(), port: placement.port, netns };
                Probe::start(target, self.next_value.clone())
            });
        }
    }

    /// Every value on the last primary, read once it takes writes.
    async fn stored(&self) -> anyhow::Result<BTreeSet<i64>> {
        for _ in 0..120 {
            if let Some((primary, _)) = leader(&self.admin).await
                && let Some(at) = placements(&self.admin).await?.into_iter().find(|p| p.member == primary)
                && let Some(client) = probe::connect(&at.host, at.port).await
                && let Ok(rows) = client.query("select v from probe", &[]).await
            {
                return Ok(rows.iter().map(|r| r.get(0)).collect());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        bail!("violation: no primary to read the commits from within a minute")
    }
}

/// Where each member of the cluster runs now (a member placed on a node
/// whose address is known, with its port).
async fn placements(admin: &Client) -> anyhow::Result<Vec<Placement>> {
    let nodes = admin.list::<NodeSpec>("").await?;
    let members = admin.list::<MemberSpec>(&format!("herd.io/cluster={CLUSTER}")).await?;
    Ok(members
        .iter()
        .filter_map(|m| {
            let node = m.spec.node.clone()?;
            let address = nodes.iter().find(|n| n.metadata.name == node)?.status.address.clone()?;
            let host = address.rsplit_once(':')?.0.to_string();
            Some(Placement { member: m.metadata.name.clone(), node, host, port: *m.spec.ports.get("pg")? })
        })
        .collect())
}
