//! Isolation: redis-benchmark's p99 latency against a redis member, in
//! one run, (1) alone on its node, (2) beside a CPU and memory hog member
//! with no requests or limits on either, and (3) beside the same hog with
//! limits: redis requests a core and 256Mi, the hog requests 100m and is
//! capped at 250m and 512Mi. The goal: with limits, p99 at most 1.5x of
//! alone.
//!
//! `cargo build --release -p herd -p herd-bench && target/release/isolation`
//! Options (environment): BENCH_ROUNDS (default 3), BENCH_REQUESTS
//! (default 200000 a round), HERD_BIN. Needs redis-server,
//! redis-benchmark and python3, and a host whose cgroups the agent can
//! use (it says so, or the run stops).

mod processes;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use herd_client::Client;
use herd_core::kinds::{MemberSpec, NodeSpec};
use herd_core::node_health::RESOURCE_ISOLATION;
use processes::{ADMIN, Killed, env_u64, herd_binary, start, wait_for};

/// Four busy loops, and a python that keeps writing through 400 MiB.
const HOG: &str = "for i in 1 2 3 4; do (while :; do :; done) & done; \
    exec python3 -c 'b = bytearray(400 << 20)\nwhile True:\n    for i in range(0, len(b), 4096): b[i] = (b[i] + 1) & 255'";

fn redis(name: &str, resources: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"metadata": {"name": name}, "spec": {"roles": [{
        "name": "redis",
        "run": {"command": ["sh", "-c", "exec redis-server --port $HERD_PORT_CLIENT --save '' --appendonly no"],
                "resources": resources},
        "ports": [{"name": "client"}],
        "readiness": {"tcpPort": "client", "period": "1s", "timeout": "500ms"}
    }]}})
}

fn hog(name: &str, resources: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"metadata": {"name": name}, "spec": {"roles": [{
        "name": "hog", "run": {"command": ["sh", "-c", HOG], "resources": resources}
    }]}})
}

fn cluster(name: &str, app: &str, role: &str) -> serde_json::Value {
    serde_json::json!({"metadata": {"name": name}, "spec": {"appRef": app, "roles": [{"name": role, "members": 1}]}})
}

/// Creates cluster `name` of App `app` and waits until its one member
/// is ready; returns the member.
async fn up(admin: &Client, name: &str, app: &str, role: &str) -> anyhow::Result<herd_core::kinds::Member> {
    admin.create_value("appclusters", &cluster(name, app, role), Default::default()).await?;
    let member = format!("{name}-{role}-0");
    wait_for(&format!("{member} ready"), Duration::from_secs(60), async || {
        admin.get::<MemberSpec>(&member).await.ok().filter(|m| m.status.ready)
    })
    .await
}

async fn down(admin: &Client, name: &str) -> anyhow::Result<()> {
    admin.delete_value("appclusters", name, Default::default()).await?;
    wait_for(&format!("{name}'s members gone"), Duration::from_secs(60), async || {
        let members = admin.list::<MemberSpec>(&format!("herd.io/cluster={name}")).await.ok()?;
        members.is_empty().then_some(())
    })
    .await
}

/// One redis-benchmark run (SET and GET): the higher of their p99s, in ms.
fn p99(port: u16, requests: u64) -> anyhow::Result<f64> {
    let out = Command::new("redis-benchmark")
        .args(["-p", &port.to_string(), "-n", &requests.to_string(), "-c", "50", "-t", "set,get", "--csv", "-q"])
        .output()
        .context("running redis-benchmark")?;
    if !out.status.success() {
        bail!("redis-benchmark: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().context("no header")?.split(',').map(|f| f.trim_matches('"')).collect();
    let column = header.iter().position(|h| *h == "p99_latency_ms").context("no p99 column")?;
    let values: Vec<f64> =
        lines.filter_map(|line| line.split(',').nth(column)?.trim_matches('"').parse().ok()).collect();
    values.into_iter().reduce(f64::max).context("no figures")
}

/// The median p99 of `rounds` runs against `member`'s redis.
fn measure(member: &herd_core::kinds::Member, rounds: u64, requests: u64) -> anyhow::Result<(f64, Vec<f64>)> {
    let port = *member.spec.ports.get("client").context("the client port")?;
    let mut all: Vec<f64> = (0..rounds).map(|_| p99(port, requests)).collect::<Result<_, _>>()?;
    let shown = all.clone();
    all.sort_by(f64::total_cmp);
    Ok((all[all.len() / 2], shown))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let rounds = env_u64("BENCH_ROUNDS", 3);
    let requests = env_u64("BENCH_REQUESTS", 200_000);
    let herd = herd_binary()?;
    let dir = tempfile::tempdir()?;
    let (server, url) =
        start(&herd, &["server", "--listen", "127.0.0.1:0", "--insecure-http"], &dir.path().join("server"))?;
    let mut children = Killed(vec![server]);
    let agent_dir: PathBuf = dir.path().join("agent-1");
    children.0.push(start(&herd, &["--server", &url, "agent", "--name", "node-1"], &agent_dir)?.0);
    let admin = Client::new(vec![url], Some(ADMIN.into()));
    let outcome = run(&admin, rounds, requests).await;
    drop(children);
    herd_agent::members::stop_processes(&agent_dir).await;
    outcome
}

async fn run(admin: &Client, rounds: u64, requests: u64) -> anyhow::Result<()> {
    let node = wait_for("node-1 Ready", Duration::from_secs(30), async || {
        admin.get::<NodeSpec>("node-1").await.ok().filter(|n| n.status.ready)
    })
    .await?;
    let isolation = node.status.condition(RESOURCE_ISOLATION).context("no isolation condition")?;
    if isolation.reason == "NoCgroups" {
        bail!("the agent has no cgroups here: {}", isolation.message);
    }
    println!(
        "isolation benchmark: redis-benchmark -c 50 -t set,get, {requests} requests a round, {rounds} rounds; {}",
        isolation.message
    );
    let none = serde_json::json!({});
    admin.create_value("apps", &redis("kv", none.clone()), Default::default()).await?;
    admin
        .create_value(
            "apps",
            &redis("kv-limited", serde_json::json!({"cpu": "1", "memory": "256Mi"})),
            Default::default(),
        )
        .await?;
    admin.create_value("apps", &hog("hog", none), Default::default()).await?;
    let capped = serde_json::json!({"cpu": "100m", "cpuMax": "250m", "memory": "256Mi", "memoryMax": "512Mi"});
    admin.create_value("apps", &hog("hog-limited", capped), Default::default()).await?;

    let member = up(admin, "kv", "kv", "redis").await?;
    let (alone, alone_rounds) = measure(&member, rounds, requests)?;
    up(admin, "hog", "hog", "hog").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (unlimited, unlimited_rounds) = measure(&member, rounds, requests)?;
    down(admin, "hog").await?;
    down(admin, "kv").await?;

    let member = up(admin, "kv-limited", "kv-limited", "redis").await?;
    up(admin, "hog-limited", "hog-limited", "hog").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (limited, limited_rounds) = measure(&member, rounds, requests)?;
    down(admin, "hog-limited").await?;
    down(admin, "kv-limited").await?;

    println!("p99 alone:                        {alone:.3} ms   rounds {alone_rounds:?}");
    println!(
        "p99 beside the hog, no limits:    {unlimited:.3} ms ({:.2}x alone)   rounds {unlimited_rounds:?}",
        unlimited / alone
    );
    println!(
        "p99 beside the hog, with limits:  {limited:.3} ms ({:.2}x alone, goal at most 1.5x)   rounds {limited_rounds:?}",
        limited / alone
    );
    Ok(())
}
