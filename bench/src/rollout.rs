//! What the rollout benchmarks (`drain`, `upgrade`) share: a server and
//! three agents on loopback, two apps (a trivial setup, and one that takes
//! half a second, as a real app's does: etcd's example takes about that),
//! the floor of their members' restarts done directly, and how the
//! figures are reported beside it.

use std::path::Path;
use std::time::Duration;

use herd_client::Client;
use herd_core::kinds::NodeSpec;

use crate::floors;
use herd_bench::processes::{ADMIN, Killed, herd_binary, start, wait_for};

/// The apps measured: a name, and what their setup does first.
pub const APPS: [(&str, &str); 2] = [("trivial", ""), ("half-second", "sleep 0.5; ")];
pub const RUN: [&str; 2] = ["sleep", "3600"];
pub const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];

pub fn setup(pause: &str) -> String {
    format!("case \"$1\" in --configure) {pause}echo configured >\"$HERD_VOLUME_HERD/bench\" ;; esac\n")
}

/// Runs `measure` against a server and three Ready agents started for it
/// (in a directory of their own, also given to `measure`), then stops
/// them and what they ran.
pub async fn with_three_nodes(measure: impl AsyncFnOnce(&Client, &Path) -> anyhow::Result<()>) -> anyhow::Result<()> {
    let herd = herd_binary()?;
    let dir = tempfile::tempdir()?;
    let (server, url) =
        start(&herd, &["server", "--listen", "127.0.0.1:0", "--insecure-http"], &dir.path().join("server"))?;
    let mut children = Killed(vec![server]);
    let agent_dirs: Vec<_> = NODES.iter().map(|n| dir.path().join(n)).collect();
    for (node, data) in NODES.iter().zip(&agent_dirs) {
        children.0.push(start(&herd, &["--server", &url, "agent", "--name", node], data)?.0);
    }
    let admin = Client::new(vec![url.clone()], Some(ADMIN.into()));
    let ready = wait_for("the agents Ready", Duration::from_secs(30), async || {
        let nodes = admin.list::<NodeSpec>("").await.unwrap_or_default();
        (nodes.iter().filter(|n| n.status.ready).count() == NODES.len()).then_some(())
    })
    .await;
    let outcome = match ready {
        Ok(()) => measure(&admin, dir.path()).await,
        Err(error) => Err(error),
    };
    drop(children);
    for data in &agent_dirs {
        herd_agent::members::stop_processes(data).await;
    }
    outcome
}

/// App `app` (one role `m` running [`RUN`], set up by [`setup`]) created.
pub async fn create_app(admin: &Client, app: &str, pause: &str) -> anyhow::Result<()> {
    let spec = serde_json::json!({"metadata": {"name": app}, "spec": {"roles": [{
        "name": "m", "run": {"command": RUN}, "setup": {"script": setup(pause)}
    }]}});
    admin.create_value("apps", &spec, Default::default()).await?;
    Ok(())
}

/// The median over `rounds` of `count` members' own restarts in sequence
/// (each process stopped, a new one started and its setup run, directly).
pub fn restarts_floor(dir: &Path, app: &str, pause: &str, count: u64, rounds: u64) -> anyhow::Result<Duration> {
    let mut rounds_taken = Vec::new();
    for round in 0..rounds {
        let mut total = Duration::ZERO;
        for i in 0..count {
            let mut old = std::process::Command::new(RUN[0]).arg(RUN[1]).stdin(std::process::Stdio::null()).spawn()?;
            let started = std::time::Instant::now();
            old.kill()?;
            old.wait()?;
            total += started.elapsed();
            total += floors::start_and_set_up(&dir.join(format!("floor-{app}-{round}-{i}")), &setup(pause), RUN)?;
        }
        rounds_taken.push(total);
    }
    Ok(median(&mut rounds_taken))
}

pub fn median(values: &mut [Duration]) -> Duration {
    values.sort();
    values[values.len() / 2]
}

pub fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// Prints app `app`'s figures: the floor, the same work by hand
/// (`by_hand`, what a client-side tool does), and the Operation's rounds.
pub fn report(app: &str, floor: Duration, by_hand: (&str, Vec<Duration>), operation: (&str, Vec<Duration>)) {
    let shown = |v: &[Duration]| v.iter().map(|d| secs(*d)).collect::<Vec<_>>();
    let ((hand_what, mut hand), (op_what, mut ops)) = (by_hand, operation);
    let (hand_rounds, op_rounds) = (shown(&hand), shown(&ops));
    let (hand, op) = (median(&mut hand), median(&mut ops));
    println!("app {app}:");
    println!("  floor (each member stopped, started and set up directly, in sequence): median {}", secs(floor));
    println!(
        "  {hand_what} by hand through the API, one after the other: median {}   rounds {hand_rounds:?}",
        secs(hand)
    );
    println!(
        "  {op_what}: median {}   rounds {op_rounds:?}\n  {:.2}x the {hand_what} by hand; {:.2}x the floor of the members' own work (goal 1.2x)",
        secs(op),
        op.as_secs_f64() / hand.as_secs_f64(),
        op.as_secs_f64() / floor.as_secs_f64()
    );
}
