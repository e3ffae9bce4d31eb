//! The app-cluster controller (leader only): one pass per AppCluster,
//! planned by `herd_core::app_plan` from what the caches show (the
//! cluster, its App, its members, their Commands, the nodes, the time)
//! and carried out here ([`apply`]): each member's writes in order, each
//! over the revision the one before left, then its Commands and Events.
//! Every decision is herd-core's; this module reads the caches, writes
//! through the fence and issues Commands.
//!
//! It runs on the keyed runtime, one cluster at a time: a change of the
//! cluster, its App, its members, their Commands or their nodes wakes it
//! (`AppClusterController::watches`), and a busy cluster requeues only
//! itself (a role waiting out its leader's lease, for the lease's end). Members whose AppCluster is gone, and members a node runs that
//! no Member binds there, are the [`janitor`]'s.

mod apply;
pub mod janitor;
mod ledger;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herd_core::app_plan::{NodeIndex, Snapshot, plan};
use herd_core::kinds::app_cluster::AppCluster;
use herd_core::kinds::app_revision::{AppRevision, AppRevisionSpec, revision_name};
use herd_core::kinds::operation::Handover;
use herd_core::kinds::{
    AppClusterSpec, AppSpec, ClusterConfigSpec, Command, CommandSpec, Member, MemberSpec, Node, NodeSpec,
    OperationAction, OperationPhase, OperationSpec,
};
use herd_core::upgrade;
use tokio::time::Instant;

use self::ledger::{Ledger, Placing};
use crate::change_clock::ChangeClock;
use crate::commands::Issuer;
use crate::controllers::keyed::{Action as Next, KeyedController, Watches};
use crate::events::EventRecorder;
use crate::nodes::cluster_config;
use crate::objects::{Objects, ObjectsError, now};
use crate::reflector::Reflector;
use crate::role_leases::RoleLeases;

/// How soon a cluster with work in flight is looked at again.
const BUSY_REQUEUE: Duration = Duration::from_millis(500);
/// How often a quiet one is (KubeDirector requeues every 30 s).
const QUIET_REQUEUE: Duration = Duration::from_secs(10);

fn cluster_of(command: &Command) -> Option<&str> {
    command.spec.origin_cluster()
}

pub struct AppClusterController {
    objects: Objects,
    /// Since when each node has been Ready or NotReady, on this leader's clock.
    readiness: Mutex<ChangeClock<bool>>,
    /// What members take of the nodes, shared by the reconciles running
    /// side by side.
    ledger: Ledger,
    /// The nodes looked up by name, kept while the nodes cache is at the
    /// revision they were taken at.
    nodes_index: Mutex<Option<(Option<herd_store::Revision>, Arc<Nodes>)>>,
    apps: Reflector<AppSpec>,
    /// The App as of the revisions clusters are pinned to and members run.
    revisions: Reflector<AppRevisionSpec>,
    clusters: Reflector<AppClusterSpec>,
    members: Reflector<MemberSpec>,
    nodes: Reflector<NodeSpec>,
    commands: Reflector<CommandSpec>,
    config: Reflector<ClusterConfigSpec>,
    /// Switchovers ask their handovers of the clusters' leader roles.
    operations: Reflector<OperationSpec>,
    /// Its Commands for Ready nodes are created issued.
    issuer: Issuer,
    events: EventRecorder,
    /// When heartbeats last renewed each role leader lease.
    role_leases: Arc<RoleLeases>,
}

/// The caches the controller reads.
#[derive(Clone)]
pub struct Caches {
    pub apps: Reflector<AppSpec>,
    pub revisions: Reflector<AppRevisionSpec>,
    pub clusters: Reflector<AppClusterSpec>,
    pub members: Reflector<MemberSpec>,
    pub nodes: Reflector<NodeSpec>,
    pub commands: Reflector<CommandSpec>,
    pub config: Reflector<ClusterConfigSpec>,
    pub operations: Reflector<OperationSpec>,
}

impl AppClusterController {
    pub fn new(
        objects: Objects,
        caches: Caches,
        issuer: Issuer,
        events: EventRecorder,
        role_leases: Arc<RoleLeases>,
    ) -> Self {
        let Caches { apps, revisions, clusters, members, nodes, commands, config, operations } = caches;
        AppClusterController {
            objects,
            readiness: Mutex::default(),
            ledger: Ledger::default(),
            nodes_index: Mutex::default(),
            apps,
            revisions,
            clusters,
            members,
            nodes,
            commands,
            config,
            operations,
            issuer,
            events,
            role_leases,
        }
    }

    /// What wakes a cluster: a change of itself, of its App, of one of its
    /// members or their Commands, of a node one of its members is on (or
    /// moving to, or reported by), or of any node while it has a member
    /// to place, or of a switchover of its; every cluster on a settings
    /// change.
    pub fn watches(&self) -> Watches {
        let clusters = self.clusters.clone();
        let members = self.members.clone();
        Watches::new()
            .owns(&self.clusters)
            .all_on(&self.config)
            .watches(&self.apps, move |old, new| {
                let apps: BTreeSet<&str> = old.into_iter().chain(new).map(|a| a.metadata.name.as_str()).collect();
                let using = clusters.map(|c| apps.contains(c.spec.app_ref.as_str()).then(|| c.metadata.name.clone()));
                using.into_iter().flatten().collect()
            })
            .watches(&self.members, |old, new| {
                let clusters: BTreeSet<String> = old.into_iter().chain(new).map(|m| m.spec.cluster.clone()).collect();
                clusters.into_iter().collect()
            })
            .watches(&self.operations, |old, new| {
                let clusters: BTreeSet<&str> = old
                    .into_iter()
                    .chain(new)
                    .filter_map(|o| match &o.spec.action {
                        OperationAction::Switchover { cluster, .. } | OperationAction::Upgrade { cluster, .. } => {
                            Some(cluster.as_str())
                        }
                        _ => None,
                    })
                    .collect();
                clusters.into_iter().map(str::to_string).collect()
            })
            .watches(&self.commands, |old, new| {
                let clusters: BTreeSet<&str> = old.into_iter().chain(new).filter_map(cluster_of).collect();
                clusters.into_iter().map(str::to_string).collect()
            })
            .watches(&self.nodes, move |old, new| {
                // The clusters whose members it runs (or ran); and when it
                // can take members now or no more (its readiness, role or
                // schedulability changed), those with members bound to it,
                // moving to it, or waiting for a node.
                let nodes: Vec<&Node> = old.into_iter().chain(new).collect();
                let mut clusters: BTreeSet<String> =
                    nodes.iter().flat_map(|n| n.status.members.iter().filter_map(|r| r.cluster.clone())).collect();
                let takes_members = |n: &Node| (n.status.ready, n.spec.clone());
                if old.map(takes_members) != new.map(takes_members) {
                    let names: BTreeSet<&str> = nodes.iter().map(|n| n.metadata.name.as_str()).collect();
                    let near = |m: &Member| {
                        m.spec.node.as_deref().is_none_or(|n| names.contains(n))
                            || m.status.migration.as_ref().is_some_and(|to| names.contains(to.to.as_str()))
                    };
                    clusters.extend(members.map(|m| near(m).then(|| m.spec.cluster.clone())).into_iter().flatten());
                }
                clusters.into_iter().collect()
            })
    }

    /// The nodes looked up by name, taken again when the nodes cache took
    /// a change that matters (not a heartbeat's time).
    fn nodes_index(&self) -> Arc<Nodes> {
        let revision = self.nodes.revision_that_matters();
        let mut index = self.nodes_index.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match &*index {
            Some((at, nodes)) if *at == revision => nodes.clone(),
            _ => {
                let nodes = Arc::new(Nodes::of(self.nodes.list_shared()));
                *index = Some((revision, nodes.clone()));
                nodes
            }
        }
    }
}

impl KeyedController for AppClusterController {
    const NAME: &'static str = "app-clusters";

    async fn synced(&self) {
        self.apps.synced().await;
        self.revisions.synced().await;
        self.clusters.synced().await;
        self.members.synced().await;
        self.nodes.synced().await;
        self.commands.synced().await;
        self.config.synced().await;
        self.operations.synced().await;
    }

    fn keys(&self) -> Vec<String> {
        self.clusters.map(|c| c.metadata.name.clone())
    }

    /// One pass over the cluster named `name` (a cluster gone is the
    /// janitor's).
    async fn reconcile(&self, name: &str) -> Result<Next, ObjectsError> {
        let Some(cluster) = self.clusters.get_shared(name) else { return Ok(Next::AwaitChange) };
        let nodes = self.nodes_index();
        let (members, orphans): (Vec<Arc<Member>>, Vec<Arc<Member>>) = self
            .members
            .list_shared()
            .into_iter()
            .filter(|m| m.spec.cluster == name)
            .partition(|m| owned_by(m, &cluster));
        let members: Vec<Member> = members.into_iter().map(Arc::unwrap_or_clone).collect();
        let not_ready = self.not_ready_for(members.iter().filter_map(|m| m.spec.node.as_deref()), &nodes);
        // The Commands of members of a former cluster of this name are the
        // janitor's (it removes those members): not read here.
        let orphans: BTreeSet<&str> = orphans.iter().map(|m| m.metadata.name.as_str()).collect();
        let commands: Vec<Arc<Command>> = self
            .commands
            .list_shared()
            .into_iter()
            .filter(|c| cluster_of(c) == Some(name) && !c.spec.origin_member().is_some_and(|m| orphans.contains(m)))
            .collect();
        let app = self.apps.get(&cluster.spec.app_ref);
        // The revision the cluster runs, and the App as of it and of each
        // other revision a member is to run.
        let latest = app.as_ref().map(|a| a.metadata.generation);
        let target = cluster.spec.app_revision.or(latest);
        let kept: Vec<Arc<AppRevision>> = members
            .iter()
            .filter_map(|m| m.spec.app_revision)
            .chain(target)
            .collect::<BTreeSet<i64>>()
            .into_iter()
            .filter(|r| Some(*r) != latest)
            .filter_map(|r| self.revisions.get_shared(&revision_name(&cluster.spec.app_ref, r)))
            .collect();
        let revisions: BTreeMap<i64, &AppSpec> = kept.iter().map(|r| (r.spec.revision, &r.spec.app_spec)).collect();
        let cluster_app = match target {
            Some(revision) if target != latest => revisions.get(&revision).copied(),
            _ => app.as_ref().map(|a| &a.spec),
        };
        let at = Instant::now();
        let leases: BTreeMap<String, Duration> = cluster
            .status
            .leaders
            .iter()
            .map(|l| (l.role.clone(), self.role_leases.since(name, &l.role, l.term, at)))
            .collect();
        let heard: BTreeMap<String, Duration> = members
            .iter()
            .filter_map(|m| m.spec.node.as_deref())
            .filter_map(|node| Some((node.to_string(), self.role_leases.silent_for(node, at)?)))
            .collect();
        let settings = cluster_config(&self.config).app_clusters;
        let handovers = self.handovers(name);
        let rolling = target.and_then(|t| upgrade::rolling_upgrade(&cluster, &members, t, self.upgrading(name)));
        let plan = {
            let snapshot = Snapshot {
                cluster: &cluster,
                app: cluster_app,
                app_revision: target,
                revisions: &revisions,
                settings: &settings,
                members,
                commands: &commands,
                nodes: &*nodes,
                not_ready: &not_ready,
                leases: &leases,
                heard: &heard,
                handovers: &handovers,
                now: now(),
            };
            let mut placing = Placing::new(&self.ledger, &self.nodes, &self.members, &nodes.list);
            let mut ids = || uuid::Uuid::now_v7().simple().to_string();
            plan(&snapshot, &mut placing, &mut ids)
        };
        let look_again_in = plan.look_again_in;
        let in_flight = self.apply(&cluster, plan).await?;
        if let Some(operation) = rolling {
            self.start_upgrade(operation).await?;
        }
        let requeue = if in_flight { BUSY_REQUEUE } else { QUIET_REQUEUE };
        // A moment past the lease's end, so that the pass then sees it ended.
        let at_lease_end = look_again_in.map(|remaining| remaining + Duration::from_millis(5));
        Ok(Next::Requeue(at_lease_end.map_or(requeue, |at| requeue.min(at))))
    }
}

impl AppClusterController {
    /// Whether an upgrade of cluster `name` is under way.
    fn upgrading(&self, name: &str) -> bool {
        let of_it = |o: &herd_core::kinds::Operation| {
            matches!(&o.spec.action, OperationAction::Upgrade { cluster, .. } if cluster == name)
                && !o.status.phase.is_finished()
        };
        self.operations.map(|o| of_it(o)).into_iter().any(|x| x)
    }

    /// Starts the upgrade a cluster under `updatePolicy: Rolling` asks for
    /// (one started before, of the same name, is not started again).
    async fn start_upgrade(&self, operation: herd_core::kinds::Operation) -> Result<(), ObjectsError> {
        let name = operation.metadata.name.clone();
        match self.objects.create(operation, false, false).await {
            Ok(_) => {
                tracing::info!(operation = %name, "a new revision started an upgrade (updatePolicy: Rolling)");
                Ok(())
            }
            Err(ObjectsError::AlreadyExists { .. }) => Ok(()),
            Err(other) => Err(other),
        }
    }

    /// The handovers the running switchovers and upgrades of cluster
    /// `name` ask, by role.
    fn handovers(&self, name: &str) -> Vec<(String, Handover)> {
        let asked = |o: &herd_core::kinds::Operation| match (&o.spec.action, &o.status.handover) {
            (OperationAction::Switchover { cluster, role, .. }, Some(handover))
                if cluster == name && o.status.phase == OperationPhase::Running =>
            {
                Some((role.clone(), handover.clone()))
            }
            // An upgrade's leader hands its lease over before its restart.
            (OperationAction::Upgrade { cluster, .. }, Some(handover))
                if cluster == name && o.status.phase == OperationPhase::Running =>
            {
                let role = self.members.get(&handover.from)?.spec.role;
                Some((role, handover.clone()))
            }
            _ => None,
        };
        self.operations.map(asked).into_iter().flatten().collect()
    }
}

fn owned_by(member: &Member, cluster: &AppCluster) -> bool {
    member.spec.cluster == cluster.metadata.name
        && member.metadata.owner_references.iter().all(|o| Some(&o.uid) == cluster.metadata.uid.as_ref())
}

/// The nodes, looked up by name: a pass asks for a member's node many
/// times, and a walk of a thousand nodes each time adds up.
struct Nodes {
    list: Vec<Arc<Node>>,
    by_name: HashMap<String, usize>,
    /// The members some node runs and wants running.
    running: HashSet<String>,
}

impl Nodes {
    fn of(list: Vec<Arc<Node>>) -> Nodes {
        let by_name = list.iter().enumerate().map(|(i, n)| (n.metadata.name.clone(), i)).collect();
        let running =
            list.iter().flat_map(|n| n.status.members.iter().filter(|r| r.wanted).map(|r| r.name.clone())).collect();
        Nodes { list, by_name, running }
    }

    fn get(&self, name: &str) -> Option<&Node> {
        self.by_name.get(name).map(|&i| &*self.list[i])
    }

    /// What `member`'s node reports of it.
    fn report(&self, member: &Member) -> Option<&herd_core::api::MemberReport> {
        let node = self.get(member.spec.node.as_deref()?)?;
        node.status.members.iter().find(|r| r.name == member.metadata.name)
    }
}

impl NodeIndex for Nodes {
    fn node(&self, name: &str) -> Option<&Node> {
        self.get(name)
    }

    fn all(&self) -> &[Arc<Node>] {
        &self.list
    }

    fn runs(&self, name: &str) -> bool {
        self.running.contains(name)
    }
}

impl AppClusterController {
    /// How long each of `bound` (the nodes a cluster's members are on)
    /// has been NotReady, as this leader saw it: a node's change wakes the
    /// clusters with members on it, so it is seen when it happens.
    fn not_ready_for<'a>(&self, bound: impl IntoIterator<Item = &'a str>, nodes: &Nodes) -> BTreeMap<String, Duration> {
        let now = Instant::now();
        let names: BTreeSet<&str> = bound.into_iter().collect();
        let mut clock = self.readiness.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // Nodes that are gone are forgotten once the clock holds more than there are.
        if clock.len() > nodes.list.len() {
            clock.retain(|name| nodes.get(name).is_some());
        }
        names
            .into_iter()
            .filter_map(|name| {
                let ready = nodes.get(name)?.status.ready;
                let held = clock.since(name, ready, now);
                (!ready).then(|| (name.to_string(), held))
            })
            .collect()
    }
}
