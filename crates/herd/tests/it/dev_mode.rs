//! `herd dev`: up with 3 Ready nodes quickly, the CLI finds it through the
//! config file it writes, Ctrl-C stops everything, and a restart with the
//! same data dir keeps the cluster.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Proc, herd};

fn start_dev(home: &Path, data: &Path) -> (Proc, String) {
    let mut command = herd();
    command.args(["dev", "--listen", "127.0.0.1:0", "--data-dir"]).arg(data);
    command
        .env("HOME", home)
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("HERD_SERVER")
        .env_remove("HERD_TOKEN")
        .env_remove("HERD_CONFIG");
    let mut dev = Proc::spawn(command);
    let line = dev.wait_for_line("server:", Duration::from_secs(30));
    let url = line.split_whitespace().last().unwrap().to_string();
    (dev, url)
}

/// `herd get nodes` as a user would run it: no flags, only the config file.
fn cli(home: &Path, args: &[&str]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_herd"));
    command
        .args(args)
        .env("HOME", home)
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("HERD_SERVER")
        .env_remove("HERD_TOKEN")
        .env_remove("HERD_CONFIG");
    command.output().unwrap()
}

fn boot_ids(home: &Path) -> Vec<String> {
    let out = cli(home, &["get", "nodes", "-o", "json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    list["items"].as_array().unwrap().iter().map(|n| n["status"]["agentBootId"].as_str().unwrap().to_string()).collect()
}

fn ready_nodes(home: &Path) -> usize {
    let out = cli(home, &["get", "nodes"]);
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with("node-") && l.contains(" Ready ")).count()
}

/// True when no process holds the agent's data dir lock any more.
fn agent_gone(data: &Path, name: &str) -> bool {
    let lock = std::fs::File::options().write(true).open(data.join("agents").join(name).join("agent.lock")).unwrap();
    lock.try_lock().is_ok()
}

#[test]
fn dev_comes_up_with_three_ready_nodes_and_stops_on_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    let (home, data) = (dir.path().join("home"), dir.path().join("dev"));
    let started = Instant::now();
    let (mut dev, url) = start_dev(&home, &data);
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let deadline = started + Duration::from_secs(15);
    while ready_nodes(&home) < 3 {
        assert!(
            Instant::now() < deadline,
            "3 Ready nodes within 15s; got: {}",
            String::from_utf8_lossy(&cli(&home, &["get", "nodes"]).stdout)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let first_uid = String::from_utf8(cli(&home, &["get", "clusterconfig", "cluster", "-o", "json"]).stdout).unwrap();
    let first_boots = boot_ids(&home);
    // Three agents on one host share it: its cores are counted once.
    let out = cli(&home, &["get", "nodes", "-o", "json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cores: f64 = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["status"]["capacity"]["cpu"].as_str().unwrap().parse::<herd_core::quantity::Millicores>().unwrap().0)
        .map(|m| m as f64 / 1000.0)
        .sum();
    let host = std::thread::available_parallelism().unwrap().get() as f64;
    assert!(cores <= host && cores > host * 0.9, "{cores} cores in all, on a host of {host}");

    dev.signal("INT");
    assert!(dev.wait_exit(Duration::from_secs(15)).success());
    for name in ["node-1", "node-2", "node-3"] {
        assert!(agent_gone(&data, name), "agent {name} still runs after Ctrl-C");
    }

    // Same data dir: the same cluster (the ClusterConfig uid survives).
    // `herd dev` prints its banner only once every agent has heartbeated.
    let (mut dev, _) = start_dev(&home, &data);
    assert_eq!(ready_nodes(&home), 3);
    let new_boots = boot_ids(&home);
    assert!(
        first_boots.iter().all(|b| !new_boots.contains(b)),
        "new agent processes: {first_boots:?} then {new_boots:?}"
    );
    let again = String::from_utf8(cli(&home, &["get", "clusterconfig", "cluster", "-o", "json"]).stdout).unwrap();
    let uid = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap()["metadata"]["uid"].clone();
    assert_eq!(uid(&first_uid), uid(&again));
    assert_eq!(cli(&home, &["get", "nodes"]).status.code(), Some(0));
    dev.signal("TERM");
    assert!(dev.wait_exit(Duration::from_secs(15)).success());
}

/// The PID recorded in an agent's data dir lock.
fn agent_pid(data: &Path, name: &str) -> u32 {
    let text = std::fs::read_to_string(data.join("agents").join(name).join("agent.lock")).unwrap();
    text.trim().parse().unwrap()
}

fn dev_output(home: &Path, data: &Path) -> std::process::Output {
    let mut command = herd();
    command.args(["dev", "--listen", "127.0.0.1:0", "--no-config", "--data-dir"]).arg(data);
    command.env("HOME", home).env_remove("HERD_SERVER").env_remove("HERD_TOKEN").env_remove("HERD_CONFIG");
    command.output().unwrap()
}

#[test]
fn a_busy_data_dir_is_refused_naming_the_pid_and_a_dead_agent_is_started_again() {
    let dir = tempfile::tempdir().unwrap();
    let (home, data) = (dir.path().join("home"), dir.path().join("dev"));
    let (mut dev, url) = start_dev(&home, &data);
    assert_eq!(ready_nodes(&home), 3);

    // A second herd dev on the same data dir starts nothing and names the first.
    let second = dev_output(&home, &data);
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success());
    assert!(said.contains(&format!("another herd dev (pid {})", dev.pid())), "{said}");
    assert!(!said.contains("listening"), "no second server started: {said}");

    // An agent killed under it is reaped, said, and started again.
    let killed = agent_pid(&data, "node-2");
    let before = boot_ids(&home);
    Command::new("kill").args(["-9", &killed.to_string()]).status().unwrap();
    dev.wait_for_line("agent node-2 exited", Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let restarted = agent_pid(&data, "node-2") != killed;
        let boots = boot_ids(&home);
        if restarted && ready_nodes(&home) == 3 && boots.iter().filter(|b| before.contains(b)).count() == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "node-2's agent is back and Ready: {boots:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let zombie = std::fs::read_to_string(format!("/proc/{killed}/stat")).map(|s| s.contains(") Z ")).unwrap_or(false);
    assert!(!zombie, "the killed agent was reaped");

    // As the README's tour says: a paused agent's node goes NotReady
    // within the grace period and a heartbeat (10 s + 2 s), and is Ready
    // again once it goes on.
    let paused = agent_pid(&data, "node-3").to_string();
    Command::new("kill").args(["-STOP", &paused]).status().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while ready_nodes(&home) == 3 {
        assert!(Instant::now() < deadline, "node-3 NotReady within 20 s of its agent's pause");
        std::thread::sleep(Duration::from_millis(200));
    }
    let nodes = String::from_utf8_lossy(&cli(&home, &["get", "nodes"]).stdout).into_owned();
    assert!(nodes.lines().any(|l| l.starts_with("node-3") && l.contains("NotReady")), "{nodes}");
    Command::new("kill").args(["-CONT", &paused]).status().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while ready_nodes(&home) < 3 {
        assert!(Instant::now() < deadline, "node-3 Ready again once its agent goes on");
        std::thread::sleep(Duration::from_millis(200));
    }
    dev.signal("INT");
    assert!(dev.wait_exit(Duration::from_secs(15)).success());

    // An agent left running on a node's data dir: refused up front, naming it.
    let mut stray = common::start_agent(&url, &data.join("agents").join("node-2"), "node-2");
    let deadline = Instant::now() + Duration::from_secs(10);
    while agent_gone(&data, "node-2") {
        assert!(Instant::now() < deadline, "the stray agent takes its data dir");
        std::thread::sleep(Duration::from_millis(50));
    }
    let refused = dev_output(&home, &data);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(said.contains(&format!("an agent (pid {}) is still running on node-2's data dir", stray.pid())), "{said}");
    assert!(!said.contains("listening"), "nothing was started: {said}");
    for name in ["node-1", "node-3"] {
        assert!(agent_gone(&data, name), "no agent started for {name}");
    }
    stray.kill9();
}
