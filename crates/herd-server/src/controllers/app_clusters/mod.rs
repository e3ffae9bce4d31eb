//! The app-cluster controller (leader only): one pass per AppCluster in
//! KubeDirector's order. First what happened (settled Commands read into the
//! members' statuses; each member checked against its node's report, a
//! changed instance being a restart), then role sync (members created or
//! sent away), then member sync (each member one step further: placed,
//! started, configured, removed), and at the end of every pass, whatever
//! happened: notifies queued and sent, the rollup computed, the statuses
//! written. Every decision is herd-core's; this module reads the caches,
//! writes through the fence and issues Commands.
//!
//! It runs on the keyed runtime, one cluster at a time: a change of the
//! cluster, its App, its members, their Commands or their nodes wakes it
//! (`AppClusterController::watches`), and a busy cluster requeues only
//! itself. Members whose AppCluster is gone, and members a node runs that
//! no Member binds there, are the [`janitor`]'s.

mod commands;
mod issuing;
pub mod janitor;
mod ledger;
mod migrating;
mod placing;
mod recovery;
mod restarting;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herd_core::configmeta::configmeta;
use herd_core::kinds::app_cluster::{AppCluster, cluster_status};
use herd_core::kinds::cluster_config::AppClusterSettings;
use herd_core::kinds::{
    Action, AppClusterSpec, AppSpec, ClusterConfigSpec, Command, CommandSpec, EventReason, EventType, Member,
    MemberSpec, MemberState, MemberStatus, Node, NodeSpec, Purpose,
};
use herd_core::member_check::{NodeSeen, Restart, Seen, check_member, crash_news, lost_news};
use herd_core::member_sync::{MemberFacts, Step, command_due, member_sync};
use herd_core::meta::OwnerReference;
use herd_core::notifies::{Change, notify_script, queue_notifies, to_send};
use herd_core::outcomes::{Recorded, record_outcome};
use herd_core::role_sync::{MemberChange, role_sync};
use herd_core::time::Timestamp;

use self::commands::{member_of, member_run};
use self::issuing::Issue;
use self::ledger::Ledger;
use crate::change_clock::ChangeClock;
use crate::commands::Issuer;
use crate::controllers::keyed::{Action as Next, KeyedController, Watches};
use crate::events::EventRecorder;
use crate::nodes::cluster_config;
use crate::objects::{Objects, ObjectsError, Part, now};
use crate::reflector::Reflector;

/// How soon a cluster with work in flight is looked at again.
const BUSY_REQUEUE: Duration = Duration::from_millis(500);
/// How often a quiet one is (KubeDirector requeues every 30 s).
const QUIET_REQUEUE: Duration = Duration::from_secs(10);

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
    clusters: Reflector<AppClusterSpec>,
    members: Reflector<MemberSpec>,
    nodes: Reflector<NodeSpec>,
    commands: Reflector<CommandSpec>,
    config: Reflector<ClusterConfigSpec>,
    /// Its Commands for Ready nodes are created issued.
    issuer: Issuer,
    events: EventRecorder,
}

/// The caches the controller reads.
#[derive(Clone)]
pub struct Caches {
    pub apps: Reflector<AppSpec>,
    pub clusters: Reflector<AppClusterSpec>,
    pub members: Reflector<MemberSpec>,
    pub nodes: Reflector<NodeSpec>,
    pub commands: Reflector<CommandSpec>,
    pub config: Reflector<ClusterConfigSpec>,
}

impl AppClusterController {
    pub fn new(objects: Objects, caches: Caches, issuer: Issuer, events: EventRecorder) -> Self {
        let Caches { apps, clusters, members, nodes, commands, config } = caches;
        AppClusterController {
            objects,
            readiness: Mutex::default(),
            ledger: Ledger::default(),
            nodes_index: Mutex::default(),
            apps,
            clusters,
            members,
            nodes,
            commands,
            config,
            issuer,
            events,
        }
    }

    /// What wakes a cluster: a change of itself, of its App, of one of its
    /// members or their Commands, of a node one of its members is on (or
    /// moving to, or reported by), or of any node while it has a member
    /// to place; every cluster on a settings change.
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
            .watches(&self.commands, |old, new| {
                let clusters: BTreeSet<&str> = old.into_iter().chain(new).filter_map(commands::cluster_of).collect();
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
        self.clusters.synced().await;
        self.members.synced().await;
        self.nodes.synced().await;
        self.commands.synced().await;
        self.config.synced().await;
    }

    fn keys(&self) -> Vec<String> {
        self.clusters.map(|c| c.metadata.name.clone())
    }

    /// One pass over the cluster named `name` (a cluster gone is the
    /// janitor's).
    async fn reconcile(&self, name: &str) -> Result<Next, ObjectsError> {
        let Some(cluster) = self.clusters.get_shared(name) else { return Ok(Next::AwaitChange) };
        let nodes = self.nodes_index();
        let members: Vec<Arc<Member>> =
            self.members.list_shared().into_iter().filter(|m| m.spec.cluster == *name).collect();
        let not_ready = self.not_ready_for(members.iter().filter_map(|m| m.spec.node.as_deref()), &nodes);
        let commands: Vec<Arc<Command>> =
            self.commands.list_shared().into_iter().filter(|c| commands::cluster_of(c) == Some(name)).collect();
        let in_flight = self.pass(&cluster, &not_ready, &nodes, &members, commands).await?;
        Ok(Next::Requeue(if in_flight { BUSY_REQUEUE } else { QUIET_REQUEUE }))
    }
}

/// What one pass works on for a cluster.
struct Pass<'a> {
    cluster: &'a AppCluster,
    settings: &'a AppClusterSettings,
    app: Option<&'a AppSpec>,
    nodes: &'a Nodes,
    /// The nodes this cluster's members are bound to (after placement).
    near: Vec<Arc<Node>>,
    /// What every cluster's members take (ports, members per node).
    ledger: &'a Ledger,
    /// This cluster's members as they are being changed.
    members: Vec<Member>,
    /// Members with an unsettled Command.
    busy: BTreeSet<String>,
    /// Members with an unsettled notify.
    notifying: BTreeSet<String>,
    /// Members whose RemoveMember succeeded.
    removed: BTreeSet<String>,
    /// Each member's settled Commands this pass read into its status:
    /// deleted with the write of that status (in its transaction), or at
    /// the end of the pass if it needs none.
    outcomes: BTreeMap<String, Vec<Arc<Command>>>,
    /// Each member's status as stored (as read, or as this pass wrote it).
    stored: BTreeMap<String, MemberStatus>,
    /// Members whose copy proved stale: nothing more is done for them.
    unwritten: BTreeSet<String>,
    /// How long this leader has seen each NotReady node so.
    not_ready: &'a BTreeMap<String, Duration>,
}

fn owned_by(member: &Member, cluster: &AppCluster) -> bool {
    member.spec.cluster == cluster.metadata.name
        && member.metadata.owner_references.iter().all(|o| Some(&o.uid) == cluster.metadata.uid.as_ref())
}

/// The round's nodes, looked up by name: a pass asks for a member's
/// node many times, and a walk of a thousand nodes each time adds up.
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

    /// What a pass sees of `member`: its node's report of it, taken as
    /// current only while the node is Ready.
    fn seen(&self, member: &Member, has_check: bool) -> Seen<'_> {
        let seen = Seen::from_report(self.report(member), has_check);
        match member.spec.node.as_deref().and_then(|name| self.get(name)) {
            Some(node) if !node.status.ready => {
                let condition = node.status.condition(herd_core::node_health::READY);
                seen.on(NodeSeen::NotReady {
                    node: &node.metadata.name,
                    since: condition.map(|c| c.last_transition_time),
                    why: condition.map_or("it has not sent a heartbeat", |c| c.message.as_str()),
                })
            }
            _ => seen,
        }
    }

    /// The nodes `members` are bound to.
    fn of_members(&self, members: &[Member]) -> Vec<Arc<Node>> {
        let names: BTreeSet<&str> = members.iter().filter_map(|m| m.spec.node.as_deref()).collect();
        names.into_iter().filter_map(|name| self.by_name.get(name).map(|&i| self.list[i].clone())).collect()
    }
}

impl AppClusterController {
    /// One pass over `cluster`: whether something is in flight.
    async fn pass(
        &self,
        cluster: &AppCluster,
        not_ready: &BTreeMap<String, Duration>,
        nodes: &Nodes,
        named: &[Arc<Member>],
        commands: Vec<Arc<Command>>,
    ) -> Result<bool, ObjectsError> {
        let app = self.apps.get(&cluster.spec.app_ref);
        let members: Vec<Member> = named.iter().filter(|m| owned_by(m, cluster)).map(|m| Member::clone(m)).collect();
        let stored = members.iter().map(|m| (m.metadata.name.clone(), m.status.clone())).collect();
        let settings = cluster_config(&self.config).app_clusters;
        let mut pass = Pass {
            cluster,
            settings: &settings,
            app: app.as_ref().map(|a| &a.spec),
            nodes,
            near: Vec::new(),
            ledger: &self.ledger,
            members,
            busy: BTreeSet::new(),
            notifying: BTreeSet::new(),
            removed: BTreeSet::new(),
            outcomes: BTreeMap::new(),
            stored,
            unwritten: BTreeSet::new(),
            not_ready,
        };
        Self::read_commands(&mut pass, commands);
        if let Some(app) = pass.app {
            self.check_members(&mut pass, app).await;
            self.recover_members(&mut pass, app).await?;
            self.migrate_members(&mut pass, app).await?;
            self.restart_members(&mut pass, app).await?;
            self.sync_roles(&mut pass, app).await?;
            self.sync_members(&mut pass, app).await?;
            self.send_notifies(&mut pass, app).await?;
        }
        let mut in_flight = !pass.busy.is_empty()
            || pass.members.iter().any(|m| {
                !matches!(m.status.state, MemberState::Configured | MemberState::ConfigError)
                    || !m.status.state_detail.pending_notify_cmds.is_empty()
            });
        // A member whose cached copy was stale is done again by the next
        // pass (its cache catching up wakes it); the others' go in.
        let everyone = 0..pass.members.len();
        self.write_statuses(&mut pass, everyone).await?;
        let unwritten = pass.unwritten;
        in_flight |= !unwritten.is_empty();
        // Outcomes are deleted only once the statuses that recorded them are
        // written; these are those of statuses that did not change.
        let deletes = pass
            .outcomes
            .iter()
            .filter(|(member, _)| !unwritten.contains(*member))
            .flat_map(|(_, commands)| commands)
            .map(|command| self.objects.delete_as_read(&**command));
        futures_util::future::try_join_all(deletes).await?;
        let status = match pass.app {
            Some(_) => cluster_status(&cluster.spec, cluster.metadata.generation, &pass.members),
            None => herd_core::kinds::AppClusterStatus {
                reason: Some(format!("App {:?} does not exist: apply it", cluster.spec.app_ref)),
                observed_generation: Some(cluster.metadata.generation),
                ..cluster.status.clone()
            },
        };
        if status != cluster.status {
            self.objects
                .modify_from::<AppClusterSpec, ObjectsError>(cluster.clone(), Part::Status, |c| {
                    if c.metadata.generation != cluster.metadata.generation || c.status == status {
                        return Ok(false);
                    }
                    c.status = status.clone();
                    Ok(true)
                })
                .await?;
        }
        Ok(in_flight)
    }

    /// Reads every settled Command of the cluster's members into their
    /// statuses (the pass's outcomes, deleted once those are written).
    /// Members with an unsettled Command are busy.
    fn read_commands(pass: &mut Pass<'_>, mut commands: Vec<Arc<Command>>) {
        commands.sort_by_key(|c| c.metadata.creation_timestamp);
        for command in &commands {
            let Some(member_name) = member_of(command) else { continue };
            let member = pass.members.iter_mut().find(|m| m.metadata.name == member_name);
            if !command.status.state_by_management.is_settled() {
                // One left on a node the member no longer is on does not hold it here.
                if member.is_none_or(|m| commands::concerns(command, m.spec.node.as_ref())) {
                    pass.busy.insert(member_name.to_string());
                    if matches!(commands::purpose_of(command), Some(Purpose::Notify { .. })) {
                        pass.notifying.insert(member_name.to_string());
                    }
                }
                continue;
            }
            // One for another node (a stray removed there) says nothing of it here.
            if let Some(member) = member.filter(|m| commands::concerns(command, m.spec.node.as_ref()))
                && record_outcome(command, &mut member.status, now()) == Recorded::Removed
            {
                pass.removed.insert(member_name.to_string());
            }
            pass.outcomes.entry(member_name.to_string()).or_default().push(command.clone());
        }
    }

    /// The first step: each member against its node's report. A
    /// restart, and a crash loop that grew since the status as stored, are
    /// Events.
    async fn check_members(&self, pass: &mut Pass<'_>, app: &AppSpec) {
        let now = now();
        let mut events = Vec::new();
        for i in 0..pass.members.len() {
            let name = &pass.members[i].metadata.name;
            let stored = pass.stored.get(name).map(|s| &s.state_detail);
            let before = stored.and_then(|d| d.crash_loop.clone());
            let lost_before = stored.map(|d| d.lost_volumes.clone()).unwrap_or_default();
            let Some(restart) = Self::check(pass, i, app, now) else { continue };
            let member = &pass.members[i];
            if let Some(restart) = restart {
                let how = match restart {
                    Restart::Persistent => "persistent restart: its setup is not run again if it succeeded",
                    Restart::CleanSlate => "clean-slate restart: it is set up from scratch",
                    Restart::ErrorRetry => "error-retry restart: it was in config error and is set up again",
                };
                events.push((
                    member.clone(),
                    EventType::Normal,
                    EventReason::MemberRestarted,
                    format!("a new instance runs ({how})"),
                ));
            }
            if let Some(news) = crash_news(before.as_ref(), member.status.state_detail.crash_loop.as_ref(), now) {
                events.push((member.clone(), EventType::Warning, EventReason::MemberCrashLooping, news));
            }
            if let Some(news) = lost_news(&lost_before, &member.status.state_detail.lost_volumes) {
                events.push((member.clone(), EventType::Warning, EventReason::MemberVolumesLost, news));
            }
        }
        for (member, type_, reason, message) in events {
            self.events.record(&member, type_, reason, message).await;
        }
    }

    /// Checks member `i` against what its node reports (None: it is not
    /// bound); returns its restart, if it restarted.
    fn check(pass: &mut Pass<'_>, i: usize, app: &AppSpec, now: Timestamp) -> Option<Option<Restart>> {
        let nodes = pass.nodes;
        let member = &pass.members[i];
        member.spec.node.as_ref()?;
        let role = app.role(&member.spec.role);
        let persistent = role.is_some_and(|r| r.run.volumes.iter().any(|v| v.persistent));
        let seen = nodes.seen(member, role.is_some_and(|r| r.readiness.is_some()));
        Some(check_member(&mut pass.members[i].status, seen, persistent, now))
    }

    /// Creates the members the spec asks for and sends away the surplus.
    async fn sync_roles(&self, pass: &mut Pass<'_>, app: &AppSpec) -> Result<(), ObjectsError> {
        let cluster = pass.cluster;
        let mut fresh = Vec::new();
        for change in role_sync(&cluster.metadata.name, &cluster.spec, &pass.members) {
            match change {
                MemberChange::Create { name, role, index } => {
                    // A slot whose former member still runs on a node (its
                    // Member deleted) is filled once that is removed there.
                    if pass.nodes.running.contains(&name) {
                        continue;
                    }
                    let mut member = Member::new(
                        name,
                        MemberSpec { cluster: cluster.metadata.name.clone(), role, index, ..Default::default() },
                    );
                    member.metadata.owner_references.push(OwnerReference {
                        kind: "AppCluster".into(),
                        name: cluster.metadata.name.clone(),
                        uid: cluster.metadata.uid.clone().unwrap_or_default(),
                    });
                    fresh.push(member);
                }
                MemberChange::MarkDeletePending { name } => {
                    if let Some(member) = pass.members.iter_mut().find(|m| m.metadata.name == name) {
                        member.status.state = MemberState::DeletePending;
                    }
                }
                MemberChange::Delete { name } => {
                    if let Some(member) = pass.members.iter_mut().find(|m| m.metadata.name == name) {
                        member.status.state = MemberState::Deleting;
                    }
                }
            }
        }
        self.create_placed(pass, app, fresh).await
    }

    /// Each member one step further; joins and departures queue notifies.
    async fn sync_members(&self, pass: &mut Pass<'_>, app: &AppSpec) -> Result<(), ObjectsError> {
        let generation = pass.cluster.metadata.generation;
        let (mut joined, mut leaving) = (Vec::new(), Vec::new());
        let mut forgotten = BTreeSet::new();
        self.place_all(pass, app).await?;
        pass.near = pass.nodes.of_members(&pass.members);
        let digest = herd_core::configmeta::digest_of(pass.cluster, &pass.members, &pass.near);
        let mut issues = Vec::new();
        let mut configured = Vec::new();
        for i in 0..pass.members.len() {
            let Some(app_role) = app.role(&pass.members[i].spec.role) else { continue };
            let member = &pass.members[i];
            let was_configured = member.status.was_configured();
            let report = pass.nodes.report(member).cloned();
            let facts = MemberFacts {
                generation,
                bound: member.spec.node.is_some(),
                report: report.as_ref(),
                has_setup: app_role.setup.is_some(),
                persistent: app_role.run.volumes.iter().any(|v| v.persistent),
                busy: pass.busy.contains(&member.metadata.name),
                removed: pass.removed.contains(&member.metadata.name),
                digest: Some(digest.as_str()),
            };
            let step = member_sync(&mut pass.members[i].status, &facts);
            if !was_configured && pass.members[i].status.state == MemberState::Configured {
                // Ready as of now when it runs (not a pass later): its
                // configmeta and the others' say so at once.
                Self::check(pass, i, app, now());
                joined.push((pass.members[i].spec.role.clone(), pass.members[i].metadata.name.clone()));
                configured.push(i);
            }
            let member = &pass.members[i];
            match step {
                // Placed by `place_all`, or by a later pass.
                Step::Place | Step::Wait => {}
                Step::Forget { announce } => {
                    if announce {
                        leaving.push((member.spec.role.clone(), member.metadata.name.clone()));
                    }
                    forgotten.insert(member.metadata.name.clone());
                }
                Step::Start | Step::Configure { .. } | Step::Remove => issues.extend(Self::issue(pass, i, app, step)),
            }
        }
        self.issue_all(pass, issues).await?;
        let events = configured.iter().map(|&i| {
            let member = &pass.members[i];
            let instance = member.status.state_detail.last_configured_instance.as_deref().unwrap_or("?");
            let message = format!("configured as instance {instance}");
            self.events.record(member, EventType::Normal, EventReason::MemberConfigured, message)
        });
        futures_util::future::join_all(events).await;
        for name in &forgotten {
            self.objects.delete_if_present::<MemberSpec>(name).await?;
            crate::commands::forget_holds(&self.objects, name).await?;
            if let Some(member) = pass.members.iter().find(|m| &m.metadata.name == name) {
                let message = match &member.spec.node {
                    Some(node) => {
                        format!("removed from node {node} with its volumes: its cluster no longer asks for it")
                    }
                    None => "removed: its cluster no longer asks for it".to_string(),
                };
                self.events.record(member, EventType::Normal, EventReason::MemberRemoved, message).await;
            }
        }
        pass.members.retain(|m| !forgotten.contains(&m.metadata.name));
        let now = now();
        queue_notifies(app, &mut pass.members, Change::Added, &joined, now);
        queue_notifies(app, &mut pass.members, Change::Deleted, &leaving, now);
        Ok(())
    }

    /// The Command that carries out `step` for member `i`, if one is due.
    fn issue(pass: &Pass<'_>, i: usize, app: &AppSpec, step: Step) -> Option<Issue> {
        let cluster = pass.cluster;
        let member = &pass.members[i];
        let (app_role, cluster_role) = (app.role(&member.spec.role)?, cluster.spec.role(&member.spec.role)?);
        if !command_due(&member.status, now()) {
            return None;
        }
        let name = member.metadata.name.clone();
        let (purpose, action) = match step {
            Step::Start => {
                let run = member_run(cluster, app_role, cluster_role, member);
                (Purpose::Start, Action::StartMember { member: name, run })
            }
            Step::Configure { run_setup } => {
                let instance = match member.status.state {
                    MemberState::Configured => member.status.state_detail.last_configured_instance.clone(),
                    _ => member.status.state_detail.configuring_instance.clone(),
                };
                let instance = instance?;
                let meta = configmeta(cluster, &pass.members, &pass.near, &name)?;
                // Compact: it is stored, watched and replicated with the
                // Command; the agent writes it out indented for people.
                let configmeta = serde_json::to_string(&meta).unwrap_or_default();
                let setup = app_role.setup.as_ref();
                let action = Action::ConfigureMember {
                    member: name,
                    expected_instance: instance,
                    configmeta,
                    setup_script: setup.map(|s| s.script.clone()),
                    run_setup,
                    setup_timeout: setup.map(|s| s.timeout),
                };
                let purpose = Purpose::Configure { generation: cluster.metadata.generation, digest: meta.digest() };
                (purpose, action)
            }
            Step::Remove => (Purpose::Remove, Action::RemoveMember { member: name }),
            _ => return None,
        };
        Some(Issue { member: i, purpose, action })
    }

    /// The end of every pass: the members whose turn it is (one of a role
    /// at a time, unless its App role asks for all at once) are sent their
    /// first pending notify.
    async fn send_notifies(&self, pass: &mut Pass<'_>, app: &AppSpec) -> Result<(), ObjectsError> {
        let busy = |m: &str| pass.busy.contains(m);
        let notifying = |m: &str| pass.notifying.contains(m);
        let mut issues = Vec::new();
        for i in to_send(app, &pass.members, &busy, &notifying, now()) {
            let member = &pass.members[i];
            let (Some(notify), Some(setup)) = (
                member.status.state_detail.pending_notify_cmds.first(),
                app.role(&member.spec.role).and_then(|r| r.setup.as_ref()),
            ) else {
                continue;
            };
            let action = Action::RunScript {
                member: member.metadata.name.clone(),
                script: notify_script(&setup.script, &notify.arguments),
                expected_instance: member.status.state_detail.last_configured_instance.clone(),
            };
            let purpose = Purpose::Notify { arguments: notify.arguments.clone() };
            issues.push(Issue { member: i, purpose, action });
        }
        self.issue_all(pass, issues).await
    }
}
