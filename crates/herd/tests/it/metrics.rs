//! `/metrics` after app-cluster work: `promtool check metrics`
//! finds nothing to complain about, and the latency histograms (API
//! requests, store commits, reconcile passes, Commands) have counted what
//! the server did.

use crate::common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::apps::{configured, kill9, nodes, pid_of};
use common::budgets::apply_web;

const PROMTOOL: &str = "promtool";

/// Whether promtool is installed; in CI (`CI` set) its absence fails.
fn promtool_available() -> bool {
    let found = Command::new("sh").args(["-c", "command -v promtool"]).output().unwrap().status.success();
    if !found {
        assert!(std::env::var_os("CI").is_none(), "promtool is missing: .ci/run installs Debian's prometheus");
        eprintln!("!!! SKIPPED: promtool is not installed (apt-get install prometheus); this test did not run");
    }
    found
}

/// The value of the sample `name{labels}` (labels as written, in order).
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(flavor = "multi_thread")]
async fn promtool_passes_metrics_of_a_server_that_ran_app_clusters() {
    if !promtool_available() {
        return;
    }
    let nodes = nodes(2).await;
    let server = &nodes.server;
    apply_web(server, nodes.dir.path(), "web", 3, "");
    let members = configured(server, "web", 3, Duration::from_secs(60)).await;
    kill9(pid_of(server, &members[0]).await);
    tokio::time::sleep(Duration::from_secs(1)).await;
    configured(server, "web", 3, Duration::from_secs(60)).await;

    let metrics = server.admin().get_text("/metrics").await.unwrap();
    let mut promtool = Command::new(PROMTOOL)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    promtool.stdin.take().unwrap().write_all(metrics.as_bytes()).unwrap();
    let checked = promtool.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&checked.stdout), String::from_utf8_lossy(&checked.stderr));
    assert!(checked.status.success() && said.trim().is_empty(), "promtool check metrics: {said}\n{metrics}");

    let count = |series: &str| sample(&metrics, series).unwrap_or_else(|| panic!("no {series} in\n{metrics}"));
    assert!(count("herd_http_request_duration_seconds_count{method=\"GET\",route=\"/api/v1/members\"}") >= 1.0);
    assert!(count("herd_store_commit_duration_seconds_count") >= 10.0);
    assert!(count("herd_reconcile_duration_seconds_count{controller=\"app-clusters\",outcome=\"ok\"}") >= 1.0);
    let started = count("herd_command_duration_seconds_count{action=\"StartMember\",state=\"Completed\"}");
    assert!(started >= 3.0, "three members started: {started}");
    let sum = count("herd_command_duration_seconds_sum{action=\"StartMember\",state=\"Completed\"}");
    assert!(sum > 0.0 && sum < 600.0, "{sum}");
    assert!(count("herd_store_commits_total{backend=\"sqlite\"}") >= 10.0);
    assert_eq!(count("herd_nodes{ready=\"true\"}"), 2.0);
    assert!(count("herd_node_allocatable_memory_bytes{node=\"n1\"}") > 0.0);
    assert!(count("herd_node_allocatable_cpu_cores{node=\"n2\"}") > 0.0);

    // What members use, where the host gives the agents cgroups.
    let n1 = server.admin().get::<herd_core::kinds::NodeSpec>("n1").await.unwrap();
    let isolation = n1.status.condition(herd_core::node_health::RESOURCE_ISOLATION).cloned().unwrap();
    if isolation.reason == "NoCgroups" {
        assert!(std::env::var_os("CI").is_none(), "CI's host must give the agent cgroups: {}", isolation.message);
        eprintln!("!!! SKIPPED: no cgroups here ({}); members' usage was not checked", isolation.message);
        return;
    }
    common::eventually(Duration::from_secs(30), "members' usage in /metrics", || async {
        let metrics = server.admin().get_text("/metrics").await.ok()?;
        let used = |name: &str| metrics.lines().filter(|l| l.starts_with(name)).count();
        (used("herd_member_memory_working_set_bytes{") == 3 && used("herd_member_cpu_cores{") == 3).then_some(())
    })
    .await;
}
