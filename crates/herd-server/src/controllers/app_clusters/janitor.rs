//! The app-cluster janitor (leader only): what no cluster's reconcile
//! owns. Members whose AppCluster is gone (deleted, or replaced by another
//! of the same name) are removed from their nodes and deleted; a member a
//! node runs that no Member binds there is removed from that node, so
//! that one slot never runs in two places; the settled Commands of
//! members that are gone are deleted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use herd_core::kinds::app_cluster::AppCluster;
use herd_core::kinds::{
    Action, AppClusterSpec, CommandSpec, EventReason, EventType, Member, MemberSpec, MemberState, NodeSpec, Purpose,
};
use herd_core::member_sync::{MemberFacts, Step, member_sync};

use super::{Caches, Nodes, owned_by};
use crate::controllers::runtime::{Controller, Next, Trigger};
use crate::events::EventRecorder;
use crate::objects::{Objects, ObjectsError};
use crate::reflector::Reflector;
use herd_core::app_plan::command_for;

/// How often it looks when nothing wakes it.
const QUIET_REQUEUE: Duration = Duration::from_secs(10);
/// How soon again while orphans are left.
const BUSY_REQUEUE: Duration = Duration::from_millis(500);

pub struct Janitor {
    objects: Objects,
    clusters: Reflector<AppClusterSpec>,
    members: Reflector<MemberSpec>,
    nodes: Reflector<NodeSpec>,
    commands: Reflector<CommandSpec>,
    events: EventRecorder,
}

impl Janitor {
    pub fn new(objects: Objects, caches: &Caches, events: EventRecorder) -> Self {
        Janitor {
            objects,
            clusters: caches.clusters.clone(),
            members: caches.members.clone(),
            nodes: caches.nodes.clone(),
            commands: caches.commands.clone(),
            events,
        }
    }
}

impl Controller for Janitor {
    const NAME: &'static str = "app-cluster-janitor";
    /// A burst of changes is one pass.
    const MIN_GAP: Duration = Duration::from_millis(200);

    async fn synced(&self) {
        self.clusters.synced().await;
        self.members.synced().await;
        self.nodes.synced().await;
        self.commands.synced().await;
    }

    /// What wakes it: any change of a cluster, a member, a Command, or a
    /// node's report.
    fn triggers(&self) -> Vec<Trigger> {
        vec![self.clusters.changes(), self.members.changes(), self.commands.changes(), self.nodes.changes_that_matter()]
    }

    async fn reconcile(&mut self) -> Result<Next, ObjectsError> {
        let orphans_left = self.orphans().await?;
        self.strays().await?;
        self.sweep().await?;
        Ok(Next::Requeue(if orphans_left { BUSY_REQUEUE } else { QUIET_REQUEUE }))
    }
}

impl Janitor {
    /// Members whose cluster is gone: removed from their nodes, then
    /// deleted. True while any is left.
    async fn orphans(&self) -> Result<bool, ObjectsError> {
        let clusters: BTreeMap<String, Arc<AppCluster>> =
            self.clusters.list_shared().into_iter().map(|c| (c.metadata.name.clone(), c)).collect();
        let orphans: Vec<Member> = self
            .members
            .list_shared()
            .into_iter()
            .filter(|m| !clusters.get(&m.spec.cluster).is_some_and(|c| owned_by(m, c)))
            .map(Arc::unwrap_or_clone)
            .collect();
        if orphans.is_empty() {
            return Ok(false);
        }
        let nodes = Nodes::of(self.nodes.list_shared());
        let mut removed = BTreeSet::new();
        let mut busy = BTreeSet::new();
        let mut settled: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for command in self.commands.list_shared() {
            let Some(member) = command.spec.origin_member().filter(|m| orphans.iter().any(|o| o.metadata.name == *m))
            else {
                continue;
            };
            if !command.status.state_by_management.is_settled() {
                busy.insert(member.to_string());
                continue;
            }
            if matches!(command.spec.action, Action::RemoveMember { .. })
                && command.status.answer.as_ref().is_some_and(|a| a.success)
            {
                removed.insert(member.to_string());
            }
            settled.entry(member.to_string()).or_default().push(command.metadata.name.clone());
        }
        for mut member in orphans {
            let name = member.metadata.name.clone();
            member.status.state = MemberState::Deleting;
            let report = nodes.report(&member).cloned();
            let facts = MemberFacts {
                generation: 0,
                bound: member.spec.node.is_some(),
                report: report.as_ref(),
                has_setup: false,
                persistent: false,
                busy: busy.contains(&name),
                removed: removed.contains(&name),
                digest: None,
            };
            match member_sync(&mut member.status, &facts) {
                Step::Forget { .. } => {
                    self.objects.delete_if_present::<MemberSpec>(&name).await?;
                    for command in settled.remove(&name).unwrap_or_default() {
                        self.objects.delete_if_present::<CommandSpec>(&command).await?;
                    }
                    crate::commands::forget_holds(&self.objects, &name).await?;
                    let message = format!(
                        "removed{} with its volumes: its AppCluster {} is gone",
                        member.spec.node.as_ref().map(|n| format!(" from node {n}")).unwrap_or_default(),
                        member.spec.cluster
                    );
                    self.events.record(&member, EventType::Normal, EventReason::MemberRemoved, message).await;
                }
                Step::Remove => {
                    let action = Action::RemoveMember { member: name.clone() };
                    if let Some(command) = command_for(
                        &member.spec.cluster,
                        &member,
                        Purpose::Remove,
                        action,
                        &uuid::Uuid::now_v7().simple().to_string(),
                    ) {
                        match crate::commands::create(&self.objects, command, false).await {
                            Ok(_) | Err(ObjectsError::Held(_)) => {}
                            Err(error) => return Err(error),
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(true)
    }

    /// App-cluster members a node runs that no Member binds to it (deleted
    /// by the operator, or bound elsewhere since): removed from that node,
    /// so that one slot never runs in two places. The binding is read from
    /// the store, not the cache, before anything is removed.
    async fn strays(&self) -> Result<(), ObjectsError> {
        // A NotReady node's report is stale, and it could not act on a
        // Command: its strays are removed once it is back.
        for node in self.nodes.list_shared().into_iter().filter(|n| n.status.ready) {
            for report in node.status.members.iter().filter(|r| r.cluster.is_some() && r.wanted) {
                // Bound there, or moving there with its data.
                let belongs = |m: &Member| {
                    m.spec.node.as_ref() == Some(&node.metadata.name)
                        || m.status.migration.as_ref().is_some_and(|to| to.to == node.metadata.name)
                };
                if self.members.get_shared(&report.name).is_some_and(|m| belongs(&m)) {
                    continue;
                }
                let stored = self.objects.get::<MemberSpec>(&report.name).await?;
                if stored.as_ref().is_some_and(belongs) {
                    continue;
                }
                // The node's report as stored too: the cache may show one
                // from before the node forgot the member (a move's end).
                let reported = self.objects.get::<NodeSpec>(&node.metadata.name).await?;
                let still = reported.is_some_and(|n| {
                    n.status
                        .members
                        .iter()
                        .any(|r| r.name == report.name && r.wanted && r.instance_id == report.instance_id)
                });
                if !still {
                    continue;
                }
                let mut stray = Member::new(report.name.clone(), MemberSpec::default());
                stray.spec.node = Some(node.metadata.name.clone());
                let cluster = report.cluster.clone().unwrap_or_default();
                let action = Action::RemoveMember { member: report.name.clone() };
                let Some(command) =
                    command_for(&cluster, &stray, Purpose::Remove, action, &uuid::Uuid::now_v7().simple().to_string())
                else {
                    continue;
                };
                match crate::commands::create(&self.objects, command, false).await {
                    Ok(created) => {
                        // An instance the member left behind (a replace, a
                        // move) is expected to go: no warning.
                        let retired = stored.as_ref().is_some_and(|m| {
                            report.instance_id.as_ref().is_some_and(|i| m.status.retired_instances.contains(i))
                        });
                        let bound =
                            stored.and_then(|m| m.spec.node).map_or("no node".to_string(), |n| format!("node {n}"));
                        let (type_, reason, message) = if retired {
                            let what = format!(
                                "member {}'s old instance {} runs on node {}, which it left (it is on {bound}): \
                                 removing it there",
                                report.name,
                                report.instance_id.as_deref().unwrap_or("?"),
                                node.metadata.name
                            );
                            (EventType::Normal, EventReason::OldInstanceRemoved, what)
                        } else {
                            let what = format!(
                                "member {} runs on node {} but is bound to {bound}: removing it there",
                                report.name, node.metadata.name
                            );
                            (EventType::Warning, EventReason::StrayMember, what)
                        };
                        self.events.record(&created, type_, reason, message).await;
                    }
                    Err(ObjectsError::Held(_)) => {}
                    Err(error) => return Err(error),
                }
            }
        }
        Ok(())
    }

    /// Deletes settled Commands of this controller whose member is gone
    /// (a stray's removal, the last of a deleted member's).
    async fn sweep(&self) -> Result<(), ObjectsError> {
        for command in self.commands.list_shared() {
            let Some(member) = command.spec.origin_member() else { continue };
            if command.status.state_by_management.is_settled() && self.members.get_shared(member).is_none() {
                self.objects.delete_if_present::<CommandSpec>(&command.metadata.name).await?;
            }
        }
        Ok(())
    }
}
