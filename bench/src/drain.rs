//! Drain on real agents: the time a drain Operation takes to
//! move 10 members of a trivial app off a node under a budget of
//! `maxUnavailable: 1`, beside two baselines measured in the same run:
//!
//! - the floor the issue names: each member's own work in sequence (its
//!   process stopped, a new one started and its setup run, directly);
//! - the same evictions driven by hand through the API, one after the
//!   other (ask, retry a refusal at once, wait until the member is ready
//!   elsewhere): what a client-side drain such as `kubectl drain` does, so
//!   the figure is the Operation's own cost.
//!
//! Two apps: a trivial setup, and one whose setup takes half a second.
//!
//! `cargo build --release -p herd -p herd-bench && target/release/drain`
//! Options (environment): BENCH_MEMBERS (default 10), BENCH_ROUNDS
//! (default 3), HERD_BIN.

mod floors;
mod rollout;

use std::time::{Duration, Instant};

use anyhow::bail;
use herd_bench::processes::{env_u64, wait_for};
use herd_client::Client;
use herd_core::api::NodeRoleRequest;
use herd_core::kinds::{MemberSpec, NodeRole, Operation, OperationAction, OperationPhase, OperationSpec};
use rollout::{APPS, NODES};

async fn role(admin: &Client, node: &str, role: NodeRole) -> anyhow::Result<()> {
    let request = NodeRoleRequest { role: Some(role), master_capable: None, auto_promote: true };
    admin.change_node_role(node, &request).await?;
    Ok(())
}

async fn members(admin: &Client, cluster: &str) -> Vec<herd_core::kinds::Member> {
    admin.list::<MemberSpec>(&format!("herd.io/cluster={cluster}")).await.unwrap_or_default()
}

/// Every member of `cluster` off `node`, bound elsewhere and ready.
async fn all_moved(admin: &Client, cluster: &str, node: &str, count: usize) -> bool {
    let members = members(admin, cluster).await;
    members.len() == count && members.iter().all(|m| m.status.ready && m.spec.node.as_deref() != Some(node))
}

/// Cluster `name` of `count` members, all on node-1 (the others drained
/// while they are placed), configured and ready; its budget counted.
async fn cluster_on_node_1(admin: &Client, name: &str, app: &str, count: u64) -> anyhow::Result<()> {
    for node in &NODES[1..] {
        role(admin, node, NodeRole::Drained).await?;
    }
    let cluster = serde_json::json!({"metadata": {"name": name}, "spec": {"appRef": app, "roles": [{"name": "m", "members": count}]}});
    admin.create_value("appclusters", &cluster, Default::default()).await?;
    let budget = serde_json::json!({"metadata": {"name": name}, "spec": {"selector": format!("herd.io/cluster={name}"), "maxUnavailable": 1}});
    admin.create_value("disruptionbudgets", &budget, Default::default()).await?;
    wait_for("the cluster ready on node-1", Duration::from_secs(300), async || {
        let members = members(admin, name).await;
        let ready = members.len() == count as usize
            && members.iter().all(|m| m.status.ready && m.spec.node.as_deref() == Some("node-1"));
        ready.then_some(())
    })
    .await?;
    for node in &NODES[1..] {
        role(admin, node, NodeRole::Regular).await?;
    }
    wait_for("the budget counted", Duration::from_secs(60), async || {
        let budget = admin.get::<herd_core::kinds::DisruptionBudgetSpec>(name).await.ok()?;
        (budget.status.current_healthy == count as u32 && budget.status.disruptions_allowed == 1).then_some(())
    })
    .await
}

async fn clean_up(admin: &Client, name: &str) -> anyhow::Result<()> {
    admin.delete_value("appclusters", name, Default::default()).await?;
    admin.delete_value("disruptionbudgets", name, Default::default()).await?;
    wait_for("its members gone", Duration::from_secs(120), async || {
        members(admin, name).await.is_empty().then_some(())
    })
    .await?;
    role(admin, "node-1", NodeRole::Regular).await
}

/// The drain Operation, from its creation to Succeeded.
async fn drain_operation(admin: &Client, name: &str) -> anyhow::Result<Duration> {
    let spec = OperationSpec {
        action: OperationAction::Drain { node: "node-1".into() },
        max_parallel: 1,
        ..Default::default()
    };
    let started = Instant::now();
    admin.create(&Operation::new(format!("drain-{name}"), spec)).await?;
    let done = wait_for("the drain finished", Duration::from_secs(600), async || {
        let op = admin.get::<OperationSpec>(&format!("drain-{name}")).await.ok()?;
        op.status.phase.is_finished().then_some(op)
    })
    .await?;
    let took = started.elapsed();
    if done.status.phase != OperationPhase::Succeeded {
        bail!("the drain ended {:?}: {:?}", done.status.phase, done.status.message);
    }
    Ok(took)
}

/// The same by hand: node-1 drained, then each member evicted through the
/// API in turn (a refusal asked again at once) and waited for until it is
/// ready elsewhere.
async fn drain_by_hand(admin: &Client, name: &str, count: usize) -> anyhow::Result<Duration> {
    let started = Instant::now();
    role(admin, "node-1", NodeRole::Drained).await?;
    let mut names: Vec<String> = members(admin, name).await.into_iter().map(|m| m.metadata.name).collect();
    names.sort();
    for member in &names {
        wait_for("the eviction allowed", Duration::from_secs(120), async || {
            admin.evict_member(member, false).await.ok()
        })
        .await?;
        wait_for("the member ready elsewhere", Duration::from_secs(120), async || {
            let m = admin.get::<MemberSpec>(member).await.ok()?;
            (m.status.ready && m.spec.node.as_deref() != Some("node-1")).then_some(())
        })
        .await?;
    }
    if !all_moved(admin, name, "node-1", count).await {
        bail!("not every member moved");
    }
    Ok(started.elapsed())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let count = env_u64("BENCH_MEMBERS", 10);
    let rounds = env_u64("BENCH_ROUNDS", 3);
    println!("drain benchmark: {count} members on one of 3 nodes (2 s heartbeats), maxUnavailable 1, {rounds} rounds");
    rollout::with_three_nodes(async |admin, dir| {
        for (app, pause) in APPS {
            rollout::create_app(admin, app, pause).await?;
            let floor = rollout::restarts_floor(dir, app, pause, count, rounds)?;
            let (mut operations, mut by_hand) = (Vec::new(), Vec::new());
            for round in 0..rounds {
                let name = format!("{app}-op-{round}");
                cluster_on_node_1(admin, &name, app, count).await?;
                operations.push(drain_operation(admin, &name).await?);
                clean_up(admin, &name).await?;
                let name = format!("{app}-hand-{round}");
                cluster_on_node_1(admin, &name, app, count).await?;
                by_hand.push(drain_by_hand(admin, &name, count as usize).await?);
                clean_up(admin, &name).await?;
            }
            rollout::report(app, floor, ("evictions", by_hand), ("drain Operation", operations));
        }
        Ok(())
    })
    .await
}
