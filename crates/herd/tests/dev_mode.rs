//! `herd dev`: up with 3 Ready nodes quickly, the CLI finds it through the
//! config file it writes, Ctrl-C stops everything, and a restart with the
//! same data dir keeps the cluster.

mod common;

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
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
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
