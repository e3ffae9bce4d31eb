//! Leaders for App roles on real agents: a member granted its role's
//! lease is promoted by its hook; when its host is cut off, its agent
//! fences it (demote, then its processes end) before the next term is
//! granted elsewhere, so that two members never accept writes at once.
//!
//! The app is a shell loop that "accepts a write" every 10 ms while its
//! data volume holds the `primary` mark the promote hook writes and the
//! demote hook removes, logging the time and its term.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::apps::{Nodes, configured, nodes, nodes_with_n1_apart};
use common::eventually;
use herd_core::kinds::{AppClusterSpec, NodeSpec};

/// A member that writes while it is primary.
const MEMBER: &str = r#"while :; do
  if [ -e "$HERD_VOLUME_DATA/primary" ]; then
    echo "$(date +%s%N) $(cat "$HERD_VOLUME_DATA/primary")" >>"$WRITES/$HERD_MEMBER"
  fi
  sleep 0.01
done"#;

/// The promote hook: marks the member primary in its term.
const PROMOTE: &str = "echo \"$HERD_LEADER_TERM\" >\"$HERD_VOLUME_DATA/primary\"";

fn app() -> serde_json::Value {
    app_with(serde_json::json!({
        "promote": {"script": PROMOTE},
        "demote": {"script": "rm -f \"$HERD_VOLUME_DATA/primary\""}
    }))
}

/// The App with role `db` leading as `leader` says.
fn app_with(leader: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"name": "lead"},
        "spec": {"roles": [{
            "name": "db",
            "run": {"command": ["sh", "-c", MEMBER], "volumes": [{"name": "data", "persistent": true}]},
            "leader": leader
        }]}
    })
}

/// Each write a member logged: (nanoseconds since the epoch, term).
fn writes(dir: &Path, member: &str) -> Vec<(u128, u64)> {
    let text = std::fs::read_to_string(dir.join(member)).unwrap_or_default();
    let parse = |line: &str| {
        let (at, term) = line.split_once(' ')?;
        Some((at.parse().ok()?, term.trim().parse().ok()?))
    };
    text.lines().filter_map(parse).collect()
}

/// (holder, term) of role `db` in cluster `c`.
async fn leader(server: &common::TestServer) -> Option<(String, u64)> {
    let cluster = server.admin().get::<AppClusterSpec>("c").await.ok()?;
    let leader = cluster.status.leaders.into_iter().find(|l| l.role == "db")?;
    Some((leader.member?, leader.term))
}

/// Cluster `c` of three members, one a node, its first member the leader
/// on n1 (alone there while n2 and n3 were cordoned, the two others
/// joining after), promoted and writing; returns where the writes go.
async fn led_cluster(nodes: &Nodes) -> PathBuf {
    led_cluster_of(nodes, app()).await
}

/// As [`led_cluster`], of `app`.
async fn led_cluster_of(nodes: &Nodes, app: serde_json::Value) -> PathBuf {
    let server = &nodes.server;
    let admin = server.admin();
    let dir = nodes.dir.path().join("writes");
    std::fs::create_dir_all(&dir).unwrap();
    admin.create_value("apps", &app, Default::default()).await.unwrap();
    // Read and written again while a heartbeat's status write races it.
    let cordon = async |node: &str, cordoned: bool| {
        for _ in 0..20 {
            let mut object = admin.get::<NodeSpec>(node).await.unwrap();
            object.spec.unschedulable = cordoned;
            if admin.update(&object).await.is_ok() {
                return;
            }
        }
        panic!("could not cordon {node}");
    };
    cordon("n2", true).await;
    cordon("n3", true).await;
    let cluster = serde_json::json!({
        "metadata": {"name": "c"},
        "spec": {"appRef": "lead", "roles": [{"name": "db", "members": 1, "env": {"WRITES": dir}}]}
    });
    admin.create_value("appclusters", &cluster, Default::default()).await.unwrap();
    configured(server, "c", 1, Duration::from_secs(30)).await;
    eventually(Duration::from_secs(20), "c-db-0 leads", || async { leader(server).await.filter(|(_, t)| *t == 1) })
        .await;
    cordon("n2", false).await;
    cordon("n3", false).await;
    eventually(Duration::from_secs(10), "c scaled to 3", || async {
        let mut scaled = admin.get::<AppClusterSpec>("c").await.ok()?;
        scaled.spec.roles[0].members = 3;
        admin.update(&scaled).await.ok()
    })
    .await;
    let members = configured(server, "c", 3, Duration::from_secs(30)).await;
    let on_n1: Vec<&str> =
        members.iter().filter(|m| m.spec.node.as_deref() == Some("n1")).map(|m| m.metadata.name.as_str()).collect();
    assert_eq!((leader(server).await, on_n1), (Some(("c-db-0".to_string(), 1)), vec!["c-db-0"]));
    eventually(Duration::from_secs(20), "the leader promoted and writing", || async {
        (!writes(&dir, "c-db-0").is_empty()).then_some(())
    })
    .await;
    dir
}

/// Agents told of a standby replica first heartbeat to the leader all
/// the same: a standby answers 503 (only the leader renews role leases,
/// and a member is granted one only on a node the leader hears), and the
/// agent asks the next server. Before, the standby took the heartbeats,
/// and no member was ever granted a lease.
#[tokio::test(flavor = "multi_thread")]
async fn agents_told_of_a_standby_first_heartbeat_to_the_leader_and_its_role_leases_hold() {
    let nodes = common::apps::nodes_told_of_the_standby_first(3).await;
    let dir = led_cluster(&nodes).await;
    // Renewed all along: no new term, and the leader writes on.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(leader(&nodes.server).await, Some(("c-db-0".to_string(), 1)));
    let before = writes(&dir, "c-db-0").len();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(writes(&dir, "c-db-0").len() > before, "the leader still writes");
}

fn now_ns() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

/// Waits for term 2 to be granted and its leader to write; asserts the
/// old leader's last write came before the new one's first, and returns
/// (the new leader, ms from `since` to the old leader's last write, ms to
/// the new one's first).
async fn failed_over(nodes: &Nodes, dir: &Path, since: u128) -> (String, u128, u128) {
    let server = &nodes.server;
    let (second, term) =
        eventually(Duration::from_secs(40), "a new leader", || async { leader(server).await.filter(|(_, t)| *t == 2) })
            .await;
    assert_ne!(second, "c-db-0");
    eventually(Duration::from_secs(20), "the new leader promoted and writing", || async {
        writes(dir, &second).iter().any(|(_, t)| *t == term).then_some(())
    })
    .await;
    // The third member hears of it in its configmeta.
    let third = ["c-db-1", "c-db-2"].into_iter().find(|m| *m != second).unwrap();
    let node = if third == "c-db-1" { 1 } else { 2 };
    let path = nodes.dirs[node].join(format!("volumes/{third}/herd/configmeta.json"));
    eventually(Duration::from_secs(20), &format!("{third}'s configmeta naming {second} in term 2"), || async {
        let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
        let leader = &meta["roles"][0]["leader"];
        (leader["member"] == second.as_str() && leader["term"] == 2).then_some(())
    })
    .await;
    let last_old = writes(dir, "c-db-0").iter().map(|(at, _)| *at).max().unwrap();
    let first_new = writes(dir, &second).iter().filter(|(_, t)| *t == 2).map(|(at, _)| *at).min().unwrap();
    assert!(
        last_old < first_new,
        "never two primaries at once: the old wrote until {last_old}, the new from {first_new}"
    );
    let ms = |ns: u128| ns.saturating_sub(since) / 1_000_000;
    (second, ms(last_old), ms(first_new))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cut_off_leader_is_fenced_before_another_member_is_promoted_and_never_two_write_at_once() {
    let nodes = nodes_with_n1_apart(3).await;
    let server = &nodes.server;
    let dir = led_cluster(&nodes).await;

    // n1 is cut off: its agent cannot renew, and fences its leader
    // (demote, then its processes end) at its renew deadline.
    let netns = nodes.netns.as_ref().expect("n1 apart");
    netns.cut();
    let (second, fenced, promoted) = failed_over(&nodes, &dir, now_ns()).await;
    eprintln!("cut off: the old leader's last write {fenced} ms after the cut, the new leader's first {promoted} ms");
    // Renewed at most a heartbeat before the cut, fenced 7 s after that.
    assert!(fenced < 7_500, "fenced in time: {fenced} ms");

    // The operator sees who leads, in which term, and each grant.
    let table = String::from_utf8_lossy(&server.cli(&["get", "members"]).stdout).to_string();
    let row = table.lines().find(|l| l.starts_with(second.as_str())).unwrap_or_default().to_string();
    assert!(row.contains(" yes ") && row.split_whitespace().any(|w| w == "2"), "{table}");
    let described = String::from_utf8_lossy(&server.cli(&["describe", "appcluster", "c"]).stdout).to_string();
    for line in
        [format!("Leader of role db: {second}, term 2"), "term 1 to c-db-0".into(), format!("term 2 to {second}")]
    {
        assert!(described.contains(&line), "{line:?} in\n{described}");
    }

    // The cut heals: the old leader, demoted, stays a follower.
    let old = writes(&dir, "c-db-0").len();
    netns.heal();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(writes(&dir, "c-db-0").len(), old, "the old leader writes no more");
    assert_eq!(leader(server).await, Some((second, 2)));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leader_whose_agent_is_stopped_is_ended_by_its_guard_and_demoted_before_it_runs_again() {
    let nodes = nodes(3).await;
    let server = &nodes.server;
    let dir = led_cluster(&nodes).await;

    // n1's agent stops (SIGSTOP): nothing renews, nothing fences but the
    // guard, halfway between the renew deadline and the lease's end.
    let agent = nodes.agents[0].pid();
    signal(agent, "-STOP");
    let (second, ended, promoted) = failed_over(&nodes, &dir, now_ns()).await;
    eprintln!("agent stopped: the old leader's last write {ended} ms after, the new leader's first {promoted} ms");
    assert!(ended < 9_500, "ended by its guard before the lease could end: {ended} ms");

    // The agent goes on: the old leader is demoted before it runs again.
    let old = writes(&dir, "c-db-0").len();
    signal(agent, "-CONT");
    running_again(server).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(writes(&dir, "c-db-0").len(), old, "the old leader writes no more");
    assert_eq!(leader(server).await, Some((second, 2)));
}

/// Waits until n1 is Ready and runs c-db-0 again.
async fn running_again(server: &common::TestServer) {
    eventually(Duration::from_secs(30), "c-db-0 running again", || async {
        let node = server.admin().get::<NodeSpec>("n1").await.ok()?;
        let report = node.status.members.iter().find(|r| r.name == "c-db-0")?;
        (node.status.ready && report.running).then_some(())
    })
    .await;
}

fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill").args([signal, &pid.to_string()]).status().unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leaders_process_killed_is_started_again_in_place_and_keeps_its_lease() {
    let nodes = nodes(3).await;
    let server = &nodes.server;
    let dir = led_cluster(&nodes).await;
    let member = server.admin().get::<herd_core::kinds::MemberSpec>("c-db-0").await.unwrap();
    let pid = common::apps::pid_of(server, &member).await;
    common::apps::kill9(pid);
    let killed = now_ns();
    eventually(Duration::from_secs(20), "c-db-0 writing again, in term 1", || async {
        writes(&dir, "c-db-0").iter().any(|(at, term)| *at > killed + 100_000_000 && *term == 1).then_some(())
    })
    .await;
    // Past a whole lease and more: still its leader, in its term.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(leader(server).await, Some(("c-db-0".to_string(), 1)));
    for other in ["c-db-1", "c-db-2"] {
        assert!(writes(&dir, other).is_empty(), "{other} never led");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_leaders_role_fails_over_and_the_old_leader_comes_back_a_follower() {
    let mut nodes = nodes(3).await;
    let dir = led_cluster(&nodes).await;
    // n1 is lost: its agent and its members die at once.
    lose_n1(&mut nodes).await;
    let (second, lost, promoted) = failed_over(&nodes, &dir, now_ns()).await;
    eprintln!("host lost: the old leader's last write {lost} ms after, the new leader's first {promoted} ms");

    // The host comes back: the old leader starts again demoted, a follower.
    let old = writes(&dir, "c-db-0").len();
    nodes.agents[0] = common::start_agent(&nodes.server.url, &nodes.dirs[0], "n1");
    let server = &nodes.server;
    running_again(server).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(writes(&dir, "c-db-0").len(), old, "the old leader writes no more");
    assert_eq!(leader(server).await, Some((second, 2)));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_switchover_demotes_the_leader_first_and_the_next_writes_within_a_second() {
    let nodes = nodes(3).await;
    let server = &nodes.server;
    let dir = led_cluster(&nodes).await;

    // Refused, naming the field and why, before anything is asked.
    let refused = server.cli(&["appcluster", "switchover", "c", "--role", "db", "--to", "c-db-9"]);
    let said = String::from_utf8_lossy(&refused.stderr).to_string();
    assert!(!refused.status.success() && said.contains("spec.action.to"), "{said}");
    assert!(said.contains("no member named \"c-db-9\""), "{said}");
    let refused = server.cli(&["appcluster", "switchover", "c", "--role", "web"]);
    let said = String::from_utf8_lossy(&refused.stderr).to_string();
    assert!(!refused.status.success() && said.contains("spec.action.role"), "{said}");

    let asked = now_ns();
    let out = server.cli_blocking(&["appcluster", "switchover", "c", "--role", "db", "--to", "c-db-2"]).await;
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{said}{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("role db handed over: c-db-0 (term 1) to c-db-2 (term 2)"), "{said}");
    assert_eq!(leader(server).await, Some(("c-db-2".to_string(), 2)));
    eventually(Duration::from_secs(10), "c-db-2 writing in term 2", || async {
        writes(&dir, "c-db-2").iter().any(|(_, t)| *t == 2).then_some(())
    })
    .await;
    let last_old = writes(&dir, "c-db-0").iter().map(|(at, _)| *at).max().unwrap();
    let first_new = writes(&dir, "c-db-2").iter().map(|(at, _)| *at).min().unwrap();
    assert!(last_old < first_new, "the old leader stopped writing before the new one began");
    let gap_ms = (first_new - last_old) / 1_000_000;
    eprintln!(
        "switchover: no writer for {gap_ms} ms (asked {} ms before the old leader's last write)",
        last_old.saturating_sub(asked) / 1_000_000
    );
    assert!(gap_ms < 1_000, "a planned switchover leaves no writer for under a second: {gap_ms} ms");
    // Past a whole lease: the old leader, a follower now, writes no more.
    let old = writes(&dir, "c-db-0").len();
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(writes(&dir, "c-db-0").len(), old, "the old leader writes no more");
    assert_eq!(leader(server).await, Some(("c-db-2".to_string(), 2)));
    assert!(writes(&dir, "c-db-1").is_empty(), "c-db-1 never led");
}

/// Loses n1 (its agent and c-db-0's processes at once).
async fn lose_n1(nodes: &mut Nodes) {
    let member = nodes.server.admin().get::<herd_core::kinds::MemberSpec>("c-db-0").await.unwrap();
    common::apps::lose_host(nodes, &member).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_promote_passes_the_lease_on_and_an_event_names_the_hooks_stderr() {
    let mut nodes = nodes(3).await;
    let refuses = format!(
        "if [ \"$HERD_MEMBER\" = c-db-1 ]; then echo 'c-db-1: no disk for a primary' >&2; exit 3; fi; {PROMOTE}"
    );
    let spec = serde_json::json!({
        "promote": {"script": refuses},
        "demote": {"script": "rm -f \"$HERD_VOLUME_DATA/primary\""}
    });
    let dir = led_cluster_of(&nodes, app_with(spec)).await;
    lose_n1(&mut nodes).await;
    let server = &nodes.server;
    // Term 2 goes to c-db-1 (no positions: by name), whose promote fails;
    // its lease goes unrenewed, and term 3 to c-db-2 once it expired.
    let (third, _) =
        eventually(Duration::from_secs(60), "term 3", || async { leader(server).await.filter(|(_, t)| *t == 3) }).await;
    assert_eq!(third, "c-db-2");
    eventually(Duration::from_secs(20), "c-db-2 writing in term 3", || async {
        writes(&dir, "c-db-2").iter().any(|(_, t)| *t == 3).then_some(())
    })
    .await;
    assert!(writes(&dir, "c-db-1").is_empty(), "c-db-1 never wrote");
    let events = String::from_utf8_lossy(&server.cli(&["get", "events"]).stdout).to_string();
    let said = events.lines().find(|l| l.contains("member/c-db-1") && l.contains("no disk for a primary"));
    assert!(said.is_some(), "an Event on c-db-1 names its hook's stderr:\n{events}");
    let described = String::from_utf8_lossy(&server.cli(&["describe", "appcluster", "c"]).stdout).to_string();
    assert!(described.contains("term 3 to c-db-2"), "{described}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_synchronous_role_with_no_replica_in_sync_promotes_nothing_says_why_and_waits_for_its_leader() {
    let mut nodes = nodes(3).await;
    // Every member says it is at 1 and the leader that none is in sync.
    let spec = serde_json::json!({
        "synchronous": true,
        "position": {"script": "echo 1; echo sync"},
        "promote": {"script": PROMOTE},
        "demote": {"script": "rm -f \"$HERD_VOLUME_DATA/primary\""}
    });
    let dir = led_cluster_of(&nodes, app_with(spec)).await;
    lose_n1(&mut nodes).await;
    let server = &nodes.server;
    let why = eventually(Duration::from_secs(30), "the role leaderless, saying why", || async {
        let cluster = server.admin().get::<AppClusterSpec>("c").await.ok()?;
        let leader = cluster.status.leaders.into_iter().find(|l| l.role == "db")?;
        leader.waiting.filter(|w| w.starts_with("no member may lead"))
    })
    .await;
    assert!(
        why.contains("c-db-1 not a synchronous replica") && why.contains("c-db-2 not a synchronous replica"),
        "{why}"
    );
    // Past a whole lease more: no one promoted.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(leader(server).await, Some(("c-db-0".to_string(), 1)));
    for other in ["c-db-1", "c-db-2"] {
        assert!(writes(&dir, other).is_empty(), "{other} never led");
    }
    // Its host comes back: the last leader, who had every write, leads again.
    nodes.agents[0] = common::start_agent(&nodes.server.url, &nodes.dirs[0], "n1");
    let server = &nodes.server;
    eventually(Duration::from_secs(40), "c-db-0 leading in term 2", || async {
        let cluster = server.admin().get::<AppClusterSpec>("c").await.ok()?;
        let leader = cluster.status.leaders.into_iter().find(|l| l.role == "db")?;
        (leader.member.as_deref() == Some("c-db-0") && leader.term == 2 && leader.waiting.is_none()).then_some(())
    })
    .await;
    eventually(Duration::from_secs(20), "c-db-0 writing in term 2", || async {
        writes(&dir, "c-db-0").iter().any(|(_, t)| *t == 2).then_some(())
    })
    .await;
}
