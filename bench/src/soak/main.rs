//! The chaos soak: an etcd cluster under herd (the example App, three
//! members on three agents, its quorum budget) hit with faults drawn from
//! a printed seed (`herd_bench::schedule`), several at once, while clients
//! record every operation; checked by the clients' own history
//! (`herd_bench::linearizable`) and by herd's invariants: no member slot
//! runs twice on any host (a scan of every process, all along), and at
//! the end every Operation ended, every Command settled, every member
//! configured and every node Ready. The report: the seed, the faults by
//! kind, how long the cluster took to be whole again after each (p50,
//! p99), and the first violation, if any, with the seed to replay it.
//!
//! `cargo build --release -p herd -p herd-bench && target/release/soak`
//! Options (environment): SOAK_SEED (default: drawn, and printed),
//! SOAK_FAULTS (default 1000), SOAK_GAP_MS (default 1000-4000),
//! SOAK_LENGTH_MS (default 500-5000), SOAK_KINDS (comma-separated kinds
//! of `FaultKind`, default every kind this soak does), HERD_BIN.

#[path = "../processes.rs"]
mod processes;

mod clients;
mod faults;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use herd_bench::linearizable::{Register, check};
use herd_bench::schedule::{FaultKind, Plan, schedule};
use herd_client::Client;
use herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME;
use herd_core::kinds::{ClusterConfigSpec, CommandSpec, MemberSpec, MemberState, NodeSpec, OperationSpec};
use processes::{Killed, env_u64, herd_binary, start, wait_for};
use tokio_util::sync::CancellationToken;

const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];
const CLUSTER: &str = "etcd";

fn range(name: &str, default: (u64, u64)) -> (Duration, Duration) {
    let parsed = std::env::var(name).ok().and_then(|v| {
        let (low, high) = v.split_once('-')?;
        Some((low.trim().parse().ok()?, high.trim().parse().ok()?))
    });
    let (low, high) = parsed.unwrap_or(default);
    (Duration::from_millis(low), Duration::from_millis(high.max(low + 1)))
}

fn kinds() -> anyhow::Result<Vec<FaultKind>> {
    let Ok(names) = std::env::var("SOAK_KINDS") else { return Ok(faults::SUPPORTED.to_vec()) };
    names
        .split(',')
        .map(|name| {
            let kind = FaultKind::ALL.into_iter().find(|k| format!("{k:?}") == name.trim());
            match kind {
                Some(kind) if faults::SUPPORTED.contains(&kind) => Ok(kind),
                Some(kind) => bail!("SOAK_KINDS: {kind:?} is not done by this soak yet"),
                None => bail!("SOAK_KINDS: {name:?} is no fault kind (kinds: {:?})", FaultKind::ALL),
            }
        })
        .collect()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let seed = match std::env::var("SOAK_SEED") {
        Ok(seed) => seed.parse().context("SOAK_SEED: a number")?,
        Err(_) => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64,
    };
    let plan = Plan {
        seed,
        count: env_u64("SOAK_FAULTS", 1000) as u32,
        kinds: kinds()?,
        gap: range("SOAK_GAP_MS", (1000, 4000)),
        length: range("SOAK_LENGTH_MS", (500, 5000)),
    };
    println!("soak: seed {seed} (SOAK_SEED={seed} replays this schedule), {} faults of {:?}", plan.count, plan.kinds);
    let herd = herd_binary()?;
    let dir = tempfile::tempdir()?;
    let listen = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0")?;
        probe.local_addr()?.to_string()
    };
    let server = start(&herd, &["server", "--listen", &listen, "--insecure-http"], &dir.path().join("server"))?;
    let mut agents = Vec::new();
    for node in NODES {
        agents.push(start(&herd, &["--server", &server.1, "agent", "--name", node], &dir.path().join(node))?.0);
    }
    let nodes: Vec<String> = NODES.iter().map(|n| n.to_string()).collect();
    let cluster = faults::Cluster::new(herd, dir.path().to_path_buf(), server, listen, nodes, agents, CLUSTER);
    let outcome = soak(&cluster, &plan).await;
    cluster.heal()?;
    {
        drop(Killed(std::mem::take(&mut *cluster.agents.lock().unwrap_or_else(|p| p.into_inner()))));
        let server = &mut cluster.server.lock().unwrap_or_else(|p| p.into_inner()).0;
        let _ = server.kill();
        let _ = server.wait();
    }
    for node in NODES {
        herd_agent::members::stop_processes(&dir.path().join(node)).await;
    }
    match outcome {
        Ok(()) => Ok(()),
        Err(error) => bail!("{error:#}\nreplay: SOAK_SEED={seed}"),
    }
}

async fn soak(cluster: &Arc<faults::Cluster>, plan: &Plan) -> anyhow::Result<()> {
    let admin = cluster.admin();
    set_up(&admin).await?;
    let endpoints = client_endpoints(&admin).await?;
    let recorder = clients::Recorder::new(endpoints);
    let stop = CancellationToken::new();
    let mut tasks = Vec::new();
    for id in 0..3 {
        tasks.push(tokio::spawn(recorder.clone().run(id, plan.seed, Duration::from_millis(50), stop.clone())));
    }
    let twice = Arc::new(AtomicBool::new(false));
    let scan = tokio::spawn(scan_for_twice(twice.clone(), stop.clone()));
    let started = Instant::now();
    let mut running = Vec::new();
    let done: Arc<std::sync::Mutex<BTreeMap<FaultKind, u32>>> = Arc::default();
    let recoveries: Arc<std::sync::Mutex<HashMap<FaultKind, Vec<Duration>>>> = Arc::default();
    for fault in schedule(plan) {
        if let Some(wait) = fault.at.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        if twice.load(Ordering::SeqCst) {
            break;
        }
        let (on, done, recoveries) = (cluster.clone(), done.clone(), recoveries.clone());
        running.push(tokio::spawn(async move {
            let begun = Instant::now();
            match on.run(&fault).await {
                Ok(Some(awaited)) => {
                    *done.lock().unwrap_or_else(|p| p.into_inner()).entry(fault.kind).or_default() += 1;
                    // How long from the fault's start until the cluster is
                    // whole again, after what the fault awaits.
                    if recovered(&on.admin(), &awaited, Duration::from_secs(300)).await.is_ok() {
                        let mut recoveries = recoveries.lock().unwrap_or_else(|p| p.into_inner());
                        recoveries.entry(fault.kind).or_default().push(begun.elapsed());
                    }
                }
                Ok(None) => {}
                Err(error) => println!("fault {fault} could not be done: {error:#}"),
            }
        }));
        running.retain(|task| !task.is_finished());
        // Where the clients go follows the members.
        if let Ok(endpoints) = client_endpoints(&cluster.admin()).await {
            *recorder.endpoints.lock().unwrap_or_else(|p| p.into_inner()) = endpoints;
        }
    }
    for task in running {
        let _ = task.await;
    }
    cluster.heal()?;
    let whole = whole_again(&cluster.admin(), Duration::from_secs(300)).await;
    stop.cancel();
    for task in tasks {
        let _ = task.await;
    }
    let _ = scan.await;
    let history = recorder.history();
    let done = done.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let recoveries = recoveries.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let report = Report { plan, done: &done, recoveries: &recoveries, operations: history.len() };
    report.print();
    if twice.load(Ordering::SeqCst) {
        bail!("violation: a member slot ran twice at once on the hosts (see the scan's line above)");
    }
    whole.context("violation: the cluster did not come back whole")?;
    ended(&cluster.admin()).await?;
    if let Err(violation) = check(&Register, &history) {
        let ops: Vec<String> = violation.operations.iter().take(40).map(|&i| format!("{:?}", history[i])).collect();
        bail!("violation: key {} is not linearizable; its operations:\n{}", violation.key, ops.join("\n"));
    }
    println!("no violation: {} operations linearizable, every member configured, every node Ready", history.len());
    Ok(())
}

/// Quick heartbeats, the etcd example (App, budget) and a cluster of 3.
async fn set_up(admin: &Client) -> anyhow::Result<()> {
    wait_for("the agents Ready", Duration::from_secs(60), async || {
        let nodes = admin.list::<NodeSpec>("").await.ok()?;
        (nodes.iter().filter(|n| n.status.ready).count() == NODES.len()).then_some(())
    })
    .await?;
    let mut config = admin.get::<ClusterConfigSpec>(CLUSTER_CONFIG_NAME).await?;
    config.spec.heartbeat_period = herd_core::HumanDuration(Duration::from_millis(500));
    config.spec.node_grace_period = herd_core::HumanDuration(Duration::from_secs(4));
    admin.update(&config).await?;
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/apps/etcd");
    for file in ["app.yaml", "budget.yaml"] {
        let text = std::fs::read_to_string(examples.join(file))?;
        let value: serde_json::Value = serde_saphyr::from_str(&text)?;
        let plural = if file == "app.yaml" { "apps" } else { "disruptionbudgets" };
        admin.create_value(plural, &value, Default::default()).await?;
    }
    let cluster = serde_json::json!({"metadata": {"name": CLUSTER}, "spec": {"appRef": "etcd", "roles": [{"name": "member", "members": 3}]}});
    admin.create_value("appclusters", &cluster, Default::default()).await?;
    whole_again(admin, Duration::from_secs(180)).await?;
    Ok(())
}

/// The members' client addresses.
async fn client_endpoints(admin: &Client) -> anyhow::Result<Vec<String>> {
    let members = admin.list::<MemberSpec>(&format!("herd.io/cluster={CLUSTER}")).await?;
    Ok(members.iter().filter_map(|m| Some(format!("127.0.0.1:{}", m.spec.ports.get("client")?))).collect())
}

/// How long until every member is configured and ready and every node
/// Ready (at most `within`).
async fn whole_again(admin: &Client, within: Duration) -> anyhow::Result<Duration> {
    let started = Instant::now();
    loop {
        if is_whole(admin).await {
            return Ok(started.elapsed());
        }
        if started.elapsed() > within {
            bail!("the cluster was not whole again within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whole again after `awaited` (at most `within`).
async fn recovered(admin: &Client, awaited: &faults::Awaited, within: Duration) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let seen = match awaited {
            faults::Awaited::Whole => true,
            faults::Awaited::NewInstance { member, instance } => {
                let now = admin.get::<MemberSpec>(member).await.ok();
                now.and_then(|m| m.status.state_detail.last_configured_instance).is_some_and(|i| i != *instance)
            }
            faults::Awaited::Operation(name) => {
                admin.get::<OperationSpec>(name).await.is_ok_and(|o| o.status.phase.is_finished())
            }
        };
        if seen && is_whole(admin).await {
            return Ok(());
        }
        if started.elapsed() > within {
            bail!("not whole again within {within:?} after {awaited:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn is_whole(admin: &Client) -> bool {
    let members = admin.list::<MemberSpec>(&format!("herd.io/cluster={CLUSTER}")).await.unwrap_or_default();
    let nodes = admin.list::<NodeSpec>("").await.unwrap_or_default();
    members.len() == 3
        && members.iter().all(|m| m.status.state == MemberState::Configured && m.status.ready)
        && nodes.len() == NODES.len()
        && nodes.iter().all(|n| n.status.ready)
}

/// Every Operation ended and every Command settled, within a minute; or
/// the ones that did not, named.
async fn ended(admin: &Client) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let operations = admin.list::<OperationSpec>("").await.unwrap_or_default();
        let commands = admin.list::<CommandSpec>("").await.unwrap_or_default();
        let mut open: Vec<String> = operations
            .iter()
            .filter(|o| !o.status.phase.is_finished())
            .map(|o| format!("operation {} ({:?}: {:?})", o.metadata.name, o.status.phase, o.status.message))
            .collect();
        open.extend(
            commands
                .iter()
                .filter(|c| !c.status.state_by_management.is_settled())
                .map(|c| format!("command {} ({:?})", c.metadata.name, c.status.state_by_management)),
        );
        if open.is_empty() {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("violation: not ended a minute after the faults: {}", open.join("; "));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Scans every process on this host twice a second until `stop`: two
/// etcd processes of one member slot at once is a violation.
async fn scan_for_twice(twice: Arc<AtomicBool>, stop: CancellationToken) {
    while !stop.is_cancelled() {
        let mut by_member: HashMap<String, Vec<u32>> = HashMap::new();
        for (pid, member) in etcd_processes() {
            by_member.entry(member).or_default().push(pid);
        }
        for (member, pids) in by_member.iter().filter(|(_, pids)| pids.len() > 1) {
            println!("violation: member {member} runs as {} processes at once: {pids:?}", pids.len());
            twice.store(true, Ordering::SeqCst);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// (pid, member) of every etcd process a herd member runs.
fn etcd_processes() -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "etcd"))
        .filter_map(|pid| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            let member = env
                .split(|b| *b == 0)
                .find_map(|var| String::from_utf8_lossy(var).strip_prefix("HERD_MEMBER=").map(str::to_string))?;
            Some((pid, member))
        })
        .collect()
}

struct Report<'a> {
    plan: &'a Plan,
    done: &'a BTreeMap<FaultKind, u32>,
    recoveries: &'a HashMap<FaultKind, Vec<Duration>>,
    operations: usize,
}

impl Report<'_> {
    fn print(&self) {
        let total: u32 = self.done.values().sum();
        println!(
            "seed {}: {total} of {} faults done, {} client operations recorded",
            self.plan.seed, self.plan.count, self.operations
        );
        println!("{:<16} {:>6} {:>10} {:>10}", "fault", "done", "p50", "p99");
        for (kind, count) in self.done {
            let mut times = self.recoveries.get(kind).cloned().unwrap_or_default();
            times.sort();
            let at = |q: f64| {
                times
                    .get(((times.len() as f64 - 1.0) * q).round() as usize)
                    .map_or("-".to_string(), |d| format!("{:.1}s", d.as_secs_f64()))
            };
            println!("{:<16} {:>6} {:>10} {:>10}", format!("{kind:?}"), count, at(0.5), at(0.99));
        }
    }
}
