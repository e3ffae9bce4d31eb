//! Scale on simulated nodes (`herd sim-nodes`, one process): for 10, 100
//! and 1,000 nodes heartbeating every 2 s, the cost of one configuration
//! change with a candidate pool of 10 (the time until every candidate
//! reports the new serial, and the bytes of configuration the server
//! sent), printed beside the same change with every node a candidate
//! (the configuration pushed to all nodes), measured in the same run
//! before any burst (then the candidates beyond the pool are demoted). At
//! the largest size also: the latency of API mutations (p50/p99) while
//! the nodes heartbeat, beside the same mutations on the idle server
//! before any node joined; and a burst of members placed, started and
//! configured, beside the floor of creating as many objects through the
//! API one after the other and the latency of one member alone (every
//! step waits for a heartbeat to report it; the rate net of that latency
//! is printed too), with what the server did for it from its /metrics
//! (store transactions per member, and each controller's reconcile passes),
//! and the server's CPU at rest afterwards beside its CPU at rest with the
//! same nodes and no members. The share of the machine's CPU the
//! hypervisor took (steal) during the burst and the floor is printed
//! with them: on a shared virtual machine it moves the figures by half.
//!
//! `cargo build --release -p herd -p herd-bench && target/release/scale`
//! Options (environment): BENCH_NODES (default "10,100,1000"), BENCH_POOL
//! (10), BENCH_MUTATIONS (200), BENCH_MEMBERS (3000) in app clusters of
//! BENCH_CLUSTER_SIZE (10) submitted by BENCH_SUBMITTERS clients at once
//! (1), BENCH_POLL_MS (how often the burst's end is looked for, 250;
//! its steps are timed from a watch of Members), BENCH_SIM_LOG (the
//! simulated nodes' HERD_LOG, "warn"), HERD_BIN. Plain HTTP
//! (`--insecure-http`), SQLite store.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context;
use herd_bench::processes::{ADMIN, Killed, env_u64, herd_binary, start, wait_for};
use herd_client::Client;
use herd_core::Object;
use herd_core::kinds::app_cluster::ClusterState;
use herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME;
use herd_core::kinds::{AppClusterSpec, ClusterConfigSpec, EventSpec, InvolvedObject, MemberState, NodeRole, NodeSpec};

/// One configuration change's cost.
struct Cost {
    took: Duration,
    bytes: u64,
}

/// Every sample of the server's /metrics, by series (`name{labels}`).
async fn samples(admin: &Client) -> anyhow::Result<BTreeMap<String, f64>> {
    let metrics = admin.get_text("/metrics").await?;
    Ok(metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect())
}

async fn bytes_sent(admin: &Client) -> anyhow::Result<u64> {
    let all = samples(admin).await?;
    let sent =
        all.get("herd_configuration_sent_bytes_total").context("no herd_configuration_sent_bytes_total in /metrics")?;
    Ok(*sent as u64)
}

/// What the server did for a burst, from /metrics before and after it:
/// store transactions and commits per member, and the time each
/// controller's reconcile passes took.
fn burst_work(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>, members: u64) {
    let grew = |series: &str| after.get(series).unwrap_or(&0.0) - before.get(series).unwrap_or(&0.0);
    let per_member = |series: &str| grew(series) / members as f64;
    println!(
        "  store work per member: {:.1} transactions in {:.2} commits",
        per_member("herd_store_transactions_total{backend=\"sqlite\"}"),
        per_member("herd_store_commits_total{backend=\"sqlite\"}")
    );
    let passes: Vec<String> = after
        .keys()
        .filter(|k| k.starts_with("herd_reconcile_duration_seconds_sum{"))
        .filter_map(|k| {
            let count = k.replace("_sum{", "_count{");
            let (seconds, n) = (grew(k), grew(&count));
            let controller = k.split('"').nth(1)?;
            (n > 0.0).then(|| format!("{controller} {n:.0} passes {seconds:.1} s"))
        })
        .collect();
    println!("  reconcile passes during the burst: {}", passes.join("; "));
}

async fn set_config(admin: &Client, change: impl Fn(&mut ClusterConfigSpec)) -> anyhow::Result<()> {
    let mut last = None;
    for _ in 0..20 {
        let mut config = admin.get::<ClusterConfigSpec>(CLUSTER_CONFIG_NAME).await?;
        change(&mut config.spec);
        match admin.update(&config).await {
            Ok(_) => return Ok(()),
            Err(error) => last = Some(error),
        }
    }
    anyhow::bail!("could not change the ClusterConfig: {last:?}")
}

/// Waits until `count` nodes are Ready, `candidates` of them candidates,
/// each candidate reporting one serial above `above`; returns that serial.
async fn settled(admin: &Client, count: usize, candidates: usize, above: u64) -> anyhow::Result<u64> {
    let what = format!("{count} Ready nodes, {candidates} candidates at one serial above {above}");
    wait_for(&what, Duration::from_secs(600), async || {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let nodes = admin.list::<NodeSpec>("").await.ok()?;
        let ready = nodes.iter().filter(|n| n.status.ready).count();
        let serials: Vec<u64> =
            nodes.iter().filter(|n| n.spec.role == NodeRole::Candidate).map(|n| n.status.config_serial).collect();
        let first = *serials.first()?;
        let done =
            ready == count && serials.len() == candidates && first > above && serials.iter().all(|s| *s == first);
        done.then_some(first)
    })
    .await
}

/// The pool back to `pool`: a lower pool size only warns (as Ganeti), so
/// the candidates beyond it are demoted one by one, as an operator would.
async fn shrink_pool(admin: &Client, pool: usize) -> anyhow::Result<()> {
    set_config(admin, |c| c.candidate_pool_size = pool as u32).await?;
    let candidates: Vec<String> = admin
        .list::<NodeSpec>("")
        .await?
        .into_iter()
        .filter(|n| n.spec.role == NodeRole::Candidate)
        .map(|n| n.metadata.name)
        .collect();
    let demote = herd_core::api::NodeRoleRequest { role: Some(NodeRole::Regular), ..Default::default() };
    for node in candidates.iter().skip(pool) {
        admin.change_node_role(node, &demote).await?;
    }
    Ok(())
}

/// One small change (an App created): until every candidate holds it.
async fn one_change(admin: &Client, count: usize, candidates: usize, serial: u64, tag: &str) -> anyhow::Result<Cost> {
    let bytes = bytes_sent(admin).await?;
    let started = Instant::now();
    let app = serde_json::json!({
        "metadata": {"name": format!("change-{tag}")},
        "spec": {"roles": [{"name": "m", "run": {"command": ["true"]}}]}
    });
    admin.create_value("apps", &app, Default::default()).await?;
    settled(admin, count, candidates, serial).await?;
    Ok(Cost { took: started.elapsed(), bytes: bytes_sent(admin).await? - bytes })
}

/// The CPU time process `pid` has used (user and system), from /proc.
fn cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat.rsplit_once(')').context("/proc stat")?.1.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).context("/proc stat field");
    let clock = std::process::Command::new("getconf").arg("CLK_TCK").output()?;
    let per_second: u64 = String::from_utf8_lossy(&clock.stdout).trim().parse().context("getconf CLK_TCK")?;
    // utime and stime are the 14th and 15th fields, 12th and 13th after the name.
    Ok(Duration::from_secs_f64((ticks(11)? + ticks(12)?) as f64 / per_second as f64))
}

/// The machine's CPU ticks so far: (stolen by the hypervisor, all), from
/// the `cpu` line of /proc/stat. On a shared virtual machine the steal
/// tells a slow run's cause apart from herd's own cost.
fn machine_ticks() -> anyhow::Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().find(|l| l.starts_with("cpu ")).context("/proc/stat cpu line")?;
    let ticks: Vec<u64> = line.split_whitespace().skip(1).map(|t| t.parse().unwrap_or(0)).collect();
    // user nice system idle iowait irq softirq steal ...
    Ok((ticks.get(7).copied().unwrap_or(0), ticks.iter().take(8).sum()))
}

/// The share of the machine's CPU the hypervisor took since `before`.
fn steal_since(before: (u64, u64)) -> anyhow::Result<f64> {
    let now = machine_ticks()?;
    Ok((now.0 - before.0) as f64 / (now.1 - before.1).max(1) as f64)
}

/// The share of one core process `pid` uses over ten seconds of rest.
async fn cpu_share(pid: u32) -> anyhow::Result<f64> {
    const REST: Duration = Duration::from_secs(10);
    let before = cpu_time(pid)?;
    tokio::time::sleep(REST).await;
    Ok((cpu_time(pid)? - before).as_secs_f64() / REST.as_secs_f64())
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// A small object to create: an Event about the benchmark.
fn event(name: String) -> Object<EventSpec> {
    let about = InvolvedObject { kind: "Node".into(), name: "bench".into(), uid: None };
    Object::new(
        name,
        EventSpec {
            reason: "Bench".into(),
            message: "a mutation".into(),
            count: 1,
            involved_object: about,
            ..Default::default()
        },
    )
}

/// `n` small mutations (Events created) one after the other: p50 and p99.
async fn mutations(admin: &Client, n: u64, tag: &str) -> anyhow::Result<(Duration, Duration)> {
    let mut took = Vec::new();
    for i in 0..n {
        let event = event(format!("bench-{tag}-{i}"));
        let started = Instant::now();
        admin.create(&event).await?;
        took.push(started.elapsed());
    }
    took.sort();
    Ok((percentile(&took, 0.5), percentile(&took, 0.99)))
}

/// How long a burst took, from the first creation: until every member was
/// bound to a node (the scheduling decision, written), past its start
/// (running, as its node reported), and configured.
struct Burst {
    /// When the last AppCluster create was answered.
    submitted: Duration,
    placed: Duration,
    started: Duration,
    configured: Duration,
}

/// The App every burst's clusters run.
async fn burst_app(admin: &Client) -> anyhow::Result<()> {
    let app = serde_json::json!({
        "metadata": {"name": "burst"},
        "spec": {"roles": [{"name": "m", "run": {"command": ["sleep", "3600"]}, "setup": {"script": "true"}}]}
    });
    admin.create_value("apps", &app, Default::default()).await?;
    Ok(())
}

/// A burst: `members` members in app clusters `<prefix>-<i>` of `size`,
/// created at once by `submitters` clients, each one cluster after the other.
async fn burst(admin: &Client, members: u64, size: u64, prefix: &str, submitters: u64) -> anyhow::Result<Burst> {
    use futures_util::stream::{self, StreamExt, TryStreamExt};
    let clusters = members.div_ceil(size);
    // Opened before the first create, so that it sees every member's every step.
    let watch = admin.watch("members", None, "").await?;
    let started = Instant::now();
    let progress = Arc::new(Mutex::new(Progress::default()));
    // Aborted if the burst fails before it ends.
    let following = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(follow(
        watch,
        format!("{prefix}-"),
        members as usize,
        started,
        progress.clone(),
    )));
    stream::iter(0..clusters)
        .map(|i| async move {
            let count = size.min(members - i * size);
            let cluster = serde_json::json!({
                "metadata": {"name": format!("{prefix}-{i}"), "labels": {"bench": prefix}},
                "spec": {"appRef": "burst", "roles": [{"name": "m", "members": count}]}
            });
            admin.create_value("appclusters", &cluster, Default::default()).await
        })
        .buffer_unordered(submitters.max(1) as usize)
        .try_collect::<Vec<_>>()
        .await?;
    let submitted = started.elapsed();
    let mut reported = Instant::now();
    let poll = Duration::from_millis(env_u64("BENCH_POLL_MS", 250));
    wait_for("the burst configured", Duration::from_secs(1800), async || {
        tokio::time::sleep(poll).await;
        if following.is_finished() {
            return Some(());
        }
        if reported.elapsed() >= Duration::from_secs(10) {
            reported = Instant::now();
            let p = progress.lock().unwrap_or_else(PoisonError::into_inner);
            println!(
                "    after {}: {} placed, {} started, {} configured",
                ms(started.elapsed()),
                p.placed.len(),
                p.started.len(),
                p.configured.len()
            );
        }
        None
    })
    .await?;
    let times = following.await??;
    let clusters_done = admin
        .list::<AppClusterSpec>(&format!("bench={prefix}"))
        .await?
        .iter()
        .all(|c| c.status.state == ClusterState::Configured);
    anyhow::ensure!(clusters_done, "every member is configured but not every AppCluster says so");
    Ok(Burst { submitted, placed: times.placed, started: times.started, configured: times.configured })
}

/// A member as the burst's watch needs it.
#[derive(serde::Deserialize)]
struct SeenMember {
    metadata: SeenName,
    spec: SeenSpec,
    #[serde(default)]
    status: SeenStatus,
}

#[derive(serde::Deserialize)]
struct SeenName {
    name: String,
}

#[derive(serde::Deserialize)]
struct SeenSpec {
    cluster: String,
    node: Option<String>,
}

#[derive(serde::Deserialize, Default)]
struct SeenStatus {
    #[serde(default)]
    state: MemberState,
}

/// The burst's members seen placed, past their start, and configured.
#[derive(Default)]
struct Progress {
    placed: BTreeSet<String>,
    started: BTreeSet<String>,
    configured: BTreeSet<String>,
}

/// When the last of the burst's members was first seen placed, started and configured.
struct Times {
    placed: Duration,
    started: Duration,
    configured: Duration,
}

/// Follows the burst on a watch of Members: each step's time is that of
/// the event that shows it (a poll would see it up to a period late).
async fn follow(
    mut watch: herd_client::WatchStream,
    cluster_prefix: String,
    members: usize,
    began: Instant,
    progress: Arc<Mutex<Progress>>,
) -> anyhow::Result<Times> {
    use herd_core::api::WatchEventType;
    let (mut placed, mut started) = (None, None);
    while let Some(event) = watch.next_raw().await {
        let event = event?;
        if !matches!(event.type_, WatchEventType::Added | WatchEventType::Modified) {
            continue;
        }
        let member: SeenMember = serde_json::from_str(event.object.get())?;
        if !member.spec.cluster.starts_with(&cluster_prefix) {
            continue;
        }
        let at = began.elapsed();
        let mut p = progress.lock().unwrap_or_else(PoisonError::into_inner);
        let name = member.metadata.name;
        if member.spec.node.is_some() && p.placed.insert(name.clone()) && p.placed.len() == members {
            placed = Some(at);
        }
        if member.status.state != MemberState::CreatePending
            && p.started.insert(name.clone())
            && p.started.len() == members
        {
            started = Some(at);
        }
        if member.status.state == MemberState::Configured && p.configured.insert(name) && p.configured.len() == members
        {
            return Ok(Times { placed: placed.unwrap_or(at), started: started.unwrap_or(at), configured: at });
        }
    }
    anyhow::bail!("the watch of Members ended before the burst was configured")
}

/// The floor of the burst: as many objects created through the API one
/// after the other (each member needs at least its own write).
async fn create_floor(admin: &Client, count: u64) -> anyhow::Result<Duration> {
    let started = Instant::now();
    for i in 0..count {
        admin.create(&event(format!("floor-{i}"))).await?;
    }
    Ok(started.elapsed())
}

async fn measure_size(herd: &Path, dir: &Path, nodes: usize, pool: usize, last: bool) -> anyhow::Result<(Cost, Cost)> {
    let (server, url) =
        start(herd, &["server", "--listen", "127.0.0.1:0", "--insecure-http"], &dir.join(format!("server-{nodes}")))?;
    let server_pid = server.id();
    let mut children = Killed(vec![server]);
    let admin = Client::new(vec![url.clone()], Some(ADMIN.into()));
    set_config(&admin, |c| {
        c.candidate_pool_size = pool as u32;
        c.node_grace_period = herd_core::HumanDuration::from_secs(120);
    })
    .await?;
    let mutations_n = env_u64("BENCH_MUTATIONS", 200);
    let idle = if last { Some(mutations(&admin, mutations_n, "idle").await?) } else { None };
    let count = nodes.to_string();
    let sim = std::process::Command::new(herd)
        .args(["--server", &url, "sim-nodes", "--count", &count])
        .env("HERD_JOIN_TOKEN", herd_bench::processes::JOIN)
        .env("HERD_LOG", std::env::var("BENCH_SIM_LOG").unwrap_or("warn".into()))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .context("starting the simulated nodes")?;
    let sim_pid = sim.id();
    children.0.push(sim);
    let started = Instant::now();
    let serial = settled(&admin, nodes, pool.min(nodes), 0).await?;
    println!("  {nodes} nodes joined, Ready, {} candidates in sync after {}", pool.min(nodes), ms(started.elapsed()));
    let pooled = one_change(&admin, nodes, pool.min(nodes), serial, "pool").await?;
    // The baseline: every node a candidate, the same change to all; then
    // the pool as it was. Before the burst, so that at every size the
    // change is made to a configuration of the same size.
    set_config(&admin, |c| c.candidate_pool_size = nodes as u32).await?;
    let serial = settled(&admin, nodes, nodes, 0).await?;
    let everyone = one_change(&admin, nodes, nodes, serial, "all").await?;
    shrink_pool(&admin, pool).await?;
    settled(&admin, nodes, pool.min(nodes), 0).await?;
    if let Some((idle_p50, idle_p99)) = idle {
        let (p50, p99) = mutations(&admin, mutations_n, "busy").await?;
        println!(
            "  API mutation ({mutations_n} Events, one after the other): p50 {}, p99 {} while {nodes} nodes heartbeat; \
             idle server: p50 {}, p99 {}",
            ms(p50),
            ms(p99),
            ms(idle_p50),
            ms(idle_p99)
        );
        let members = env_u64("BENCH_MEMBERS", 3000);
        let size = env_u64("BENCH_CLUSTER_SIZE", 10);
        let idle_without = cpu_share(server_pid).await?;
        let floor_ticks = machine_ticks()?;
        let floor = create_floor(&admin, members).await?;
        let floor_steal = steal_since(floor_ticks)?;
        burst_app(&admin).await?;
        // The latency floor: one member alone goes through every step
        // (placed, started and reported, set up and reported).
        let alone = burst(&admin, 1, 1, "alone", 1).await?;
        let metrics_before = samples(&admin).await?;
        let before = bytes_sent(&admin).await?;
        let submitters = env_u64("BENCH_SUBMITTERS", 1);
        let cpu_before = (cpu_time(server_pid)?, cpu_time(sim_pid)?);
        let burst_ticks = machine_ticks()?;
        let b = burst(&admin, members, size, "burst", submitters).await?;
        let burst_steal = steal_since(burst_ticks)?;
        let cpu_per_member = |pid: u32, before: Duration| -> anyhow::Result<f64> {
            Ok((cpu_time(pid)? - before).as_secs_f64() * 1e3 / members as f64)
        };
        let (server_cpu, sim_cpu) = (cpu_per_member(server_pid, cpu_before.0)?, cpu_per_member(sim_pid, cpu_before.1)?);
        let burst_bytes = bytes_sent(&admin).await? - before;
        burst_work(&metrics_before, &samples(&admin).await?, members);
        let rate = |d: Duration| members as f64 / d.as_secs_f64();
        println!(
            "  one member alone: placed in {}, started in {}, configured in {}",
            ms(alone.placed),
            ms(alone.started),
            ms(alone.configured)
        );
        println!(
            "  burst of {members} members in clusters of {size}: all placed in {} ({:.0}/s), placed and started in {} \
             ({:.0}/s), configured in {} ({:.0}/s); floor, {members} objects created through the API: {} ({:.0}/s)",
            ms(b.placed),
            rate(b.placed),
            ms(b.started),
            rate(b.started),
            ms(b.configured),
            rate(b.configured),
            ms(floor),
            rate(floor)
        );
        println!(
            "  the {} AppClusters submitted by {submitters} client(s), each one after the other, in {}",
            members.div_ceil(size),
            ms(b.submitted)
        );
        println!("  configuration sent to the candidates during the burst: {burst_bytes} bytes");
        println!(
            "  CPU time during the burst, per member: the server {server_cpu:.2} ms, the simulated nodes {sim_cpu:.2} ms \
             (the two share the machine's cores)"
        );
        println!(
            "  the machine's CPU taken by the hypervisor (steal): {:.0}% during the burst, {:.0}% during the floor",
            burst_steal * 100.0,
            floor_steal * 100.0
        );
        let idle_with = cpu_share(server_pid).await?;
        println!(
            "  the server at rest, {nodes} nodes heartbeating: {:.0}% of a core with the {members} members configured; \
             {:.0}% with none",
            idle_with * 100.0,
            idle_without * 100.0
        );
        let net = |d: Duration, floor: Duration| members as f64 / d.saturating_sub(floor).as_secs_f64().max(0.001);
        println!(
            "  the same, net of one member's latency: placed and started {:.0}/s, configured {:.0}/s",
            net(b.started, alone.started),
            net(b.configured, alone.configured)
        );
    }
    drop(children);
    Ok((pooled, everyone))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let sizes: Vec<usize> = std::env::var("BENCH_NODES")
        .unwrap_or("10,100,1000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let pool = env_u64("BENCH_POOL", 10) as usize;
    let herd = herd_binary()?;
    let dir = tempfile::tempdir()?;
    println!("scale benchmark: simulated nodes {sizes:?}, 2 s heartbeats, candidate pool {pool}, SQLite, plain HTTP");
    let mut rows = Vec::new();
    for (i, &nodes) in sizes.iter().enumerate() {
        println!("{nodes} nodes:");
        let (pooled, everyone) = measure_size(&herd, dir.path(), nodes, pool, i + 1 == sizes.len()).await?;
        println!(
            "  one change, pool of {pool}: {} and {} bytes; pushed to all {nodes} nodes: {} and {} bytes",
            ms(pooled.took),
            pooled.bytes,
            ms(everyone.took),
            everyone.bytes
        );
        rows.push((nodes, pooled, everyone));
    }
    if let (Some((small, first, first_all)), Some((large, last, last_all))) = (rows.first(), rows.last()) {
        println!(
            "cost of one change, {large} nodes against {small}: pool of {pool}: {:.2}x the bytes, {:.2}x the time \
             (goal within 1.2x); all nodes: {:.2}x the bytes, {:.2}x the time",
            last.bytes as f64 / first.bytes.max(1) as f64,
            last.took.as_secs_f64() / first.took.as_secs_f64(),
            last_all.bytes as f64 / first_all.bytes.max(1) as f64,
            last_all.took.as_secs_f64() / first_all.took.as_secs_f64(),
        );
    }
    Ok(())
}
