//! `herd dev`: a server on SQLite and a few real agent processes, in one
//! command, for trying herd out. Ctrl-C stops everything it started; the
//! data dir keeps the cluster for the next run.

use std::time::Duration;

use anyhow::{Context, bail};
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

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    let dir = &args.data_dir;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir.canonicalize().with_context(|| format!("resolving {}", dir.display()))?;
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
    })
    .await
    .context("starting the server")?;
    let url = format!("http://{}", server.addr());

    let agents_started = Timestamp::from_system_time(std::time::SystemTime::now());
    let mut agents = Vec::new();
    for i in 1..=args.agents {
        let name = format!("node-{i}");
        let agent_args: Vec<String> = vec![
            "agent".into(),
            "--server".into(),
            url.clone(),
            "--data-dir".into(),
            dir.join("agents").join(&name).display().to_string(),
            "--name".into(),
            name.clone(),
        ];
        let child = processes::spawn_self(&agent_args, &[("HERD_JOIN_TOKEN", &join_token)])
            .with_context(|| format!("starting agent {name}"))?;
        agents.push((name, child));
    }

    wait_for_agents(&url, &admin_token, &mut agents, agents_started).await?;

    let config_note = if args.no_config {
        String::from("(no CLI config written: --no-config)")
    } else {
        let path = default_config_path().context("no HOME to write the CLI config into; use --no-config")?;
        write_config(&path, &ConfigFile { servers: vec![url.clone()], token: Some(admin_token.clone()) })?;
        format!("CLI config written to {}", path.display())
    };
    println!("herd dev is running");
    println!("  server:      {url}");
    println!("  admin token: {admin_token}");
    println!("  data dir:    {}", dir.display());
    println!("  agents:      {}", agents.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", "));
    println!("  {config_note}");
    println!("  try:         herd get nodes");
    println!("  or point any shell at it: export HERD_SERVER={url} HERD_TOKEN={admin_token}");
    println!("Press Ctrl-C to stop.");

    shutdown_signal().await;
    println!("stopping {} agents, their members and the server", agents.len());
    for (_, child) in &mut agents {
        processes::stop(child, Duration::from_secs(5)).await;
    }
    // Members outlive their agent by design; here they go too, as in a
    // host shutdown, and the next `herd dev` starts them again.
    for (name, _) in &agents {
        herd_agent::members::stop_processes(&dir.join("agents").join(name)).await;
    }
    server.stop().await?;
    Ok(())
}

/// How long `herd dev` waits for its agents to report Ready.
const AGENTS_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Waits until every agent's node is Ready with a heartbeat from after
/// `since` (a node kept from an earlier run still says Ready before its
/// new agent has spoken); fails at once, naming it, if an agent exits.
async fn wait_for_agents(
    url: &str,
    admin_token: &str,
    agents: &mut [(String, Child)],
    since: Timestamp,
) -> anyhow::Result<()> {
    let client = Client::new(vec![url.to_string()], Some(admin_token.to_string()));
    let deadline = tokio::time::Instant::now() + AGENTS_READY_TIMEOUT;
    loop {
        for (name, child) in agents.iter_mut() {
            if let Some(status) = child.try_wait()? {
                bail!("agent {name} exited ({status}) before its node was Ready; its log is above");
            }
        }
        let nodes = client.list::<NodeSpec>("").await.unwrap_or_default();
        let ready = |name: &str| {
            nodes.iter().any(|n| {
                n.metadata.name == name && n.status.ready && n.status.last_heartbeat.is_some_and(|t| t >= since)
            })
        };
        if agents.iter().all(|(name, _)| ready(name)) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            let waiting: Vec<_> = agents.iter().map(|(n, _)| n.as_str()).filter(|n| !ready(n)).collect();
            bail!("agents {} did not become Ready within {}s", waiting.join(", "), AGENTS_READY_TIMEOUT.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
