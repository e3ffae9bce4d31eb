//! What `herd describe appcluster|member|node|budget|operation` says before
//! the object itself: why a cluster is not configured (which members, in which state,
//! with which notifies pending since when, and why they wait), a member's
//! state, instance, setup outcome and notifies, a node's resources and
//! what its members request of them, a budget's counts,
//! who is not healthy and why, and its recent evictions; an Operation's
//! progress, blocker, steps and history.

use std::fmt::Write;
use std::time::SystemTime;

use herd_client::Client;
use herd_core::disruption;
use herd_core::kinds::app_cluster::RoleLeader;
use herd_core::kinds::member::PendingNotify;
use herd_core::kinds::{
    AppCluster, AppClusterSpec, DisruptionBudget, DisruptionBudgetSpec, Event, EventReason, EventSpec, Member,
    MemberSpec, Node, NodeSpec, Operation, OperationSpec, UpdateType,
};
use herd_core::resources::Kind;
use herd_core::{Resource, Timestamp};
use herd_core::{placement, usage};

use crate::output::short_duration;

fn ago(time: Option<Timestamp>) -> String {
    time.map(|t| {
        let age = SystemTime::now().duration_since(t.system_time()).unwrap_or_default();
        format!("since {t} ({} ago)", short_duration(age))
    })
    .unwrap_or_default()
}

/// "at <time> (in 12s)".
fn until(time: Timestamp) -> String {
    let left = time.system_time().duration_since(SystemTime::now()).unwrap_or_default();
    format!("at {time} (in {})", short_duration(left))
}

fn notify_line(notify: &PendingNotify) -> String {
    let error = notify.last_error.as_deref().map(|e| format!("; last error: {}", e.trim())).unwrap_or_default();
    format!("`{}`: {} attempts, {}{error}", notify.arguments.join(" "), notify.attempts, ago(notify.since))
}

fn member_lines(member: &Member, out: &mut String) {
    let status = &member.status;
    let detail = &status.state_detail;
    let instance = detail.last_configured_instance.as_deref().or(detail.configuring_instance.as_deref());
    let _ = writeln!(
        out,
        "  {}: {:?} on {}, instance {}, last known {:?}, {}{}",
        member.metadata.name,
        status.state,
        member.spec.node.as_deref().unwrap_or("no node"),
        instance.unwrap_or("-"),
        detail.last_known_state,
        if status.ready { "ready" } else { "not ready" },
        status.ready_changed_at.map(|t| format!(" {}", ago(Some(t)))).unwrap_or_default(),
    );
    if let Some(why) = status.not_ready_reason.as_deref().filter(|_| !status.ready) {
        let _ = writeln!(out, "    not ready: {why}");
    }
    if let Some(crash) = &detail.crash_loop {
        let next = crash.next_start.map(|t| format!("; next start {}", until(t))).unwrap_or_default();
        let _ = writeln!(
            out,
            "    crash loop: {} runs in a row ended within seconds (last: {}){next}",
            crash.runs, crash.last_exit
        );
    }
    if let Some(reason) = &status.reason {
        let _ = writeln!(out, "    why: {reason}");
    }
    if let Some(error) = &detail.config_error_detail {
        let _ = writeln!(out, "    config error: {}", error.trim());
    }
    for notify in &detail.pending_notify_cmds {
        let _ = writeln!(out, "    pending notify {}", notify_line(notify));
    }
}

/// Which revision of its App the cluster runs, and which each member
/// runs (and is to run), and why.
fn revision_lines(cluster: &AppCluster, members: &[Member], out: &mut String) {
    let Some(target) = cluster.status.app_revision else { return };
    let name = &cluster.metadata.name;
    let how = match cluster.spec.app_revision {
        Some(_) => "pinned by its appRevision",
        None => "the App's latest",
    };
    let policy = match cluster.spec.update_policy.type_ {
        UpdateType::Manual => "updatePolicy Manual: running members keep theirs until an upgrade",
        UpdateType::Rolling => "updatePolicy Rolling: a new revision is rolled out by itself",
    };
    let _ = writeln!(out, "App revision {target} ({how}; what new members start as; {policy})");
    let mut runs: std::collections::BTreeMap<(Option<i64>, Option<i64>), Vec<&str>> = Default::default();
    for member in members {
        runs.entry((member.status.app_revision, member.spec.app_revision)).or_default().push(&member.metadata.name);
    }
    for ((revision, to_run), names) in runs.iter().rev() {
        let names = names.join(", ");
        let _ = match (revision, to_run) {
            (Some(revision), Some(to_run)) if revision != to_run => {
                writeln!(out, "  runs revision {revision}, to restart as revision {to_run}: {names}")
            }
            (Some(revision), _) if *revision == target => writeln!(out, "  runs revision {revision}: {names}"),
            (Some(revision), _) => writeln!(
                out,
                "  runs revision {revision}: {names} (not the cluster's: `herd appcluster upgrade {name}` brings it \
                 to revision {target})"
            ),
            (None, _) => writeln!(out, "  not started yet: {names}"),
        };
    }
}

/// The summary of an AppCluster and its members.
pub fn cluster_summary(cluster: &AppCluster, members: &[Member]) -> String {
    let status = &cluster.status;
    let mut out = format!(
        "AppCluster {} of App {}: {:?} (generation {}, last pass saw {})\n",
        cluster.metadata.name,
        cluster.spec.app_ref,
        status.state,
        cluster.metadata.generation,
        status.observed_generation.map_or("none".to_string(), |g| g.to_string())
    );
    if let Some(reason) = &status.reason {
        let _ = writeln!(out, "Why not configured: {reason}");
    }
    for leader in &status.leaders {
        leader_lines(leader, &mut out);
    }
    revision_lines(cluster, members, &mut out);
    let _ = writeln!(out, "Members ({}):", members.len());
    for member in members {
        member_lines(member, &mut out);
    }
    out
}

/// A leader role's lease: its holder, term and since when, or why it has
/// none (or why its holder is not renewed), then each grant.
fn leader_lines(leader: &RoleLeader, out: &mut String) {
    let times = match (leader.lease_duration, leader.renew_deadline) {
        (Some(lease), Some(renew)) => format!(" (lease {lease}, renew deadline {renew})"),
        _ => String::new(),
    };
    let _ = match (&leader.member, &leader.waiting) {
        (Some(member), None) => writeln!(
            out,
            "Leader of role {}: {member}, term {}, {}{times}",
            leader.role,
            leader.term,
            ago(leader.since)
        ),
        (holder, Some(why)) => {
            let last = holder.as_ref().map(|m| format!(", last {m} in term {}", leader.term)).unwrap_or_default();
            writeln!(out, "Leader of role {}: none now{last}: {why}{times}", leader.role)
        }
        (None, None) => writeln!(out, "Leader of role {}: none yet{times}", leader.role),
    };
    for transition in &leader.transitions {
        let _ = writeln!(
            out,
            "  term {} to {} at {}: {}",
            transition.term, transition.member, transition.at, transition.reason
        );
    }
}

/// The summary of one Member.
pub fn member_summary(member: &Member) -> String {
    let mut out =
        format!("Member {} of AppCluster {}, role {}:\n", member.metadata.name, member.spec.cluster, member.spec.role);
    member_lines(member, &mut out);
    out
}

/// A node's resources: what it has, what members may request of it, and
/// what its members request (each resource's share of the allocatable).
pub fn node_summary(node: &Node, members: &[Member]) -> String {
    let mut out = format!("Node {}:\n", node.metadata.name);
    let (Some(capacity), Some(allocatable)) = (node.status.capacity, node.status.allocatable) else {
        out.push_str("  resources: not reported yet (members that request any are not placed here)\n");
        return out;
    };
    let load = placement::loads(members).remove(&node.metadata.name).unwrap_or_default();
    let _ = writeln!(out, "  capacity:    {capacity}");
    let _ = writeln!(out, "  allocatable: {allocatable}");
    let shares: Vec<String> = Kind::ALL
        .iter()
        .map(|&kind| {
            let (requested, of) = (load.requested.get(kind), allocatable.get(kind));
            let share = usage::percent(requested, of).map(|percent| format!(" ({percent}%)")).unwrap_or_default();
            format!("{} {}{share}", kind.name(), kind.show(requested))
        })
        .collect();
    let _ = writeln!(out, "  requested by {} members: {}", load.members, shares.join(", "));
    out
}

/// How many of a budget's members' MemberEvicted events are shown.
const RECENT_EVICTIONS: usize = 10;

/// A budget's counts, whether an eviction would be allowed now, who is not
/// healthy and why, the evictions approved and not yet taken effect, and
/// the members it selects that were evicted most recently.
pub fn budget_summary(budget: &DisruptionBudget, evictions: &[Event]) -> String {
    let status = &budget.status;
    let mut out = String::new();
    let bound = match (budget.spec.min_available, budget.spec.max_unavailable) {
        (Some(min), _) => format!("minAvailable {min}"),
        (None, Some(max)) => format!("maxUnavailable {max}"),
        (None, None) => "no bound".into(),
    };
    let _ = writeln!(
        out,
        "DisruptionBudget {} over {:?} ({bound}, unhealthy members: {:?}):",
        budget.metadata.name, budget.spec.selector, budget.spec.unhealthy_eviction_policy
    );
    if disruption::is_stale(budget) {
        let _ = writeln!(out, "  not counted for generation {} yet: evictions wait", budget.metadata.generation);
    }
    let _ = writeln!(
        out,
        "  {} healthy of {} expected, {} needed: {} eviction(s) allowed now",
        status.current_healthy, status.expected_members, status.desired_healthy, status.disruptions_allowed
    );
    if status.expected_members == 0 {
        let _ = writeln!(out, "  selects no member (yet): it is asked about no eviction");
    }
    if let Some(never) = disruption::never_allows(budget) {
        let _ = writeln!(out, "  warning: {never}");
    }
    for unhealthy in &status.unhealthy {
        let _ = writeln!(out, "  not healthy: {} is {}", unhealthy.name, unhealthy.reason);
    }
    for (member, approved) in &status.disrupted_members {
        let _ = writeln!(out, "  eviction approved, not yet taken effect: {member} {}", ago(Some(*approved)));
    }
    for event in evictions.iter().take(RECENT_EVICTIONS) {
        let _ =
            writeln!(out, "  evicted: {} {}", event.spec.involved_object.name, ago(Some(event.spec.last_timestamp)));
    }
    out
}

/// An Operation's phase and progress, what blocks it and since when,
/// where each member stands, and what happened.
pub fn operation_summary(operation: &Operation) -> String {
    let (spec, status) = (&operation.spec, &operation.status);
    let mut out = String::new();
    let deadline =
        spec.deadline.map(|d| format!("deadline {d}, then {:?}", spec.on_deadline)).unwrap_or("no deadline".into());
    let _ = writeln!(
        out,
        "Operation {} ({:?} of {}; {deadline}; at most {} at once{}):",
        operation.metadata.name,
        status.phase,
        spec.action.target(),
        spec.max_parallel,
        match (spec.cancel, spec.paused) {
            (true, _) => "; cancel asked",
            (false, true) => "; paused",
            (false, false) => "",
        }
    );
    if let Some(progress) = &status.upgrade {
        let _ = writeln!(out, "  the cluster ran revision {} before", progress.from_revision);
        if let Some(why) = &progress.reverting {
            let _ = writeln!(out, "  reverted: {why}");
        }
    }
    let _ = writeln!(out, "  {} of {} members done {}", status.done, status.total, ago(status.started_at));
    if let Some(message) = &status.message {
        let _ = writeln!(out, "  {message}");
    }
    if let Some(blocker) = &status.blocker {
        let never = if blocker.never { " (it never will as it stands)" } else { "" };
        let _ = writeln!(out, "  blocked{never}: {} {}", blocker.message, ago(Some(blocker.since)));
    }
    for step in &status.steps {
        let forced = if step.forced { ", forced" } else { "" };
        let message = step.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default();
        let revisions = match (step.from_revision, step.to_revision) {
            (Some(from), Some(to)) => format!(" (revision {from} to {to})"),
            (None, Some(to)) => format!(" (to revision {to})"),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "  step {}{revisions}: {:?} {}, {} attempt(s){forced}{message}",
            step.member,
            step.state,
            ago(Some(step.since)),
            step.attempts
        );
    }
    for entry in &status.history {
        let _ = writeln!(out, "  {}  {}", entry.at, entry.message);
    }
    out
}

/// The summary for `kind`, when it has one.
pub async fn summary(client: &Client, kind: &str, name: &str) -> anyhow::Result<Option<String>> {
    Ok(match kind {
        AppClusterSpec::KIND => {
            let cluster = client.get::<AppClusterSpec>(name).await?;
            let mut members = client.list::<MemberSpec>(&format!("herd.io/cluster={name}")).await?;
            members.sort_by_key(|m| (m.spec.role.clone(), m.spec.index));
            Some(cluster_summary(&cluster, &members))
        }
        MemberSpec::KIND => Some(member_summary(&client.get::<MemberSpec>(name).await?)),
        NodeSpec::KIND => {
            let node = client.get::<NodeSpec>(name).await?;
            Some(node_summary(&node, &client.list::<MemberSpec>("").await?))
        }
        DisruptionBudgetSpec::KIND => {
            let budget = client.get::<DisruptionBudgetSpec>(name).await?;
            let members = client.list::<MemberSpec>("").await?;
            let mut evictions: Vec<Event> = client
                .list::<EventSpec>("")
                .await?
                .into_iter()
                .filter(|e| {
                    e.spec.reason_is(EventReason::MemberEvicted)
                        && members
                            .iter()
                            .any(|m| m.metadata.name == e.spec.involved_object.name && disruption::selects(&budget, m))
                })
                .collect();
            evictions.sort_by_key(|e| std::cmp::Reverse(e.spec.last_timestamp));
            Some(budget_summary(&budget, &evictions))
        }
        OperationSpec::KIND => Some(operation_summary(&client.get::<OperationSpec>(name).await?)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use herd_core::quantity::{Bytes, Millicores};
    use herd_core::resources::Amounts;

    #[test]
    fn a_node_says_what_its_members_request_of_what_it_has() {
        let mut node = Node::new("node-2", Default::default());
        assert!(node_summary(&node, &[]).contains("not reported yet"));
        let has = Amounts { cpu: Millicores(2000), memory: Bytes(8 << 30), disk: Bytes(100 << 30) };
        node.status.capacity = Some(has);
        node.status.allocatable = Some(has.minus(&Amounts { cpu: Millicores(100), ..Default::default() }));
        let member = |name: &str, on: &str, cpu: u64| {
            let resources = Amounts { cpu: Millicores(cpu), memory: Bytes(2 << 30), ..Default::default() };
            Member::new(name, MemberSpec { node: Some(on.into()), resources, ..Default::default() })
        };
        let members = [member("a", "node-2", 950), member("b", "node-2", 0), member("c", "node-1", 500)];
        assert_eq!(
            node_summary(&node, &members),
            "Node node-2:\n  capacity:    cpu 2, memory 8Gi, disk 100Gi\n  allocatable: cpu 1900m, memory 8Gi, disk 100Gi\n  requested by 2 members: cpu 950m (50%), memory 4Gi (50%), disk 0 (0%)\n"
        );
    }
}
