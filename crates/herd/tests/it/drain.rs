//! Drains on real agents and members, through the
//! CLI: `herd node drain` marks the node drained and moves its members
//! away under their budgets, one at a time as the budget allows, and
//! follows the Operation to its end; a budget that can never allow an
//! eviction is reported within seconds; a deadline with `--on-deadline
//! fail` ends the Operation Failed naming the blocker; cancel stops it;
//! `herd node undrain` makes the node take members again.

use crate::common;

use std::time::{Duration, Instant};

use common::apps::{configured, instance, nodes};
use common::budgets::{apply_web, budget_yaml, counted};
use common::eventually;
use herd_core::kinds::{EventReason, NodeRole, NodeSpec, OperationPhase, OperationSpec, StepState};

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The name of the Operation `herd node drain` created, from its output.
fn operation_name(out: &std::process::Output) -> String {
    let text = stdout(out);
    let line = text.lines().find(|l| l.starts_with("operation/")).unwrap_or_else(|| panic!("{text}"));
    line.trim_start_matches("operation/").split([':', ' ']).next().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_drain_moves_every_member_off_the_node_under_its_budget() {
    let nodes = nodes(3).await;
    let server = &nodes.server;
    apply_web(server, nodes.dir.path(), "web", 6, &budget_yaml("web-one", "herd.io/cluster=web", "maxUnavailable: 1"));
    let before = configured(server, "web", 6, Duration::from_secs(90)).await;
    counted(server, "web-one", 6, 1).await;
    let node = before[0].spec.node.clone().unwrap();

    let dry = server.cli(&["node", "drain", &node, "--dry-run"]);
    assert!(dry.status.success(), "{}", stderr(&dry));
    assert!(stdout(&dry).contains(&format!("{}: allowed", before[0].metadata.name)), "{}", stdout(&dry));
    assert!(server.admin().list::<OperationSpec>("").await.unwrap().is_empty(), "a dry run creates nothing");

    // What the node holds as the drain starts.
    let at_start = common::apps::list_members(server, "web").await;
    let on_node: Vec<String> =
        at_start.iter().filter(|m| m.spec.node.as_deref() == Some(&node)).map(|m| m.metadata.name.clone()).collect();
    let out = server.cli_blocking(&["node", "drain", &node]).await;
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    let placed: Vec<(String, Option<String>)> =
        at_start.iter().map(|m| (m.metadata.name.clone(), m.spec.node.clone())).collect();
    assert!(
        stdout(&out).contains(&format!("succeeded: node {node} drained: {} members moved", on_node.len())),
        "{}\n{}\nat the start: {placed:?}",
        stdout(&out),
        stderr(&out)
    );
    assert!(stderr(&out).contains("evicted:"), "each step is told as it happens: {}", stderr(&out));

    let after = configured(server, "web", 6, Duration::from_secs(60)).await;
    for member in &after {
        assert_ne!(member.spec.node.as_deref(), Some(node.as_str()), "{} is still on {node}", member.metadata.name);
        let old = before.iter().find(|m| m.metadata.name == member.metadata.name).unwrap();
        let moved = on_node.contains(&member.metadata.name);
        assert_eq!(instance(member) != instance(old), moved, "only the drained node's members were moved");
    }
    let drained = server.admin().get::<NodeSpec>(&node).await.unwrap();
    assert_eq!(drained.spec.role, NodeRole::Drained);
    let operation = &server.admin().list::<OperationSpec>("").await.unwrap()[0];
    assert_eq!(operation.status.phase, OperationPhase::Succeeded);
    assert!(operation.status.steps.iter().all(|s| s.state == StepState::Done && s.attempts >= 1));
    let evictions = operation.status.history.iter().filter(|h| h.message.contains(" evicted: ")).count();
    assert_eq!(evictions, on_node.len(), "each member evicted once: {:?}", operation.status.history);

    let table = stdout(&server.cli(&["get", "operations"]));
    assert!(table.contains(&format!("Drain {node}")) && table.contains("Succeeded"), "{table}");
    let described = stdout(&server.cli(&["describe", "operation", &operation.metadata.name]));
    assert!(described.contains(&format!("step {}: Done", on_node[0])), "{described}");
    // The old instances left on the node were removed as expected, not
    // warned of as strays.
    let events = server.admin().list::<herd_core::kinds::EventSpec>("").await.unwrap();
    let warned: Vec<&str> =
        events.iter().filter(|e| e.spec.reason_is(EventReason::StrayMember)).map(|e| e.spec.message.as_str()).collect();
    assert!(warned.is_empty(), "{warned:?}");

    let out = server.cli(&["node", "undrain", &node]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Regular, or promoted again at once by the pool keeper (pool size 10).
    let role = server.admin().get::<NodeSpec>(&node).await.unwrap().spec.role;
    assert!(matches!(role, NodeRole::Regular | NodeRole::Candidate), "{role:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_blocked_drain_says_why_within_seconds_fails_at_its_deadline_and_can_be_cancelled() {
    let nodes = nodes(3).await;
    let server = &nodes.server;
    apply_web(server, nodes.dir.path(), "web", 3, &budget_yaml("web-all", "herd.io/cluster=web", "minAvailable: 3"));
    let before = configured(server, "web", 3, Duration::from_secs(90)).await;
    counted(server, "web-all", 3, 0).await;
    let node = before[0].spec.node.clone().unwrap();

    // A deadline with --on-deadline fail: Failed at the deadline, naming
    // the budget that blocks.
    let started = Instant::now();
    let out = server.cli_blocking(&["node", "drain", &node, "--deadline", "4s", "--on-deadline", "fail"]).await;
    assert_eq!(out.status.code(), Some(1), "{}\n{}", stdout(&out), stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("failed: the deadline (4s) passed with"), "{said}");
    assert!(said.contains("budget web-all can never allow an eviction: minAvailable 3"), "{said}");
    assert!(started.elapsed() < Duration::from_secs(20), "ended at its deadline: {:?}", started.elapsed());

    // Without a deadline: the budget that never allows is the blocker
    // within seconds, and the Operation waits (the budget may change).
    // The CLI following it detaches on Ctrl-C; the drain goes on.
    let mut following = common::herd()
        .args(["--server", &server.url, "--token", common::ADMIN_TOKEN, "node", "drain", &node])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(following.stdout.as_mut().unwrap()), &mut first).unwrap();
    let name = first.trim_start_matches("operation/").split(' ').next().unwrap().trim().to_string();
    let asked = Instant::now();
    let blocked = eventually(Duration::from_secs(10), "the drain blocked by a budget that never allows", || async {
        let op = server.admin().get::<OperationSpec>(&name).await.ok()?;
        op.status.blocker.clone().filter(|b| b.never).map(|b| (op, b))
    })
    .await;
    assert!(asked.elapsed() < Duration::from_secs(10));
    assert!(blocked.1.message.contains("budget web-all can never allow an eviction"), "{:?}", blocked.1);
    assert_eq!(blocked.0.status.phase, OperationPhase::Running);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let _ = std::process::Command::new("kill").args(["-INT", &following.id().to_string()]).status();
    let followed = following.wait_with_output().unwrap();
    assert!(followed.status.success(), "{}", String::from_utf8_lossy(&followed.stderr));
    assert!(stdout(&followed).contains(&format!("detached; operation/{name} goes on")), "{}", stdout(&followed));
    assert!(stderr(&followed).contains("refused: cannot evict member"), "steps are told: {}", stderr(&followed));
    let op = server.admin().get::<OperationSpec>(&name).await.unwrap();
    assert_eq!(op.status.phase, OperationPhase::Running, "Ctrl-C does not cancel it");
    let described = stdout(&server.cli(&["describe", "operation", &name]));
    assert!(described.contains("blocked (it never will as it stands): cannot evict member"), "{described}");
    assert!(described.contains("budget web-all can never allow an eviction"), "{described}");

    // A second drain of the same node is refused while this one runs.
    let again = server.cli(&["node", "drain", &node, "--detach"]);
    assert_eq!(again.status.code(), Some(4), "{}", stderr(&again));
    assert!(stderr(&again).contains(&format!("is being drained by operation {name} already")), "{}", stderr(&again));

    let out = server.cli(&["operation", "cancel", &name]);
    assert!(out.status.success(), "{}", stderr(&out));
    let cancelled = eventually(Duration::from_secs(10), "the drain cancelled", || async {
        let op = server.admin().get::<OperationSpec>(&name).await.ok()?;
        (op.status.phase == OperationPhase::Cancelled).then_some(op)
    })
    .await;
    assert!(cancelled.status.message.unwrap().contains("stays drained"));
    // It ended: cancelling it again is a conflict, said so, not a success.
    let again = server.cli(&["operation", "cancel", &name]);
    assert_eq!(again.status.code(), Some(4), "{}", stderr(&again));
    assert!(stderr(&again).contains("has ended already (cancelled): nothing to cancel"), "{}", stderr(&again));
    let after = configured(server, "web", 3, Duration::from_secs(30)).await;
    for (a, b) in after.iter().zip(&before) {
        assert_eq!(instance(a), instance(b), "nothing was evicted");
    }
}

/// A leader failover in the middle of a drain: two replicas on
/// PostgreSQL, a drain of a node
/// with 6 members under maxUnavailable 1, and the leading replica killed
/// (kill -9) in the middle of it. The other replica takes the lease and
/// finishes the drain from the Operation's status; afterwards the store's
/// history of the members shows each evicted exactly once and never more
/// than one of the six not ready at a time.
#[tokio::test(flavor = "multi_thread")]
async fn a_drain_goes_on_under_the_next_leader_and_evicts_no_member_twice_on_postgres() {
    const SHORT: [&str; 6] = ["--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "500ms"];
    let Some(schema) = common::PostgresSchema::create() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut replicas: Vec<common::TestServer> = ["s1", "s2"]
        .iter()
        .map(|id| common::TestServer::start_replica(&dir.path().join(id), id, Some(&schema.url), &SHORT))
        .collect();
    let servers = format!("{},{}", replicas[0].url, replicas[1].url);
    common::cluster::quick_heartbeats(&replicas[0]).await;
    common::apps::own_member_ports(&replicas[0]).await;
    let node_dirs: Vec<_> = (1..=3).map(|i| dir.path().join(format!("n{i}"))).collect();
    let _reapers: Vec<_> = node_dirs.iter().map(|d| common::MemberReaper(d.clone())).collect();
    let _agents: Vec<_> =
        node_dirs.iter().enumerate().map(|(i, d)| common::start_agent(&servers, d, &format!("n{}", i + 1))).collect();
    let admin = replicas[0].admin();
    // Ready, and master candidates (the pool takes each in once it is
    // Ready; a node drained before that would leave the pool short).
    for node in ["n1", "n2", "n3"] {
        eventually(Duration::from_secs(20), "every node Ready and a master candidate", || async {
            admin.get::<NodeSpec>(node).await.ok().filter(|n| n.status.ready && n.spec.role == NodeRole::Candidate)
        })
        .await;
    }
    // All six on n1: the other nodes are cordoned while they are placed.
    for node in ["n2", "n3"] {
        let out = replicas[0].cli(&["node", "modify", node, "--role", "drained"]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    apply_web(&replicas[0], dir.path(), "web", 6, &budget_yaml("web-one", "herd.io/cluster=web", "maxUnavailable: 1"));
    let before = configured(&replicas[0], "web", 6, Duration::from_secs(90)).await;
    assert!(before.iter().all(|m| m.spec.node.as_deref() == Some("n1")));
    for node in ["n2", "n3"] {
        assert!(replicas[0].cli(&["node", "undrain", node]).status.success());
    }
    counted(&replicas[0], "web-one", 6, 1).await;
    let start = admin.list_values("members", "").await.unwrap().metadata.resource_version;

    let out = replicas[0].cli(&["node", "drain", "n1", "--detach"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let name = operation_name(&out);
    eventually(Duration::from_secs(60), "two members moved", || async {
        let op = admin.get::<OperationSpec>(&name).await.ok()?;
        (op.status.done >= 2).then_some(())
    })
    .await;
    let leader = admin.get::<herd_core::kinds::LeaseSpec>("herd-leader").await.unwrap().spec.holder_identity;
    let (dead, alive) = if leader == "s1" { (0, 1) } else { (1, 0) };
    replicas[dead].proc.kill9();
    let survivor = &replicas[alive];
    let done = eventually(Duration::from_secs(120), "the drain finished under the next leader", || async {
        let op = survivor.admin().get::<OperationSpec>(&name).await.ok()?;
        op.status.phase.is_finished().then_some(op)
    })
    .await;
    assert_eq!(done.status.phase, OperationPhase::Succeeded, "{:?}", done.status);
    let after = configured(survivor, "web", 6, Duration::from_secs(60)).await;
    assert!(after.iter().all(|m| m.spec.node.as_deref() != Some("n1")), "n1 is empty");

    // The store's history of the members, from before the drain to now.
    let mut watch = survivor.admin().watch("members", Some(&start), "herd.io/cluster=web").await.unwrap();
    let mut ready: std::collections::BTreeMap<String, bool> =
        before.iter().map(|m| (m.metadata.name.clone(), true)).collect();
    let mut asked: std::collections::BTreeMap<String, bool> = Default::default();
    let mut evictions: std::collections::BTreeMap<String, u32> = Default::default();
    let mut fewest_ready = 6;
    // Everything up to now comes at once; a quiet moment means all of it came.
    while let Ok(event) = tokio::time::timeout(Duration::from_secs(3), watch.next()).await {
        let event = event.unwrap().unwrap();
        let member: herd_core::kinds::Member = herd_core::Object::from_json_value(event.object).unwrap();
        let name = member.metadata.name.clone();
        let now_asked = member.spec.requests.replace.is_some();
        if now_asked && !asked.get(&name).copied().unwrap_or(false) {
            *evictions.entry(name.clone()).or_default() += 1;
        }
        asked.insert(name.clone(), now_asked);
        ready.insert(name, member.status.ready);
        fewest_ready = fewest_ready.min(ready.values().filter(|r| **r).count());
    }
    assert_eq!(evictions.len(), 6, "every member evicted: {evictions:?}");
    assert!(evictions.values().all(|n| *n == 1), "no member evicted twice: {evictions:?}");
    assert!(fewest_ready >= 5, "the budget held: at least 5 of 6 ready at every revision, saw {fewest_ready}");
}

/// A rolling restart whose canary does not come back (its setup fails
/// once the marker file exists) stops there: the Operation fails naming
/// it, and no other member was restarted. The role's drain hook ran once,
/// for the canary, before it was stopped. A role that does not exist is
/// refused naming the field.
#[tokio::test(flavor = "multi_thread")]
async fn a_rolling_restart_stops_at_a_broken_canary() {
    let nodes = nodes(3).await;
    let server = &nodes.server;
    let marker = nodes.dir.path().join("broken");
    let drained = nodes.dir.path().join("drained");
    let manifest = nodes.dir.path().join("web.yaml");
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: herd/v1\nkind: App\nmetadata: {{name: web}}\nspec:\n  roles:\n  - name: w\n    run:\n      command: [sleep, '600']\n      drain: {{script: 'echo \"$HERD_MEMBER $1\" >> {}', timeout: 5s}}\n    setup: {{script: '[ ! -e {} ]'}}\n\
             ---\napiVersion: herd/v1\nkind: AppCluster\nmetadata: {{name: web}}\nspec:\n  appRef: web\n  roles: [{{name: w, members: 3}}]\n{}",
            drained.display(),
            marker.display(),
            budget_yaml("web-one", "herd.io/cluster=web", "maxUnavailable: 1")
        ),
    )
    .unwrap();
    assert!(server.cli(&["apply", "-f", manifest.to_str().unwrap()]).status.success());
    let before = configured(server, "web", 3, Duration::from_secs(90)).await;
    counted(server, "web-one", 3, 1).await;

    let out = server.cli(&["appcluster", "restart", "web", "--role", "nope"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("spec.action.role: AppCluster web has no role \"nope\" (its roles: w)"),
        "{}",
        stderr(&out)
    );

    std::fs::write(&marker, b"").unwrap();
    let out = server.cli_blocking(&["appcluster", "restart", "web", "--role", "w", "--canary", "1"]).await;
    assert_eq!(out.status.code(), Some(1), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stderr(&out).contains("web-w-0 did not come back configured after its restart"), "{}", stderr(&out));
    let hooked = std::fs::read_to_string(&drained).unwrap_or_default();
    assert_eq!(hooked, "web-w-0 --drain\n", "the drain hook ran for the canary only, before its stop");
    let after = common::apps::list_members(server, "web").await;
    for (a, b) in after.iter().zip(&before) {
        if a.metadata.name == "web-w-0" {
            assert_eq!(a.status.state, herd_core::kinds::MemberState::ConfigError);
        } else {
            assert_eq!(instance(a), instance(b), "{} was not restarted", a.metadata.name);
        }
    }
}

/// A finished Operation is kept a day (`operation::FINISHED_KEPT`), then
/// the leader deletes it: finished drains do not pile up in the store and
/// the candidates' configuration copies. One whose finishedAt is set two
/// days back goes; one that finished now stays.
#[tokio::test(flavor = "multi_thread")]
async fn a_finished_operation_is_deleted_a_day_after_it_finished() {
    let nodes = nodes(2).await;
    let server = &nodes.server;
    let admin = server.admin();
    let mut names = Vec::new();
    for node in ["n1", "n2"] {
        let out = server.cli_blocking(&["node", "drain", node]).await;
        assert!(out.status.success(), "{}", stderr(&out));
        names.push(operation_name(&out));
    }
    let mut old = admin.get::<OperationSpec>(&names[0]).await.unwrap();
    assert_eq!(old.status.phase, OperationPhase::Succeeded);
    let two_days = std::time::SystemTime::now() - Duration::from_secs(2 * 24 * 3600);
    old.status.finished_at = Some(herd_core::Timestamp::from_system_time(two_days));
    admin.update_status(&old).await.unwrap();
    eventually(Duration::from_secs(30), "the old Operation deleted", || async {
        admin.get::<OperationSpec>(&names[0]).await.is_err().then_some(())
    })
    .await;
    let kept = admin.get::<OperationSpec>(&names[1]).await.unwrap();
    assert_eq!(kept.status.phase, OperationPhase::Succeeded, "finished now: kept");
}
