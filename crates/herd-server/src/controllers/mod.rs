//! Controllers: background loops that move observed state toward desired
//! state. They are leader-only work: the elector starts them when this
//! replica wins the lease and cancels (and awaits) them before it gives the
//! lease up, which is why they take a token and keep no state that
//! outlives it. Their writes go through the leadership's fence.

pub mod app_clusters;
pub mod budgets;
pub mod caches;
pub mod candidate_pool;
pub mod commands;
pub mod compactor;
pub mod configuration;
pub mod event_ttl;
pub mod fencing_probe;
pub mod keyed;
pub mod node_lifecycle;
pub mod operations;
pub mod runtime;

use std::sync::Arc;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use self::caches::Caches;
use crate::events::EventRecorder;
use crate::metrics::Metrics;
use crate::objects::Objects;
use crate::reflector::Reflector;
use herd_core::kinds::{ClusterConfigSpec, CommandSpec, NodeSpec};

/// What the leader-only work knows of the replica running it.
#[derive(Clone)]
pub struct LeaderSelf {
    pub peers: Arc<crate::peers::PeerAuthority>,
    /// The node it runs on: the master's while it leads.
    pub node: Option<String>,
    /// Where it serves: the master's URL in the facts every node keeps.
    pub url: String,
    /// The App role leader leases heartbeats renew (started afresh for
    /// each leadership).
    pub role_leases: Arc<crate::role_leases::RoleLeases>,
}

/// The caches a replica keeps whether it leads or not, which its
/// controllers share (each write decoded once, not once per cache).
#[derive(Clone)]
pub struct ReplicaCaches {
    pub config: Reflector<ClusterConfigSpec>,
    /// Started with `node_health::changed_beyond_heartbeat`, so that a
    /// heartbeat's time or serial wakes no controller.
    pub nodes: Reflector<NodeSpec>,
    /// Also read by heartbeats, for the Commands agents report on.
    pub commands: Reflector<CommandSpec>,
}

/// Starts every controller for the leadership of `term`; they stop when
/// `stop` is cancelled.
pub fn start(
    objects: Objects,
    term: u64,
    ReplicaCaches { config, nodes, commands }: ReplicaCaches,
    metrics: Arc<Metrics>,
    leader: LeaderSelf,
    stop: CancellationToken,
) -> JoinSet<()> {
    let mut set = JoinSet::new();
    leader.role_leases.begin();
    let events = EventRecorder::new(objects.clone(), "node-lifecycle");
    let shared = Caches::new(objects.store().clone(), stop.clone())
        .with(config.clone())
        .with(nodes.clone())
        .with(commands.clone());
    let caches = app_clusters::Caches {
        apps: shared.of(),
        revisions: shared.of(),
        clusters: shared.of(),
        members: shared.of(),
        nodes: nodes.clone(),
        commands: commands.clone(),
        config: config.clone(),
        operations: shared.of(),
    };
    let budgets = shared.of();
    let operation_caches = operations::Caches {
        operations: caches.operations.clone(),
        members: caches.members.clone(),
        budgets: budgets.clone(),
        nodes: nodes.clone(),
        config: config.clone(),
        clusters: caches.clusters.clone(),
        apps: caches.apps.clone(),
    };
    let budget_keeper = budgets::BudgetKeeper::new(
        objects.clone(),
        budgets,
        caches.members.clone(),
        EventRecorder::new(objects.clone(), "disruption-budgets"),
    );
    let watches = budget_keeper.watches();
    set.spawn(keyed::run(budget_keeper, watches, metrics.clone(), stop.clone()));
    let operations = operations::OperationsController::new(
        objects.clone(),
        operation_caches,
        EventRecorder::new(objects.clone(), "operations"),
    );
    let watches = operations.watches();
    set.spawn(keyed::run(operations, watches, metrics.clone(), stop.clone()));
    let issuer = crate::commands::Issuer { term, peers: leader.peers, nodes: nodes.clone() };
    let janitor = app_clusters::janitor::Janitor::new(
        objects.clone(),
        &caches,
        EventRecorder::new(objects.clone(), "app-clusters"),
    );
    set.spawn(runtime::run(janitor, metrics.clone(), stop.clone()));
    let app_clusters = app_clusters::AppClusterController::new(
        objects.clone(),
        caches,
        issuer.clone(),
        EventRecorder::new(objects.clone(), "app-clusters"),
        leader.role_leases.clone(),
    );
    let watches = app_clusters.watches();
    set.spawn(keyed::run(app_clusters, watches, metrics.clone(), stop.clone()));
    let command_controller = commands::CommandController::new(
        objects.clone(),
        issuer,
        commands,
        nodes.clone(),
        config.clone(),
        metrics.clone(),
    );
    let watches = command_controller.watches();
    set.spawn(keyed::run(command_controller, watches, metrics.clone(), stop.clone()));
    set.spawn(compactor::run(objects.store().clone(), stop.clone()));
    set.spawn(event_ttl::run(objects.clone(), stop.clone()));
    let pool = candidate_pool::CandidatePool::new(
        objects.clone(),
        nodes.clone(),
        config.clone(),
        EventRecorder::new(objects.clone(), "candidate-pool"),
        leader.node,
    );
    set.spawn(runtime::run(pool, metrics.clone(), stop.clone()));
    let keeper = configuration::ConfigurationKeeper::new(objects.clone(), &shared, leader.url, term);
    set.spawn(runtime::run(keeper, metrics.clone(), stop.clone()));
    let node_lifecycle = node_lifecycle::NodeLifecycle::new(objects, nodes, config, events, metrics.clone());
    set.spawn(runtime::run(node_lifecycle, metrics, stop));
    set
}
