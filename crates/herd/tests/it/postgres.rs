//! The PostgreSQL example (`examples/apps/postgres/`) on real agents with
//! Debian's PostgreSQL 15: a primary elected by herd's role lease and two
//! streaming standbys. A kill -9 of the primary's process keeps its
//! lease; the loss of its host makes another the primary, with every
//! acknowledged commit (synchronous mode), and the old one comes back a
//! standby, rewound; a switchover hands the primary back in under a
//! second without losing a write.

use crate::common;

use std::process::Command;

use herd_bench::probe;
use std::time::{Duration, Instant};

use common::apps::{Nodes, configured, example, list_members, nodes, pid_of, require};
use common::eventually;
use herd_core::kinds::{AppClusterSpec, Member, MemberSpec, NodeSpec};

const CLUSTER: &str = "postgres";

/// `psql` against one member on loopback: what it printed, or why it failed.
fn psql(member: &Member, sql: &str) -> Result<String, String> {
    psql_at("127.0.0.1", member, sql)
}

/// `psql` against one member at `host`.
fn psql_at(host: &str, member: &Member, sql: &str) -> Result<String, String> {
    let port = member.spec.ports["pg"].to_string();
    let out = Command::new("psql")
        .args(["-X", "-q", "-h", host, "-p", &port, "-U", "postgres", "-d", "postgres", "-tA"])
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
    writable_leader_at(nodes, after, within, &|_| "127.0.0.1".into()).await
}

/// As [`writable_leader`], each member reached at the address `host` says.
/// The leader is read again while it takes no writes (it may lose its
/// lease meanwhile, on a loaded machine).
async fn writable_leader_at(
    nodes: &Nodes,
    after: u64,
    within: Duration,
    host: &dyn Fn(&Member) -> String,
) -> (Member, u64) {
    let start = Instant::now();
    let create = "create table if not exists t (id int primary key, term int)";
    let mut why = String::from("no leader yet");
    loop {
        if let Some((name, term)) = leader(nodes).await.filter(|(_, t)| *t > after) {
            let primary = member(nodes, &name).await;
            match psql_at(&host(&primary), &primary, create) {
                Ok(_) => return (primary, term),
                Err(error) => why = format!("{name} (term {term}) takes no writes at {}: {error}", host(&primary)),
            }
        }
        if start.elapsed() > within {
            let described = nodes.server.cli(&["describe", "appcluster", CLUSTER]);
            panic!(
                "no writable leader after term {after} within {within:?}: {why}\n{}",
                String::from_utf8_lossy(&described.stdout)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
            let said: Vec<&str> =
                text.lines().filter(|l| !l.starts_with("20") && !l.starts_with(char::is_whitespace)).collect();
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
    let _turn = common::take_turn().await;
    let mut nodes = nodes(3).await;
    let server = &nodes.server;
    let out = server.cli(&["apply", "-f", example("postgres").to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    configured(server, CLUSTER, 3, Duration::from_secs(120)).await;
    let (first, first_term) = writable_leader(&nodes, 0, Duration::from_secs(60)).await;
    let first_name = first.metadata.name.clone();
    let term = first_term;
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

    // kill -9 of the primary's process just after its standbys were
    // unnamed, as a promote killed midway leaves it: started again in
    // place, still the leader, it waits for a standby to have each commit
    // from its first on (alone, it acknowledged commits the next leader
    // lacked).
    let pid = pid_of(server, &first).await;
    let node = first.spec.node.as_deref().and_then(|n| n.strip_prefix('n')).unwrap();
    let data = &nodes.dirs[node.parse::<usize>().unwrap() - 1].join(format!("volumes/{first_name}/data"));
    std::fs::remove_file(data.join("sync.conf")).unwrap();
    common::apps::kill9(pid);
    let named = eventually(Duration::from_secs(30), "the primary answers again", || async {
        psql(&first, "show synchronous_standby_names").ok()
    })
    .await;
    assert_ne!(named, "", "started again with no standbys named, the primary acknowledges commits alone");
    eventually(Duration::from_secs(30), "the primary takes writes again", || async {
        psql(&first, "insert into t values (50, 1)").ok()
    })
    .await;
    // Ready again within its lease: renewed, no failover.
    eventually(Duration::from_secs(10), "the leader renewed in its term", || async {
        leader(&nodes).await.filter(|l| *l == (first_name.clone(), first_term))
    })
    .await;

    // Again, with its data a standby's, as a leader killed before its
    // promote took leaves it: started as a standby and promoted (a
    // standby's data started as a primary loses the WAL it streamed since
    // its last restartpoint), it comes back the primary with every row,
    // holding commits for a standby.
    let pid = pid_of(server, &first).await;
    std::fs::write(data.join("pgdata/standby.signal"), "").unwrap();
    common::apps::kill9(pid);
    eventually(Duration::from_secs(30), "the primary takes writes again after a promote", || async {
        psql(&first, "insert into t values (1000, 1)").ok()
    })
    .await;
    assert_eq!(count(&first), Ok(52), "every acknowledged commit is on it");
    assert_ne!(psql(&first, "show synchronous_standby_names"), Ok(String::new()), "it holds commits for a standby");
    eventually(Duration::from_secs(10), "the leader renewed in its term", || async {
        leader(&nodes).await.filter(|l| *l == (first_name.clone(), first_term))
    })
    .await;

    // Its host is lost: agent and members at once.
    let node_index = common::apps::lose_host(&mut nodes, &first).await;
    let lost = Instant::now();
    let (second, term) = writable_leader(&nodes, first_term, Duration::from_secs(60)).await;
    eprintln!("host lost: {} writable in term {term} after {:?}", second.metadata.name, lost.elapsed());
    assert_ne!(second.metadata.name, first_name);
    assert_eq!(count(&second), Ok(52), "every acknowledged commit is on the new primary");
    insert(&second, 51..60, term);

    // The host comes back: the old primary is rewound and follows.
    nodes.agents[node_index] =
        common::start_agent(&nodes.server.url, &nodes.dirs[node_index], &format!("n{}", node_index + 1));
    within(&nodes, &first, Duration::from_secs(60), "a standby with every row", || {
        standby(&first) && count(&first) == Ok(61)
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
    assert_eq!(count(&back), Ok(61), "nothing lost in the switchover");
    insert(&back, 60..70, term);
    within(&nodes, &second, Duration::from_secs(60), "a standby with every row", || {
        standby(&second) && count(&second) == Ok(71)
    })
    .await;
    let node = nodes.server.admin().get::<NodeSpec>("n1").await.unwrap();
    assert!(node.status.ready);
}

/// Applies the example's App with `change` made to it, then its cluster
/// of `members`.
async fn apply_example(nodes: &Nodes, members: u32, change: impl FnOnce(&mut serde_json::Value)) {
    let admin = nodes.server.admin();
    let text = std::fs::read_to_string(example("postgres").join("app.yaml")).unwrap();
    let mut app: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    change(&mut app);
    admin.create_value("apps", &app, Default::default()).await.unwrap();
    let cluster = serde_json::json!({
        "metadata": {"name": CLUSTER},
        "spec": {"appRef": "postgres", "roles": [{"name": "db", "members": members}]}
    });
    admin.create_value("appclusters", &cluster, Default::default()).await.unwrap();
}

/// Where each member is reached, in the order given: n1's from inside its
/// network namespace (where a cut-off primary is still heard).
async fn targets(nodes: &Nodes, members: &[Member]) -> Vec<probe::Target> {
    let mut targets = Vec::new();
    for member in members {
        let netns = nodes.netns.as_ref().filter(|_| member.spec.node.as_deref() == Some("n1"));
        let (host, port) = (nodes.host_of(member).await, member.spec.ports["pg"]);
        targets.push(probe::Target { host, port, netns: netns.map(|ns| ns.name.clone()) });
    }
    targets
}

/// Every write the probes saw acknowledged that `primary` does not have,
/// once they stopped.
async fn lost_writes(nodes: &Nodes, primary: &Member, timelines: &[Vec<probe::Ack>]) -> Vec<probe::Lost> {
    let host = nodes.host_of(primary).await;
    let client = probe::connect(&host, primary.spec.ports["pg"]).await.expect("the primary takes connections");
    let rows = client.query("select v from probe", &[]).await.unwrap();
    let stored: std::collections::BTreeSet<i64> = rows.iter().map(|r| r.get(0)).collect();
    probe::lost(timelines, &stored)
}

#[tokio::test(flavor = "multi_thread")]
async fn in_synchronous_mode_every_acknowledged_commit_survives_20_failovers() {
    require(&["psql", "pg_isready", "/usr/lib/postgresql/15/bin/postgres"]);
    // Beside the soak, or in the suite's first burst, its leaders missed
    // renewals and it failed: it takes its turn.
    let _turn = common::take_turn().await;
    let mut nodes = common::apps::nodes_with_n1_apart(3).await;
    apply_example(&nodes, 3, herd_bench::soak::quick_failovers).await;
    let members = configured(&nodes.server, CLUSTER, 3, Duration::from_secs(120)).await;
    let netns_of = |m: &Member| m.spec.node.as_deref() == Some("n1");
    let n1 = members.iter().find(|m| netns_of(m)).unwrap().metadata.name.clone();
    let mut hosts = std::collections::BTreeMap::new();
    for member in &members {
        hosts.insert(member.metadata.name.clone(), nodes.host_of(member).await);
    }
    let host_of = |m: &Member| hosts[&m.metadata.name].clone();
    // The table goes on whichever primary takes it: on a loaded machine
    // the first may lose its lease at once (its readiness check late).
    let (mut primary, mut term) = loop {
        let (primary, term) = writable_leader_at(&nodes, 0, Duration::from_secs(60), &host_of).await;
        match psql_at(&host_of(&primary), &primary, "create table if not exists probe (v bigint primary key)") {
            Ok(_) => break (primary, term),
            Err(error) => eprintln!("{} (term {term}) took no write: {error}; looking again", primary.metadata.name),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // A write every 10 ms to each member, n1's from inside its namespace:
    // a cut-off primary that acknowledged a commit alone is heard there.
    let mut probes = probe::Probes::start(&targets(&nodes, &members).await, Default::default());

    let mut faults = Vec::new();
    for round in 1..=20 {
        // Odd rounds cut n1 off while its member leads (switched over to it
        // first); even rounds lose the primary's host.
        let cut = round % 2 == 1;
        if cut && primary.metadata.name != n1 {
            switch_over_to(&nodes, &n1).await;
            (primary, term) = writable_leader_at(&nodes, term, Duration::from_secs(30), &host_of).await;
            assert_eq!(primary.metadata.name, n1);
        }
        // One standby in sync is enough to fail over to.
        in_sync(&nodes, 1).await;
        let name = primary.metadata.name.clone();
        let faulted = probe::now_ns();
        faults.push((round, faulted));
        let old = members.iter().position(|m| m.metadata.name == name).unwrap();
        let lost_node = match cut {
            true => {
                nodes.netns.as_ref().unwrap().cut();
                None
            }
            false => Some(common::apps::lose_host(&mut nodes, &primary).await),
        };
        let (next, next_term) = writable_leader_at(&nodes, term, Duration::from_secs(30), &host_of).await;
        // What a client saw: the longest time with no write acknowledged
        // (none of the cut-off primary's after the cut).
        let since = faulted - 5_000_000_000;
        let outage = eventually(Duration::from_secs(60), "writes flowing again on the next primary", || async {
            probe::outage(&probes.timelines_since(since), faulted, |i| !cut || i != old, probe::now_ns())
        })
        .await;
        eprintln!(
            "round {round}: {name} {}; {} writable in term {next_term}; no write acknowledged for {} ms",
            if cut { "cut off" } else { "lost" },
            next.metadata.name,
            outage.as_millis()
        );
        match lost_node {
            Some(node) => nodes.restart_agent(node),
            None => nodes.netns.as_ref().unwrap().heal(),
        }
        (primary, term) = (next, next_term);
    }
    // Every member back, each standby in sync.
    in_sync(&nodes, 2).await;
    let timelines = probes.finish();
    let acknowledged: usize = timelines.iter().map(Vec::len).sum();
    assert!(acknowledged > 1000, "the probes wrote all along: {acknowledged}");
    let lost = lost_writes(&nodes, &primary, &timelines).await;
    let faults: Vec<String> = faults.iter().map(|(round, at)| format!("round {round} at {at}")).collect();
    let lost: Vec<String> =
        lost.iter().map(|l| format!("{} by {} at {}", l.value, members[l.instance].metadata.name, l.at)).collect();
    assert!(lost.is_empty(), "acknowledged commits lost: {lost:?}; faults: {faults:?}");
    let two = probe::two_writable(&timelines);
    assert!(two.is_empty(), "two members took writes at once: {two:?}");
    eprintln!("20 failovers (10 cut off, 10 lost): {acknowledged} commits acknowledged, none lost");
}

/// How long a standby may take to be in sync again after a failover: a
/// precondition of the next round, not a measure. In CI, beside the soak,
/// a former primary was not back in sync within a minute (and what its
/// script said is shown if it is not within this).
const BACK_IN_SYNC: Duration = Duration::from_secs(180);

/// Waits until the primary reports `member` in sync.
async fn in_sync_member(nodes: &Nodes, member: &str) {
    in_sync_as(nodes, &format!("{member} in sync"), |in_sync| in_sync.iter().any(|m| m == member)).await;
}

/// Switches role `db` over to `member` once it is in sync and ready, as
/// an operator would: a switchover refused because the target's readiness
/// check fails (a former primary restarted to follow the new one reports
/// in sync a moment before its check passes again) is asked again.
async fn switch_over_to(nodes: &Nodes, member: &str) {
    eventually(BACK_IN_SYNC, &format!("a switchover to {member} taken"), || async {
        in_sync_member(nodes, member).await;
        if !nodes.server.admin().get::<MemberSpec>(member).await.ok()?.status.ready {
            return None;
        }
        let out =
            nodes.server.cli_blocking(&["appcluster", "switchover", CLUSTER, "--role", "db", "--to", member]).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        match (out.status.success(), stderr.contains("its readiness check")) {
            (true, _) => Some(()),
            (false, true) => {
                eprintln!("switchover to {member} refused, asked again: {}", stderr.trim());
                tokio::time::sleep(Duration::from_millis(500)).await;
                None
            }
            (false, false) => panic!("switchover to {member} failed: {stderr}"),
        }
    })
    .await;
}

/// Waits until the primary reports `count` standbys in sync or more.
async fn in_sync(nodes: &Nodes, count: usize) {
    in_sync_as(nodes, &format!("{count} standbys in sync"), |in_sync| in_sync.len() >= count).await;
}

/// Waits until a primary, not waiting, reports standbys in sync as `wanted`
/// says; on time-out the panic shows the cluster, what the primary says of
/// its standbys, and what each member's script said.
async fn in_sync_as(nodes: &Nodes, what: &str, wanted: impl Fn(&[String]) -> bool) {
    let start = Instant::now();
    loop {
        let cluster = nodes.server.admin().get::<AppClusterSpec>(CLUSTER).await.unwrap();
        let leader = cluster.status.leaders.into_iter().find(|l| l.role == "db").unwrap_or_default();
        if wanted(&leader.in_sync) && leader.waiting.is_none() {
            return;
        }
        if start.elapsed() > BACK_IN_SYNC {
            let described = nodes.server.cli(&["describe", "appcluster", CLUSTER]);
            let primary = member(nodes, leader.member.as_deref().unwrap_or_default()).await;
            let standbys = psql(&primary, "select application_name, state, sync_state from pg_stat_replication");
            let members = list_members(&nodes.server, CLUSTER).await;
            let logs: Vec<String> = members
                .iter()
                .map(|m| {
                    let log = nodes.dir_of(m).join(format!("members/{}/stderr.log", m.metadata.name));
                    let text = std::fs::read_to_string(log).unwrap_or_default();
                    let said: Vec<&str> =
                        text.lines().filter(|l| !l.starts_with("20") && !l.starts_with(char::is_whitespace)).collect();
                    let last: Vec<&str> = text.lines().rev().take(8).collect();
                    format!("{}:\n{}\n...\n{}", m.metadata.name, said.join("\n"), last.join("\n"))
                })
                .collect();
            panic!(
                "not {what} within {BACK_IN_SYNC:?}:\n{}\nthe primary's standbys: {standbys:?}\n{}",
                String::from_utf8_lossy(&described.stdout),
                logs.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cut_off_primary_stops_taking_writes_before_another_takes_any() {
    require(&["psql", "pg_isready", "/usr/lib/postgresql/15/bin/postgres"]);
    let _turn = common::take_turn().await;
    let nodes = common::apps::nodes_with_n1_apart(3).await;
    let server = &nodes.server;
    // Asynchronous: the cut-off primary could acknowledge writes alone,
    // until it is fenced. Its first member leads, on n1 (the others
    // cordoned until it does).
    for node in ["n2", "n3"] {
        common::apps::cordon(server, node, true).await;
    }
    apply_example(&nodes, 1, |app| {
        app["spec"]["roles"][0]["leader"]["synchronous"] = false.into();
        app["spec"]["roles"][0]["run"]["env"]["SYNCHRONOUS"] = "off".into();
    })
    .await;
    configured(server, CLUSTER, 1, Duration::from_secs(60)).await;
    let netns = nodes.netns.as_ref().expect("n1 apart");
    // n1's members at its address inside, the others' at the outside one.
    let host_of =
        |m: &Member| if m.spec.node.as_deref() == Some("n1") { netns.inside() } else { netns.outside.clone() };
    let (primary, _) = writable_leader_at(&nodes, 0, Duration::from_secs(60), &host_of).await;
    assert_eq!(primary.spec.node.as_deref(), Some("n1"));
    psql_at(&netns.inside(), &primary, "create table probe (v bigint primary key)").unwrap();
    for node in ["n2", "n3"] {
        common::apps::cordon(server, node, false).await;
    }
    let mut cluster = server.admin().get::<AppClusterSpec>(CLUSTER).await.unwrap();
    cluster.spec.roles[0].members = 3;
    server.admin().update(&cluster).await.unwrap();
    let members = configured(server, CLUSTER, 3, Duration::from_secs(120)).await;

    // A write every 10 ms on each side: to n1's member from inside its
    // namespace, to the two others from here.
    let probes = probe::Probes::start(&targets(&nodes, &members).await, Default::default());
    let index = |name: &str| members.iter().position(|m| m.metadata.name == name).unwrap();
    // Cut once the primary has acknowledged writes: a loaded machine can
    // take over a second to begin.
    eventually(Duration::from_secs(30), "the primary taking the probe's writes", || async {
        (!probes.timelines()[index(&primary.metadata.name)].is_empty()).then_some(())
    })
    .await;
    netns.cut();
    let cut = probe::now_ns();
    let (second, term) = writable_leader_at(&nodes, 1, Duration::from_secs(40), &host_of).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let timelines = probes.timelines();
    let old = &timelines[index(&primary.metadata.name)];
    let new = &timelines[index(&second.metadata.name)];
    let last_old = old.iter().map(|a| a.at).max().expect("the old primary took writes");
    let first_new = new.iter().map(|a| a.at).filter(|at| *at > cut).min().expect("the new primary takes writes");
    let ms = |ns: u128| ns.saturating_sub(cut) / 1_000_000;
    eprintln!(
        "cut off: the old primary's last acknowledged write {} ms after the cut, the new one's ({} in term {term}) first {} ms",
        ms(last_old),
        second.metadata.name,
        ms(first_new)
    );
    assert!(last_old < first_new, "never two primaries taking writes at once");
    assert_eq!(probe::two_writable(&timelines), [], "never two primaries taking writes at once");
    // Its agent fences it at the renew deadline (7 s after the report the
    // last renewal answered); its guard, at the latest, halfway to the
    // lease's end (8.5 s), when a loaded machine makes the demote slow.
    assert!(ms(last_old) < 9_000, "fenced before its guard's deadline: {} ms", ms(last_old));
    netns.heal();
}
