//! `herd server` and `herd agent`: the long-running modes.

use anyhow::Context;
use herd_agent::AgentConfig;
use herd_agent::host_resources::ResourceFlags;
use herd_core::HumanDuration;
use herd_core::resources::Amounts;
use herd_server::{Server, ServerConfig};
use tokio_util::sync::CancellationToken;

use crate::cli::{AgentArgs, ServerArgs};
use crate::tokens;

/// Resolves when the process is asked to stop (SIGINT or SIGTERM).
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) {
        (Ok(mut interrupt), Ok(mut terminate)) => {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

pub async fn server(args: ServerArgs) -> anyhow::Result<()> {
    let server = start_server(args, None).await?;
    serve_until_signal(server).await
}

/// Starts a server (seeding its new store from `restore`, for a master
/// failover) and prints where it serves and how agents join.
pub async fn start_server(args: ServerArgs, restore: Option<herd_server::restore::Restore>) -> anyhow::Result<Server> {
    std::fs::create_dir_all(&args.data_dir).with_context(|| format!("creating {}", args.data_dir.display()))?;
    let admin_token = match args.admin_token {
        Some(token) => token,
        None => tokens::load_or_generate(&args.data_dir.join("admin.token"))?,
    };
    let join_token = match args.join_token {
        Some(token) => token,
        None => tokens::load_or_generate(&args.data_dir.join("join.token"))?,
    };
    let store_url = args.store.unwrap_or_else(|| args.data_dir.join("herd.db").display().to_string());
    let identity = args.identity.unwrap_or_else(|| format!("{}-{}", host_name(), std::process::id()));
    let server = Server::start(ServerConfig {
        listen: args.listen,
        store_url,
        admin_token,
        join_token,
        identity,
        advertise_url: args.advertise_url,
        election: args.election.overrides(),
        fencing_probe: args.fencing_probe.map(HumanDuration::get),
        insecure_http: args.insecure_http,
        node: args.node.clone(),
        agent_cert_lifetime: args.agent_cert_lifetime.get(),
        restore,
    })
    .await?;
    println!("herd server listening on {}", server.url());
    if let (Some(hash), Some(pem)) = (server.ca_hash(), server.ca_pem()) {
        let ca_file = args.data_dir.join("ca.pem");
        herd_agent::fsutil::write_atomic(&ca_file, pem.as_bytes(), 0o644)
            .with_context(|| format!("writing {}", ca_file.display()))?;
        println!("cluster CA: {hash} (certificate in {})", ca_file.display());
        println!(
            "join an agent: herd agent --server {} --ca-hash {hash} --join-token <the join token> --name NODE",
            server.url()
        );
    }
    Ok(server)
}

/// Serves until SIGINT or SIGTERM, then stops.
pub async fn serve_until_signal(server: Server) -> anyhow::Result<()> {
    let stop = server.shutdown_token();
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("stopping");
        stop.cancel();
    });
    server.wait().await?;
    Ok(())
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_ascii_lowercase())
        .unwrap_or_else(|_| "localhost".into())
}

pub async fn agent(args: AgentArgs, conn: crate::cli::Connection) -> anyhow::Result<()> {
    let servers = conn.server.clone();
    if servers.is_empty() {
        anyhow::bail!("the agent needs --server URL (or HERD_SERVER): the server(s) to join");
    }
    let config = AgentConfig {
        servers,
        join_token: args.join_token,
        data_dir: args.data_dir,
        node_name: args.name.unwrap_or_else(host_name),
        listen: args.listen,
        disconnect_grace: args.disconnect_grace.get(),
        worker_program: std::env::current_exe().context("finding the herd binary, to run copy workers")?,
        copy_bandwidth: args.copy_mib_per_sec.map(|mib| mib.saturating_mul(1 << 20)),
        ca_hashes: crate::context::ca_hashes(&conn.ca_hash)?,
        resources: ResourceFlags {
            cpu: args.capacity_cpu,
            memory: args.capacity_memory,
            disk: args.capacity_disk,
            reserved: Amounts { cpu: args.reserve_cpu, memory: args.reserve_memory, disk: args.reserve_disk },
        },
    };
    let stop = CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        on_signal.cancel();
    });
    herd_agent::run(config, stop).await?;
    Ok(())
}

pub async fn sim_nodes(args: crate::cli::SimArgs, conn: crate::cli::Connection) -> anyhow::Result<()> {
    let client = crate::context::client(&conn)?;
    let config = herd_agent::sim::SimConfig {
        client,
        join_token: args.join_token,
        prefix: args.prefix,
        count: args.count as usize,
    };
    let stop = CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        on_signal.cancel();
    });
    println!("running {} simulated nodes ({}-1..)", config.count, config.prefix);
    herd_agent::sim::run(config, stop).await;
    Ok(())
}
