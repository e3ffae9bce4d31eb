//! What a member's processes are given and what they leave behind, seen
//! on the host itself: a member, its setup, its notifies, its readiness
//! checks and its drain hook get only what herd gives them (never a herd
//! credential of the agent's), everything any of them starts ends with
//! it (even a `timeout` or `setsid` child, which leave the process
//! group), and a setup that times out, dies or fills its volume is a
//! config error that says so. Every check scans every process on the host.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::apps::{list_members, own_member_ports};
use common::cluster::quick_heartbeats;
use common::{
    ADMIN_TOKEN, JOIN_TOKEN, MemberReaper, Proc, SmallDisk, TestServer, eventually, herd, host_processes_with,
};
use herd_core::kinds::{MemberSpec, MemberState, NodeSpec};

/// Environment variables an agent may hold that no member process may.
const CREDENTIALS: [&str; 7] =
    ["HERD_TOKEN", "HERD_JOIN_TOKEN", "HERD_ADMIN_TOKEN", "HERD_CA_HASH", "HERD_CA_FILE", "HERD_SERVER", "HERD_STORE"];

/// A server and one agent, n1, started as README says a standalone one is
/// (server, CA file and admin token exported beside the join token).
struct OneNode {
    server: TestServer,
    agent: Option<Proc>,
    agent_dir: std::path::PathBuf,
    _reaper: MemberReaper,
    _dir: tempfile::TempDir,
}

impl OneNode {
    async fn start() -> OneNode {
        let dir = tempfile::tempdir().unwrap();
        let server = TestServer::start(&dir.path().join("server"));
        quick_heartbeats(&server).await;
        own_member_ports(&server).await;
        let agent_dir = dir.path().join("n1");
        let mut node = OneNode { agent: None, _reaper: MemberReaper(agent_dir.clone()), agent_dir, server, _dir: dir };
        node.start_agent().await;
        node
    }

    async fn start_agent(&mut self) {
        let mut command = herd();
        command.args(["agent", "--name", "n1"]).arg("--data-dir").arg(&self.agent_dir);
        command.env("HERD_SERVER", &self.server.url).env("HERD_JOIN_TOKEN", JOIN_TOKEN);
        command.env("HERD_TOKEN", ADMIN_TOKEN).env("HERD_CA_FILE", self.server.data_dir.join("ca.pem"));
        self.agent = Some(Proc::spawn(command));
        let server = &self.server;
        eventually(Duration::from_secs(15), "n1 Ready", || async {
            server.admin().get::<NodeSpec>("n1").await.ok().filter(|n| n.status.ready)
        })
        .await;
    }

    fn stop_agent(&mut self) {
        if let Some(mut agent) = self.agent.take() {
            agent.kill9();
        }
    }

    /// Applies App `name` with one role `db` (`members` members), and a
    /// cluster of the same name.
    async fn apply(&self, name: &str, members: u32, role: serde_json::Value) {
        let admin = self.server.admin();
        let mut role = role;
        role["name"] = "db".into();
        let app = serde_json::json!({"metadata": {"name": name}, "spec": {"roles": [role]}});
        admin.create_value("apps", &app, Default::default()).await.unwrap();
        let cluster = serde_json::json!({
            "metadata": {"name": name},
            "spec": {"appRef": name, "roles": [{"name": "db", "members": members}]}
        });
        admin.create_value("appclusters", &cluster, Default::default()).await.unwrap();
    }

    /// Waits for member `name` to be in config error; returns its detail.
    async fn config_error(&self, name: &str) -> String {
        let server = &self.server;
        eventually(Duration::from_secs(40), &format!("{name} in config error"), || async {
            let member = server.admin().get::<MemberSpec>(name).await.ok()?;
            (member.status.state == MemberState::ConfigError)
                .then(|| member.status.state_detail.config_error_detail.clone().unwrap_or_default())
        })
        .await
    }
}

/// The processes of cluster `cluster` on this host (every one carries its
/// name in `HERD_CLUSTER`).
fn of_cluster(cluster: &str) -> Vec<common::HostProcess> {
    host_processes_with("HERD_CLUSTER", cluster)
}

/// What kind of run a member process is: `member`, `setup`, `check`,
/// `script` (a notify) or `drain`.
fn run_kind(process: &common::HostProcess) -> String {
    process.env.get("HERD_RUN").map_or("member".into(), |run| run.split('/').next().unwrap_or_default().into())
}

/// Waits until no process of `cluster` is left on the host.
async fn nothing_left_of(cluster: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = of_cluster(cluster);
        if left.is_empty() {
            return;
        }
        let shown: Vec<String> = left.iter().map(|p| format!("{} {:?} ({})", p.pid, p.command, run_kind(p))).collect();
        assert!(tokio::time::Instant::now() < deadline, "processes of {cluster} outlived it:\n{}", shown.join("\n"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn no_herd_credential_reaches_a_member_its_setup_notifies_checks_or_drain_hook() {
    let node = OneNode::start().await;
    // Every run sleeps a little, so that the scan sees it running.
    let script = r#"case "$1" in --configure) sleep 2 ;; *) sleep 2 ;; esac"#;
    let role = serde_json::json!({
        "run": {"command": ["sleep", "600"], "volumes": [{"name": "data", "persistent": true}],
                "drain": {"script": "sleep 2"}},
        "setup": {"script": script},
        "notifies": ["db"],
        "readiness": {"command": ["sh", "-c", "sleep 0.5"], "period": "1s", "timeout": "900ms"}
    });
    node.apply("envs", 2, role).await;
    let mut seen = std::collections::BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut deleted = false;
    while tokio::time::Instant::now() < deadline {
        for process in of_cluster("envs") {
            let carried: Vec<&str> = CREDENTIALS.iter().copied().filter(|key| process.env.contains_key(*key)).collect();
            assert!(
                carried.is_empty(),
                "{} ({}) carries {carried:?}: {:?}",
                process.command,
                run_kind(&process),
                process.env
            );
            for (key, value) in &process.env {
                assert!(
                    !value.contains(ADMIN_TOKEN) && !value.contains(JOIN_TOKEN),
                    "{key} of {} holds a token",
                    process.command
                );
            }
            assert!(process.env.contains_key("PATH") && process.env["HERD_MEMBER"].starts_with("envs-db-"));
            seen.insert(run_kind(&process));
        }
        // Deleting the cluster stops its members: their drain hooks run.
        if !deleted && ["member", "setup", "check", "script"].iter().all(|k| seen.contains(*k)) {
            node.server.admin().delete_value("appclusters", "envs", Default::default()).await.unwrap();
            deleted = true;
        }
        if seen.contains("drain") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        ["check", "drain", "member", "script", "setup"],
        "a member, its setup, a notify, a readiness check and the drain hook were all seen"
    );
    nothing_left_of("envs").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn what_a_setup_starts_ends_with_its_member_and_its_cluster() {
    let node = OneNode::start().await;
    // A setup whose children leave its process group: `timeout` makes a
    // group of its own, `setsid` a session.
    let script = r#"if [ "$1" = --configure ]; then
  timeout 100 sleep 100 &
  setsid sleep 100 &
  sleep 60
fi
"#;
    let role = serde_json::json!({
        "run": {"command": ["sleep", "600"], "volumes": [{"name": "data", "persistent": true}]},
        "setup": {"script": script}
    });
    node.apply("leaky", 2, role).await;
    let setups = || {
        let mut runs: Vec<String> = of_cluster("leaky")
            .iter()
            .filter_map(|p| p.env.get("HERD_RUN").filter(|r| r.starts_with("setup/")).cloned())
            .collect();
        runs.sort();
        runs.dedup();
        runs
    };
    let first = eventually(Duration::from_secs(30), "both setups running", || async {
        let runs = setups();
        (runs.len() == 2).then_some(runs)
    })
    .await;
    // The setup's whole run: the wrapper, sh, timeout and its sleep, the
    // setsid sleep and the sleep it waits on (a loaded machine starts
    // them a moment after the wrapper).
    eventually(Duration::from_secs(30), "the first setup's whole run", || async {
        let of_first: Vec<_> =
            of_cluster("leaky").into_iter().filter(|p| p.env.get("HERD_RUN") == Some(&first[0])).collect();
        (of_first.len() >= 5).then_some(())
    })
    .await;

    // The member of the first setup is killed: a new instance is set up,
    // and nothing of the old setup runs beside the new one.
    let instance = first[0].trim_start_matches("setup/").to_string();
    let victim = of_cluster("leaky")
        .into_iter()
        .find(|p| p.env.get("HERD_INSTANCE_ID") == Some(&instance) && !p.env.contains_key("HERD_RUN"))
        .expect("the member of the first setup runs");
    common::apps::kill9(victim.pid);
    eventually(Duration::from_secs(30), "its new instance is set up, and the old setup is gone", || async {
        let runs = setups();
        (runs.len() == 2 && !runs.contains(&first[0])).then_some(())
    })
    .await;
    let old: Vec<_> = host_processes_with("HERD_RUN", &first[0]);
    assert!(old.is_empty(), "the old setup's processes outlived its member: {old:?}");

    // Deleting the cluster during the setups leaves nothing behind.
    node.server.admin().delete_value("appclusters", "leaky", Default::default()).await.unwrap();
    nothing_left_of("leaky").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_agent_times_out_a_setup_and_answers_one_that_is_gone_without_a_status() {
    let mut node = OneNode::start().await;
    let sleeper = |timeout: &str| {
        serde_json::json!({
            "run": {"command": ["sleep", "600"], "volumes": [{"name": "data", "persistent": true}]},
            "setup": {"script": "if [ \"$1\" = --configure ]; then setsid sleep 100 & sleep 60; fi", "timeout": timeout}
        })
    };
    // Its timeout passes: the agent kills it, with what it started.
    node.apply("slow", 1, sleeper("2s")).await;
    let detail = node.config_error("slow-db-0").await;
    assert!(detail.contains("timed out after 2 s"), "{detail}");
    let setups_of =
        |cluster: &str| of_cluster(cluster).into_iter().filter(|p| run_kind(p) == "setup").collect::<Vec<_>>();
    assert!(setups_of("slow").is_empty(), "{:?}", setups_of("slow"));

    // It is killed (as an OOM killer would), the agent watching.
    node.apply("killed", 1, sleeper("5m")).await;
    let running = eventually(Duration::from_secs(30), "the setup of killed-db-0 runs", || async {
        let found = setups_of("killed");
        (!found.is_empty()).then_some(found)
    })
    .await;
    for process in running {
        common::apps::kill9(process.pid);
    }
    let detail = node.config_error("killed-db-0").await;
    assert!(detail.contains("killed by a signal"), "{detail}");

    // It dies while the agent is down: the next agent run answers it.
    node.apply("lost", 1, sleeper("5m")).await;
    let running = eventually(Duration::from_secs(30), "the setup of lost-db-0 runs", || async {
        let found = setups_of("lost");
        (!found.is_empty()).then_some(found)
    })
    .await;
    node.stop_agent();
    for process in running {
        common::apps::kill9(process.pid);
    }
    node.start_agent().await;
    let detail = node.config_error("lost-db-0").await;
    assert!(detail.contains("ended without recording its exit status"), "{detail}");
    for cluster in ["slow", "killed", "lost"] {
        node.server.admin().delete_value("appclusters", cluster, Default::default()).await.unwrap();
        nothing_left_of(cluster).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_setup_whose_deadline_passes_while_the_agent_is_down_is_ended_when_it_is_back() {
    let mut node = OneNode::start().await;
    let role = serde_json::json!({
        "run": {"command": ["sleep", "600"], "volumes": [{"name": "data", "persistent": true}]},
        "setup": {"script": "if [ \"$1\" = --configure ]; then sleep 60; fi", "timeout": "3s"}
    });
    node.apply("late", 1, role).await;
    eventually(Duration::from_secs(30), "the setup of late-db-0 runs", || async {
        of_cluster("late").iter().any(|p| run_kind(p) == "setup").then_some(())
    })
    .await;
    node.stop_agent();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(of_cluster("late").iter().any(|p| run_kind(p) == "setup"), "it outlives the agent until its next run");
    node.start_agent().await;
    let detail = node.config_error("late-db-0").await;
    assert!(detail.contains("timed out after 3 s"), "{detail}");
    assert!(!of_cluster("late").iter().any(|p| run_kind(p) == "setup"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_setup_that_fills_its_volume_is_a_config_error_that_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    quick_heartbeats(&server).await;
    own_member_ports(&server).await;
    // The agent's data dir (and so the member's volumes) on a disk of 24 MB.
    let agent_dir = dir.path().join("n1");
    let _disk = SmallDisk::mount(&agent_dir, 24);
    let _reaper = MemberReaper(agent_dir.clone());
    let _agent = common::start_agent(&server.url, &agent_dir, "n1");
    eventually(Duration::from_secs(15), "n1 Ready", || async {
        server.admin().get::<NodeSpec>("n1").await.ok().filter(|n| n.status.ready)
    })
    .await;
    let script = r#"if [ "$1" = --configure ]; then
  dd if=/dev/zero of="$HERD_VOLUME_DATA/fill" bs=1M 2>/dev/null
  exit 1
fi
"#;
    let app = serde_json::json!({"metadata": {"name": "full"}, "spec": {"roles": [{
        "name": "db",
        "run": {"command": ["sleep", "600"], "volumes": [{"name": "data", "persistent": true}]},
        "setup": {"script": script}
    }]}});
    let admin = server.admin();
    admin.create_value("apps", &app, Default::default()).await.unwrap();
    let cluster = serde_json::json!({"metadata": {"name": "full"},
        "spec": {"appRef": "full", "roles": [{"name": "db", "members": 1}]}});
    admin.create_value("appclusters", &cluster, Default::default()).await.unwrap();
    let detail = eventually(Duration::from_secs(40), "full-db-0 in config error", || async {
        let member = admin.get::<MemberSpec>("full-db-0").await.ok()?;
        (member.status.state == MemberState::ConfigError)
            .then(|| member.status.state_detail.config_error_detail.clone())
    })
    .await
    .unwrap_or_default();
    let herd_volume = agent_dir.join("volumes/full-db-0/herd");
    let shown = |name: &str| std::fs::read_to_string(herd_volume.join(name)).unwrap_or_else(|e| format!("({e})"));
    let files = format!("setup.status: {:?}, setup.err: {:?}", shown("setup.status"), shown("setup.err"));
    assert!(
        detail.contains("exit status 1") && detail.contains("no space left on the member's volume"),
        "{detail} ({files})"
    );
    let _ = std::fs::remove_file(agent_dir.join("volumes/full-db-0/data/fill"));
    admin.delete_value("appclusters", "full", Default::default()).await.unwrap();
    eventually(Duration::from_secs(30), "full-db-0 gone", || async {
        list_members(&server, "full").await.is_empty().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_setup_that_floods_its_output_keeps_to_the_log_budget_and_its_failure_quotes_its_last_words() {
    let node = OneNode::start().await;
    // 40 MiB on each stream, then its last words, and it fails.
    let script = r#"if [ "$1" = --configure ]; then
  head -c 41943040 /dev/zero | tr '\0' o
  head -c 41943040 /dev/zero | tr '\0' e >&2
  echo "the last words" >&2
  exit 3
fi
"#;
    let role = serde_json::json!({
        "run": {"command": ["sleep", "600"], "volumes": [{"name": "data", "persistent": true}],
                "logs": {"maxSize": "1Mi", "keep": 2}},
        "setup": {"script": script, "timeout": "60s"}
    });
    node.apply("loud", 1, role).await;
    let detail = node.config_error("loud-db-0").await;
    assert!(detail.contains("exit status 3"), "{detail}");
    assert!(detail.contains("the last words"), "its stderr's tail, across the rotation: {detail}");
    let volume = node.agent_dir.join("volumes/loud-db-0/herd");
    let on_disk = |prefix: &str| -> u64 {
        let files = std::fs::read_dir(&volume).unwrap().flatten();
        files.filter(|f| f.file_name().to_string_lossy().starts_with(prefix)).map(|f| f.metadata().unwrap().len()).sum()
    };
    for stream in ["setup.out", "setup.err"] {
        let kept = on_disk(stream);
        assert!(kept <= (3 << 20) + 64, "{stream}: {kept} bytes kept, over 3 MiB (and its start offset)");
        assert!(kept >= 2 << 20, "{stream}: {kept} bytes kept: rotated, not cut short");
    }
    let out = node.server.cli(&["logs", "member/loud-db-0", "--setup", "--bytes", "100000"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let shown = format!("{}...{}", &text[..300.min(text.len())], &text[text.len().saturating_sub(300)..]);
    assert!(text.starts_with("# status: ") && text.contains("\n# stdout (from byte "), "{shown}");
    assert!(text.contains("\n# stderr (from byte ") && text.trim_end().ends_with("the last words"), "{shown}");
    assert!(text.len() <= 100_000, "{} bytes shown", text.len());
    assert!(!of_cluster("loud").iter().any(|p| run_kind(p) == "setup"), "its writers ended with it");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_started_with_a_relative_data_dir_runs_its_members() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    quick_heartbeats(&server).await;
    own_member_ports(&server).await;
    // As README's PostgreSQL section starts agents: `--data-dir a1`.
    let _reaper = MemberReaper(dir.path().join("a1"));
    let mut command = herd();
    command.current_dir(dir.path()).args(["agent", "--server", &server.url, "--name", "n1", "--data-dir", "a1"]);
    command.env("HERD_JOIN_TOKEN", JOIN_TOKEN);
    let _agent = Proc::spawn(command);
    let app = serde_json::json!({"metadata": {"name": "rel"}, "spec": {"roles": [{
        "name": "db",
        "run": {"command": ["sh", "-c", "echo started >>\"$HERD_VOLUME_DATA/starts.log\" && exec sleep 600"],
                "volumes": [{"name": "data", "persistent": true}]},
        "setup": {"script": "echo set up >>\"$HERD_VOLUME_DATA/setup.log\""}
    }]}});
    let admin = server.admin();
    admin.create_value("apps", &app, Default::default()).await.unwrap();
    let cluster = serde_json::json!({"metadata": {"name": "rel"},
        "spec": {"appRef": "rel", "roles": [{"name": "db", "members": 1}]}});
    admin.create_value("appclusters", &cluster, Default::default()).await.unwrap();
    common::apps::configured(&server, "rel", 1, Duration::from_secs(40)).await;
    let volume = dir.path().join("a1/volumes/rel-db-0/data");
    assert_eq!(std::fs::read_to_string(volume.join("starts.log")).unwrap(), "started\n");
    assert_eq!(std::fs::read_to_string(volume.join("setup.log")).unwrap(), "set up\n");
    assert!(Path::new(&dir.path().join("a1/agent.lock")).exists());
}
