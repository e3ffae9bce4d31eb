//! An in-process cluster on tokio's clock, for tests of the controllers
//! working together: a SQLite store in a temporary directory, the
//! leader's controllers as a replica starts them, and simulated nodes
//! (`herd_agent::sim::SimulatedNode`: members without processes) whose
//! heartbeats go through the server's own heartbeat handling, with no
//! socket and no process. Under `#[tokio::test(start_paused = true)]` a
//! minute of the cluster's life takes milliseconds of the machine's, and
//! object timestamps follow the paused clock (`objects::now`).
//!
//! What needs real processes, files or networks stays in the integration
//! tests of the `herd` crate.

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use herd_agent::sim::SimulatedNode;
use herd_core::Object;
use herd_core::api::LeaseRenewal;
use herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME;
use herd_core::kinds::{ClusterConfigSpec, NodeSpec};
use herd_store::Store;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::controllers::configuration::CONFIG_PREFIX;
use crate::controllers::{self, LeaderSelf, ReplicaCaches};
use crate::elector::LeaderHealth;
use crate::events::EventRecorder;
use crate::metrics::Metrics;
use crate::nodes::{HeartbeatServices, cluster_config};
use crate::objects::Objects;
use crate::peers::PeerAuthority;
use crate::reflector::{RawCache, Reflector};
use crate::role_leases::{Renewals, RoleLeases};
use crate::tls::NodeCertificates;

/// How often [`TestCluster::until`] looks again (and the nodes report
/// what they did meanwhile, as an agent does at once).
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// A node's agent as the test drives it.
struct Agent {
    node: SimulatedNode,
    boot: String,
    /// A silent node neither carries out Commands nor heartbeats.
    silent: bool,
    /// The role leader leases its last heartbeat answer renewed.
    renewed: Vec<LeaseRenewal>,
}

pub struct TestCluster {
    pub objects: Objects,
    caches: ReplicaCaches,
    configuration: RawCache,
    events: EventRecorder,
    metrics: Arc<Metrics>,
    certificates: NodeCertificates,
    renewals: Renewals,
    agents: BTreeMap<String, Mutex<Agent>>,
    stop: CancellationToken,
    _controllers: JoinSet<()>,
    _dir: tempfile::TempDir,
}

impl TestCluster {
    /// A leader with its controllers, and `nodes` that have each
    /// heartbeat once (so they are Ready).
    pub async fn start(nodes: &[&str]) -> TestCluster {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = Store::open(dir.path().join("store.db").to_str().expect("a UTF-8 path")).await.expect("a store");
        let objects = Objects::new(store.clone());
        let config = Object::new(CLUSTER_CONFIG_NAME, ClusterConfigSpec::default());
        objects.create(config, false, false).await.expect("the cluster's configuration");
        for node in nodes {
            objects.create(Object::new(*node, NodeSpec::default()), false, false).await.expect("a node");
        }
        let stop = CancellationToken::new();
        let caches = ReplicaCaches {
            config: Reflector::start(store.clone(), stop.clone()),
            nodes: Reflector::start_with(store.clone(), stop.clone(), herd_core::node_health::changed_beyond_heartbeat),
            commands: Reflector::start(store.clone(), stop.clone()),
        };
        let metrics = Arc::new(Metrics::new(&store));
        let ca = herd_tls::ClusterCa::generate(SystemTime::now()).expect("a cluster CA");
        let peers = Arc::new(PeerAuthority::new(&ca, "admin-token", metrics.clone()).expect("the server's identity"));
        let certificates = NodeCertificates { ca, lifetime: Duration::from_secs(3600), grant_key: peers.grant_key() };
        let role_leases: Arc<RoleLeases> = Arc::default();
        let health: Arc<LeaderHealth> = Arc::default();
        health.leading_for_tests(Duration::from_secs(3600));
        let renewals =
            Renewals { clusters: Reflector::start(store.clone(), stop.clone()), leases: role_leases.clone(), health };
        let leader = LeaderSelf { peers, node: None, url: "https://127.0.0.1:7733".into(), role_leases };
        let controllers = controllers::start(objects.clone(), 1, caches.clone(), metrics.clone(), leader, stop.clone());
        let agents = nodes
            .iter()
            .map(|node| {
                let agent = Agent {
                    node: SimulatedNode::default(),
                    boot: format!("boot-{node}"),
                    silent: false,
                    renewed: Vec::new(),
                };
                (node.to_string(), Mutex::new(agent))
            })
            .collect();
        let cluster = TestCluster {
            configuration: RawCache::start(store, CONFIG_PREFIX, stop.clone()),
            events: EventRecorder::new(objects.clone(), "test-cluster"),
            objects,
            caches,
            metrics,
            certificates,
            renewals,
            agents,
            stop,
            _controllers: controllers,
            _dir: dir,
        };
        cluster.caches.config.synced().await;
        cluster.caches.nodes.synced().await;
        cluster.caches.commands.synced().await;
        cluster.beat().await;
        cluster
    }

    fn agent(&self, node: &str) -> MutexGuard<'_, Agent> {
        let agent = self.agents.get(node).unwrap_or_else(|| panic!("no node {node} in the test cluster"));
        agent.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every node that is not silent carries out its new Command attempts,
    /// then heartbeats once.
    pub async fn beat(&self) {
        for name in self.agents.keys() {
            let report = {
                let mut agent = self.agent(name);
                if agent.silent {
                    continue;
                }
                for command in self.caches.commands.list_shared() {
                    if command.spec.node == *name {
                        agent.node.accept(&command);
                    }
                }
                let boot = agent.boot.clone();
                agent.node.report(&boot)
            };
            let services = HeartbeatServices {
                objects: &self.objects,
                config: &self.caches.config,
                nodes: &self.caches.nodes,
                commands: &self.caches.commands,
                configuration: &self.configuration,
                events: &self.events,
                metrics: &self.metrics,
                certificates: &self.certificates,
                renewals: &self.renewals,
            };
            match crate::nodes::heartbeat(services, (name, self.caches.nodes.get(name)), report).await {
                Ok(beat) => {
                    let mut agent = self.agent(name);
                    agent.node.acknowledged(&beat.response.acknowledged);
                    agent.renewed = beat.response.leases;
                }
                // As an agent does: it tells again at the next beat.
                Err(error) => tracing::warn!(node = %name, %error, "a test cluster's heartbeat failed"),
            }
        }
    }

    /// Beats (every [`LOOK_EVERY`], the cluster's heartbeat period apart
    /// at most) until `done` holds; panics naming `what` once `limit` of
    /// the cluster's time has passed. Returns how long it took.
    pub async fn until(&self, what: &str, limit: Duration, done: impl AsyncFn(&Objects) -> bool) -> Duration {
        let start = tokio::time::Instant::now();
        loop {
            self.beat().await;
            if done(&self.objects).await {
                return start.elapsed();
            }
            assert!(start.elapsed() < limit, "{what}: not within {limit:?} of the cluster's time");
            let period = cluster_config(&self.caches.config).heartbeat_period.get();
            tokio::time::sleep(LOOK_EVERY.min(period)).await;
        }
    }

    /// Silences a node's agent (it neither heartbeats nor takes up
    /// Commands), or lets it speak again.
    pub fn silence(&self, node: &str, silent: bool) {
        self.agent(node).silent = silent;
    }

    /// The role leader leases `node`'s last heartbeat answer renewed.
    pub fn renewed(&self, node: &str) -> Vec<LeaseRenewal> {
        self.agent(node).renewed.clone()
    }

    /// A member's process on `node` exits by itself.
    pub fn exit(&self, node: &str, member: &str) {
        self.agent(node).node.exit(member);
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
