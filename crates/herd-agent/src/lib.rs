//! herd's agent: the only truth about what runs on its host.
//!
//! Today it joins the cluster (trading the join token for a node token kept
//! in its data dir), serves a small HTTP endpoint of its own and sends a
//! heartbeat every period, riding out server restarts with backoff and
//! moving between several server URLs. Members, volumes and the command
//! journal come with their capabilities.
//!
//! Code map: [`credentials`] keeps the node token; [`fsutil`] writes files
//! atomically; [`heartbeat`] is the join/heartbeat loop; [`endpoint`] is
//! the agent's own HTTP server.

pub mod credentials;
pub mod endpoint;
pub mod fsutil;
pub mod heartbeat;

use std::fs::File;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use herd_client::{Client, ClientError};
use tokio_util::sync::CancellationToken;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// Server base URLs, tried in turn.
    pub servers: Vec<String>,
    /// Needed only until the node has its own token.
    pub join_token: Option<String>,
    pub data_dir: PathBuf,
    pub node_name: String,
    /// Where the agent's own HTTP endpoint listens.
    pub listen: SocketAddr,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("data dir {path}: {source}")]
    DataDir { path: PathBuf, source: std::io::Error },
    #[error("another agent is using data dir {0}")]
    DataDirLocked(PathBuf),
    #[error("listening on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("this node has no token yet and no join token was given (--join-token)")]
    NoJoinToken,
    #[error("the server refused to let this node join: {0}")]
    JoinRefused(ClientError),
    #[error("{0}")]
    Credentials(#[from] credentials::CredentialsError),
}

/// What identifies this run of the agent.
#[derive(Clone, Debug)]
pub struct Identity {
    pub node_name: String,
    /// Fresh at every start of the agent process.
    pub agent_boot_id: String,
    /// The kernel's boot id: changes when the host reboots.
    pub host_boot_id: Option<String>,
}

fn host_boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok().map(|s| s.trim().to_string())
}

/// Runs the agent until `stop` fires.
pub async fn run(config: AgentConfig, stop: CancellationToken) -> Result<(), AgentError> {
    let data_dir = config.data_dir.clone();
    std::fs::create_dir_all(&data_dir).map_err(|source| AgentError::DataDir { path: data_dir.clone(), source })?;
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(data_dir.join("agent.lock"))
        .map_err(|source| AgentError::DataDir { path: data_dir.clone(), source })?;
    lock.try_lock().map_err(|_| AgentError::DataDirLocked(data_dir.clone()))?;

    let identity = Identity {
        node_name: config.node_name.clone(),
        agent_boot_id: uuid::Uuid::now_v7().to_string(),
        host_boot_id: host_boot_id(),
    };
    let endpoint = endpoint::serve(config.listen, identity.clone(), stop.clone()).await?;
    tracing::info!(node = %identity.node_name, boot_id = %identity.agent_boot_id, address = %endpoint, "herd agent started");

    // A heartbeat that takes longer than this is given up, and the next one
    // goes to the next server: a hung server must not silence the node.
    let client = Client::new(config.servers.clone(), None).with_timeout(REQUEST_TIMEOUT);
    let store = credentials::CredentialStore::new(&data_dir);
    heartbeat::run(client, store, config.join_token.clone(), identity, endpoint, stop).await?;
    drop(lock);
    Ok(())
}
