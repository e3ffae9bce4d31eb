//! Resources, with real agents: each node says what it has (its
//! `--capacity-*` and `--reserve-*` flags), placement never puts more
//! requested than allocatable on a node and says which resource is short
//! on which node, evictions place by the same rule, and bad requests are
//! refused naming the field. Members run in cgroups of their own (the
//! host's real ones): a member over its memory cap is OOM-killed, told
//! of and restarted while its neighbour runs on, CPU is shared by the
//! requests, and a member's cgroup goes with it. A member that floods its
//! output keeps to its log budget, and its node stays Ready.

use crate::common;

use std::time::Duration;

use common::apps::{Nodes, list_members, nodes, nodes_with};
use common::{TestServer, event_where, eventually, herd};
use herd_client::ClientError;
use herd_core::kinds::{EventReason, MemberSpec, NodeSpec};
use herd_core::node_health::RESOURCE_ISOLATION;
use herd_core::quantity::Bytes;

/// Each node has 1 CPU and 1 GiB, 256 MiB of it kept back.
const SMALL_HOST: [&str; 8] =
    ["--capacity-cpu", "1", "--capacity-memory", "1Gi", "--reserve-cpu", "0", "--reserve-memory", "256Mi"];

fn app(name: &str, resources: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"metadata": {"name": name}, "spec": {"roles": [{
        "name": "db", "run": {"command": ["sleep", "600"], "resources": resources}
    }]}})
}

#[tokio::test(flavor = "multi_thread")]
async fn placement_never_overcommits_a_node_and_says_which_resource_is_short_where() {
    let nodes = nodes_with(2, &SMALL_HOST).await;
    let server = &nodes.server;
    let admin = server.admin();
    let n1 = admin.get::<NodeSpec>("n1").await.unwrap();
    assert_eq!(n1.status.allocatable.map(|a| a.memory), Some(Bytes(768 << 20)), "{:?}", n1.status);

    admin
        .create_value("apps", &app("hungry", serde_json::json!({"cpu": "500m", "memory": "512Mi"})), Default::default())
        .await
        .unwrap();
    let cluster = serde_json::json!({"metadata": {"name": "hungry"},
        "spec": {"appRef": "hungry", "roles": [{"name": "db", "members": 3}]}});
    admin.create_value("appclusters", &cluster, Default::default()).await.unwrap();

    let short = "memory 512Mi requested, 256Mi of 768Mi allocatable left";
    let (bound, refused) = eventually(Duration::from_secs(30), "two placed, the third refused", || async {
        let members = list_members(server, "hungry").await;
        let (bound, unbound): (Vec<_>, Vec<_>) = members.into_iter().partition(|m| m.spec.node.is_some());
        let reason = unbound.first()?.status.reason.clone()?;
        (bound.len() == 2 && unbound.len() == 1).then_some((bound, reason))
    })
    .await;
    assert_ne!(bound[0].spec.node, bound[1].spec.node, "one member per node: {bound:?}");
    assert_eq!(refused, format!("no node can take hungry-db-2: n1: {short}; n2: {short}"));

    let described = String::from_utf8_lossy(&server.cli(&["describe", "node", "n1"]).stdout).into_owned();
    assert!(described.contains("requested by 1 members: cpu 500m (50%), memory 512Mi (66%)"), "{described}");

    // An eviction places by the same rule: the other node has no room.
    let error = admin.evict_member(&bound[0].metadata.name, true).await.unwrap_err();
    let ClientError::Api(status) = error else { panic!("not an API error: {error}") };
    assert!(status.message.contains(short), "{}", status.message);

    // Requests that fit what is left place the member.
    let app = app("hungry", serde_json::json!({"cpu": "500m", "memory": "256Mi"}));
    let mut current = admin.get_value("apps", "hungry").await.unwrap();
    current["spec"] = app["spec"].clone();
    admin.replace_value("apps", "hungry", &current, Default::default()).await.unwrap();
    eventually(Duration::from_secs(30), "the third placed once its request fits", || async {
        let members = list_members(server, "hungry").await;
        members.iter().all(|m| m.spec.node.is_some()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn bad_requests_are_refused_naming_the_field_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::TestServer::start(dir.path());
    let admin = server.admin();
    let cases = [
        (serde_json::json!({"cpu": -1}), "cpu", "negative"),
        (serde_json::json!({"memory": "12XB"}), "memory", "\"12XB\" is not a number with an optional suffix"),
        (serde_json::json!({"memory": "1Gi", "memoryMax": "512Mi"}), "memoryMax", "less than the memory request"),
        (serde_json::json!({"cpu": 2, "cpuMax": "1500m"}), "cpuMax", "less than the cpu request"),
    ];
    for (resources, field, reason) in cases {
        let error = admin.create_value("apps", &app("bad", resources.clone()), Default::default()).await.unwrap_err();
        let ClientError::Api(status) = error else { panic!("not an API error") };
        assert_eq!(status.code, 422, "{resources}");
        assert_eq!(status.causes[0].field, format!("spec.roles[0].run.resources.{field}"), "{resources}");
        assert!(status.causes[0].reason.contains(reason), "{resources}: {}", status.causes[0].reason);
    }
    assert!(admin.list_values("apps", "").await.unwrap().items.is_empty(), "nothing stored");
}

/// One node whose members run in cgroups, or None (said loudly) where
/// the host gives this test none; CI's hosts must.
async fn node_with_cgroups() -> Option<Nodes> {
    let nodes = nodes(1).await;
    let node = nodes.server.admin().get::<NodeSpec>("n1").await.unwrap();
    let condition = node.status.condition(RESOURCE_ISOLATION).cloned().expect("the agent says how it isolates");
    if condition.status != herd_core::kinds::ConditionStatus::True {
        assert!(std::env::var_os("CI").is_none(), "CI's host must give the agent cgroups: {}", condition.message);
        eprintln!("!!! SKIPPED: no cgroups for the agent here ({}); this test did not run", condition.message);
        return None;
    }
    Some(nodes)
}

/// Applies App `name` with `roles` and a cluster of one member per role.
async fn apply(server: &TestServer, name: &str, roles: serde_json::Value) {
    let admin = server.admin();
    let app = serde_json::json!({"metadata": {"name": name}, "spec": {"roles": roles}});
    admin.create_value("apps", &app, Default::default()).await.unwrap();
    let members: Vec<serde_json::Value> = app["spec"]["roles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|role| serde_json::json!({"name": role["name"], "members": 1}))
        .collect();
    let cluster = serde_json::json!({"metadata": {"name": name}, "spec": {"appRef": name, "roles": members}});
    admin.create_value("appclusters", &cluster, Default::default()).await.unwrap();
}

/// The pid of `member`'s process, once its node reports it running.
async fn running_pid(server: &TestServer, member: &str) -> u32 {
    eventually(Duration::from_secs(30), &format!("{member} running"), || async {
        let node = server.admin().get::<NodeSpec>("n1").await.ok()?;
        node.status.members.iter().find(|r| r.name == member && r.running)?.pid
    })
    .await
}

/// The directory of `pid`'s cgroup in the v1 hierarchy of `controller`
/// (or v2's), as /proc says it is.
fn cgroup_dir(pid: u32, controller: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
        if controllers.split(',').any(|c| c == controller) {
            return std::path::Path::new("/sys/fs/cgroup").join(controller).join(path.trim_start_matches('/'));
        }
    }
    let unified = text.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
    std::path::Path::new("/sys/fs/cgroup").join(unified.trim_start_matches('/'))
}

fn read_number(path: &std::path::Path) -> u64 {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).trim().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_member_over_its_memory_cap_is_oom_killed_told_of_and_restarted_and_its_neighbour_runs_on() {
    let Some(nodes) = node_with_cgroups().await else { return };
    let server = &nodes.server;
    let hog = "x = bytearray(256 << 20)\nimport time\ntime.sleep(600)";
    apply(
        server,
        "oom",
        serde_json::json!([
            {"name": "hog", "run": {"command": ["python3", "-c", hog], "resources": {"memory": "32Mi", "memoryMax": "64Mi"}}},
            {"name": "calm", "run": {"command": ["sleep", "600"], "resources": {"memory": "16Mi"}}},
            // A child of it goes over the cap; it runs on.
            {"name": "kin", "run": {"command": ["sh", "-c", "python3 -c 'bytearray(256 << 20)'; exec sleep 600"],
                                    "resources": {"memory": "16Mi", "memoryMax": "64Mi"}}}
        ]),
    )
    .await;
    let calm_pid = running_pid(server, "oom-calm-0").await;
    let boot_before = server.admin().get::<NodeSpec>("n1").await.unwrap().status.agent_boot_id.unwrap();
    let calm_memory = cgroup_dir(calm_pid, "memory");
    assert!(calm_memory.ends_with("oom-calm-0"), "the member is in a cgroup of its own: {}", calm_memory.display());
    assert_eq!(read_number(&calm_memory.join("memory.soft_limit_in_bytes")), 16 << 20, "its request protected");

    let event = event_where(&server.admin(), "MemberOOMKilled", |e| {
        e.spec.reason_is(EventReason::MemberOOMKilled) && e.spec.involved_object.name == "oom-hog-0"
    })
    .await;
    assert!(event.spec.message.contains("killed for want of memory (limit 64Mi, peak"), "{}", event.spec.message);
    let hog_member = eventually(Duration::from_secs(30), "the hog's status says so", || async {
        let member = server.admin().get::<MemberSpec>("oom-hog-0").await.ok()?;
        member.status.state_detail.last_oom_kill.is_some().then_some(member)
    })
    .await;
    let kill = hog_member.status.state_detail.last_oom_kill.clone().unwrap();
    assert_eq!(kill.limit, Some(Bytes(64 << 20)));
    assert!(kill.peak.is_some_and(|peak| peak.0 > 60 << 20), "{kill:?}");
    // Its restart policy applies: the agent starts it again (and the
    // kernel kills it again), and says how the last run ended.
    eventually(Duration::from_secs(30), "the hog started again", || async {
        let node = server.admin().get::<NodeSpec>("n1").await.ok()?;
        let report = node.status.members.iter().find(|r| r.name == "oom-hog-0")?;
        (report.restarts >= 1 && report.last_exit.as_deref().is_some_and(|e| e.starts_with("OOMKilled"))).then_some(())
    })
    .await;
    assert!(std::fs::read_to_string(format!("/proc/{calm_pid}/cgroup")).is_ok(), "the neighbour runs on");
    let node = server.admin().get::<NodeSpec>("n1").await.unwrap();
    let calm = node.status.members.iter().find(|r| r.name == "oom-calm-0").unwrap();
    assert_eq!((calm.restarts, calm.pid), (0, Some(calm_pid)), "{calm:?}");

    // A child killed while the member's own process lives is told of too.
    let kin_pid = running_pid(server, "oom-kin-0").await;
    let event = event_where(&server.admin(), "MemberOOMKilled of oom-kin-0", |e| {
        e.spec.reason_is(EventReason::MemberOOMKilled) && e.spec.involved_object.name == "oom-kin-0"
    })
    .await;
    let message = &event.spec.message;
    assert!(
        message.contains("a process of it was killed for want of memory (limit 64Mi")
            && message.ends_with("the member runs on"),
        "{message}"
    );
    let node = server.admin().get::<NodeSpec>("n1").await.unwrap();
    let kin = node.status.members.iter().find(|r| r.name == "oom-kin-0").unwrap();
    assert_eq!((kin.restarts, kin.pid), (0, Some(kin_pid)), "{kin:?}");

    // An agent killed and started again finds its members in their cgroups.
    let mut nodes = nodes;
    nodes.agents[0].kill9();
    nodes.restart_agent(0);
    let server = &nodes.server;
    let usage = eventually(Duration::from_secs(30), "the calm member's use reported again", || async {
        let node = server.admin().get::<NodeSpec>("n1").await.ok()?;
        let agent_boot = node.status.agent_boot_id.clone()?;
        let calm = node.status.members.iter().find(|r| r.name == "oom-calm-0")?;
        (agent_boot != boot_before && calm.running).then_some(calm.usage)?
    })
    .await;
    assert!(usage.memory.is_some(), "read from its cgroup by the new agent: {usage:?}");
    assert_eq!(cgroup_dir(calm_pid, "memory"), calm_memory, "the same cgroup, the same process");

    // The members' cgroups go with them.
    server.admin().delete_value("appclusters", "oom", Default::default()).await.unwrap();
    eventually(Duration::from_secs(30), "the members' cgroups removed", || async {
        (!calm_memory.exists()).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cpu_is_shared_in_proportion_to_the_requests() {
    // Eight busy loops load the machine.
    let _turn = common::take_turn().await;
    let Some(nodes) = node_with_cgroups().await else { return };
    let server = &nodes.server;
    let busy = |threads: u32| {
        let loops = (0..threads).map(|_| "(while :; do :; done) &").collect::<Vec<_>>().join(" ");
        // On one CPU, both: weights share a CPU among what runs on it (a
        // loop alone on the other CPU would take it whatever its weight).
        serde_json::json!(["taskset", "-c", "0", "sh", "-c", format!("{loops} wait")])
    };
    apply(
        server,
        "cpu",
        serde_json::json!([
            {"name": "hog", "run": {"command": busy(4), "resources": {"cpu": "100m"}}},
            {"name": "worker", "run": {"command": busy(4), "resources": {"cpu": "1"}}}
        ]),
    )
    .await;
    let usage = |pid: u32| cgroup_dir(pid, "cpuacct").join("cpuacct.usage");
    let (hog, worker) =
        (usage(running_pid(server, "cpu-hog-0").await), usage(running_pid(server, "cpu-worker-0").await));
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The worker's part of what the two used, second by second: the
    // median stands, not a second the rest of a busy host took.
    let mut shares = Vec::new();
    for _ in 0..7 {
        let (hog_before, worker_before) = (read_number(&hog), read_number(&worker));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (hog_used, worker_used) = (read_number(&hog) - hog_before, read_number(&worker) - worker_before);
        shares.push(worker_used as f64 / (worker_used + hog_used).max(1) as f64);
    }
    let seconds = shares.clone();
    shares.sort_by(f64::total_cmp);
    let share = shares[shares.len() / 2];
    // Its weight is 1024 of 1126: it gets at least 80% of that share.
    let owed = 1024.0 / (1024.0 + 102.0);
    assert!(share >= 0.8 * owed, "the worker got {share:.2} of the CPU the two used, owed {owed:.2}: {seconds:.2?}");
    eprintln!("cpu share: worker {share:.2} (owed {owed:.2}), second by second {seconds:.2?}");

    // `herd top` shows what each uses and requests.
    let row = eventually(Duration::from_secs(30), "herd top members shows the worker's use", || async {
        let out = server.cli_blocking(&["top", "members"]).await;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let row: Vec<String> =
            text.lines().find(|l| l.starts_with("cpu-worker-0"))?.split_whitespace().map(String::from).collect();
        (row[2] != "-").then_some(row)
    })
    .await;
    assert_eq!((row[1].as_str(), row[4].as_str(), row[5].as_str()), ("n1", "1", "0"), "{row:?}");
    let used: herd_core::quantity::Millicores = row[2].parse().unwrap();
    assert!(used.0 >= 100, "four busy loops use more than {used}: {row:?}");
    let out = server.cli_blocking(&["top", "nodes"]).await;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let n1 = text.lines().find(|l| l.starts_with("n1")).unwrap_or_else(|| panic!("{text}"));
    assert!(n1.contains("Ready") && n1.contains("1100m ("), "the requests of both, against what n1 has: {text}");
}

/// The bytes of `member`'s stdout files (the current one and those rotated).
fn stdout_on_disk(dir: &std::path::Path, member: &str) -> u64 {
    let files = std::fs::read_dir(dir.join("members").join(member)).unwrap().flatten();
    files
        .filter(|f| f.file_name().to_string_lossy().starts_with("stdout.log"))
        .map(|f| f.metadata().map_or(0, |m| m.len()))
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_member_writing_100_mb_a_second_for_a_minute_keeps_to_its_log_budget_and_its_node_stays_ready() {
    let nodes = nodes(1).await;
    let server = &nodes.server;
    // 10 MiB every tenth of a second, for a minute; then it says so.
    let flood = "end=$(( $(date +%s) + 60 )); while [ $(date +%s) -lt $end ]; do head -c 10485760 /dev/zero; sleep 0.1; done; echo flood over; sleep 600";
    apply(
        server,
        "flood",
        serde_json::json!([{"name": "loud", "run": {"command": ["sh", "-c", flood], "logs": {"maxSize": "4Mi", "keep": 2}}}]),
    )
    .await;
    running_pid(server, "flood-loud-0").await;
    let budget = 3 * (4 << 20) + 64;
    // `herd logs -f` follows through the rotations.
    let mut follower = herd()
        .args(["--server", &server.url, "--token", common::ADMIN_TOKEN, "logs", "member/flood-loud-0", "-f"])
        .env("HERD_CONFIG", "/nonexistent/herd-config.yaml")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = follower.stdout.take().unwrap();
    let followed = std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()).unwrap_or(0));
    let started = std::time::Instant::now();
    let mut most = 0;
    while started.elapsed() < Duration::from_secs(62) {
        let used = stdout_on_disk(&nodes.dirs[0], "flood-loud-0");
        most = most.max(used);
        assert!(used <= budget, "{used} bytes of stdout on disk, over the budget of {budget}");
        let node = server.admin().get::<NodeSpec>("n1").await.unwrap();
        assert!(node.status.ready, "n1 went NotReady under the flood: {:?}", node.status.conditions);
        if started.elapsed() > Duration::from_secs(5) && followed.is_finished() {
            panic!("herd logs -f stopped following");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let _ = follower.kill();
    let _ = follower.wait();
    let followed = followed.join().unwrap();
    assert!(followed > budget, "-f brought {followed} bytes, more than the files ever held at once");
    let out = eventually(Duration::from_secs(30), "the flood over", || async {
        let out = server.cli_blocking(&["logs", "member/flood-loud-0", "--bytes", "64"]).await;
        String::from_utf8_lossy(&out.stdout).contains("flood over").then_some(out)
    })
    .await;
    assert!(out.status.success());
    let start_file = nodes.dirs[0].join("members/flood-loud-0/stdout.log.start");
    let written: u64 = std::fs::read_to_string(&start_file).unwrap().trim().parse().unwrap();
    assert!(written > 1 << 30, "the member wrote more than a GiB ({written} bytes through rotation)");
    eprintln!("flood: {written} bytes written, at most {most} on disk (budget {budget}), {followed} followed");
}
