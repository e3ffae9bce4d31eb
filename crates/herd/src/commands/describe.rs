//! What `herd describe appcluster|member` says before the object itself:
//! why a cluster is not configured (which members, in which state, with
//! which notifies pending since when, and why they wait), and a member's
//! state, instance, setup outcome and notifies.

use std::fmt::Write;
use std::time::SystemTime;

use herd_client::Client;
use herd_core::Timestamp;
use herd_core::kinds::member::PendingNotify;
use herd_core::kinds::{AppCluster, AppClusterSpec, Member, MemberSpec};

use crate::output::short_duration;

fn ago(time: Option<Timestamp>) -> String {
    time.map(|t| {
        let age = SystemTime::now().duration_since(t.system_time()).unwrap_or_default();
        format!("since {t} ({} ago)", short_duration(age))
    })
    .unwrap_or_default()
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
        "  {}: {:?} on {}, instance {}, last known {:?}{}",
        member.metadata.name,
        status.state,
        member.spec.node.as_deref().unwrap_or("no node"),
        instance.unwrap_or("-"),
        detail.last_known_state,
        if status.ready { ", ready" } else { "" },
    );
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
    let _ = writeln!(out, "Members ({}):", members.len());
    for member in members {
        member_lines(member, &mut out);
    }
    out
}

/// The summary of one Member.
pub fn member_summary(member: &Member) -> String {
    let mut out =
        format!("Member {} of AppCluster {}, role {}:\n", member.metadata.name, member.spec.cluster, member.spec.role);
    member_lines(member, &mut out);
    out
}

/// The summary for `kind`, when it has one.
pub async fn summary(client: &Client, kind: &str, name: &str) -> anyhow::Result<Option<String>> {
    Ok(match kind {
        "AppCluster" => {
            let cluster = client.get::<AppClusterSpec>(name).await?;
            let mut members = client.list::<MemberSpec>(&format!("herd.io/cluster={name}")).await?;
            members.sort_by_key(|m| (m.spec.role.clone(), m.spec.index));
            Some(cluster_summary(&cluster, &members))
        }
        "Member" => Some(member_summary(&client.get::<MemberSpec>(name).await?)),
        _ => None,
    })
}
