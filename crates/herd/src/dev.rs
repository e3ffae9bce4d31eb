//! `herd dev`: a server on SQLite and a few real agent processes, in one
//! command, for trying herd out. Ctrl-C stops everything it started; the
//! data dir keeps the cluster for the next run. A busy data dir (another
//! `herd dev`, or an agent left running on a node's dir) is refused up
//! front, naming the PID; an agent that dies is said and started again;
//! a failed start stops what it started, members included.

use std::time::Duration;

use anyhow::{Context, bail};
use herd_agent::pid_lock::{PidLock, PidLockError};
use herd_client::Client;
use herd_core::Timestamp;
use herd_core::kinds::NodeSpec;
use herd_server::{Server, ServerConfig};
use tokio::process::Child;

use crate::cli::DevArgs;
use crate::commands::modes::shutdown_signal;
use crate::context::{ConfigFile, default_config_path, write_config};
use crate::processes;
use crate::tokens;

/// How the dev cluster is reached.
struct Access {
    url: String,
    admin_token: String,
    join_token: String,
    ca_hash: herd_tls::CaHash,
    ca_pem: String,
}

impl Access {
    /// What an agent is started with: the join token and the CA to trust.
    fn agent_env(&self) -> [(&'static str, String); 2] {
        [("HERD_JOIN_TOKEN", self.join_token.clone()), ("HERD_CA_HASH", self.ca_hash.to_string())]
    }
}

/// One agent `herd dev` runs, and how often it had to be started again.
struct DevAgent {
    name: String,
    args: Vec<String>,
    child: Option<Child>,
    restarts: Vec<tokio::time::Instant>,
}

/// An agent that exits more often than this within [`RESTART_WINDOW`] is
/// left stopped: its log says why, and restarting it would hide that.
const MAX_RESTARTS: usize = 5;
const RESTART_WINDOW: Duration = Duration::from_secs(60);

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    let dir = &args.data_dir;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir.canonicalize().with_context(|| format!("resolving {}", dir.display()))?;
    // Refused up front, before a server or an agent starts: a second `herd
    // dev` on the same data dir, or an agent left running on one of its nodes.
    let _dev_lock = PidLock::acquire(&dir.join("dev.lock")).map_err(|error| match error {
        PidLockError::Busy { holder, .. } => anyhow::anyhow!(
            "another herd dev ({}) is using {}: stop it first (Ctrl-C in its terminal{})",
            holder.map_or("pid unknown".into(), |pid| format!("pid {pid}")),
            dir.display(),
            holder.map_or(String::new(), |pid| format!(", or kill -INT {pid}"))
        ),
        other => anyhow::Error::new(other),
    })?;
    let agent_dir = |name: &str| dir.join("agents").join(name);
    let names: Vec<String> = (1..=args.agents).map(|i| format!("node-{i}")).collect();
    for name in &names {
        if let Some(holder) = PidLock::holder(&herd_agent::lock_path(&agent_dir(name))) {
            bail!(
                "an agent ({}) is still running on {name}'s data dir {}, started outside this herd dev: \
                 stop it first{}; nothing was started",
                holder.map_or("pid unknown".into(), |pid| format!("pid {pid}")),
                agent_dir(name).display(),
                holder.map_or(String::new(), |pid| format!(" (kill {pid})"))
            );
        }
    }
    let admin_token = tokens::load_or_generate(&dir.join("admin.token"))?;
    let join_token = tokens::load_or_generate(&dir.join("join.token"))?;
    let store_url = dir.join("server").join("herd.db").display().to_string();
    let server = Server::start(ServerConfig {
        listen: args.listen,
        store_url,
        admin_token: admin_token.clone(),
        join_token: join_token.clone(),
        identity: "dev".into(),
        advertise_url: None,
        election: Default::default(),
        fencing_probe: None,
        insecure_http: false,
        // The server runs on node-1, the first node's host.
        node: Some("node-1".into()),
        agent_cert_lifetime: herd_server::DEFAULT_AGENT_CERT_LIFETIME,
        restore: None,
    })
    .await
    .context("starting the server")?;
    let url = server.url().to_string();
    let ca_hash = server.ca_hash().context("the dev server serves TLS")?;
    let ca_pem = server.ca_pem().context("the dev server serves TLS")?.to_string();

    let share = host_share(&dir, names.len());
    let mut agents: Vec<DevAgent> = names
        .iter()
        .map(|name| DevAgent {
            name: name.clone(),
            args: [
                "agent",
                "--server",
                &url,
                "--data-dir",
                &agent_dir(name).display().to_string(),
                "--name",
                name,
                "--capacity-cpu",
                &share.cpu.to_string(),
                "--capacity-memory",
                &share.memory.to_string(),
                "--capacity-disk",
                &share.disk.to_string(),
            ]
            .map(String::from)
            .to_vec(),
            child: None,
            restarts: Vec::new(),
        })
        .collect();
    let access = Access { url, admin_token, join_token, ca_hash, ca_pem };
    let outcome = run_cluster(&args, &access, &dir, &mut agents).await;
    println!("stopping {} agents, their members and the server", agents.len());
    for agent in &mut agents {
        if let Some(child) = &mut agent.child {
            processes::stop(child, Duration::from_secs(5)).await;
        }
    }
    // Members outlive their agent by design; here they go too, as in a
    // host shutdown, and the next `herd dev` starts them again. Also when
    // the start failed: nothing `herd dev` started is left behind.
    for agent in &agents {
        herd_agent::members::stop_processes(&agent_dir(&agent.name)).await;
    }
    server.stop().await?;
    outcome
}

/// What each of `agents` agents side by side on this host is given of
/// it: an equal part of its cores, memory and disk (the disk `dir` is
/// on), so that placement counts the host once, not once per agent.
fn host_share(dir: &std::path::Path, agents: usize) -> herd_core::resources::Amounts {
    use herd_core::quantity::{Bytes, Millicores};
    let host = herd_agent::host_resources::ResourceFlags::default().report(dir).capacity;
    let agents = u64::try_from(agents.max(1)).unwrap_or(1);
    herd_core::resources::Amounts {
        cpu: Millicores(host.cpu.0 / agents),
        memory: Bytes(host.memory.0 / agents),
        disk: Bytes(host.disk.0 / agents),
    }
}

/// Starts the agents, waits until they are Ready, says how to use the
/// cluster, then keeps the agents running (an agent that exits is said and
/// started again) until Ctrl-C.
async fn run_cluster(
    args: &DevArgs,
    access: &Access,
    dir: &std::path::Path,
    agents: &mut [DevAgent],
) -> anyhow::Result<()> {
    let agents_started = Timestamp::from_system_time(std::time::SystemTime::now());
    for agent in agents.iter_mut() {
        let child = processes::spawn_self(&agent.args, &access.agent_env())
            .with_context(|| format!("starting agent {}", agent.name))?;
        agent.child = Some(child);
    }
    let client = Client::new(vec![access.url.clone()], Some(access.admin_token.clone()))
        .with_trust(&herd_tls::Trust::Ca(access.ca_pem.clone()))?;
    wait_for_agents(&client, agents, agents_started).await?;
    let (url, admin_token) = (&access.url, &access.admin_token);

    let config_note = if args.no_config {
        String::from("(no CLI config written: --no-config)")
    } else {
        let path = default_config_path().context("no HOME to write the CLI config into; use --no-config")?;
        let config = ConfigFile {
            servers: vec![url.to_string()],
            token: Some(admin_token.to_string()),
            ca: Some(access.ca_pem.clone()),
        };
        write_config(&path, &config)?;
        format!("CLI config written to {}", path.display())
    };
    // For a browser to trust (the dashboard), as `herd server` writes it.
    let ca_file = dir.join("ca.pem");
    herd_agent::fsutil::write_atomic(&ca_file, access.ca_pem.as_bytes(), 0o644)
        .with_context(|| format!("writing {}", ca_file.display()))?;
    println!("herd dev is running");
    println!("  server:      {url}");
    println!("  dashboard:   {url}/ui (log in with the admin token; the browser does not know the cluster CA:");
    println!("               accept it, or import {})", ca_file.display());
    println!("  admin token: {admin_token}");
    println!("  cluster CA:  {}", access.ca_hash);
    println!("  data dir:    {}", dir.display());
    println!("  agents:      {}", agents.iter().map(|a| a.name.as_str()).collect::<Vec<_>>().join(", "));
    println!("  {config_note}");
    println!("  try:         herd get nodes");
    println!(
        "  or point any shell at it: export HERD_SERVER={url} HERD_TOKEN={admin_token} HERD_CA_HASH={}",
        access.ca_hash
    );
    println!("Press Ctrl-C to stop.");

    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    let mut checks = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = &mut shutdown => return Ok(()),
            _ = checks.tick() => {
                for agent in agents.iter_mut() {
                    supervise(agent, access)?;
                }
            }
        }
    }
}

/// Reaps an agent that exited, says so, and starts it again, unless it
/// keeps exiting.
fn supervise(agent: &mut DevAgent, access: &Access) -> anyhow::Result<()> {
    let Some(child) = &mut agent.child else { return Ok(()) };
    let Some(status) = child.try_wait()? else { return Ok(()) };
    agent.child = None;
    let now = tokio::time::Instant::now();
    agent.restarts.retain(|at| now.duration_since(*at) < RESTART_WINDOW);
    if agent.restarts.len() >= MAX_RESTARTS {
        println!(
            "agent {} exited ({status}), the {}th time within {}s: left stopped; its log is above",
            agent.name,
            MAX_RESTARTS + 1,
            RESTART_WINDOW.as_secs()
        );
        return Ok(());
    }
    agent.restarts.push(now);
    println!("agent {} exited ({status}); starting it again", agent.name);
    let child = processes::spawn_self(&agent.args, &access.agent_env())
        .with_context(|| format!("starting agent {} again", agent.name))?;
    agent.child = Some(child);
    Ok(())
}

/// How long `herd dev` waits for its agents to report Ready.
const AGENTS_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Waits until every agent's node is Ready with a heartbeat from after
/// `since` (a node kept from an earlier run still says Ready before its
/// new agent has spoken); fails at once, naming it, if an agent exits.
async fn wait_for_agents(client: &Client, agents: &mut [DevAgent], since: Timestamp) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + AGENTS_READY_TIMEOUT;
    loop {
        for agent in agents.iter_mut() {
            if let Some(status) = agent.child.as_mut().map(Child::try_wait).transpose()?.flatten() {
                bail!("agent {} exited ({status}) before its node was Ready; its log is above", agent.name);
            }
        }
        let nodes = client.list::<NodeSpec>("").await.unwrap_or_default();
        let ready = |name: &str| {
            nodes.iter().any(|n| {
                n.metadata.name == name && n.status.ready && n.status.last_heartbeat.is_some_and(|t| t >= since)
            })
        };
        if agents.iter().all(|agent| ready(&agent.name)) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            let waiting: Vec<_> = agents.iter().map(|a| a.name.as_str()).filter(|n| !ready(n)).collect();
            bail!("agents {} did not become Ready within {}s", waiting.join(", "), AGENTS_READY_TIMEOUT.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
