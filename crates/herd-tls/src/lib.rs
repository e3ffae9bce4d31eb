//! herd's TLS: the cluster CA and the certificates it signs ([`ca`]), the
//! rustls configurations that trust only that CA, pinned by its hash
//! ([`trust`]), TLS between agents and from the server to agents, each
//! side showing its certificate ([`peer`]), a TLS listener for axum
//! ([`listener`]), the sealing of the CA's key for the store ([`seal`]),
//! and signed grants ([`grant`]). rustls and ring everywhere.

pub mod ca;
pub mod grant;
pub mod listener;
pub mod peer;
pub mod seal;
pub mod trust;

pub use ca::{ClusterCa, ServingIdentity, node_dns_name, node_key_and_request};
pub use trust::{CaHash, Trust, client_config, install_provider, server_config};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("certificate: {0}")]
    Certificate(#[from] rcgen::Error),
    #[error("TLS: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("PEM: {0}")]
    Pem(String),
    #[error("{0}")]
    Hash(String),
    #[error("the sealed CA key: {0}")]
    Seal(String),
    #[error("grant: {0}")]
    Grant(String),
}
