//! The PostgreSQL example (`examples/apps/postgres/`) on real agents with
//! Debian's PostgreSQL 15: a primary elected by herd's role lease and two
//! streaming standbys. A kill -9 of the primary's process keeps its
//! lease; the loss of its host makes another the primary, with every
//! acknowledged commit (synchronous mode), and the old one comes back a
//! standby, rewound; a switchover hands the primary back in under a
//! second without losing a write.

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::apps::{Nodes, configured, example, list_members, nodes, pid_of, require};
use common::eventually;
use herd_core::kinds::{AppClusterSpec, Member, MemberSpec, NodeSpec};

const CLUSTER: &str = "postgres";

/// `psql` against one member: what it printed, or why it failed.
fn psql(member: &Member, sql: &str) -> Result<String, String> {
    let port = member.spec.ports["pg"].to_string();
    let out = Command::new("psql")
        .args(["-X", "-q", "-h", "127.0.0.1", "-p", &port, "-U", "postgres", "-d", "postgres", "-tA"])
        .args(["-v", "ON_ERROR_STOP=1", "-c", sql])
        .env("PGCONNECT_TIMEOUT", "2")
        .output()
        .unwrap();
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).trim().to_string()),
        false => Err(String::from_utf8_lossy(&out.stderr).trim().to_string()),
    }
}

/// (holder, term) of role `db`.
async fn leader(nodes: &Nodes) -> Option<(String, u64)> {
    let cluster = nodes.server.admin().get::<AppClusterSpec>(CLUSTER).await.ok()?;
    let leader = cluster.status.leaders.into_iter().find(|l| l.role == "db" && l.waiting.is_none())?;
    Some((leader.member?, leader.term))
}

async fn member(nodes: &Nodes, name: &str) -> Member {
    nodes.server.admin().get::<MemberSpec>(name).await.unwrap()
}

/// Waits for a leader in a term after `after` that takes writes; returns it.
async fn writable_leader(nodes: &Nodes, after: u64, within: Duration) -> (Member, u64) {
    let start = Instant::now();
    let (name, term) = loop {
        if let Some(found) = leader(nodes).await.filter(|(_, t)| *t > after) {
            break found;
        }
        if start.elapsed() > within {
            let described = nodes.server.cli(&["describe", "appcluster", CLUSTER]);
            panic!("no leader after term {after} within {within:?}:\n{}", String::from_utf8_lossy(&described.stdout));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let primary = member(nodes, &name).await;
    eventually(Duration::from_secs(30), &format!("{name} takes writes"), || async {
        psql(&primary, "create table if not exists t (id int primary key, term int)").ok()
    })
    .await;
    (primary, term)
}

/// Inserts `ids` on the primary, each its own acknowledged commit.
fn insert(primary: &Member, ids: std::ops::Range<u32>, term: u64) {
    for id in ids {
        psql(primary, &format!("insert into t values ({id}, {term})")).unwrap();
    }
}

fn count(member: &Member) -> Result<u32, String> {
    psql(member, "select count(*) from t")?.parse().map_err(|e| format!("{e}"))
}

/// Whether the member runs as a standby.
fn standby(member: &Member) -> bool {
    psql(member, "select pg_is_in_recovery()").is_ok_and(|s| s == "t")
}

/// Waits until `done` for at most `limit`; on time-out, the panic shows
/// the end of what `member`'s process said.
async fn within(nodes: &Nodes, member: &Member, limit: Duration, what: &str, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > limit {
            let log = nodes.dir_of(member).join(format!("members/{}/stderr.log", member.metadata.name));
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            // What its script said (PostgreSQL's own lines start with the date), then its last lines.
            let said: Vec<&str> = text.lines().filter(|l| !l.starts_with("20")).collect();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            let object = nodes.server.cli(&["get", "member", &member.metadata.name, "-o", "yaml"]);
            panic!(
                "{} not {what} after {limit:?}; its script said:\n{}\nand its stderr ends:\n{}\nits object:\n{}",
                member.metadata.name,
                said.join("\n"),
                tail.join("\n"),
                String::from_utf8_lossy(&object.stdout)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_postgres_example_fails_over_keeps_every_commit_and_its_old_primary_comes_back_rewound() {
    require(&["psql", "pg_isready", "/usr/lib/postgresql/15/bin/postgres"]);
    let mut nodes = nodes(3).await;
    let server = &nodes.server;
    let out = server.cli(&["apply", "-f", example("postgres").to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    configured(server, CLUSTER, 3, Duration::from_secs(120)).await;
    let (first, term) = writable_leader(&nodes, 0, Duration::from_secs(60)).await;
    assert_eq!(term, 1);
    let first_name = first.metadata.name.clone();
    insert(&first, 0..50, term);
    // Every standby streams from it, and is in sync.
    let members = list_members(server, CLUSTER).await;
    for standby_member in members.iter().filter(|m| m.metadata.name != first_name) {
        eventually(Duration::from_secs(30), &format!("{} has the rows", standby_member.metadata.name), || async {
            (count(standby_member) == Ok(50) && standby(standby_member)).then_some(())
        })
        .await;
    }
    eventually(Duration::from_secs(30), "both standbys reported in sync", || async {
        let cluster = server.admin().get::<AppClusterSpec>(CLUSTER).await.ok()?;
        let leader = cluster.status.leaders.into_iter().find(|l| l.role == "db")?;
        (leader.in_sync.len() == 2).then_some(())
    })
    .await;

    // kill -9 of the primary's process: started again in place, still the leader.
    let pid = pid_of(server, &first).await;
    common::apps::kill9(pid);
    eventually(Duration::from_secs(30), "the primary takes writes again", || async {
        psql(&first, "insert into t values (50, 1)").ok()
    })
    .await;
    // Ready again within its lease: renewed, no failover.
    eventually(Duration::from_secs(10), "the leader renewed in term 1", || async {
        leader(&nodes).await.filter(|l| *l == (first_name.clone(), 1))
    })
    .await;

    // Its host is lost: agent and members at once.
    let node_index = nodes.dirs.iter().position(|d| d == nodes.dir_of(&first)).unwrap();
    let pid = pid_of(server, &first).await;
    nodes.agents[node_index].kill9();
    let killed = Command::new("kill").args(["-KILL", "--", &format!("-{pid}")]).status().unwrap();
    assert!(killed.success());
    let lost = Instant::now();
    let (second, term) = writable_leader(&nodes, 1, Duration::from_secs(60)).await;
    eprintln!("host lost: {} writable in term {term} after {:?}", second.metadata.name, lost.elapsed());
    assert_ne!(second.metadata.name, first_name);
    assert_eq!(count(&second), Ok(51), "every acknowledged commit is on the new primary");
    insert(&second, 51..60, term);

    // The host comes back: the old primary is rewound and follows.
    nodes.agents[node_index] =
        common::start_agent(&nodes.server.url, &nodes.dirs[node_index], &format!("n{}", node_index + 1));
    within(&nodes, &first, Duration::from_secs(60), "a standby with every row", || {
        standby(&first) && count(&first) == Ok(60)
    })
    .await;

    // A switchover back to it (once the primary reports it in sync): no
    // write lost, no writer for under a second.
    eventually(Duration::from_secs(30), &format!("{first_name} in sync"), || async {
        let cluster = nodes.server.admin().get::<AppClusterSpec>(CLUSTER).await.ok()?;
        let leader = cluster.status.leaders.into_iter().find(|l| l.role == "db")?;
        leader.in_sync.contains(&first_name).then_some(())
    })
    .await;
    let asked = Instant::now();
    let out =
        nodes.server.cli_blocking(&["appcluster", "switchover", CLUSTER, "--role", "db", "--to", &first_name]).await;
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("switchover: {}", String::from_utf8_lossy(&out.stdout).trim());
    let (back, term) = writable_leader(&nodes, term, Duration::from_secs(10)).await;
    eprintln!("switchover: {} writable in term {term} {:?} after it was asked", back.metadata.name, asked.elapsed());
    assert_eq!(back.metadata.name, first_name);
    assert_eq!(count(&back), Ok(60), "nothing lost in the switchover");
    insert(&back, 60..70, term);
    within(&nodes, &second, Duration::from_secs(60), "a standby with every row", || {
        standby(&second) && count(&second) == Ok(70)
    })
    .await;
    let node = nodes.server.admin().get::<NodeSpec>("n1").await.unwrap();
    assert!(node.status.ready);
}
