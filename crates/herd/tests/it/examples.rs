//! The example apps under `examples/apps/`, applied as a user would
//! (`herd apply -f DIR`) onto real agents, with Debian's etcd and redis:
//! the cluster reaches configured and works as the software itself says
//! (`etcdctl endpoint health`, a key readable from every member), and
//! keeps working through a member's kill -9, a grow and shrink, and its
//! own member list stays herd's.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::apps::{Nodes, configured, example, instance, kill9, list_members, nodes, pid_of, require};
use common::eventually;
use herd_core::kinds::{EventReason, Member, MemberSpec, MemberState};

fn apply(nodes: &Nodes, path: &Path) {
    let out = nodes.server.cli(&["apply", "-f", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// `etcdctl` against one member's client URL.
fn etcdctl(member: &Member, args: &[&str]) -> std::process::Output {
    let endpoint = format!("http://127.0.0.1:{}", member.spec.ports["client"]);
    Command::new("etcdctl")
        .arg(format!("--endpoints={endpoint}"))
        .arg("--command-timeout=3s")
        .args(args)
        .output()
        .unwrap()
}

fn text(output: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// The names etcd lists as its members (started ones).
fn etcd_members(member: &Member) -> Vec<String> {
    let out = etcdctl(member, &["member", "list"]);
    assert!(out.status.success(), "{}", text(&out));
    let mut names: Vec<String> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| l.split(", ").nth(2).unwrap_or("").to_string()).collect();
    names.sort();
    names
}

fn healthy(members: &[Member]) {
    for member in members {
        let out = etcdctl(member, &["endpoint", "health"]);
        assert!(out.status.success() && text(&out).contains("is healthy"), "{}: {}", member.metadata.name, text(&out));
    }
}

fn setup_status(nodes: &Nodes, member: &Member) -> String {
    let path = nodes.dir_of(member).join(format!("volumes/{}/herd/setup.status", member.metadata.name));
    std::fs::read_to_string(path).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_etcd_example_forms_a_cluster_that_survives_a_member_kill() {
    require(&["etcd", "etcdctl"]);
    let nodes = nodes(3).await;
    let server = &nodes.server;
    apply(&nodes, &example("etcd"));
    let members = configured(server, "etcd", 3, Duration::from_secs(90)).await;
    healthy(&members);
    let out = etcdctl(&members[0], &["put", "greeting", "hello from herd"]);
    assert!(out.status.success(), "{}", text(&out));
    for member in &members {
        let out = etcdctl(member, &["get", "greeting", "--print-value-only"]);
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "hello from herd", "{}", member.metadata.name);
    }
    let names: Vec<String> = members.iter().map(|m| m.metadata.name.clone()).collect();
    assert_eq!(etcd_members(&members[0]), names);

    // kill -9 of one etcd: a new instance, back to configured through create
    // pending, and no second setup (its status file still names the first).
    let victim = members[1].clone();
    let status_before = setup_status(&nodes, &victim);
    kill9(pid_of(server, &victim).await);
    eventually(Duration::from_secs(60), "the killed member configured as a new instance", || async {
        let member = server.admin().get::<MemberSpec>(&victim.metadata.name).await.ok()?;
        (member.status.state == MemberState::Configured
            && member.status.ready
            && instance(&member) != instance(&victim))
        .then_some(())
    })
    .await;
    assert_eq!(setup_status(&nodes, &victim), status_before, "setup did not run again");
    let members = configured(server, "etcd", 3, Duration::from_secs(30)).await;
    healthy(&members);
    let out = etcdctl(&victim, &["get", "greeting", "--print-value-only"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "hello from herd", "{}", text(&out));
    let events = text(&server.cli(&["events"]));
    assert!(events.contains(EventReason::MemberRestarted.as_str()), "{events}");
}

/// Applies the etcd example's cluster with `members` members.
fn resize(nodes: &Nodes, members: u32) {
    let text = std::fs::read_to_string(example("etcd/cluster.yaml")).unwrap();
    let path = nodes.dir.path().join(format!("etcd-{members}.yaml"));
    std::fs::write(&path, text.replace("members: 3", &format!("members: {members}"))).unwrap();
    apply(nodes, &path);
}

async fn cordon(nodes: &Nodes, node: &str, unschedulable: bool) {
    common::apps::cordon(&nodes.server, node, unschedulable).await
}

async fn spec_seen(nodes: &Nodes) {
    eventually(Duration::from_secs(20), "a pass over the change", || async {
        let cluster = nodes.server.admin().get::<herd_core::kinds::AppClusterSpec>("etcd").await.ok()?;
        (cluster.status.observed_generation == Some(cluster.metadata.generation)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn etcd_grows_and_shrinks_and_its_member_list_stays_herds() {
    require(&["etcd", "etcdctl"]);
    let nodes = nodes(4).await;
    let server = &nodes.server;
    // n4 is cordoned for now: the cluster's three members go to n1-n3.
    cordon(&nodes, "n4", true).await;
    apply(&nodes, &example("etcd"));
    configured(server, "etcd", 3, Duration::from_secs(90)).await;

    // Grow 3 to 5 and at once back to 3: with one
    // member per node required and no other node to take them, both new
    // members are still create pending when the shrink comes.
    resize(&nodes, 5);
    spec_seen(&nodes).await;
    for name in ["etcd-member-3", "etcd-member-4"] {
        let pending = server.admin().get::<MemberSpec>(name).await.unwrap();
        assert_eq!(pending.status.state, MemberState::CreatePending, "{name}");
        let why = pending.status.reason.clone().unwrap_or_default();
        assert!(why.contains("spread is required") && why.contains("n4 is cordoned"), "{why}");
    }
    resize(&nodes, 3);
    let members = configured(server, "etcd", 3, Duration::from_secs(60)).await;
    let names: Vec<String> = members.iter().map(|m| m.metadata.name.clone()).collect();
    assert_eq!(etcd_members(&members[0]), names, "etcd's own member list is herd's");
    assert!(members.iter().all(|m| m.status.state_detail.pending_notify_cmds.is_empty()));
    healthy(&members);

    // A real grow: the fourth member joins with `etcdctl member add`; a
    // shrink removes it with `etcdctl member remove` (its --delnodes).
    cordon(&nodes, "n4", false).await;
    resize(&nodes, 4);
    let members = configured(server, "etcd", 4, Duration::from_secs(60)).await;
    let names: Vec<String> = members.iter().map(|m| m.metadata.name.clone()).collect();
    eventually(Duration::from_secs(20), "etcd lists four started members", || async {
        (etcd_members(&members[0]) == names).then_some(())
    })
    .await;
    healthy(&members);
    resize(&nodes, 3);
    let members = configured(server, "etcd", 3, Duration::from_secs(60)).await;
    let names: Vec<String> = members.iter().map(|m| m.metadata.name.clone()).collect();
    eventually(Duration::from_secs(20), "etcd lists the three left", || async {
        (etcd_members(&members[0]) == names).then_some(())
    })
    .await;
    healthy(&members);
    assert!(list_members(server, "etcd").await.iter().all(|m| m.status.state_detail.pending_notify_cmds.is_empty()));
}

#[tokio::test(flavor = "multi_thread")]
async fn etcd_grown_and_shrunk_at_once_keeps_no_dead_voter() {
    require(&["etcd", "etcdctl"]);
    let nodes = nodes(5).await;
    let server = &nodes.server;
    // n4 and n5 wait: the three first members go to n1-n3.
    cordon(&nodes, "n4", true).await;
    cordon(&nodes, "n5", true).await;
    apply(&nodes, &example("etcd"));
    let first = configured(server, "etcd", 3, Duration::from_secs(90)).await;
    cordon(&nodes, "n4", false).await;
    cordon(&nodes, "n5", false).await;
    // Grown to 5: the new members register themselves (`etcdctl member
    // add`) as they are set up; shrunk back to 3 as soon as etcd lists them,
    // before they had time to start (an added member that never started
    // has no name in etcd's list).
    resize(&nodes, 5);
    eventually(Duration::from_secs(60), "etcd lists five members", || async {
        (etcd_members(&first[0]).len() == 5).then_some(())
    })
    .await;
    let unstarted = etcd_members(&first[0]).iter().filter(|name| name.is_empty()).count();
    eventually(Duration::from_secs(20), "the shrink accepted", || async {
        let text = std::fs::read_to_string(example("etcd/cluster.yaml")).unwrap();
        let path = nodes.dir.path().join("etcd-3-again.yaml");
        std::fs::write(&path, text).unwrap();
        let out = server.cli(&["apply", "-f", path.to_str().unwrap()]);
        out.status.success().then_some(())
    })
    .await;
    let members = configured(server, "etcd", 3, Duration::from_secs(60)).await;
    let names: Vec<String> = members.iter().map(|m| m.metadata.name.clone()).collect();
    eventually(Duration::from_secs(30), "etcd lists herd's three members and no other voter", || async {
        (etcd_members(&members[0]) == names).then_some(())
    })
    .await;
    healthy(&members);
    eprintln!("{unstarted} of the two new members had not started when the shrink came");
}

/// Linearizable reads of key `greeting` through some etcd members, every
/// 100 ms from a thread of its own until [`QuorumWatch::held`]: each needs
/// a quorum.
struct QuorumWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(usize, Vec<String>)>,
}

impl QuorumWatch {
    fn start(through: &[Member]) -> QuorumWatch {
        let endpoints: Vec<String> =
            through.iter().map(|m| format!("http://127.0.0.1:{}", m.spec.ports["client"])).collect();
        let endpoints = endpoints.join(",");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut reads, mut failures) = (0, Vec::new());
            while !stopped.load(std::sync::atomic::Ordering::SeqCst) {
                let out = Command::new("etcdctl")
                    .args([&format!("--endpoints={endpoints}"), "--command-timeout=2s", "get", "greeting"])
                    .args(["--consistency=l", "--print-value-only"])
                    .output()
                    .unwrap();
                reads += 1;
                if !out.status.success() {
                    failures.push(text(&out));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            (reads, failures)
        });
        QuorumWatch { stop, thread }
    }

    /// Stops watching; panics if any read failed.
    fn held(self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let (reads, failures) = self.thread.join().unwrap();
        assert!(reads >= 1 && failures.is_empty(), "quorum lost in {} of {reads} reads: {failures:?}", failures.len());
    }
}

/// Drain of a node with an etcd member: the member moves to
/// the free node with its data (stopped, copied verified, started there
/// and set up again at its new address), one at a time under the
/// example's budget (minAvailable 2), while etcd keeps quorum the whole
/// time: a linearizable read through the two members that stay never
/// fails. A key written before is read from the moved member after.
#[tokio::test(flavor = "multi_thread")]
async fn draining_a_node_moves_its_etcd_member_with_its_data_and_keeps_quorum() {
    require(&["etcd", "etcdctl"]);
    let nodes = nodes(4).await;
    let server = &nodes.server;
    cordon(&nodes, "n4", true).await;
    apply(&nodes, &example("etcd"));
    let members = configured(server, "etcd", 3, Duration::from_secs(90)).await;
    cordon(&nodes, "n4", false).await;
    let out = etcdctl(&members[0], &["put", "greeting", "kept through a drain"]);
    assert!(out.status.success(), "{}", text(&out));
    let moving = members[0].clone();
    let node = moving.spec.node.clone().unwrap();

    // Quorum, watched from outside while the drain runs.
    let quorum = QuorumWatch::start(&members[1..]);
    let out = server.cli_blocking(&["node", "drain", &node]).await;
    assert!(out.status.success(), "{}", text(&out));
    let members = configured(server, "etcd", 3, Duration::from_secs(60)).await;
    quorum.held();

    let moved = members.iter().find(|m| m.metadata.name == moving.metadata.name).unwrap();
    assert_eq!(moved.spec.node.as_deref(), Some("n4"), "moved to the only free node");
    assert_ne!(instance(moved), instance(&moving));
    assert!(members.iter().all(|m| m.spec.node.as_deref() != Some(node.as_str())));
    let out = etcdctl(moved, &["get", "greeting", "--print-value-only"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "kept through a drain", "{}", text(&out));
    let names: Vec<String> = members.iter().map(|m| m.metadata.name.clone()).collect();
    eventually(Duration::from_secs(20), "etcd lists the same three members", || async {
        (etcd_members(moved) == names).then_some(())
    })
    .await;
    healthy(&members);
    let events = text(&server.cli(&["events"]));
    assert!(events.contains(EventReason::MemberMoved.as_str()), "{events}");
    // Its copy on the drained node was forgotten by the move itself: it
    // is no stray to remove there.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events = text(&server.cli(&["events"]));
    assert!(!events.contains(EventReason::StrayMember.as_str()), "{events}");
}

/// A rolling restart of the etcd role with one canary: every
/// member restarted once, in place, one at a time under the example's
/// budget, quorum kept the whole time, and etcd's data and member list
/// as before.
#[tokio::test(flavor = "multi_thread")]
async fn a_rolling_restart_of_etcd_restarts_each_member_once_and_keeps_quorum() {
    require(&["etcd", "etcdctl"]);
    let nodes = nodes(3).await;
    let server = &nodes.server;
    apply(&nodes, &example("etcd"));
    let before = configured(server, "etcd", 3, Duration::from_secs(90)).await;
    let out = etcdctl(&before[0], &["put", "greeting", "kept through a restart"]);
    assert!(out.status.success(), "{}", text(&out));
    let quorum = QuorumWatch::start(&before);
    let out = server.cli_blocking(&["appcluster", "restart", "etcd", "--role", "member", "--canary", "1"]).await;
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("role member of etcd restarted: 3 members, each once"), "{}", text(&out));
    let after = configured(server, "etcd", 3, Duration::from_secs(60)).await;
    quorum.held();
    for (a, b) in after.iter().zip(&before) {
        assert_ne!(instance(a), instance(b), "{} restarted", a.metadata.name);
        assert_eq!(a.spec.node, b.spec.node, "{} stayed where it was", a.metadata.name);
        let out = etcdctl(a, &["get", "greeting", "--print-value-only"]);
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "kept through a restart", "{}", text(&out));
    }
    let events = server.admin().list::<herd_core::kinds::EventSpec>("").await.unwrap();
    for member in &before {
        let restarts = events
            .iter()
            .filter(|e| {
                e.spec.reason_is(EventReason::MemberRestartedInPlace)
                    && e.spec.involved_object.name == member.metadata.name
            })
            .map(|e| e.spec.count)
            .sum::<u64>();
        assert_eq!(restarts, 1, "{} restarted once", member.metadata.name);
    }
    let names: Vec<String> = after.iter().map(|m| m.metadata.name.clone()).collect();
    assert_eq!(etcd_members(&after[0]), names);
    healthy(&after);
}

fn redis_cli(member: &Member, args: &[&str]) -> String {
    let port = member.spec.ports["redis"].to_string();
    let out = Command::new("redis-cli").args(["-h", "127.0.0.1", "-p", &port]).args(args).output().unwrap();
    text(&out)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_redis_example_has_replicas_that_follow_the_primary_herd_elects() {
    require(&["redis-server", "redis-cli"]);
    let nodes = nodes(3).await;
    let server = &nodes.server;
    apply(&nodes, &example("redis"));
    configured(server, "redis", 3, Duration::from_secs(60)).await;
    let leader = || async {
        let cluster = server.admin().get::<herd_core::kinds::AppClusterSpec>("redis").await.ok()?;
        let leader = cluster.status.leaders.into_iter().find(|l| l.role == "redis" && l.waiting.is_none())?;
        Some((leader.member?, leader.term))
    };
    let (name, term) = eventually(Duration::from_secs(30), "a primary in term 1", leader).await;
    assert_eq!(term, 1);
    let members = list_members(server, "redis").await;
    let primary = members.iter().find(|m| m.metadata.name == name).unwrap();
    let replicas: Vec<&Member> = members.iter().filter(|m| m.metadata.name != name).collect();
    eventually(Duration::from_secs(20), "the primary takes a write", || async {
        redis_cli(primary, &["set", "greeting", "hello from herd"]).contains("OK").then_some(())
    })
    .await;
    for replica in &replicas {
        eventually(Duration::from_secs(20), "the replica has the key", || async {
            (redis_cli(replica, &["get", "greeting"]).trim() == "hello from herd").then_some(())
        })
        .await;
        let info = redis_cli(replica, &["info", "replication"]);
        assert!(info.contains("role:slave") && info.contains("master_link_status:up"), "{info}");
        assert!(redis_cli(replica, &["set", "x", "1"]).contains("READONLY"), "a replica takes no write");
    }
    eventually(Duration::from_secs(20), "the primary counts two replicas", || async {
        redis_cli(primary, &["info", "replication"]).contains("connected_slaves:2").then_some(())
    })
    .await;
    // kill -9 of the primary: it comes back as a new instance with its data
    // (append-only file on its persistent volume), still the primary in
    // its term, and the replicas follow it again.
    kill9(pid_of(server, primary).await);
    eventually(Duration::from_secs(60), "the primary configured as a new instance", || async {
        let members = configured(server, "redis", 3, Duration::from_secs(60)).await;
        let back = members.iter().find(|m| m.metadata.name == primary.metadata.name)?;
        (instance(back) != instance(primary)).then_some(())
    })
    .await;
    eventually(Duration::from_secs(20), "the new primary instance serves the key", || async {
        (redis_cli(primary, &["get", "greeting"]).trim() == "hello from herd").then_some(())
    })
    .await;
    assert_eq!(leader().await, Some((name.clone(), 1)), "restarted in place within its lease: no failover");
    eventually(Duration::from_secs(30), "both replicas linked again", || async {
        redis_cli(primary, &["info", "replication"]).contains("connected_slaves:2").then_some(())
    })
    .await;
    // A switchover: the old primary a replica of the new one.
    let to = replicas[0];
    let out =
        server.cli_blocking(&["appcluster", "switchover", "redis", "--role", "redis", "--to", &to.metadata.name]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    eventually(Duration::from_secs(20), "the new primary takes a write", || async {
        redis_cli(to, &["set", "after", "switchover"]).contains("OK").then_some(())
    })
    .await;
    eventually(Duration::from_secs(30), "the old primary follows the new one", || async {
        (redis_cli(primary, &["get", "after"]).trim() == "switchover").then_some(())
    })
    .await;
    assert!(redis_cli(primary, &["set", "x", "1"]).contains("READONLY"), "the old primary takes no write");
    assert!(list_members(server, "redis").await.iter().all(|m| m.status.state == MemberState::Configured));
}
