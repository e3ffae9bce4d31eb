//! Isolation: redis-benchmark's p99 latency against a redis member, in
//! one run, (1) alone on its node, (2) beside a CPU and memory hog member
//! with no requests or limits on either, and (3) beside the same hog with
//! limits: redis requests a core and 256Mi, the hog requests 100m and is
//! capped at 250m and 512Mi. The goal: with limits, p99 at most 1.5x of
//! alone. Each is measured twice: with the load generator as it is (on
//! the same two cores, unprotected, so the hog slows the client too), and
//! with it in a cgroup of its own weighted as ten cores' request (the
//! clients of a real redis run on other hosts).
//!
//! `cargo build --release -p herd -p herd-bench && target/release/isolation`
//! Options (environment): BENCH_ROUNDS (default 3), BENCH_REQUESTS
//! (default 200000 a round), BENCH_HOG_CPU_MAX (the hog's cap, default
//! 250m), HERD_BIN. Needs redis-server,
//! redis-benchmark and python3, and a host whose cgroups the agent can
//! use (it says so, or the run stops).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use herd_bench::processes::{ADMIN, Killed, env_u64, herd_binary, start, wait_for};
use herd_client::Client;
use herd_core::kinds::{MemberSpec, NodeSpec};
use herd_core::node_health::RESOURCE_ISOLATION;

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

/// A cgroup of the benchmark's own for the load generator, with the CPU
/// weight of ten cores' request: it stands for clients on other hosts,
/// which a hog on redis's node does not slow. Removed on drop.
struct ClientCgroup {
    procs: PathBuf,
    dir: PathBuf,
}

impl ClientCgroup {
    /// In this process's cpu cgroup (v1) or its cgroup (v2).
    fn make() -> anyhow::Result<ClientCgroup> {
        let own = std::fs::read_to_string("/proc/self/cgroup")?;
        let v1 = own.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers.split(',').any(|c| c == "cpu").then(|| path.to_string())
        });
        let (parent, weight_file, weight) = match v1 {
            Some(path) => {
                (PathBuf::from("/sys/fs/cgroup/cpu").join(path.trim_start_matches('/')), "cpu.shares", "10240")
            }
            None => {
                let path = own.lines().find_map(|l| l.strip_prefix("0::")).context("no cgroup of this process")?;
                (PathBuf::from("/sys/fs/cgroup").join(path.trim_start_matches('/')), "cpu.weight", "400")
            }
        };
        let dir = parent.join(format!("herd-bench-client-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("making {}", dir.display()))?;
        std::fs::write(dir.join(weight_file), weight).with_context(|| format!("weighting {}", dir.display()))?;
        Ok(ClientCgroup { procs: dir.join("cgroup.procs"), dir })
    }
}

impl Drop for ClientCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// One redis-benchmark run (SET and GET), in `client` when given: the
/// higher of their p99s, in ms.
fn p99(port: u16, requests: u64, client: Option<&ClientCgroup>) -> anyhow::Result<f64> {
    let args = ["-p", &port.to_string(), "-n", &requests.to_string(), "-c", "50", "-t", "set,get", "--csv", "-q"];
    let mut command = match client {
        Some(cgroup) => {
            let mut command = Command::new("sh");
            command.arg("-c").arg("echo $$ > \"$0\" && exec redis-benchmark \"$@\"").arg(&cgroup.procs);
            command
        }
        None => Command::new("redis-benchmark"),
    };
    let out = command.args(args).output().context("running redis-benchmark")?;
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

/// The median p99 of `rounds` runs against `member`'s redis, the load
/// generator as it is and in a cgroup of its own.
fn measure(
    member: &herd_core::kinds::Member,
    rounds: u64,
    requests: u64,
    client: &ClientCgroup,
) -> anyhow::Result<[Figure; 2]> {
    let port = *member.spec.ports.get("client").context("the client port")?;
    let figure = |client: Option<&ClientCgroup>| -> anyhow::Result<Figure> {
        let rounds: Vec<f64> = (0..rounds).map(|_| p99(port, requests, client)).collect::<Result<_, _>>()?;
        let mut sorted = rounds.clone();
        sorted.sort_by(f64::total_cmp);
        Ok(Figure { median: sorted[sorted.len() / 2], rounds })
    };
    Ok([figure(None)?, figure(Some(client))?])
}

/// A median p99, and each round's.
struct Figure {
    median: f64,
    rounds: Vec<f64>,
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
    let cap = std::env::var("BENCH_HOG_CPU_MAX").unwrap_or("250m".into());
    let capped = serde_json::json!({"cpu": "100m", "cpuMax": cap, "memory": "256Mi", "memoryMax": "512Mi"});
    admin.create_value("apps", &hog("hog-limited", capped), Default::default()).await?;

    let client = ClientCgroup::make()?;
    let member = up(admin, "kv", "kv", "redis").await?;
    let alone = measure(&member, rounds, requests, &client)?;
    up(admin, "hog", "hog", "hog").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let unlimited = measure(&member, rounds, requests, &client)?;
    down(admin, "hog").await?;
    down(admin, "kv").await?;

    let member = up(admin, "kv-limited", "kv-limited", "redis").await?;
    up(admin, "hog-limited", "hog-limited", "hog").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let limited = measure(&member, rounds, requests, &client)?;
    down(admin, "hog-limited").await?;
    down(admin, "kv-limited").await?;

    for (i, how) in ["the load generator as it is", "the load generator in a cgroup of its own (clients elsewhere)"]
        .iter()
        .enumerate()
    {
        println!("{how}:");
        let base = alone[i].median;
        println!("  p99 alone:                        {base:.3} ms   rounds {:?}", alone[i].rounds);
        println!(
            "  p99 beside the hog, no limits:    {:.3} ms ({:.2}x alone)   rounds {:?}",
            unlimited[i].median,
            unlimited[i].median / base,
            unlimited[i].rounds
        );
        println!(
            "  p99 beside the hog, with limits:  {:.3} ms ({:.2}x alone, goal at most 1.5x; the hog capped at {cap})   rounds {:?}",
            limited[i].median,
            limited[i].median / base,
            limited[i].rounds
        );
    }
    Ok(())
}
