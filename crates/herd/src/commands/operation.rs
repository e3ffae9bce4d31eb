//! `herd node drain|undrain`, `herd appcluster
//! restart|switchover|upgrade|wait` and `herd operation
//! cancel|pause|resume`: a drain, a rolling restart, a switchover or an
//! upgrade is an Operation the
//! server carries out; the CLI creates it and follows it
//! (a progress bar, the blocker and since when, each step as it
//! happens), and detaches on Ctrl-C without cancelling it.

use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use herd_client::Client;
use herd_core::Resource;
use herd_core::api::{NodeRoleRequest, StatusReason};
use herd_core::kinds::app_cluster::ClusterState;
use herd_core::kinds::{
    AppClusterSpec, MemberSpec, MemberState, NodeRole, NodeSpec, OnDeadline, Operation, OperationAction,
    OperationPhase, OperationSpec, TARGET_LABEL,
};
use herd_core::time::HumanDuration;
use herd_core::units::short_duration;
use indicatif::{ProgressBar, ProgressStyle};

use crate::cli::UpgradeArgs;

/// How often a followed Operation is read.
const FOLLOW_EVERY: Duration = Duration::from_millis(500);

/// How long an Operation may take and how many members it moves at once.
pub struct Limits {
    pub deadline: Option<HumanDuration>,
    pub on_deadline: OnDeadline,
    pub max_parallel: u32,
}

/// Starts an Operation (named `<prefix>-<milliseconds>`) and follows it
/// unless `detach`.
pub async fn start(
    client: &Client,
    prefix: &str,
    action: OperationAction,
    limits: Limits,
    detach: bool,
) -> anyhow::Result<()> {
    // What it names must exist: a missing one is exit code 3, as everywhere.
    match &action {
        OperationAction::Drain { node } => drop(client.get::<NodeSpec>(node).await?),
        OperationAction::Restart { cluster, .. }
        | OperationAction::Switchover { cluster, .. }
        | OperationAction::Upgrade { cluster, .. } => drop(client.get::<AppClusterSpec>(cluster).await?),
    }
    let stamp = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_millis();
    let what = match &action {
        OperationAction::Drain { node } => format!("draining node {node}"),
        OperationAction::Restart { cluster, role, .. } => format!("restarting role {role} of {cluster}"),
        OperationAction::Switchover { cluster, role, to: Some(to) } => {
            format!("switching role {role} of {cluster} over to {to}")
        }
        OperationAction::Switchover { cluster, role, to: None } => format!("switching role {role} of {cluster} over"),
        OperationAction::Upgrade { cluster, to_revision, .. } => {
            format!("upgrading {cluster} to revision {to_revision}")
        }
    };
    let spec = OperationSpec {
        action,
        deadline: limits.deadline,
        on_deadline: limits.on_deadline,
        max_parallel: limits.max_parallel,
        cancel: false,
        paused: false,
    };
    let operation = client.create(&Operation::new(format!("{prefix}-{stamp}"), spec)).await?;
    let name = operation.metadata.name;
    println!("operation/{name} created: {what}");
    if detach {
        println!("follow it with `herd describe operation {name}`; cancel it with `herd operation cancel {name}`");
        return Ok(());
    }
    follow(client, &name).await
}

/// Starts (and follows) the upgrade of `cluster`: to the App's latest
/// revision unless one is asked for, paced as asked, else as the
/// cluster's `updatePolicy` says.
pub async fn upgrade(
    client: &Client,
    cluster: &str,
    asked: &UpgradeArgs,
    deadline: Option<HumanDuration>,
    detach: bool,
) -> anyhow::Result<()> {
    let found = client.get::<AppClusterSpec>(cluster).await?;
    let to_revision = match asked.to_revision {
        Some(revision) => revision,
        None => client.get::<herd_core::kinds::AppSpec>(&found.spec.app_ref).await?.metadata.generation,
    };
    let policy = &found.spec.update_policy;
    let action = OperationAction::Upgrade {
        cluster: cluster.to_string(),
        to_revision,
        canary: asked.canary.unwrap_or(policy.canary),
        min_healthy_time: asked.min_healthy_time.unwrap_or(policy.min_healthy_time),
        healthy_deadline: asked.healthy_deadline.unwrap_or(policy.healthy_deadline),
        auto_revert: policy.auto_revert && !asked.no_auto_revert,
    };
    let max_parallel = asked.max_parallel.unwrap_or(policy.max_parallel);
    let limits = Limits { deadline, on_deadline: OnDeadline::Fail, max_parallel };
    start(client, &format!("upgrade-{cluster}"), action, limits, detach).await
}

/// `herd appcluster wait NAME --for configured`: a progress bar of the
/// members ready until the cluster is configured, for at most `timeout`;
/// a member in config error ends the wait at once, naming it.
pub async fn wait_configured(client: &Client, name: &str, timeout: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    let bar = progress_bar("{spinner} [{bar:30}] {pos}/{len} members ready {wide_msg}");
    loop {
        let cluster = client.get::<AppClusterSpec>(name).await?;
        let members = client.list::<MemberSpec>(&format!("herd.io/cluster={name}")).await?;
        let wanted: u32 = cluster.spec.roles.iter().map(|r| r.members).sum();
        let ready = members.iter().filter(|m| m.status.ready).count();
        bar.set_length(u64::from(wanted));
        bar.set_position(ready as u64);
        let current = cluster.status.observed_generation == Some(cluster.metadata.generation);
        let all_ready = members.len() == wanted as usize && ready == members.len();
        // Done when the budgets say so too: what the wait reports is what an
        // eviction right after would be judged on.
        let uncounted = if current && cluster.status.state == ClusterState::Configured && all_ready {
            uncounted_by_budgets(client, &members).await?
        } else {
            Some("not every member ready yet".into())
        };
        if uncounted.is_none() {
            bar.finish_and_clear();
            println!(
                "appcluster/{name} configured: {ready} of {wanted} members ready, and counted healthy by its budgets"
            );
            return Ok(());
        }
        if let Some(broken) = members.iter().find(|m| m.status.state == MemberState::ConfigError) {
            bar.finish_and_clear();
            let why = broken.status.state_detail.config_error_detail.as_deref().unwrap_or("config error");
            bail!("appcluster/{name}: member {} is in config error: {why}", broken.metadata.name);
        }
        let waiting: Vec<&str> =
            members.iter().filter(|m| !m.status.ready).map(|m| m.metadata.name.as_str()).take(3).collect();
        bar.set_message(match (waiting.is_empty(), uncounted) {
            (false, _) => format!("waiting for {}", waiting.join(", ")),
            (true, Some(why)) => why,
            (true, None) => String::new(),
        });
        if tokio::time::Instant::now() >= deadline {
            bar.finish_and_clear();
            bail!(
                "appcluster/{name} is not configured after {}: {ready} of {wanted} members ready ({:?})",
                humantime::format_duration(timeout),
                cluster.status.state
            );
        }
        tokio::time::sleep(FOLLOW_EVERY).await;
    }
}

/// Why a budget that selects some of `members` does not count them all
/// healthy yet (None: every one does).
async fn uncounted_by_budgets(client: &Client, members: &[herd_core::kinds::Member]) -> anyhow::Result<Option<String>> {
    let budgets = client.list::<herd_core::kinds::DisruptionBudgetSpec>("").await?;
    for budget in &budgets {
        let selected: Vec<&herd_core::kinds::Member> =
            members.iter().filter(|m| herd_core::disruption::selects(budget, m)).collect();
        if selected.is_empty() {
            continue;
        }
        let name = &budget.metadata.name;
        if herd_core::disruption::is_stale(budget) || budget.status.expected_members < selected.len() as u32 {
            return Ok(Some(format!("budget {name} has not counted them yet")));
        }
        if let Some(unhealthy) =
            budget.status.unhealthy.iter().find(|u| selected.iter().any(|m| m.metadata.name == u.name))
        {
            return Ok(Some(format!("budget {name} counts {} not healthy yet", unhealthy.name)));
        }
    }
    Ok(None)
}

fn bar_style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()).progress_chars("#>-")
}

pub(super) fn progress_bar(template: &str) -> ProgressBar {
    let bar = ProgressBar::new(0);
    bar.set_style(bar_style(template));
    bar
}

/// Follows an Operation to its end; Ctrl-C detaches.
async fn follow(client: &Client, name: &str) -> anyhow::Result<()> {
    // A spinner until the Operation knows how many members it moves (a
    // bar of 0/0 would show full).
    let bar = progress_bar("{spinner} {wide_msg}");
    let mut counted = false;
    let say = |line: String| if bar.is_hidden() { eprintln!("{line}") } else { bar.println(line) };
    let mut seen_history: Option<herd_core::time::Timestamp> = None;
    loop {
        let operation = client.get::<OperationSpec>(name).await?;
        let status = &operation.status;
        for entry in status.history.iter().filter(|h| seen_history.is_none_or(|seen| h.at > seen)) {
            say(format!("{}  {}", entry.at, entry.message));
        }
        seen_history = status.history.last().map(|h| h.at).or(seen_history);
        if status.total > 0 && !counted {
            bar.set_style(bar_style("{spinner} [{bar:30}] {pos}/{len} members {wide_msg}"));
            counted = true;
        }
        bar.set_length(u64::from(status.total));
        bar.set_position(u64::from(status.done));
        let blocker = status.blocker.as_ref().map(|b| {
            let since = short_duration(b.since.system_time().elapsed().unwrap_or_default());
            let never = if b.never { " [never allows: change the budget or add members]" } else { "" };
            format!("blocked {since}: {}{never}", b.message)
        });
        bar.set_message(blocker.unwrap_or_default());
        if status.phase.is_finished() {
            bar.finish_and_clear();
            let message = status.message.clone().unwrap_or_default();
            return match status.phase {
                OperationPhase::Succeeded => {
                    println!("operation/{name} succeeded: {message}");
                    Ok(())
                }
                OperationPhase::Stopped => {
                    println!("operation/{name} stopped: {message}");
                    Ok(())
                }
                phase => bail!("operation/{name} {}: {message}", phase_word(phase)),
            };
        }
        tokio::select! {
            _ = tokio::time::sleep(FOLLOW_EVERY) => {}
            _ = tokio::signal::ctrl_c() => {
                bar.abandon();
                println!(
                    "detached; operation/{name} goes on (`herd describe operation {name}`; \
                     `herd operation cancel {name}` stops it)"
                );
                return Ok(());
            }
        }
    }
}

fn phase_word(phase: OperationPhase) -> &'static str {
    match phase {
        OperationPhase::Pending => "pending",
        OperationPhase::Running => "running",
        OperationPhase::Succeeded => "succeeded",
        OperationPhase::Failed => "failed",
        OperationPhase::Stopped => "stopped",
        OperationPhase::Cancelled => "cancelled",
        OperationPhase::Reverted => "reverted",
    }
}

/// What a drain of `node` would meet now: each member's eviction asked of
/// its budgets alone (each as if it were the only one).
pub async fn drain_dry_run(client: &Client, node: &str) -> anyhow::Result<()> {
    let mut members: Vec<_> =
        client.list::<MemberSpec>("").await?.into_iter().filter(|m| m.spec.node.as_deref() == Some(node)).collect();
    members.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    println!("node {node} hosts {} member(s); each eviction asked alone (dry run: nothing changed):", members.len());
    for member in &members {
        let name = &member.metadata.name;
        match client.evict_member(name, true).await {
            Ok(eviction) => println!("  {name}: allowed: {}", eviction.message),
            Err(error) if error.reason() == Some(StatusReason::TooManyRequests) => {
                println!("  {name}: refused now: {error}")
            }
            Err(error) => println!("  {name}: cannot be evicted: {error}"),
        }
    }
    Ok(())
}

/// Cancels an Operation (only `spec.cancel` changes).
pub async fn cancel(client: &Client, name: &str) -> anyhow::Result<()> {
    let changed = set(client, name, "cancel", "cancel", true, |spec| spec.cancel).await?;
    println!(
        "operation/{name}: {}",
        match changed {
            true => "cancel asked; nothing more is started (members on their way go on)",
            false => "cancel asked already",
        }
    );
    Ok(())
}

/// Pauses an Operation (`pause`) or resumes it: only `spec.paused` changes.
pub async fn pause(client: &Client, name: &str, pause: bool) -> anyhow::Result<()> {
    let verb = if pause { "pause" } else { "resume" };
    let changed = set(client, name, verb, "paused", pause, |spec| spec.paused).await?;
    println!(
        "operation/{name}: {}",
        match (changed, pause) {
            (true, true) =>
                "paused; nothing more is started (members on their way go on) until `herd operation resume`",
            (true, false) => "resumed",
            (false, true) => "paused already",
            (false, false) => "not paused",
        }
    );
    Ok(())
}

/// Sets a running Operation's `spec.<field>` to `value` (a merge patch:
/// its status, written all the while, does not stand in the way);
/// whether that changed it. `verb` says what for, when it has ended.
async fn set(
    client: &Client,
    name: &str,
    verb: &str,
    field: &str,
    value: bool,
    now: impl Fn(&OperationSpec) -> bool,
) -> anyhow::Result<bool> {
    let operation = client.get::<OperationSpec>(name).await?;
    if operation.status.phase.is_finished() {
        let phase = phase_word(operation.status.phase);
        return Err(crate::Conflict(format!("operation/{name} has ended already ({phase}): nothing to {verb}")).into());
    }
    if now(&operation.spec) == value {
        return Ok(false);
    }
    client.patch_value(OperationSpec::PLURAL, name, &serde_json::json!({"spec": {field: value}})).await?;
    Ok(true)
}

/// Cancels the drains still running on `node`, then makes it regular.
pub async fn undrain(client: &Client, node: &str) -> anyhow::Result<()> {
    let operations = client.list::<OperationSpec>(&format!("{TARGET_LABEL}={node}")).await?;
    for operation in operations.iter().filter(|o| !o.status.phase.is_finished()) {
        cancel(client, &operation.metadata.name).await?;
    }
    let role = client.get::<NodeSpec>(node).await?.spec.role;
    if role != NodeRole::Drained {
        println!("node/{node} is not drained (its role is {}); nothing to do", serde_json::to_value(role)?);
        return Ok(());
    }
    let request = NodeRoleRequest { role: Some(NodeRole::Regular), master_capable: None, auto_promote: false };
    client.change_node_role(node, &request).await.with_context(|| format!("undraining node {node}"))?;
    println!("node/{node} regular: it takes new members again");
    Ok(())
}
