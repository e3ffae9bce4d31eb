//! The API's write latency over TLS beside plain HTTP, measured in the same
//! run: two servers in this process, one serving TLS with the cluster CA
//! and one with `insecure_http`, each on its own SQLite store, written to
//! through the typed client (keep-alive connections, as the CLI and agents
//! use them). Sides alternate in rounds, so drift falls on both alike.
//!
//! `cargo run --release -p herd-bench --bin api`
//! Options (environment): BENCH_ROUNDS (default 5), BENCH_SEQUENTIAL
//! (creates per round, default 300), BENCH_WRITERS (default 16),
//! BENCH_PER_WRITER (creates per writer per round, default 20).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use herd_client::Client;
use herd_core::Object;
use herd_core::kinds::{LeaderElectionOverrides, LeaseSpec};
use herd_server::{Server, ServerConfig};

const ADMIN: &str = "bench-admin-token";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

async fn server(dir: &std::path::Path, insecure_http: bool) -> anyhow::Result<(Server, Client)> {
    let server = Server::start(ServerConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        store_url: dir.join("herd.db").display().to_string(),
        admin_token: ADMIN.into(),
        join_token: "bench-join".into(),
        identity: if insecure_http { "plain".into() } else { "tls".into() },
        advertise_url: None,
        election: LeaderElectionOverrides::default(),
        fencing_probe: None,
        insecure_http,
        node: None,
        agent_cert_lifetime: herd_server::DEFAULT_AGENT_CERT_LIFETIME,
        restore: None,
    })
    .await?;
    let client = Client::new(vec![server.url().to_string()], Some(ADMIN.into()));
    let client = match server.ca_hash() {
        Some(hash) => client.with_trust(&herd_tls::Trust::Pinned(vec![hash]))?,
        None => client,
    };
    Ok((server, client))
}

fn lease(name: String) -> Object<LeaseSpec> {
    Object::new(name, LeaseSpec { holder_identity: "bench".into(), lease_duration_seconds: 15, ..Default::default() })
}

#[derive(Default)]
struct Side {
    sequential: Vec<Duration>,
    concurrent: Vec<Duration>,
    concurrent_busy: Duration,
    concurrent_writes: usize,
}

async fn round(
    client: &Client,
    side: &mut Side,
    round: u64,
    sequential: u64,
    writers: u64,
    per_writer: u64,
) -> anyhow::Result<()> {
    for i in 0..sequential {
        let started = Instant::now();
        client.create(&lease(format!("s-{round}-{i}"))).await?;
        side.sequential.push(started.elapsed());
    }
    let started = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                for i in 0..per_writer {
                    let began = Instant::now();
                    client.create(&lease(format!("c-{round}-{w}-{i}"))).await?;
                    latencies.push(began.elapsed());
                }
                anyhow::Ok(latencies)
            })
        })
        .collect();
    for task in tasks {
        side.concurrent.extend(task.await??);
    }
    side.concurrent_busy += started.elapsed();
    side.concurrent_writes += (writers * per_writer) as usize;
    Ok(())
}

fn percentile(latencies: &mut [Duration], p: f64) -> Duration {
    latencies.sort();
    let index = ((latencies.len() as f64 - 1.0) * p).round() as usize;
    latencies.get(index).copied().unwrap_or_default()
}

fn mean(latencies: &[Duration]) -> Duration {
    latencies.iter().sum::<Duration>() / latencies.len().max(1) as u32
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let rounds = env_u64("BENCH_ROUNDS", 5);
    let sequential = env_u64("BENCH_SEQUENTIAL", 300);
    let writers = env_u64("BENCH_WRITERS", 16);
    let per_writer = env_u64("BENCH_PER_WRITER", 20);
    let (plain_dir, tls_dir) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let (plain_server, plain) = server(plain_dir.path(), true).await?;
    let (tls_server, tls) = server(tls_dir.path(), false).await?;
    println!(
        "API writes (create a Lease), {rounds} rounds of {sequential} sequential and {writers}x{per_writer} concurrent"
    );
    let (mut plain_side, mut tls_side) = (Side::default(), Side::default());
    for r in 0..rounds {
        if r % 2 == 0 {
            round(&plain, &mut plain_side, r, sequential, writers, per_writer).await?;
            round(&tls, &mut tls_side, r, sequential, writers, per_writer).await?;
        } else {
            round(&tls, &mut tls_side, r, sequential, writers, per_writer).await?;
            round(&plain, &mut plain_side, r, sequential, writers, per_writer).await?;
        }
    }
    println!("{:<28}{:>14}{:>14}{:>10}", "", "plain HTTP", "TLS", "TLS/plain");
    let row = |label: &str, plain: Duration, tls: Duration| {
        println!("{label:<28}{:>14}{:>14}{:>9.2}x", ms(plain), ms(tls), tls.as_secs_f64() / plain.as_secs_f64());
    };
    row("sequential mean", mean(&plain_side.sequential), mean(&tls_side.sequential));
    row("sequential p50", percentile(&mut plain_side.sequential, 0.5), percentile(&mut tls_side.sequential, 0.5));
    row("sequential p99", percentile(&mut plain_side.sequential, 0.99), percentile(&mut tls_side.sequential, 0.99));
    row("concurrent mean", mean(&plain_side.concurrent), mean(&tls_side.concurrent));
    row("concurrent p99", percentile(&mut plain_side.concurrent, 0.99), percentile(&mut tls_side.concurrent, 0.99));
    let throughput = |side: &Side| side.concurrent_writes as f64 / side.concurrent_busy.as_secs_f64();
    println!(
        "{:<28}{:>11.0}/s{:>11.0}/s{:>9.2}x",
        "concurrent throughput",
        throughput(&plain_side),
        throughput(&tls_side),
        throughput(&tls_side) / throughput(&plain_side)
    );
    plain_server.stop().await?;
    tls_server.stop().await?;
    Ok(())
}
