//! Drains (seed 004, issue 13) on real agents and members, through the
//! CLI: `herd node drain` marks the node drained and moves its members
//! away under their budgets, one at a time as the budget allows, and
//! follows the Operation to its end; a budget that can never allow an
//! eviction is reported within seconds; a deadline with `--on-deadline
//! fail` ends the Operation Failed naming the blocker; cancel stops it;
//! `herd node undrain` makes the node take members again.

mod common;

use std::time::{Duration, Instant};

use common::apps::{configured, instance, nodes};
use common::budgets::{apply_web, budget_yaml, counted, herd};
use common::eventually;
use herd_core::kinds::{NodeRole, NodeSpec, OperationPhase, OperationSpec, StepState};

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs the CLI off the test's runtime (a followed drain takes a while).
async fn herd_blocking(server: &common::TestServer, args: &[&str]) -> std::process::Output {
    let url = server.url.clone();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        common::herd().args(["--server", &url, "--token", common::ADMIN_TOKEN]).args(&args).output().unwrap()
    })
    .await
    .unwrap()
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
    apply_web(&nodes, "web", 6, &budget_yaml("web-one", "herd.io/cluster=web", "maxUnavailable: 1"));
    let before = configured(server, "web", 6, Duration::from_secs(90)).await;
    counted(server, "web-one", 6, 1).await;
    let node = before[0].spec.node.clone().unwrap();
    let on_node: Vec<String> =
        before.iter().filter(|m| m.spec.node.as_deref() == Some(&node)).map(|m| m.metadata.name.clone()).collect();

    let dry = herd(server, &["node", "drain", &node, "--dry-run"]);
    assert!(dry.status.success(), "{}", stderr(&dry));
    assert!(stdout(&dry).contains(&format!("{}: allowed", on_node[0])), "{}", stdout(&dry));
    assert!(server.admin().list::<OperationSpec>("").await.unwrap().is_empty(), "a dry run creates nothing");

    let out = herd_blocking(server, &["node", "drain", &node]).await;
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    assert!(
        stdout(&out).contains(&format!("succeeded: node {node} drained: {} members moved", on_node.len())),
        "{}",
        stdout(&out)
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

    let table = stdout(&herd(server, &["get", "operations"]));
    assert!(table.contains(&format!("Drain {node}")) && table.contains("Succeeded"), "{table}");
    let described = stdout(&herd(server, &["describe", "operation", &operation.metadata.name]));
    assert!(described.contains(&format!("step {}: Done", on_node[0])), "{described}");

    let out = herd(server, &["node", "undrain", &node]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Regular, or promoted again at once by the pool keeper (pool size 10).
    let role = server.admin().get::<NodeSpec>(&node).await.unwrap().spec.role;
    assert!(matches!(role, NodeRole::Regular | NodeRole::Candidate), "{role:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_blocked_drain_says_why_within_seconds_fails_at_its_deadline_and_can_be_cancelled() {
    let nodes = nodes(3).await;
    let server = &nodes.server;
    apply_web(&nodes, "web", 3, &budget_yaml("web-all", "herd.io/cluster=web", "minAvailable: 3"));
    let before = configured(server, "web", 3, Duration::from_secs(90)).await;
    counted(server, "web-all", 3, 0).await;
    let node = before[0].spec.node.clone().unwrap();

    // A deadline with --on-deadline fail: Failed at the deadline, naming
    // the budget that blocks.
    let started = Instant::now();
    let out = herd_blocking(server, &["node", "drain", &node, "--deadline", "4s", "--on-deadline", "fail"]).await;
    assert_eq!(out.status.code(), Some(1), "{}\n{}", stdout(&out), stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("failed: the deadline (4s) passed with"), "{said}");
    assert!(said.contains("budget web-all can never allow an eviction: minAvailable 3"), "{said}");
    assert!(started.elapsed() < Duration::from_secs(20), "ended at its deadline: {:?}", started.elapsed());

    // Without a deadline: the budget that never allows is the blocker
    // within seconds, and the Operation waits (the budget may change).
    let out = herd(server, &["node", "drain", &node, "--detach"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let name = operation_name(&out);
    let asked = Instant::now();
    let blocked = eventually(Duration::from_secs(10), "the drain blocked by a budget that never allows", || async {
        let op = server.admin().get::<OperationSpec>(&name).await.ok()?;
        op.status.blocker.clone().filter(|b| b.never).map(|b| (op, b))
    })
    .await;
    assert!(asked.elapsed() < Duration::from_secs(10));
    assert!(blocked.1.message.contains("budget web-all can never allow an eviction"), "{:?}", blocked.1);
    assert_eq!(blocked.0.status.phase, OperationPhase::Running);
    let described = stdout(&herd(server, &["describe", "operation", &name]));
    assert!(described.contains("blocked (it never will as it stands): cannot evict member"), "{described}");
    assert!(described.contains("budget web-all can never allow an eviction"), "{described}");

    // A second drain of the same node is refused while this one runs.
    let again = herd(server, &["node", "drain", &node, "--detach"]);
    assert_eq!(again.status.code(), Some(4), "{}", stderr(&again));
    assert!(stderr(&again).contains(&format!("is being drained by operation {name} already")), "{}", stderr(&again));

    let out = herd(server, &["operation", "cancel", &name]);
    assert!(out.status.success(), "{}", stderr(&out));
    let cancelled = eventually(Duration::from_secs(10), "the drain cancelled", || async {
        let op = server.admin().get::<OperationSpec>(&name).await.ok()?;
        (op.status.phase == OperationPhase::Cancelled).then_some(op)
    })
    .await;
    assert!(cancelled.status.message.unwrap().contains("stays drained"));
    let after = configured(server, "web", 3, Duration::from_secs(30)).await;
    for (a, b) in after.iter().zip(&before) {
        assert_eq!(instance(a), instance(b), "nothing was evicted");
    }
}
