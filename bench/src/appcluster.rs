//! App clusters on real agents: the time from creating an AppCluster to
//! every member configured, for 3, 10 and 30 members of a trivial app,
//! and from kill -9 of a member to configured again (persistent: no
//! second setup; ephemeral: set up again), each beside the floor measured
//! in the same run: starting the member's process and running its setup
//! script directly, one after the other, as the agent would.
//!
//! `cargo build --release -p herd -p herd-bench && target/release/appcluster`
//! Options (environment): BENCH_AGENTS (default 3), BENCH_SIZES (default
//! "3,10,30"), BENCH_ROUNDS (default 5), HERD_BIN. The agents heartbeat
//! every 2 s (the default), and report a member change at once.

mod floors;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use herd_bench::processes::{ADMIN, Killed, env_u64, herd_binary, start, wait_for};
use herd_client::Client;
use herd_core::kinds::app_cluster::ClusterState;
use herd_core::kinds::command::MemberRun;
use herd_core::kinds::{
    Action, AppClusterSpec, CommandSpec, ManagementState, Member, MemberSpec, MemberState, NodeSpec,
};
use herd_core::{Object, Timestamp};

/// The trivial app's setup: it records that it ran and exits.
const SETUP: &str = "case \"$1\" in --configure) echo configured >\"$HERD_VOLUME_HERD/bench\" ;; esac\n";
const RUN: [&str; 2] = ["sleep", "3600"];

/// The floor: the member's process started and its setup run directly.
fn floor(dir: &Path) -> anyhow::Result<Duration> {
    floors::start_and_set_up(dir, SETUP, RUN)
}

async fn members(admin: &Client, cluster: &str) -> Vec<Member> {
    admin.list::<MemberSpec>(&format!("herd.io/cluster={cluster}")).await.unwrap_or_default()
}

async fn configured(admin: &Client, cluster: &str, count: usize) -> anyhow::Result<Vec<Member>> {
    wait_for(&format!("{cluster} configured"), Duration::from_secs(300), async || {
        let object = admin.get::<AppClusterSpec>(cluster).await.ok()?;
        let members = members(admin, cluster).await;
        let done = object.status.state == ClusterState::Configured
            && members.len() == count
            && members.iter().all(|m| m.status.state == MemberState::Configured);
        done.then_some(members)
    })
    .await
}

fn app(name: &str, persistent: bool) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"name": name},
        "spec": {"roles": [{
            "name": "m",
            "run": {"command": RUN, "volumes": [{"name": "data", "persistent": persistent}]},
            "setup": {"script": SETUP}
        }]}
    })
}

fn cluster(name: &str, app: &str, members: u64) -> serde_json::Value {
    serde_json::json!({"metadata": {"name": name}, "spec": {"appRef": app, "roles": [{"name": "m", "members": members}]}})
}

fn median(values: &mut [Duration]) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

/// Creates cluster `name` of `size` members and waits until it is configured.
async fn apply_to_configured(admin: &Client, name: &str, size: u64) -> anyhow::Result<Duration> {
    let started = Instant::now();
    admin.create_value("appclusters", &cluster(name, "trivial", size), Default::default()).await?;
    configured(admin, name, size as usize).await?;
    let took = started.elapsed();
    admin.delete_value("appclusters", name, Default::default()).await?;
    wait_for("its members gone", Duration::from_secs(120), async || {
        members(admin, name).await.is_empty().then_some(())
    })
    .await?;
    Ok(took)
}

/// One StartMember Command from its creation to Completed: the round
/// trip (leader, agent, heartbeat) a member's start and its configuring each take.
async fn command_round_trip(admin: &Client, round: u64) -> anyhow::Result<Duration> {
    let member = format!("probe-{round}");
    let run = MemberRun { command: RUN.map(str::to_string).to_vec(), ..Default::default() };
    let spec = CommandSpec {
        node: "node-1".into(),
        timeout: None,
        action: Action::StartMember { member: member.clone(), run },
        origin: None,
    };
    let name = format!("start-probe-{round}");
    let started = Instant::now();
    admin.create(&Object::new(name.clone(), spec)).await?;
    let command = wait_for("the probe started", Duration::from_secs(60), async || {
        admin.get::<CommandSpec>(&name).await.ok().filter(|c| c.status.state_by_management.is_settled())
    })
    .await?;
    let took = started.elapsed();
    if command.status.state_by_management != ManagementState::Completed {
        bail!("the probe's StartMember ended {:?}", command.status);
    }
    let remove =
        CommandSpec { node: "node-1".into(), timeout: None, action: Action::RemoveMember { member }, origin: None };
    admin.create(&Object::new(format!("remove-probe-{round}"), remove)).await?;
    Ok(took)
}

/// Kills member `index` of `cluster` once it has run for longer than the
/// agent's crash-loop window (so the agent waits its first restart delay,
/// as for a member that crashes once), and waits until it is configured
/// again as a new instance.
async fn kill_to_configured(admin: &Client, cluster: &str, index: u64) -> anyhow::Result<Duration> {
    let member = admin.get::<MemberSpec>(&format!("{cluster}-m-{index}")).await?;
    let node_name = member.spec.node.clone().context("bound")?;
    let report = wait_for("the member running for 11 s", Duration::from_secs(60), async || {
        let node = admin.get::<NodeSpec>(&node_name).await.ok()?;
        let report = node.status.members.iter().find(|r| r.name == member.metadata.name)?.clone();
        let since = report.started_at?;
        (since.age(Timestamp::from_system_time(SystemTime::now())) > Duration::from_secs(11)).then_some(report)
    })
    .await?;
    let pid = report.pid.context("pid")?;
    let before = member.status.state_detail.last_configured_instance.clone();
    let started = Instant::now();
    Command::new("kill").args(["-9", &pid.to_string()]).status()?;
    wait_for("configured again", Duration::from_secs(120), async || {
        let now = admin.get::<MemberSpec>(&member.metadata.name).await.ok()?;
        let again =
            now.status.state == MemberState::Configured && now.status.state_detail.last_configured_instance != before;
        again.then_some(())
    })
    .await?;
    Ok(started.elapsed())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let agents = env_u64("BENCH_AGENTS", 3);
    let rounds = env_u64("BENCH_ROUNDS", 5);
    let sizes: Vec<u64> = std::env::var("BENCH_SIZES")
        .unwrap_or("3,10,30".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let herd = herd_binary()?;
    let dir = tempfile::tempdir()?;
    println!("appcluster benchmark: {agents} agents (2 s heartbeats), sizes {sizes:?}, {rounds} rounds each");
    let (server, url) =
        start(&herd, &["server", "--listen", "127.0.0.1:0", "--insecure-http"], &dir.path().join("server"))?;
    let mut children = Killed(vec![server]);
    let agent_dirs: Vec<PathBuf> = (1..=agents).map(|i| dir.path().join(format!("agent-{i}"))).collect();
    for (i, data) in agent_dirs.iter().enumerate() {
        let name = format!("node-{}", i + 1);
        children.0.push(start(&herd, &["--server", &url, "agent", "--name", &name], data)?.0);
    }
    let admin = Client::new(vec![url.clone()], Some(ADMIN.into()));
    let outcome = measure(&admin, agents, rounds, &sizes, dir.path()).await;
    // Members outlive their agents: end them, whatever happened.
    drop(children);
    for data in &agent_dirs {
        herd_agent::members::stop_processes(data).await;
    }
    outcome
}

async fn measure(admin: &Client, agents: u64, rounds: u64, sizes: &[u64], dir: &Path) -> anyhow::Result<()> {
    wait_for("the agents Ready", Duration::from_secs(30), async || {
        let nodes = admin.list::<NodeSpec>("").await.unwrap_or_default();
        (nodes.iter().filter(|n| n.status.ready).count() == agents as usize).then_some(())
    })
    .await?;
    admin.create_value("apps", &app("trivial", false), Default::default()).await?;
    admin.create_value("apps", &app("trivial-data", true), Default::default()).await?;

    let mut floors: Vec<Duration> =
        (0..rounds).map(|i| floor(&dir.join(format!("floor-{i}")))).collect::<Result<_, _>>()?;
    let floor = median(&mut floors);
    println!("floor (process start + setup run directly): median {}", ms(floor));
    let mut trips = Vec::new();
    for round in 0..rounds {
        trips.push(command_round_trip(admin, round).await?);
    }
    let trip = median(&mut trips);
    // Fair: a member is started by one Command and configured by another,
    // and its setup's end is seen by the agent's status-file watch (250 ms).
    let fair = floor + trip * 2;
    println!(
        "one Command's round trip (create to Completed): median {}; fair floor for apply (2 round trips + floor) {}",
        ms(trip),
        ms(fair)
    );
    for size in sizes {
        let mut times = Vec::new();
        for round in 0..rounds {
            times.push(apply_to_configured(admin, &format!("bench-{size}-{round}"), *size).await?);
        }
        let shown: Vec<String> = times.iter().map(|t| ms(*t)).collect();
        let took = median(&mut times);
        println!(
            "apply to configured, {size:>2} members: median {:>7} ({:.0}x the floor, goal 2x; {:.1}x the fair floor)   rounds {shown:?}",
            ms(took),
            took.as_secs_f64() / floor.as_secs_f64(),
            took.as_secs_f64() / fair.as_secs_f64()
        );
    }
    for (label, app, persistent) in
        [("persistent (no second setup)", "trivial-data", true), ("ephemeral (set up again)", "trivial", false)]
    {
        let name = if persistent { "kill-data" } else { "kill" };
        admin.create_value("appclusters", &cluster(name, app, 3), Default::default()).await?;
        configured(admin, name, 3).await?;
        let mut times = Vec::new();
        for round in 0..rounds {
            times.push(kill_to_configured(admin, name, round % 3).await?);
            configured(admin, name, 3).await?;
        }
        let shown: Vec<String> = times.iter().map(|t| ms(*t)).collect();
        let took = median(&mut times);
        println!(
            "kill -9 to configured, {label}: median {:>7} (floor + heartbeat period = {}; the agent waits 500 ms before starting an exited member again)   rounds {shown:?}",
            ms(took),
            ms(floor + Duration::from_secs(2))
        );
    }
    Ok(())
}
