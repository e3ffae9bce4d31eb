//! herd's agent: the only truth about what runs on its host.
//!
//! It joins the cluster (trading the join token for a node token kept in
//! its data dir), serves a small HTTP endpoint of its own and sends a
//! heartbeat every period, riding out server restarts with backoff and
//! moving between several server URLs. It runs members, and carries out
//! the Commands the leader issues to it, journaling each.
//!
//! Code map: [`credentials`] keeps the node token; [`node_cert`] the
//! node's certificate (its key made here, renewed before it expires); [`fsutil`] writes files
//! atomically; [`pid_lock`] keeps a second agent off the data dir, naming
//! the first; [`heartbeat`] is the join/heartbeat loop; [`endpoint`] is
//! the agent's own HTTP server; [`members`] runs and re-adopts member
//! processes ([`procs`]: liveness and signals); [`command_watch`] feeds the
//! node's Commands to the [`executor`], which journals ([`journal`]) and
//! carries them out ([`script`] runs scripts; [`worker`] is the detached
//! copy worker).

pub mod cgroups;
pub mod command_watch;
pub mod configuration;
pub mod credentials;
pub mod endpoint;
pub mod executor;
pub mod fsutil;
pub mod heartbeat;
pub mod host_resources;
pub mod journal;
pub mod member_logs;
pub mod members;
pub mod node_cert;
pub mod peer_access;
pub mod pid_lock;
pub mod procs;
pub mod readiness;
pub mod script;
pub mod setup;
pub mod sim;
pub mod volumes;
pub mod worker;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use herd_client::{Client, ClientError};
use tokio_util::sync::CancellationToken;

/// The agent's wall clock, as journal entries, answers and member status carry it.
pub(crate) fn now() -> herd_core::time::Timestamp {
    herd_core::time::Timestamp::from_system_time(std::time::SystemTime::now())
}

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
    /// After the server has been unreachable this long, the disconnect
    /// hooks of running commands run (cancelling them).
    pub disconnect_grace: Duration,
    /// The program that runs detached copy workers (`<program> agent-worker <job>`):
    /// the `herd` binary.
    pub worker_program: PathBuf,
    /// The cluster CAs the agent trusts, by hash (`--ca-hash`); empty: the
    /// ones it kept in its data dir from an earlier start.
    pub ca_hashes: Vec<herd_tls::CaHash>,
    /// Bytes per second a volume copy may pull at most (None: no limit).
    pub copy_bandwidth: Option<u64>,
    /// The host's capacity where not measured, and what is kept back.
    pub resources: host_resources::ResourceFlags,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("data dir {path}: {source}")]
    DataDir { path: PathBuf, source: std::io::Error },
    #[error("another agent ({}) is using data dir {}", holder.map_or("pid unknown".to_string(), |p| format!("pid {p}")), path.display())]
    DataDirLocked { path: PathBuf, holder: Option<u32> },
    #[error("listening on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("this node has no token yet and no join token was given (--join-token)")]
    NoJoinToken,
    #[error("the server refused to let this node join: {0}")]
    JoinRefused(ClientError),
    #[error("{0}")]
    UntrustedServer(ClientError),
    #[error("{path}: {reason}")]
    Trust { path: PathBuf, reason: String },
    #[error("{0}")]
    Credentials(#[from] credentials::CredentialsError),
    #[error("{0}")]
    NodeCert(#[from] node_cert::NodeCertError),
    #[error("{0}")]
    Members(#[from] members::MemberError),
    #[error("{0}")]
    Journal(#[from] journal::JournalError),
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

/// The client trusting the cluster CA: the hashes given, kept in the data
/// dir for the next start, or the ones kept there before. Plain HTTP
/// servers need none.
fn trusting(client: Client, data_dir: &std::path::Path, given: &[herd_tls::CaHash]) -> Result<Client, AgentError> {
    let path = data_dir.join("ca-hash");
    let trust_error = |reason: String| AgentError::Trust { path: path.clone(), reason };
    let hashes = if given.is_empty() {
        match std::fs::read_to_string(&path) {
            Ok(text) => text
                .split_whitespace()
                .map(|h| h.parse::<herd_tls::CaHash>().map_err(|e| trust_error(e.to_string())))
                .collect::<Result<Vec<_>, _>>()?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(trust_error(e.to_string())),
        }
    } else {
        let text: Vec<String> = given.iter().map(ToString::to_string).collect();
        fsutil::write_atomic(&path, format!("{}\n", text.join("\n")).as_bytes(), 0o644)
            .map_err(|e| trust_error(e.to_string()))?;
        given.to_vec()
    };
    if hashes.is_empty() {
        if client.servers().iter().any(|s| s.starts_with("https://")) {
            return Err(trust_error(
                "no cluster CA to trust: start the agent with --ca-hash sha256:... (the join command that `herd server` prints has it)".into(),
            ));
        }
        return Ok(client);
    }
    client.with_trust(&herd_tls::Trust::Pinned(hashes)).map_err(AgentError::UntrustedServer)
}

/// The servers to try, in order: `first`, then those of `then` not among them.
pub fn servers_in_order(first: Vec<String>, then: &[String]) -> Vec<String> {
    let mut servers = first;
    for server in then {
        if !servers.contains(server) {
            servers.push(server.clone());
        }
    }
    servers
}

/// The lock an agent holds on its data dir while it runs.
pub fn lock_path(data_dir: &std::path::Path) -> PathBuf {
    data_dir.join("agent.lock")
}

/// Runs the agent until `stop` fires.
pub async fn run(config: AgentConfig, stop: CancellationToken) -> Result<(), AgentError> {
    // Resolved once: members run in directories of their own, where a
    // relative path (`--data-dir a1`) would name another place.
    let data_dir = std::path::absolute(&config.data_dir)
        .map_err(|source| AgentError::DataDir { path: config.data_dir.clone(), source })?;
    std::fs::create_dir_all(&data_dir).map_err(|source| AgentError::DataDir { path: data_dir.clone(), source })?;
    // Taken before anything else: a second agent must not touch members.
    let lock = pid_lock::PidLock::acquire(&lock_path(&data_dir)).map_err(|error| match error {
        pid_lock::PidLockError::Busy { holder, .. } => AgentError::DataDirLocked { path: data_dir.clone(), holder },
        pid_lock::PidLockError::Io { source, .. } => AgentError::DataDir { path: data_dir.clone(), source },
    })?;

    // Checked before any member is touched: an agent that cannot trust its
    // server starts nothing.
    let copies = configuration::ConfigCopies::open(&data_dir);
    // The master it was last told of is tried once the given servers fail
    // (it may be one a failover started while this agent was down).
    let servers = servers_in_order(config.servers.clone(), &copies.master_urls());
    let client = trusting(Client::new(servers.clone(), None), &data_dir, &config.ca_hashes)?;
    let identity = Identity {
        node_name: config.node_name.clone(),
        agent_boot_id: uuid::Uuid::now_v7().to_string(),
        host_boot_id: host_boot_id(),
    };
    let cgroups = cgroups::Cgroups::detect(&config.node_name, &data_dir);
    let host = members::MemberHost { cgroups: cgroups.clone(), log_writer: Some(config.worker_program.clone()) };
    let members = members::Members::open(&data_dir, host, stop.clone()).await?;
    // Workers killed with the host left their staging locks behind.
    let stale = worker::remove_stale_locks(&members.incoming_dir());
    if stale > 0 {
        tracing::info!(count = stale, "removed staging locks no copy holds");
    }
    let node_identity = node_cert::NodeCertStore::open(&data_dir, &identity.node_name)?.identity();
    let access = peer_access::PeerAccess::open(&data_dir, &identity.node_name, node_identity);
    let endpoint = endpoint::serve(
        config.listen,
        identity.clone(),
        (members.clone(), copies.clone()),
        access.clone(),
        stop.clone(),
    )
    .await?;
    tracing::info!(node = %identity.node_name, boot_id = %identity.agent_boot_id, address = %endpoint, "herd agent started");
    let workers = executor::Workers {
        program: config.worker_program.clone(),
        access: access.clone(),
        bandwidth: config.copy_bandwidth,
        node: identity.node_name.clone(),
    };
    let executor = executor::Executor::open(&data_dir, members.clone(), workers, stop.clone())?;
    let checks = tokio::spawn(readiness::run(members.clone(), stop.clone()));
    let fences = tokio::spawn(members::leadership::run(members.clone(), stop.clone()));

    // A heartbeat that takes longer than this is given up, and the next one
    // goes to the next server: a hung server must not silence the node.
    let watch_client = client.clone();
    let client = client.with_timeout(REQUEST_TIMEOUT);
    let store = credentials::CredentialStore::new(&data_dir);
    // The watch is long-lived: no request timeout on it.
    let watcher = tokio::spawn(command_watch::run(
        watch_client,
        store.clone(),
        identity.node_name.clone(),
        executor.clone(),
        stop.clone(),
    ));
    let heartbeat = heartbeat::Heartbeat {
        client,
        store,
        join_token: config.join_token.clone(),
        identity,
        endpoint,
        members,
        executor: executor.clone(),
        access,
        data_dir: data_dir.clone(),
        disconnect_grace: config.disconnect_grace,
        copies,
        servers: config.servers.clone(),
        resources: config.resources.clone(),
    };
    let beating = heartbeat.run(stop.clone()).await;
    stop.cancel();
    let _ = watcher.await;
    let _ = checks.await;
    let _ = fences.await;
    executor.run_disconnect_hooks("the agent is stopping").await;
    cgroups.remove_empty_groups();
    beating?;
    drop(lock);
    Ok(())
}
