//! The chaos soak's binary (`herd_bench::soak`): options from the
//! environment, the report printed, a violation a non-zero exit with the
//! seed to replay it. SIGINT or SIGTERM ends every process it started.
//!
//! `cargo build --release -p herd -p herd-bench && target/release/soak`
//! Options (environment): SOAK_SEED (default: drawn, and printed),
//! SOAK_FAULTS (faults to be done, default 1000), SOAK_GAP_MS (default
//! 1000-4000), SOAK_LENGTH_MS (default 500-5000), SOAK_KINDS
//! (comma-separated kinds of `FaultKind`, default every kind these
//! options allow), SOAK_REPLICAS (default 3), SOAK_POSTGRES (a
//! PostgreSQL URL for the replicas' store; default one SQLite file),
//! SOAK_NETNS (1: the first host in a network namespace, to be cut off;
//! default 1 as root), SOAK_DISKS (1: each host's data dir a tmpfs of its
//! own, to be filled; default 1 as root), SOAK_POSTGRES_APP (1: the
//! PostgreSQL example runs too, under a write probe; default 1 where
//! PostgreSQL 15 is installed), SOAK_CLIENT_PAUSE_MS (between each etcd
//! client's operations, default 50), SOAK_KEEP_LOGS (1: the logs are
//! kept in $TMPDIR/herd-soak-SEED without a violation too), HERD_BIN.

use std::time::Duration;

use anyhow::{Context, bail};
use herd_bench::processes::{env_u64, herd_binary};
use herd_bench::schedule::{FaultKind, Plan};
use herd_bench::soak::{Options, faketime_library, run};

fn range(name: &str, default: (u64, u64)) -> (Duration, Duration) {
    let parsed = std::env::var(name).ok().and_then(|v| {
        let (low, high) = v.split_once('-')?;
        Some((low.trim().parse().ok()?, high.trim().parse().ok()?))
    });
    let (low, high) = parsed.unwrap_or(default);
    (Duration::from_millis(low), Duration::from_millis(high.max(low + 1)))
}

fn kinds(possible: &[FaultKind]) -> anyhow::Result<Vec<FaultKind>> {
    let Ok(names) = std::env::var("SOAK_KINDS") else { return Ok(possible.to_vec()) };
    names
        .split(',')
        .map(|name| match FaultKind::ALL.into_iter().find(|k| format!("{k:?}") == name.trim()) {
            Some(kind) if possible.contains(&kind) => Ok(kind),
            Some(kind) => bail!("SOAK_KINDS: {kind:?} cannot be done here (possible: {possible:?})"),
            None => bail!("SOAK_KINDS: {name:?} is no fault kind (kinds: {:?})", FaultKind::ALL),
        })
        .collect()
}

fn postgres_installed() -> bool {
    std::path::Path::new(herd_bench::soak::POSTGRES_SERVER).exists()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let seed = match std::env::var("SOAK_SEED") {
        Ok(seed) => seed.parse().context("SOAK_SEED: a number")?,
        Err(_) => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64,
    };
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0);
    let mut options = Options {
        plan: Plan {
            seed,
            kinds: Vec::new(),
            gap: range("SOAK_GAP_MS", (1000, 4000)),
            length: range("SOAK_LENGTH_MS", (500, 5000)),
        },
        faults: env_u64("SOAK_FAULTS", 1000) as u32,
        herd: herd_binary()?,
        replicas: env_u64("SOAK_REPLICAS", 3) as usize,
        postgres: std::env::var("SOAK_POSTGRES").ok(),
        member_ports: None,
        netns: env_u64("SOAK_NETNS", u64::from(root)) == 1,
        faketime: faketime_library(),
        disks: env_u64("SOAK_DISKS", u64::from(root)) == 1,
        postgres_app: env_u64("SOAK_POSTGRES_APP", u64::from(postgres_installed())) == 1,
        client_pause: Duration::from_millis(env_u64("SOAK_CLIENT_PAUSE_MS", 50)),
        keep_logs: env_u64("SOAK_KEEP_LOGS", 0) == 1,
    };
    options.plan.kinds = kinds(&options.possible())?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // On a signal the soak is dropped, and with it every process it started.
    tokio::select! {
        outcome = run(&options) => outcome.map(drop),
        _ = tokio::signal::ctrl_c() => bail!("interrupted: every process the soak started is ended"),
        _ = terminate.recv() => bail!("terminated: every process the soak started is ended"),
    }
}
