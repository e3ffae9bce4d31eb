//! herd's control plane: the HTTP API, authentication and authorisation,
//! admission, and the controllers, over a [`herd_store::Store`].
//!
//! Code map: [`objects`] applies the lifecycle rules of `herd-core` to
//! objects in the store (no HTTP); [`reflector`] keeps watch-fed copies of
//! a kind for controllers; [`registry`] binds each kind's JSON to
//! its typed rules; [`api`] is the axum router and thin handlers; [`error`]
//! is the one place errors become HTTP statuses; [`auth`] knows tokens;
//! [`nodes`] is the agent protocol (join, heartbeat); [`elector`] campaigns
//! for leadership and runs the leader-only [`controllers`] while it leads;
//! [`replicas`] keeps this replica's record and reads the cluster status;
//! [`events`] records Events; [`metrics`] and [`openapi`] describe the server.

pub mod api;
pub mod app_clusters;
pub mod app_revisions;
pub mod auth;
pub mod change_clock;
pub mod commands;
pub mod controllers;
pub mod elector;
pub mod error;
pub mod events;
pub mod eviction;
pub mod join_refusals;
pub mod metrics;
pub mod node_roles;
pub mod nodes;
pub mod objects;
pub mod openapi;
pub mod operations;
pub mod peers;
pub mod reflector;
pub mod registry;
pub mod replicas;
pub mod restore;
pub mod role_leases;
pub mod store_clock;
pub mod supersession;
#[cfg(test)]
mod test_cluster;
pub mod tls;
pub mod ui;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use herd_core::Resource;
use herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME;
use herd_core::kinds::{ClusterConfigSpec, CommandSpec, LeaderElectionOverrides};
use herd_core::validation::{FieldPath, check_name};
use herd_core::{Object, ValidationErrors};
use herd_store::{Partitioned, Store, StoreError};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::api::AppState;
use crate::auth::Authenticator;
use crate::elector::{Elector, LeaderWork};
use crate::error::ApiError;
use crate::events::EventRecorder;
use crate::metrics::Metrics;
use crate::objects::{Objects, ObjectsError};
use crate::reflector::Reflector;
use crate::registry::Registry;
use crate::replicas::ReplicaIdentity;

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// `postgres://...`, or a SQLite file path (`sqlite://PATH` also works).
    pub store_url: String,
    pub admin_token: String,
    pub join_token: String,
    /// This replica's name in the leader election.
    pub identity: String,
    /// Where other replicas and the CLI reach this one [default: http://<listen address>].
    pub advertise_url: Option<String>,
    /// Leader-election flags; each one given wins over the ClusterConfig.
    pub election: LeaderElectionOverrides,
    /// Run the fencing probe while leading, writing at this interval
    /// (diagnostics: see `controllers::fencing_probe`).
    pub fencing_probe: Option<Duration>,
    /// Serve plain HTTP instead of TLS (`--insecure-http`).
    pub insecure_http: bool,
    /// How long the certificates signed for nodes last; agents renew them
    /// when two thirds have passed.
    pub agent_cert_lifetime: Duration,
    /// The node this replica runs on (`--node`): it campaigns only while
    /// that node is a master candidate (or while there is none at all, to
    /// bootstrap), and its node is the master's while it leads.
    pub node: Option<String>,
    /// Seed the (new, empty) store from a configuration copy first: a
    /// master failover.
    pub restore: Option<restore::Restore>,
}

/// How long a node's certificate lasts unless told otherwise.
pub const DEFAULT_AGENT_CERT_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("opening the store: {0}")]
    Store(#[from] StoreError),
    #[error("listening on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("preparing the cluster: {0}")]
    Bootstrap(#[from] ApiError),
    #[error("invalid settings: {0}")]
    Settings(ValidationErrors),
    #[error("serving HTTP: {0}")]
    Serve(std::io::Error),
    #[error("the cluster CA: {0}")]
    Ca(#[from] tls::CaError),
    #[error("TLS: {0}")]
    Tls(#[from] herd_tls::TlsError),
    #[error("starting from the configuration copy: {0}")]
    Restore(#[from] restore::RestoreError),
}

/// A running server.
pub struct Server {
    addr: SocketAddr,
    url: String,
    /// The cluster CA, as clients pin it (None with plain HTTP, whose
    /// clients pin nothing).
    certificates: Option<Arc<tls::NodeCertificates>>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), ServerError>>,
}

impl Server {
    /// Opens the store, makes sure the ClusterConfig exists, starts the
    /// controllers and serves HTTP.
    pub async fn start(config: ServerConfig) -> Result<Server, ServerError> {
        let mut bad_identity = ValidationErrors::new();
        check_name(&FieldPath::root("--identity"), &config.identity, &mut bad_identity);
        bad_identity.into_result().map_err(ServerError::Settings)?;
        let store = Store::open(&config.store_url).await?;
        // Before this replica stamps anything.
        let store_has_clock = store_clock::anchor(&store).await?.is_some();
        let objects = Objects::new(store.clone());
        if let Some(restore) = &config.restore {
            restore::seed(&store, restore).await?;
        }
        ensure_cluster_config(&objects).await?;
        commands::index_legacy_holds(&objects).await.map_err(ApiError::from)?;

        let shutdown = CancellationToken::new();
        if store_has_clock {
            tokio::spawn(store_clock::keep_anchored(store.clone(), shutdown.clone()));
        }
        // Serve only with the settings in hand: heartbeat answers carry them.
        let cluster_config = Reflector::start(store.clone(), shutdown.clone());
        cluster_config.synced().await;
        let settings = match config.election.apply(&nodes::cluster_config(&cluster_config).leader_election) {
            Ok(settings) => settings,
            Err(errors) => {
                shutdown.cancel();
                return Err(ServerError::Settings(errors));
            }
        };
        if let Some(restore) = &config.restore {
            restore::seed_lease(&objects, restore, &settings.lock_name).await.inspect_err(|_| shutdown.cancel())?;
        }

        let bound = tokio::net::TcpListener::bind(config.listen).await.and_then(|l| Ok((l.local_addr()?, l)));
        let (addr, listener) = bound.map_err(|source| {
            shutdown.cancel();
            ServerError::Bind { addr: config.listen, source }
        })?;
        // The CA is made even for plain HTTP: agents talk to each other
        // over TLS with the certificates it signs, whatever the API does.
        let ca = tls::cluster_ca(&store, &config.admin_token).await.inspect_err(|_| shutdown.cancel())?;
        let tls_config = if config.insecure_http {
            tracing::warn!("serving plain HTTP (--insecure-http): tokens and data cross the network in the clear");
            None
        } else {
            let names = tls::serving_names(addr, config.advertise_url.as_deref());
            Some(herd_tls::server_config(&tls::serving_identity(&ca, &config.identity, &names)?)?)
        };
        // Shared with the controllers (one decode of each Node write, not
        // two); they are woken only by the changes that matter.
        let nodes = Reflector::start_with(
            objects.store().clone(),
            shutdown.clone(),
            herd_core::node_health::changed_beyond_heartbeat,
        );
        let mut metrics = Metrics::new(&store);
        metrics.collect_usage(nodes.clone());
        let metrics = Arc::new(metrics);
        let peers = Arc::new(peers::PeerAuthority::new(&ca, &config.admin_token, metrics.clone())?);
        let node_certificates =
            Arc::new(tls::NodeCertificates { ca, lifetime: config.agent_cert_lifetime, grant_key: peers.grant_key() });
        let certificates = (!config.insecure_http).then(|| node_certificates.clone());
        let scheme = if tls_config.is_some() { "https" } else { "http" };
        let url = config.advertise_url.clone().unwrap_or_else(|| format!("{scheme}://{addr}"));
        let me = ReplicaIdentity {
            name: config.identity.clone(),
            url: url.clone(),
            node: config.node.clone(),
            lock_name: settings.lock_name.clone(),
        };

        let leases = Reflector::start(objects.store().clone(), shutdown.clone());
        // Each SQLite master has a store of its own: one a failover replaced must know.
        let supersession = (objects.store().backend_name() == "sqlite").then(|| {
            let check = supersession::Check {
                nodes: nodes.clone(),
                leases: leases.clone(),
                lock_name: settings.lock_name.clone(),
                peers: peers.clone(),
                url: url.clone(),
            };
            supersession::Supersession::start(check, shutdown.clone())
        });
        // Shared with the controllers, like the nodes.
        let commands_cache = Reflector::start(objects.store().clone(), shutdown.clone());
        let registry = Arc::new(Registry::standard());
        let node_commands = Partitioned::start(
            &store,
            &objects::collection_prefix(CommandSpec::PLURAL),
            commands::agent_to_tell,
            &shutdown,
        )
        .inspect_err(|_| shutdown.cancel())?;
        // Heartbeats renew App role leader leases while this replica leads;
        // its controllers judge their expiry on the same clock.
        let leader_health: Arc<elector::LeaderHealth> = Arc::default();
        let role_leases: Arc<role_leases::RoleLeases> = Arc::default();
        let renewals = role_leases::Renewals {
            clusters: Reflector::start(objects.store().clone(), shutdown.clone()),
            leases: role_leases.clone(),
            health: leader_health.clone(),
        };
        let state = AppState {
            objects: objects.clone(),
            node_commands,
            config: cluster_config.clone(),
            nodes: nodes.clone(),
            commands: commands_cache.clone(),
            configuration: reflector::RawCache::start(
                objects.store().clone(),
                controllers::configuration::CONFIG_PREFIX,
                shutdown.clone(),
            ),
            openapi: Arc::new(openapi::document(&registry)),
            registry,
            auth: Arc::new(Authenticator::new(store, &config.admin_token, &config.join_token, shutdown.clone())),
            join_refusals: Arc::default(),
            metrics: metrics.clone(),
            events: EventRecorder::new(objects.clone(), "api"),
            leader_health,
            renewals,
            node_certificates,
            peers: peers.clone(),
            supersession: supersession.clone(),
            replica: Arc::new(me.clone()),
            replica_sightings: replicas::ReplicaSightings::start(objects.store().clone(), shutdown.clone()),
            shutdown: shutdown.clone(),
        };
        let elector = Elector {
            objects: objects.clone(),
            leases,
            config: cluster_config.clone(),
            events: EventRecorder::new(objects.clone(), "leader-election"),
            identity: config.identity.clone(),
            node: config.node.clone(),
            nodes: nodes.clone(),
            supersession,
            settings,
            overrides: config.election.clone(),
            health: state.leader_health.clone(),
            metrics: metrics.clone(),
            work: leader_work(
                objects.clone(),
                controllers::ReplicaCaches { config: cluster_config, nodes: nodes.clone(), commands: commands_cache },
                metrics,
                controllers::LeaderSelf { peers, node: config.node.clone(), url: url.clone(), role_leases },
                config.identity.clone(),
                config.fencing_probe,
            ),
        };
        let leading = elector.health.leading();
        let election = elector.start(shutdown.clone());
        // The record is marked stopped only after the lease is released:
        // nothing else is written while a standby waits for it.
        let record_stop = CancellationToken::new();
        let record = replicas::keep_record(objects, me, leading, record_stop.clone()).await;
        // A 503 is an answer (a standby passing a heartbeat on, a server
        // not ready yet), not a fault of the server's: only a 500 is
        // logged as an error.
        let failures = tower_http::classify::StatusInRangeAsFailures::new(500..=500).into_make_classifier();
        let router = api::router(state).layer(tower_http::trace::TraceLayer::new(failures));
        let stop = shutdown.clone();
        let task = tokio::spawn(async move {
            let served = match tls_config {
                Some(tls_config) => {
                    let listener =
                        herd_tls::listener::TlsListener::new(listener, tls_config).map_err(ServerError::Serve)?;
                    let service = router.into_make_service_with_connect_info::<join_refusals::RemoteAddr>();
                    axum::serve(listener, service).with_graceful_shutdown(stop.cancelled_owned()).await
                }
                None => {
                    let listener = join_refusals::PlainListener(listener);
                    let service = router.into_make_service_with_connect_info::<join_refusals::RemoteAddr>();
                    axum::serve(listener, service).with_graceful_shutdown(stop.cancelled_owned()).await
                }
            };
            // The elector stops the leader-only work, then releases the
            // lease; the record then says this replica stopped.
            let _ = election.await;
            record_stop.cancel();
            let _ = record.await;
            served.map_err(ServerError::Serve)
        });
        let backend = Store::redacted_url(&config.store_url);
        tracing::info!(%addr, %backend, identity = %config.identity, "herd server listening");
        Ok(Server { addr, url, certificates, shutdown, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where this replica is reached (`https://...`, or `http://...` with
    /// `insecure_http`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The cluster CA's hash, what agents and the CLI pin (None with plain HTTP).
    pub fn ca_hash(&self) -> Option<herd_tls::CaHash> {
        self.certificates.as_ref().map(|c| c.ca.hash())
    }

    /// The cluster CA's certificate, PEM (None with plain HTTP).
    pub fn ca_pem(&self) -> Option<&str> {
        self.certificates.as_ref().map(|c| c.ca.cert_pem())
    }

    /// Stops serving (open watches end), stops the controllers, waits.
    pub async fn stop(self) -> Result<(), ServerError> {
        self.shutdown.cancel();
        self.wait().await
    }

    /// Waits until the server stops.
    pub async fn wait(self) -> Result<(), ServerError> {
        match self.task.await {
            Ok(result) => result,
            Err(join) => Err(ServerError::Serve(std::io::Error::other(join.to_string()))),
        }
    }

    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }
}

/// The leader-only work: the controllers, and the fencing probe when asked
/// for, all writing through this leadership's fence.
fn leader_work(
    objects: Objects,
    caches: controllers::ReplicaCaches,
    metrics: Arc<Metrics>,
    leader: controllers::LeaderSelf,
    identity: String,
    fencing_probe: Option<Duration>,
) -> LeaderWork {
    Box::new(move |stop, fence| {
        let term = fence.term;
        let fenced = objects.fenced(fence, metrics.clone());
        let mut work =
            controllers::start(fenced.clone(), term, caches.clone(), metrics.clone(), leader.clone(), stop.clone());
        if let Some(every) = fencing_probe {
            work.spawn(controllers::fencing_probe::run(fenced, identity.clone(), term, every, stop));
        }
        work
    })
}

async fn ensure_cluster_config(objects: &Objects) -> Result<(), ApiError> {
    let config = Object::new(CLUSTER_CONFIG_NAME, ClusterConfigSpec::default());
    match objects.create(config, false, false).await {
        Ok(_) | Err(ObjectsError::AlreadyExists { .. }) => Ok(()),
        Err(other) => Err(other.into()),
    }
}
