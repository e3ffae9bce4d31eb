//! herd's control plane: the HTTP API, authentication and authorisation,
//! admission, and the controllers, over a [`herd_store::Store`].
//!
//! Code map: [`objects`] applies the lifecycle rules of `herd-core` to
//! objects in the store (no HTTP); [`reflector`] keeps watch-fed copies of
//! a kind for controllers; [`registry`] binds each kind's JSON to
//! its typed rules; [`api`] is the axum router and thin handlers; [`error`]
//! is the one place errors become HTTP statuses; [`auth`] knows tokens;
//! [`nodes`] is the agent protocol (join, heartbeat); [`controllers`] are
//! the background loops; [`events`] records Events; [`metrics`] and
//! [`openapi`] describe the server.

pub mod api;
pub mod auth;
pub mod controllers;
pub mod elector;
pub mod error;
pub mod events;
pub mod metrics;
pub mod nodes;
pub mod objects;
pub mod openapi;
pub mod reflector;
pub mod registry;

use std::net::SocketAddr;
use std::sync::Arc;

use herd_core::Object;
use herd_core::kinds::ClusterConfigSpec;
use herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME;
use herd_store::{Store, StoreError};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::api::AppState;
use crate::auth::Authenticator;
use crate::elector::Elector;
use crate::error::ApiError;
use crate::events::EventRecorder;
use crate::objects::Objects;
use crate::reflector::Reflector;
use crate::registry::Registry;

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// `postgres://...`, or a SQLite file path (`sqlite://PATH` also works).
    pub store_url: String,
    pub admin_token: String,
    pub join_token: String,
    /// This replica's name in the leader election.
    pub identity: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("opening the store: {0}")]
    Store(#[from] StoreError),
    #[error("listening on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("preparing the cluster: {0}")]
    Bootstrap(#[from] ApiError),
    #[error("serving HTTP: {0}")]
    Serve(std::io::Error),
}

/// A running server.
pub struct Server {
    addr: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), ServerError>>,
}

impl Server {
    /// Opens the store, makes sure the ClusterConfig exists, starts the
    /// controllers and serves HTTP.
    pub async fn start(config: ServerConfig) -> Result<Server, ServerError> {
        let store = Store::open(&config.store_url).await?;
        let objects = Objects::new(store.clone());
        ensure_cluster_config(&objects).await?;

        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| ServerError::Bind { addr: config.listen, source })?;
        let addr = listener.local_addr().map_err(|source| ServerError::Bind { addr: config.listen, source })?;

        let registry = Arc::new(Registry::standard());
        let shutdown = CancellationToken::new();
        // Serve only with the settings in hand: heartbeat answers carry them.
        let cluster_config = Reflector::start(store.clone(), shutdown.clone());
        cluster_config.synced().await;
        let state = AppState {
            objects: objects.clone(),
            config: cluster_config.clone(),
            openapi: Arc::new(openapi::document(&registry)),
            registry,
            auth: Arc::new(Authenticator::new(store, &config.admin_token, &config.join_token)),
            metrics: Arc::default(),
            events: EventRecorder::new(objects.clone(), "api"),
            leader_health: Arc::default(),
            shutdown: shutdown.clone(),
        };
        let leases = Reflector::start(objects.store().clone(), shutdown.clone());
        let work_objects = objects.clone();
        let work_config = cluster_config.clone();
        let work_metrics = state.metrics.clone();
        let elector = Elector {
            objects: objects.clone(),
            leases,
            config: cluster_config,
            events: EventRecorder::new(objects, "leader-election"),
            identity: config.identity.clone(),
            release_on_shutdown: true,
            health: state.leader_health.clone(),
            work: Box::new(move |stop, fence| {
                controllers::start(work_objects.fenced(fence), work_config.clone(), work_metrics.clone(), stop)
            }),
        };
        let (mut leadership, election) = elector.start(shutdown.clone());
        let metrics = state.metrics.clone();
        tokio::spawn(async move {
            while leadership.changed().await.is_ok() {
                let leading = matches!(*leadership.borrow(), elector::Leadership::Leading { .. });
                metrics.leading.store(i64::from(leading), std::sync::atomic::Ordering::Relaxed);
            }
        });
        let router = api::router(state).layer(tower_http::trace::TraceLayer::new_for_http());
        let stop = shutdown.clone();
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, router).with_graceful_shutdown(stop.cancelled_owned()).await;
            // The elector stops the leader-only work, then releases the lease.
            let _ = election.await;
            served.map_err(ServerError::Serve)
        });
        tracing::info!(%addr, backend = %config.store_url, "herd server listening");
        Ok(Server { addr, shutdown, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
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

async fn ensure_cluster_config(objects: &Objects) -> Result<(), ApiError> {
    let config = Object::new(CLUSTER_CONFIG_NAME, ClusterConfigSpec::default());
    match objects.create(config, false, false).await {
        Ok(_) | Err(ApiError::AlreadyExists { .. }) => Ok(()),
        Err(other) => Err(other),
    }
}
