//! What the soak sets up and checks through herd's API and the host's
//! processes: the cluster whole (every member configured and ready,
//! every node Ready), every Operation ended and every Command settled,
//! and no member slot running twice.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use herd_client::Client;
use herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME;
use herd_core::kinds::{ClusterConfigSpec, CommandSpec, MemberSpec, MemberState, NodeSpec, OperationSpec};
use tokio_util::sync::CancellationToken;

use super::Options;
use super::faults::Awaited;
use super::report::Seen;
use crate::processes::wait_for;

const CLUSTER: &str = "etcd";

/// What the cluster is whole with: every node Ready, each cluster's three
/// members configured and ready, and the PostgreSQL primary elected.
#[derive(Clone, Copy, Debug)]
pub struct Expected {
    pub nodes: usize,
    pub postgres: bool,
}

/// Quick heartbeats, the members' ports, the etcd example (App, budget)
/// and a cluster of 3 (and the PostgreSQL example's), whole.
pub async fn set_up(admin: &Client, options: &Options, expected: &Expected) -> anyhow::Result<()> {
    wait_for("the agents Ready", Duration::from_secs(90), async || {
        let listed = admin.list::<NodeSpec>("").await.ok()?;
        (listed.iter().filter(|n| n.status.ready).count() == expected.nodes).then_some(())
    })
    .await?;
    let mut config = admin.get::<ClusterConfigSpec>(CLUSTER_CONFIG_NAME).await?;
    config.spec.heartbeat_period = herd_core::HumanDuration(Duration::from_millis(500));
    config.spec.node_grace_period = herd_core::HumanDuration(Duration::from_secs(4));
    if let Some((first, last)) = options.member_ports {
        config.spec.app_clusters.first_member_port = first;
        config.spec.app_clusters.last_member_port = last;
    }
    admin.update(&config).await?;
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/apps/etcd");
    for file in ["app.yaml", "budget.yaml"] {
        let text = std::fs::read_to_string(examples.join(file))?;
        let value: serde_json::Value = serde_saphyr::from_str(&text)?;
        let plural = if file == "app.yaml" { "apps" } else { "disruptionbudgets" };
        admin.create_value(plural, &value, Default::default()).await?;
    }
    let cluster = serde_json::json!({"metadata": {"name": CLUSTER}, "spec": {"appRef": "etcd", "roles": [{"name": "member", "members": 3}]}});
    admin.create_value("appclusters", &cluster, Default::default()).await?;
    if expected.postgres {
        super::postgres::set_up(admin).await?;
    }
    whole_again(admin, expected, Duration::from_secs(180)).await?;
    Ok(())
}

/// The members' client addresses, each at its node's address.
pub async fn client_endpoints(admin: &Client) -> anyhow::Result<Vec<String>> {
    let nodes = admin.list::<NodeSpec>("").await?;
    let host = |node: &str| {
        let node = nodes.iter().find(|n| n.metadata.name == node)?;
        Some(node.status.address.as_deref()?.rsplit_once(':')?.0.to_string())
    };
    let members = admin.list::<MemberSpec>(&format!("herd.io/cluster={CLUSTER}")).await?;
    Ok(members
        .iter()
        .filter_map(|m| Some(format!("{}:{}", host(m.spec.node.as_deref()?)?, m.spec.ports.get("client")?)))
        .collect())
}

/// How long until every member is configured and ready and every node
/// Ready (at most `within`); or what still lacked then.
pub async fn whole_again(admin: &Client, expected: &Expected, within: Duration) -> anyhow::Result<Duration> {
    let started = Instant::now();
    loop {
        let lacking = lacking(admin, expected).await;
        if lacking.is_empty() {
            return Ok(started.elapsed());
        }
        if started.elapsed() > within {
            bail!("the cluster was not whole again within {within:?}: {}", lacking.join("; "));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whole again after `awaited` (at most `within`).
pub async fn recovered(admin: &Client, expected: &Expected, awaited: &Awaited, within: Duration) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let seen = match awaited {
            Awaited::Whole => true,
            Awaited::NewInstance { member, instance } => {
                let now = admin.get::<MemberSpec>(member).await.ok();
                now.and_then(|m| m.status.state_detail.last_configured_instance).is_some_and(|i| i != *instance)
            }
            Awaited::Operation(name) => {
                admin.get::<OperationSpec>(name).await.is_ok_and(|o| o.status.phase.is_finished())
            }
        };
        let lacking = if seen { lacking(admin, expected).await } else { vec![format!("{awaited:?} not seen")] };
        if lacking.is_empty() {
            return Ok(());
        }
        if started.elapsed() > within {
            bail!("not whole again within {within:?} after {awaited:?}: {}", lacking.join("; "));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the cluster lacks to be whole, each named (nothing when whole).
async fn lacking(admin: &Client, expected: &Expected) -> Vec<String> {
    let (members, nodes) = match (admin.list::<MemberSpec>("").await, admin.list::<NodeSpec>("").await) {
        (Ok(members), Ok(nodes)) => (members, nodes),
        (Err(error), _) | (_, Err(error)) => return vec![format!("herd's API did not answer: {error}")],
    };
    let clusters = if expected.postgres { 2 } else { 1 };
    let mut lacking = Vec::new();
    if members.len() != 3 * clusters {
        lacking.push(format!("{} members, not {}", members.len(), 3 * clusters));
    }
    for member in members.iter().filter(|m| m.status.state != MemberState::Configured || !m.status.ready) {
        let status = &member.status;
        let ready = if status.ready { "ready" } else { "not ready" };
        lacking
            .push(format!("member {} {:?} and {ready} on {:?}", member.metadata.name, status.state, member.spec.node));
    }
    if nodes.len() != expected.nodes {
        lacking.push(format!("{} nodes, not {}", nodes.len(), expected.nodes));
    }
    for node in nodes.iter().filter(|n| !n.status.ready) {
        lacking.push(format!("node {} not Ready", node.metadata.name));
    }
    if expected.postgres
        && let Some(waiting) = super::postgres::no_leader(admin).await
    {
        lacking.push(waiting);
    }
    lacking
}

/// Every Operation ended and every Command settled, within a minute; or
/// the ones that did not, named.
pub async fn ended(admin: &Client) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let operations = admin.list::<OperationSpec>("").await.unwrap_or_default();
        let commands = admin.list::<CommandSpec>("").await.unwrap_or_default();
        let mut open: Vec<String> = operations
            .iter()
            .filter(|o| !o.status.phase.is_finished())
            .map(|o| format!("operation {} ({:?}: {:?})", o.metadata.name, o.status.phase, o.status.message))
            .collect();
        open.extend(
            commands
                .iter()
                .filter(|c| !c.status.state_by_management.is_settled())
                .map(|c| format!("command {} ({:?})", c.metadata.name, c.status.state_by_management)),
        );
        if open.is_empty() {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("violation: not ended a minute after the faults: {}", open.join("; "));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Scans every process on this host twice a second until `stop`: two
/// etcd processes of one member slot at once is a violation, kept in
/// `twice` (the first one).
pub async fn scan_for_twice(twice: Arc<Mutex<Option<Seen>>>, root: PathBuf, clock: Instant, stop: CancellationToken) {
    while !stop.is_cancelled() {
        let mut by_member: HashMap<String, Vec<u32>> = HashMap::new();
        for (pid, member) in etcd_processes(&root) {
            by_member.entry(member).or_default().push(pid);
        }
        if let Some((member, pids)) = by_member.iter().find(|(_, pids)| pids.len() > 1) {
            let what = format!("member {member} runs as {} processes at once: {pids:?}", pids.len());
            println!("violation: {what}");
            let mut twice = twice.lock().unwrap_or_else(|p| p.into_inner());
            twice.get_or_insert(Seen { at: clock.elapsed().as_nanos() as u64, what });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// (pid, member) of every etcd process a member of an agent under `root`
/// runs (its `HERD_VOLUME_HERD` there): other tests' etcd, on the same
/// host, are not the soak's.
fn etcd_processes(root: &Path) -> Vec<(u32, String)> {
    let root = root.to_string_lossy();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "etcd"))
        .filter_map(|pid| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            let vars: Vec<String> = env.split(|b| *b == 0).map(|v| String::from_utf8_lossy(v).into_owned()).collect();
            let value = |name: &str| vars.iter().find_map(|var| var.strip_prefix(name));
            value("HERD_VOLUME_HERD=").filter(|path| path.starts_with(&*root))?;
            Some((pid, value("HERD_MEMBER=")?.to_string()))
        })
        .collect()
}
