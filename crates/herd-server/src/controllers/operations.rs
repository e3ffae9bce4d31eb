//! The operations controller (leader only): carries out drains and
//! rolling restarts (`herd_core::operation` decides each step). A Pending
//! drain marks its node drained (under the pool's rules, promoting another
//! candidate if the node was one) and starts; a Running Operation asks for
//! the evictions (a restart's: restarts in place) the pass decided,
//! through the same path as the eviction API, records how each went and
//! writes the status. Everything it needs to go on is in
//! that status, so a new leader resumes a drain where the old one was: a
//! member whose approval was never recorded is asked again, and the
//! eviction API answers that its eviction is under way.

use std::collections::BTreeSet;
use std::time::Duration;

use herd_core::Resource;
use herd_core::disruption;
use herd_core::kinds::{
    DisruptionBudgetSpec, MemberSpec, NodeRole, NodeSpec, Operation, OperationAction, OperationPhase, OperationSpec,
    OperationStatus,
};
use herd_core::operation::{self, Outcome, View};
use herd_core::roles::RoleChange;

use crate::controllers::runtime::{Controller, Next};
use crate::error::ApiError;
use crate::events::EventRecorder;
use crate::eviction::Disruption;
use crate::nodes::cluster_config;
use crate::objects::{Objects, ObjectsError, now};
use crate::reflector::Reflector;
use herd_core::kinds::ClusterConfigSpec;

/// How often running Operations are looked at when nothing wakes them.
const PASS_INTERVAL: Duration = Duration::from_secs(5);

pub struct OperationsController {
    objects: Objects,
    operations: Reflector<OperationSpec>,
    members: Reflector<MemberSpec>,
    budgets: Reflector<DisruptionBudgetSpec>,
    nodes: Reflector<NodeSpec>,
    config: Reflector<ClusterConfigSpec>,
    events: EventRecorder,
    /// The budgets' revisions at the last pass: when they moved, every
    /// refused eviction is asked again at once (the count it was refused
    /// on has changed).
    budgets_seen: Vec<(String, Option<String>)>,
}

/// The caches the controller reads.
pub struct Caches {
    pub operations: Reflector<OperationSpec>,
    pub members: Reflector<MemberSpec>,
    pub budgets: Reflector<DisruptionBudgetSpec>,
    pub nodes: Reflector<NodeSpec>,
    pub config: Reflector<ClusterConfigSpec>,
}

impl OperationsController {
    pub fn new(objects: Objects, caches: Caches, events: EventRecorder) -> Self {
        let Caches { operations, members, budgets, nodes, config } = caches;
        OperationsController { objects, operations, members, budgets, nodes, config, events, budgets_seen: Vec::new() }
    }

    /// Deletes the Operations finished longer ago than
    /// `operation::FINISHED_KEPT`, each at the revision seen (one changed
    /// or gone meanwhile is left for the next pass).
    async fn delete_expired(&self) -> Result<(), ObjectsError> {
        let at = now();
        let expired = self.operations.map(|o| {
            let revision = o.metadata.revision().ok().flatten()?;
            operation::expired(o, at).then(|| (o.metadata.name.clone(), revision))
        });
        for (name, revision) in expired.into_iter().flatten() {
            match self.objects.delete_value("Operation", OperationSpec::PLURAL, &name, Some(revision), false).await {
                Ok(_) => tracing::info!(operation = %name, "deleted a finished operation kept its day"),
                Err(ObjectsError::NotFound { .. } | ObjectsError::Conflict { .. }) => {}
                Err(other) => return Err(other),
            }
        }
        Ok(())
    }

    /// Takes up a Pending Operation: a drain's node marked drained, or the
    /// reason it cannot be.
    async fn begin(&self, op: &Operation) -> Result<OperationStatus, ObjectsError> {
        let at = now();
        let other = self.operations.list().into_iter().find(|other| {
            other.metadata.name != op.metadata.name
                && other.spec.action == op.spec.action
                && other.status.phase == OperationPhase::Running
        });
        if let Some(other) = other {
            let why = format!("operation {} does the same already", other.metadata.name);
            return Ok(operation::refuse(&op.status, why, at));
        }
        let node = match &op.spec.action {
            OperationAction::Drain { node } => node,
            OperationAction::Restart { cluster, role, canary } => {
                let canaries = if *canary > 0 { format!(", {canary} canary first") } else { String::new() };
                let said = format!("restarting role {role} of {cluster}{canaries}");
                return Ok(operation::begin(&op.status, said, at));
            }
        };
        let pool = cluster_config(&self.config).candidate_pool_size as usize;
        let change = RoleChange::Role(NodeRole::Drained);
        match crate::node_roles::change(&self.objects, &self.events, pool, node, change, true).await {
            Ok(updates) => {
                let promoted: Vec<&str> = updates.iter().filter(|u| u.name != *node).map(|u| u.name.as_str()).collect();
                let mut said = format!("draining {node}: marked drained (it takes no new members)");
                if !promoted.is_empty() {
                    said += &format!("; {} promoted to master candidate in its place", promoted.join(", "));
                }
                Ok(operation::begin(&op.status, said, at))
            }
            // Not an answer about the node: this replica cannot write now.
            Err(error @ (ApiError::Fenced(_) | ApiError::Unavailable(_) | ApiError::Internal(_))) => {
                tracing::info!(operation = %op.metadata.name, %error, "drain to be taken up again");
                Ok(op.status.clone())
            }
            Err(refused) => Ok(operation::refuse(&op.status, format!("node {node} cannot be drained: {refused}"), at)),
        }
    }

    /// One pass of a Running Operation: the evictions it decided, asked for.
    async fn work(&self, op: &Operation, retry_refused: bool) -> OperationStatus {
        let (how, node) = match &op.spec.action {
            OperationAction::Drain { node } => (Disruption::Move, Some(node)),
            OperationAction::Restart { .. } => (Disruption::Restart, None),
        };
        let members = self.members.list();
        let drained = node.and_then(|node| self.nodes.get(node));
        let reported: BTreeSet<String> =
            drained.as_ref().map(|n| n.status.members.iter().map(|m| m.name.clone()).collect()).unwrap_or_default();
        let reporter_ready = drained.as_ref().is_none_or(|n| n.status.ready);
        let view = View { members: &members, reported: &reported, reporter_ready };
        let at = now();
        let (mut status, orders) = operation::pass(op, &view, retry_refused, at);
        for order in orders {
            let asked = if order.force {
                crate::eviction::force(&self.objects, &self.events, &order.member, how).await
            } else {
                crate::eviction::disrupt(&self.objects, &self.events, &order.member, false, how)
                    .await
                    .map(|e| e.message)
            };
            let outcome = match asked {
                Ok(message) => Outcome::Evicted(message),
                Err(refused) => {
                    let never = members.iter().find(|m| m.metadata.name == order.member).and_then(|member| {
                        self.budgets
                            .list()
                            .iter()
                            .filter(|b| disruption::selects(b, member))
                            .find_map(disruption::never_allows)
                    });
                    Outcome::Refused { message: refused.to_string(), never: never.is_some() }
                }
            };
            operation::record(&mut status, &order.member, order.force, outcome, now());
        }
        status
    }
}

impl Controller for OperationsController {
    const NAME: &'static str = "operations";

    async fn synced(&self) {
        self.operations.synced().await;
        self.members.synced().await;
        self.budgets.synced().await;
        self.nodes.synced().await;
        self.config.synced().await;
    }

    async fn reconcile(&mut self) -> Result<Next, ObjectsError> {
        let budgets_now = self.budgets.map(|b| (b.metadata.name.clone(), b.metadata.resource_version.clone()));
        let retry_refused = budgets_now != self.budgets_seen;
        self.budgets_seen = budgets_now;
        let mut next = PASS_INTERVAL;
        self.delete_expired().await?;
        let unfinished = self.operations.map(|o| (!o.status.phase.is_finished()).then(|| o.metadata.name.clone()));
        for name in unfinished.into_iter().flatten() {
            // Read from the store, not the cache: a pass must start from the
            // last status written (the cache may not show it yet, and a pass
            // on an older one would forget the steps taken since).
            let Some(op) = self.objects.get::<OperationSpec>(&name).await? else { continue };
            let status = match op.status.phase {
                OperationPhase::Pending => self.begin(&op).await?,
                OperationPhase::Running => self.work(&op, retry_refused).await,
                _ => continue,
            };
            if let Some(due) = operation::next_pass(&Operation { status: status.clone(), ..op.clone() }, now()) {
                next = next.min(due.max(Duration::from_millis(100)));
            }
            if status == op.status {
                continue;
            }
            // Only over the object this pass started from: anything written
            // meanwhile (a cancel, a pass of another leader) is where the
            // next pass starts (an eviction asked again is the same one).
            match self.objects.update_status(Operation { status, ..op }, false).await {
                Ok(_) | Err(ObjectsError::NotFound { .. }) => {}
                Err(ObjectsError::Conflict { .. }) => next = Duration::from_millis(100),
                Err(other) => return Err(other),
            }
        }
        Ok(Next::Requeue(next))
    }
}
