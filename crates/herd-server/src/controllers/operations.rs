//! The operations controller (leader only): carries out drains, rolling
//! restarts and switchovers (`herd_core::operation` and
//! `herd_core::switchover` decide each step; a switchover's handover is
//! carried out by the app-cluster planner, which reads it from here). A Pending
//! drain marks its node drained (under the pool's rules, promoting another
//! candidate if the node was one) and starts; a Running Operation asks for
//! the evictions (a restart's: restarts in place) the pass decided,
//! through the same path as the eviction API, records how each went and
//! writes the status. Everything it needs to go on is in
//! that status, so a new leader resumes a drain where the old one was: a
//! member whose approval was never recorded is asked again, and the
//! eviction API answers that its eviction is under way.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use herd_core::Resource;
use herd_core::disruption;
use herd_core::kinds::operation::UpgradeProgress;
use herd_core::kinds::{
    AppClusterSpec, AppSpec, DisruptionBudgetSpec, MemberSpec, NodeRole, NodeSpec, Operation, OperationAction,
    OperationPhase, OperationSpec, OperationStatus,
};
use herd_core::operation::{self, Outcome, View};
use herd_core::roles::RoleChange;
use herd_core::{switchover, upgrade};

use crate::controllers::keyed::{Action, KeyedController, Watches};
use crate::events::EventRecorder;
use crate::eviction::{Disruption, EvictionError};
use crate::node_roles::RoleChangeError;
use crate::nodes::cluster_config;
use crate::objects::{Objects, ObjectsError, Part, now};
use crate::reflector::Reflector;
use herd_core::kinds::ClusterConfigSpec;

/// How often a running Operation is looked at when nothing wakes it.
const PASS_INTERVAL: Duration = Duration::from_secs(5);
/// How often a finished one is, until it is deleted.
const FINISHED_INTERVAL: Duration = Duration::from_secs(60);

pub struct OperationsController {
    objects: Objects,
    operations: Reflector<OperationSpec>,
    members: Reflector<MemberSpec>,
    budgets: Reflector<DisruptionBudgetSpec>,
    nodes: Reflector<NodeSpec>,
    config: Reflector<ClusterConfigSpec>,
    clusters: Reflector<AppClusterSpec>,
    apps: Reflector<AppSpec>,
    events: EventRecorder,
    /// The budgets' revisions at each Operation's last pass: when they
    /// moved, its refused evictions are asked again at once (the count
    /// they were refused on has changed).
    budgets_seen: Mutex<HashMap<String, BudgetRevisions>>,
}

/// Each budget's name and resourceVersion.
type BudgetRevisions = Vec<(String, Option<String>)>;

/// The caches the controller reads.
pub struct Caches {
    pub operations: Reflector<OperationSpec>,
    pub members: Reflector<MemberSpec>,
    pub budgets: Reflector<DisruptionBudgetSpec>,
    pub nodes: Reflector<NodeSpec>,
    pub config: Reflector<ClusterConfigSpec>,
    pub clusters: Reflector<AppClusterSpec>,
    pub apps: Reflector<AppSpec>,
}

impl OperationsController {
    pub fn new(objects: Objects, caches: Caches, events: EventRecorder) -> Self {
        let Caches { operations, members, budgets, nodes, config, clusters, apps } = caches;
        let budgets_seen = Mutex::default();
        OperationsController {
            objects,
            operations,
            members,
            budgets,
            nodes,
            config,
            clusters,
            apps,
            events,
            budgets_seen,
        }
    }

    /// What wakes an Operation: a change of itself, of a member or node it
    /// works on, of the cluster it works on, or of any budget (its
    /// refusals are asked again).
    pub fn watches(&self) -> Watches {
        let on_cluster = {
            let operations = self.operations.clone();
            move |cluster: &str| -> Vec<String> {
                let works_on = |o: &Operation| match &o.spec.action {
                    OperationAction::Restart { cluster: c, .. }
                    | OperationAction::Switchover { cluster: c, .. }
                    | OperationAction::Upgrade { cluster: c, .. } => c == cluster,
                    OperationAction::Drain { .. } => false,
                };
                operations.map(|o| works_on(o).then(|| o.metadata.name.clone())).into_iter().flatten().collect()
            }
        };
        let on_cluster_too = on_cluster.clone();
        let operations = self.operations.clone();
        let on_node = move |node: &str| -> Vec<String> {
            operations
                .map(|o| {
                    matches!(&o.spec.action, OperationAction::Drain { node: n } if n == node)
                        .then(|| o.metadata.name.clone())
                })
                .into_iter()
                .flatten()
                .collect()
        };
        let on_node_too = on_node.clone();
        Watches::new()
            .owns(&self.operations)
            .all_on(&self.budgets)
            .watches(&self.clusters, move |old, new| {
                let names: BTreeSet<&str> = old.into_iter().chain(new).map(|c| c.metadata.name.as_str()).collect();
                names.into_iter().flat_map(&on_cluster).collect()
            })
            .watches(&self.nodes, move |old, new| {
                let names: BTreeSet<&str> = old.into_iter().chain(new).map(|n| n.metadata.name.as_str()).collect();
                names.into_iter().flat_map(&on_node).collect()
            })
            .watches(&self.members, move |old, new| {
                let members: Vec<_> = old.into_iter().chain(new).collect();
                let mut woken: BTreeSet<String> =
                    members.iter().filter_map(|m| m.spec.node.as_deref()).flat_map(&on_node_too).collect();
                let clusters: BTreeSet<&str> = members.iter().map(|m| m.spec.cluster.as_str()).collect();
                woken.extend(clusters.into_iter().flat_map(&on_cluster_too));
                woken.into_iter().collect()
            })
    }

    /// Deletes `op` once it finished longer ago than
    /// `operation::FINISHED_KEPT`, at the revision seen (one changed or
    /// gone meanwhile is left for its next pass); whether it was.
    async fn delete_if_expired(&self, op: &Operation) -> Result<bool, ObjectsError> {
        let Some(revision) = op.metadata.revision().ok().flatten().filter(|_| operation::expired(op, now())) else {
            return Ok(false);
        };
        let name = &op.metadata.name;
        match self.objects.delete_value(OperationSpec::KIND, OperationSpec::PLURAL, name, Some(revision), false).await {
            Ok(_) => tracing::info!(operation = %name, "deleted a finished operation kept its day"),
            Err(ObjectsError::NotFound { .. } | ObjectsError::Conflict { .. }) => {}
            Err(other) => return Err(other),
        }
        Ok(true)
    }

    /// Whether the budgets moved since `name`'s last pass.
    fn budgets_moved(&self, name: &str) -> bool {
        let budgets_now = self.budgets.map(|b| (b.metadata.name.clone(), b.metadata.resource_version.clone()));
        let mut seen = self.budgets_seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        seen.insert(name.to_string(), budgets_now.clone()).is_none_or(|before| before != budgets_now)
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
            OperationAction::Switchover { cluster, role, to } => {
                let to = to.as_deref().map_or_else(|| "the most advanced member that may lead".into(), str::to_string);
                return Ok(operation::begin(
                    &op.status,
                    format!("switching role {role} of {cluster} over to {to}"),
                    at,
                ));
            }
            OperationAction::Restart { cluster, role, canary } => {
                let canaries = if *canary > 0 { format!(", {canary} canary first") } else { String::new() };
                let said = format!("restarting role {role} of {cluster}{canaries}");
                return Ok(operation::begin(&op.status, said, at));
            }
            OperationAction::Upgrade { cluster, to_revision, canary, .. } => {
                return self.begin_upgrade(op, cluster, *to_revision, *canary).await;
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
            Err(RoleChangeError::Refused(refused)) => {
                Ok(operation::refuse(&op.status, format!("node {node} cannot be drained: {refused}"), at))
            }
            // Not an answer about the node: taken up again on the next pass.
            Err(RoleChangeError::Contended(_)) => Ok(op.status.clone()),
            Err(RoleChangeError::Objects(failed)) => Err(failed),
        }
    }

    /// One pass of a Running Operation: the evictions it decided, asked
    /// for, and how each went. It stops at the first eviction that got no
    /// answer (the store failed, or the member and its budgets kept
    /// changing): that one is not recorded, and it and the rest are asked
    /// on the next pass.
    async fn work(&self, op: &Operation, retry_refused: bool) -> (OperationStatus, Option<EvictionError>) {
        let (how, node) = match &op.spec.action {
            OperationAction::Drain { node } => (Disruption::Move, Some(node)),
            OperationAction::Restart { .. } => (Disruption::Restart, None),
            OperationAction::Upgrade { to_revision, .. } => (Disruption::Upgrade { to: *to_revision }, None),
            OperationAction::Switchover { cluster, role, .. } => return self.switch_over(op, cluster, role).await,
        };
        let irreversible = match &op.spec.action {
            OperationAction::Upgrade { cluster, to_revision, .. } => {
                match self.irreversible(cluster, *to_revision).await {
                    Ok(irreversible) => irreversible,
                    Err(failed) => return (op.status.clone(), Some(failed.into())),
                }
            }
            _ => None,
        };
        let members = self.members.list();
        let drained = node.and_then(|node| self.nodes.get(node));
        let reported: BTreeSet<String> =
            drained.as_ref().map(|n| n.status.members.iter().map(|m| m.name.clone()).collect()).unwrap_or_default();
        let reporter_ready = drained.as_ref().is_none_or(|n| n.status.ready);
        let cluster = match &op.spec.action {
            OperationAction::Upgrade { cluster, .. } => self.clusters.get(cluster),
            _ => None,
        };
        let leaders = cluster.map(|c| c.status.leaders).unwrap_or_default();
        let view = View { members: &members, reported: &reported, reporter_ready, irreversible, leaders: &leaders };
        let at = now();
        let (mut status, orders) = operation::pass(op, &view, retry_refused, at);
        if let Err(failed) = self.pin_for_revert(op, &status).await {
            return (op.status.clone(), Some(failed.into()));
        }
        for order in orders {
            // An upgrade's order names the revision (its revert's, the one before).
            let how = match (how, order.to_revision) {
                (Disruption::Upgrade { .. }, Some(to)) => Disruption::Upgrade { to },
                (how, _) => how,
            };
            let asked = if order.force {
                crate::eviction::force(&self.objects, &self.events, &order.member, how).await.map_err(Into::into)
            } else {
                crate::eviction::disrupt(&self.objects, &self.events, &order.member, false, how)
                    .await
                    .map(|e| e.message)
            };
            let outcome = match asked {
                Ok(message) => Outcome::Evicted(message),
                Err(refused @ EvictionError::Refused { .. }) => {
                    let never = members.iter().find(|m| m.metadata.name == order.member).and_then(|member| {
                        self.budgets
                            .list()
                            .iter()
                            .filter(|b| disruption::selects(b, member))
                            .find_map(disruption::never_allows)
                    });
                    Outcome::Refused { message: refused.to_string(), never: never.is_some() }
                }
                Err(unanswered) => return (status, Some(unanswered)),
            };
            operation::record(&mut status, &order.member, order.force, outcome, now());
        }
        (status, None)
    }
}

impl OperationsController {
    /// One pass of a Running switchover (`herd_core::switchover`): the
    /// budgets that select the leader are asked (a dry run: the leader
    /// stands down and comes back a follower, a disruption like a
    /// restart) until the handover is recorded.
    async fn switch_over(&self, op: &Operation, cluster: &str, role: &str) -> (OperationStatus, Option<EvictionError>) {
        let found = self.clusters.get(cluster);
        let leader = found.as_ref().and_then(|c| c.status.leaders.iter().find(|l| l.role == role));
        let synchronous = found
            .as_ref()
            .and_then(|c| self.apps.get(&c.spec.app_ref))
            .and_then(|app| app.spec.role(role).and_then(|r| r.leader.as_ref()).map(|l| l.synchronous))
            .unwrap_or(false);
        let members: Vec<_> =
            self.members.list().into_iter().filter(|m| m.spec.cluster == cluster && m.spec.role == role).collect();
        let holder = leader.and_then(|l| l.member.as_deref()).filter(|_| op.status.handover.is_none());
        let budgets = match holder {
            None => Ok(()),
            Some(holder) => {
                match crate::eviction::disrupt(&self.objects, &self.events, holder, true, Disruption::Restart).await {
                    Ok(_) => Ok(()),
                    Err(EvictionError::Refused { why, .. }) => Err(why),
                    Err(unanswered) => return (op.status.clone(), Some(unanswered)),
                }
            }
        };
        let view = switchover::View { leader, members: &members, synchronous, budgets };
        (switchover::pass(op, &view, now()), None)
    }
}

impl OperationsController {
    /// Takes up an upgrade: the cluster pinned to the revision (unless it
    /// follows the App's latest and that is the revision), so that
    /// members made meanwhile start as it, and what it ran before recorded
    /// (a revert pins it back).
    async fn begin_upgrade(
        &self,
        op: &Operation,
        cluster: &str,
        to: i64,
        canary: u32,
    ) -> Result<OperationStatus, ObjectsError> {
        let at = now();
        let Some(found) = self.objects.get::<AppClusterSpec>(cluster).await? else {
            return Ok(operation::refuse(&op.status, format!("there is no AppCluster {cluster}"), at));
        };
        let latest = self.objects.get::<AppSpec>(&found.spec.app_ref).await?.map(|a| a.metadata.generation);
        let members = self.members.list();
        let running = members.iter().filter(|m| m.spec.cluster == cluster).filter_map(|m| m.spec.app_revision);
        let Some(from) = upgrade::prevailing(running).or(found.spec.app_revision).or(latest) else {
            return Ok(operation::refuse(&op.status, format!("App {} does not exist", found.spec.app_ref), at));
        };
        let pinned_before = found.spec.app_revision;
        if pinned_before.is_some() || latest != Some(to) {
            self.pin(cluster, to).await?;
        }
        let canaries = if canary > 0 { format!(", {canary} canary first") } else { String::new() };
        let said = format!("upgrading {cluster} from revision {from} to {to}{canaries}");
        let mut status = operation::begin(&op.status, said, at);
        status.upgrade = Some(UpgradeProgress { pinned_before, from_revision: from, reverting: None });
        Ok(status)
    }

    /// Pins `cluster` to `revision` of its App.
    async fn pin(&self, cluster: &str, revision: i64) -> Result<(), ObjectsError> {
        self.objects
            .modify::<AppClusterSpec, ObjectsError>(cluster, Part::Spec, |c| {
                Ok(c.spec.app_revision.replace(revision) != Some(revision))
            })
            .await?;
        Ok(())
    }

    /// A reverted upgrade's cluster pinned back to the revision it ran
    /// before: members made from then on start as that one, and an
    /// upgrade under `updatePolicy: Rolling` does not start again by itself.
    async fn pin_for_revert(&self, op: &Operation, status: &OperationStatus) -> Result<(), ObjectsError> {
        let (OperationAction::Upgrade { cluster, .. }, Some(progress)) = (&op.spec.action, &status.upgrade) else {
            return Ok(());
        };
        if progress.reverting.is_none() {
            return Ok(());
        }
        match self.clusters.get(cluster) {
            Some(found) if found.spec.app_revision != Some(progress.from_revision) => {
                self.pin(cluster, progress.from_revision).await
            }
            _ => Ok(()),
        }
    }

    /// Why revision `revision` of `cluster`'s App may not be reverted, if
    /// its App says so.
    async fn irreversible(&self, cluster: &str, revision: i64) -> Result<Option<String>, ObjectsError> {
        let Some(found) = self.clusters.get(cluster) else { return Ok(None) };
        let spec = crate::app_revisions::spec_at(&self.objects, &found.spec.app_ref, revision).await?;
        Ok(spec.ok().and_then(|app| app.upgrade.irreversible))
    }
}

impl KeyedController for OperationsController {
    const NAME: &'static str = "operations";

    async fn synced(&self) {
        self.operations.synced().await;
        self.members.synced().await;
        self.budgets.synced().await;
        self.nodes.synced().await;
        self.config.synced().await;
        self.clusters.synced().await;
        self.apps.synced().await;
    }

    fn keys(&self) -> Vec<String> {
        self.operations.map(|o| o.metadata.name.clone())
    }

    async fn reconcile(&self, name: &str) -> Result<Action, ObjectsError> {
        // Read from the store, not the cache: a pass must start from the
        // last status written (the cache may not show it yet, and a pass
        // on an older one would forget the steps taken since).
        let Some(op) = self.objects.get::<OperationSpec>(name).await? else {
            self.budgets_seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(name);
            return Ok(Action::AwaitChange);
        };
        let retry_refused = self.budgets_moved(name);
        let (status, unanswered) = match op.status.phase {
            OperationPhase::Pending => (self.begin(&op).await?, None),
            OperationPhase::Running => self.work(&op, retry_refused).await,
            _ => {
                self.delete_if_expired(&op).await?;
                return Ok(Action::Requeue(FINISHED_INTERVAL));
            }
        };
        let mut next = PASS_INTERVAL;
        // Only an upgrade's next pass depends on its members (when one has
        // been ready long enough): no copy of every member for the others.
        let members = if op.spec.action.pace().is_some() { self.members.list() } else { Vec::new() };
        if let Some(due) = operation::next_pass(&Operation { status: status.clone(), ..op.clone() }, &members, now()) {
            next = next.min(due.max(Duration::from_millis(100)));
        }
        if status != op.status {
            // Only over the object this pass started from: anything
            // written meanwhile (a cancel, a pass of another leader) is
            // where the next pass starts (an eviction asked again is the
            // same one).
            match self.objects.update_status(Operation { status, ..op }, false).await {
                Ok(_) | Err(ObjectsError::NotFound { .. }) => {}
                Err(ObjectsError::Conflict { .. }) => next = Duration::from_millis(100),
                Err(other) => return Err(other),
            }
        }
        match unanswered {
            None => {}
            Some(EvictionError::Objects(failed)) => return Err(failed),
            Some(contended) => {
                tracing::info!(operation = %name, error = %contended, "eviction to be asked again");
                next = Duration::from_millis(100);
            }
        }
        Ok(Action::Requeue(next))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use async_trait::async_trait;
    use herd_core::Object;
    use herd_core::kinds::{OnDeadline, StepState};
    use herd_store::sqlite::SqliteBackend;
    use herd_store::{Backend, Committed, Event, KeyValue, Revision, Store, StoreError, Txn};
    use tokio_util::sync::CancellationToken;

    use super::*;

    /// SQLite whose next `failing` commits fail, as a database that is
    /// briefly unreachable does.
    struct Flaky {
        inner: SqliteBackend,
        failing: Arc<AtomicU32>,
    }

    #[async_trait]
    impl Backend for Flaky {
        fn name(&self) -> &'static str {
            "flaky-sqlite"
        }
        async fn get(&self, key: &str) -> Result<(Option<KeyValue>, Revision), StoreError> {
            self.inner.get(key).await
        }
        async fn range(
            &self,
            prefix: &str,
            start_after: Option<&str>,
            limit: usize,
        ) -> Result<(Vec<KeyValue>, Revision), StoreError> {
            self.inner.range(prefix, start_after, limit).await
        }
        async fn commit(&self, batch: Vec<Txn>) -> Result<Committed, StoreError> {
            let fail = self.failing.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
            if fail {
                return Err(StoreError::Backend("the database went away".into()));
            }
            self.inner.commit(batch).await
        }
        async fn events_after(&self, after: Revision, limit: usize) -> Result<Vec<Event>, StoreError> {
            self.inner.events_after(after, limit).await
        }
        async fn compact(&self, upto: Revision) -> Result<(), StoreError> {
            self.inner.compact(upto).await
        }
    }

    fn member(name: &str, node: &str) -> Object<MemberSpec> {
        let spec = MemberSpec { cluster: "c1".into(), role: "r".into(), node: Some(node.into()), ..Default::default() };
        Object::new(name, spec)
    }

    #[tokio::test]
    async fn a_store_failure_during_a_drains_eviction_is_retried_never_recorded_as_refused() {
        let dir = tempfile::tempdir().unwrap();
        let failing = Arc::new(AtomicU32::new(0));
        let inner = SqliteBackend::open(&dir.path().join("s.db")).await.unwrap();
        let store = Store::new(Arc::new(Flaky { inner, failing: failing.clone() })).await.unwrap();
        let objects = Objects::new(store.clone());
        for node in ["n1", "n2"] {
            let mut node = Object::new(node, NodeSpec::default());
            node.status.ready = true;
            objects.create(node, true, false).await.unwrap();
        }
        objects.create(member("c1-r-0", "n1"), false, false).await.unwrap();
        let drain = OperationSpec {
            action: OperationAction::Drain { node: "n1".into() },
            deadline: None,
            on_deadline: OnDeadline::default(),
            max_parallel: 1,
            cancel: false,
            paused: false,
        };
        objects.create(Object::new("drain-n1", drain), false, false).await.unwrap();

        let stop = CancellationToken::new();
        let _stop = stop.clone().drop_guard();
        let caches = Caches {
            operations: Reflector::start(store.clone(), stop.clone()),
            members: Reflector::start(store.clone(), stop.clone()),
            budgets: Reflector::start(store.clone(), stop.clone()),
            nodes: Reflector::start(store.clone(), stop.clone()),
            config: Reflector::start(store.clone(), stop.clone()),
            clusters: Reflector::start(store.clone(), stop.clone()),
            apps: Reflector::start(store.clone(), stop.clone()),
        };
        let controller =
            OperationsController::new(objects.clone(), caches, EventRecorder::new(objects.clone(), "test"));
        controller.synced().await;
        controller.reconcile("drain-n1").await.unwrap();
        let running = objects.require::<OperationSpec>("drain-n1").await.unwrap();
        assert_eq!(running.status.phase, OperationPhase::Running, "{:?}", running.status);

        // The eviction's write (the first of the pass) fails.
        failing.store(1, Ordering::SeqCst);
        let failed = controller.reconcile("drain-n1").await;
        assert!(matches!(failed, Err(ObjectsError::Store(_))), "the pass failed for the runtime to retry: {failed:?}");
        let after = objects.require::<OperationSpec>("drain-n1").await.unwrap();
        let step = after.status.steps.iter().find(|s| s.member == "c1-r-0").unwrap();
        assert_eq!(step.state, StepState::Waiting, "not refused: {step:?}");
        assert_eq!((step.attempts, &after.status.blocker), (0, &None), "{:?}", after.status);
        let member = objects.require::<MemberSpec>("c1-r-0").await.unwrap();
        assert!(member.spec.requests.replace.is_none(), "nothing approved");

        // The store is back: the next pass evicts it.
        controller.reconcile("drain-n1").await.unwrap();
        let after = objects.require::<OperationSpec>("drain-n1").await.unwrap();
        let step = after.status.steps.iter().find(|s| s.member == "c1-r-0").unwrap();
        assert_eq!((step.state, step.attempts), (StepState::Evicted, 1), "{step:?}");
        let member = objects.require::<MemberSpec>("c1-r-0").await.unwrap();
        assert!(member.spec.requests.replace.is_some(), "asked to be placed again");
    }
}
