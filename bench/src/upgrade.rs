//! Upgrade on real agents: the time an Upgrade Operation takes to restart
//! the 10 members of a trivial app spread over 3 nodes as a new revision
//! of their App, one at a time (`maxParallel 1`, no canary,
//! `minHealthyTime 0s`), beside two baselines measured in the same run:
//!
//! - the floor the issue names: each member's own work in sequence (its
//!   process stopped, a new one started and its setup run, directly);
//! - the same restarts driven by hand through the API, one after the
//!   other (each member's revision and restart request written, then
//!   waited for until it runs the new revision, configured and ready):
//!   what a client-side rollout does, so the figure is the Operation's
//!   own cost.
//!
//! Two apps: a trivial setup, and one whose setup takes half a second.
//!
//! `cargo build --release -p herd -p herd-bench && target/release/upgrade`
//! Options (environment): BENCH_MEMBERS (default 10), BENCH_ROUNDS
//! (default 3), HERD_BIN.

mod floors;
mod rollout;

use std::time::{Duration, Instant};

use anyhow::bail;
use herd_bench::processes::{env_u64, wait_for};
use herd_client::Client;
use herd_core::kinds::{Member, MemberSpec, Operation, OperationAction, OperationPhase, OperationSpec};
use herd_core::time::HumanDuration;
use rollout::APPS;

async fn members(admin: &Client, cluster: &str) -> Vec<Member> {
    admin.list::<MemberSpec>(&format!("herd.io/cluster={cluster}")).await.unwrap_or_default()
}

/// Whether `member` runs `revision` as an instance other than `before`,
/// configured and ready.
fn upgraded(member: &Member, revision: i64, before: &str) -> bool {
    let detail = &member.status.state_detail;
    member.status.app_revision == Some(revision)
        && member.status.ready
        && detail.last_configured_instance.as_deref().is_some_and(|i| i != before)
}

/// A new revision of App `app` (its description changed): its number.
async fn new_revision(admin: &Client, app: &str, round: String) -> anyhow::Result<i64> {
    let patch = serde_json::json!({"spec": {"description": round}});
    let written = admin.patch_value("apps", app, &patch).await?;
    Ok(written["metadata"]["generation"].as_i64().unwrap_or_default())
}

/// The Upgrade Operation, from its creation to Succeeded.
async fn upgrade_operation(admin: &Client, cluster: &str, to: i64) -> anyhow::Result<Duration> {
    let action = OperationAction::Upgrade {
        cluster: cluster.into(),
        to_revision: to,
        canary: 0,
        min_healthy_time: HumanDuration::from_secs(0),
        healthy_deadline: HumanDuration::from_secs(300),
        auto_revert: true,
    };
    let spec = OperationSpec { action, max_parallel: 1, ..Default::default() };
    let name = format!("upgrade-{cluster}-{to}");
    let started = Instant::now();
    admin.create(&Operation::new(name.clone(), spec)).await?;
    let done = wait_for("the upgrade finished", Duration::from_secs(600), async || {
        let op = admin.get::<OperationSpec>(&name).await.ok()?;
        op.status.phase.is_finished().then_some(op)
    })
    .await?;
    let took = started.elapsed();
    if done.status.phase != OperationPhase::Succeeded {
        bail!("the upgrade ended {:?}: {:?}", done.status.phase, done.status.message);
    }
    Ok(took)
}

/// The same by hand: each member in turn given the revision and asked to
/// restart, and waited for until it runs it, configured and ready.
async fn upgrade_by_hand(admin: &Client, cluster: &str, to: i64) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut all = members(admin, cluster).await;
    all.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for member in &all {
        let name = &member.metadata.name;
        let before = member.status.state_detail.last_configured_instance.clone().unwrap_or_default();
        let now = herd_core::Timestamp::from_system_time(std::time::SystemTime::now());
        let patch = serde_json::json!({"spec": {"appRevision": to, "requests": {"restart": now}}});
        admin.patch_value("members", name, &patch).await?;
        wait_for("the member upgraded", Duration::from_secs(120), async || {
            let m = admin.get::<MemberSpec>(name).await.ok()?;
            upgraded(&m, to, &before).then_some(())
        })
        .await?;
    }
    Ok(started.elapsed())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let count = env_u64("BENCH_MEMBERS", 10);
    let rounds = env_u64("BENCH_ROUNDS", 3);
    println!("upgrade benchmark: {count} members on 3 nodes (2 s heartbeats), one at a time, {rounds} rounds");
    rollout::with_three_nodes(async |admin, dir| {
        for (app, pause) in APPS {
            rollout::create_app(admin, app, pause).await?;
            let cluster = serde_json::json!({"metadata": {"name": app}, "spec": {"appRef": app, "roles": [{"name": "m", "members": count}]}});
            admin.create_value("appclusters", &cluster, Default::default()).await?;
            wait_for("the cluster ready", Duration::from_secs(300), async || {
                let members = members(admin, app).await;
                (members.len() == count as usize && members.iter().all(|m| m.status.ready)).then_some(())
            })
            .await?;
            let floor = rollout::restarts_floor(dir, app, pause, count, rounds)?;
            let (mut operations, mut by_hand) = (Vec::new(), Vec::new());
            for round in 0..rounds {
                let to = new_revision(admin, app, format!("operation round {round}")).await?;
                operations.push(upgrade_operation(admin, app, to).await?);
                let to = new_revision(admin, app, format!("by hand round {round}")).await?;
                by_hand.push(upgrade_by_hand(admin, app, to).await?);
            }
            rollout::report(app, floor, ("restarts", by_hand), ("Upgrade Operation", operations));
        }
        Ok(())
    })
    .await
}
