//! Upgrades end to end on real agents: a cluster taken from one revision
//! of its App to another by `herd appcluster upgrade`, member by member
//! under its budget; a revision whose setup fails stops at its canary and
//! is reverted there alone; an irreversible revision is never taken back;
//! an upgrade goes on where it was under the next leader when the leading
//! server replica is killed; a cluster
//! under `updatePolicy: Rolling` upgrades itself; and a five-member etcd
//! serves linearizable reads all through its upgrade.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::apps::{Nodes, configured, example, instance, list_members, nodes, nodes_with_a_standby, require};
use common::{TestServer, eventually};
use herd_core::HumanDuration;
use herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME;
use herd_core::kinds::{AppClusterSpec, ClusterConfigSpec, Member, OperationPhase, OperationSpec};

/// The App `up`: one role of members that sleep, set up by `setup`, one
/// of them leading (its hooks do nothing).
fn app(setup: &str, irreversible: Option<&str>) -> serde_json::Value {
    let hook = serde_json::json!({"script": "true"});
    let mut app = serde_json::json!({
        "metadata": {"name": "up"},
        "spec": {"roles": [{
            "name": "r", "run": {"command": ["sleep", "600"]}, "setup": {"script": setup},
            "leader": {"promote": hook, "demote": hook}
        }]}
    });
    if let Some(why) = irreversible {
        app["spec"]["upgrade"] = serde_json::json!({"irreversible": why});
    }
    app
}

/// Writes App `up` as `app` says (a new revision when it exists).
async fn apply_app(server: &TestServer, app: serde_json::Value) {
    let admin = server.admin();
    match admin.get_value("apps", "up").await {
        Ok(old) => {
            let mut app = app;
            app["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
            admin.replace_value("apps", "up", &app, Default::default()).await.unwrap();
        }
        Err(_) => drop(admin.create_value("apps", &app, Default::default()).await.unwrap()),
    }
}

/// `herd appcluster upgrade <args>`, followed to its end.
async fn upgrade(server: &TestServer, args: &str) -> std::process::Output {
    let args: Vec<&str> = ["appcluster", "upgrade"].into_iter().chain(args.split(' ')).collect();
    server.cli_blocking(&args).await
}

fn said(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// (member, the revision it runs, the one it is to run, its instance).
fn revisions(members: &[Member]) -> Vec<(String, Option<i64>, Option<i64>, String)> {
    let mut all: Vec<_> = members
        .iter()
        .map(|m| (m.metadata.name.clone(), m.status.app_revision, m.spec.app_revision, instance(m)))
        .collect();
    all.sort();
    all
}

const SETUP_OK: &str = "exit 0";
const SETUP_FAILS: &str = "case \"$1\" in --configure) echo 'revision 2 cannot start' >&2; exit 3 ;; esac";

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_canary_is_reverted_alone_an_irreversible_revision_stays_and_an_upgrade_outlives_its_leader() {
    let mut nodes: Nodes = nodes_with_a_standby(2).await;
    // A lease of 4 s: the standby takes over soon after the leader is gone.
    let admin = nodes.server.admin();
    let mut config = admin.get::<ClusterConfigSpec>(CLUSTER_CONFIG_NAME).await.unwrap();
    config.spec.leader_election.lease_duration = HumanDuration::from_secs(4);
    config.spec.leader_election.renew_deadline = HumanDuration::from_secs(3);
    config.spec.leader_election.retry_period = HumanDuration(Duration::from_millis(500));
    admin.update(&config).await.unwrap();
    apply_app(&nodes.server, app(SETUP_OK, None)).await;
    let cluster = serde_json::json!({
        "metadata": {"name": "u"},
        "spec": {"appRef": "up", "roles": [{"name": "r", "members": 3}]}
    });
    nodes.server.admin().create_value("appclusters", &cluster, Default::default()).await.unwrap();
    let before = revisions(&configured(&nodes.server, "u", 3, Duration::from_secs(60)).await);
    assert!(before.iter().all(|(_, runs, to_run, _)| *runs == Some(1) && *to_run == Some(1)), "{before:?}");

    // Bad input: a revision the App does not keep, as an upgrade or a pin.
    let out = nodes.server.cli(&["appcluster", "upgrade", "u", "--to-revision", "9"]);
    assert!(!out.status.success() && said(&out).contains("spec.action.toRevision"), "{}", said(&out));
    assert!(said(&out).contains("App up has no revision 9 (it keeps 1"), "{}", said(&out));
    let pin = serde_json::json!({"spec": {"appRevision": 9}});
    let refused = nodes.server.admin().patch_value("appclusters", "u", &pin).await.unwrap_err().to_string();
    assert!(refused.contains("spec.appRevision") && refused.contains("no revision 9"), "{refused}");

    // Revision 2's setup fails: its canary stops the upgrade and alone is
    // returned to revision 1; the others are never touched.
    apply_app(&nodes.server, app(SETUP_FAILS, None)).await;
    let out = upgrade(&nodes.server, "u --to-revision 2 --canary 1 --min-healthy-time 1s").await;
    let text = said(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("reverted") && text.contains("did not come back configured as revision 2"), "{text}");
    assert!(text.contains("revision 2 cannot start"), "the setup's own words: {text}");
    let after = revisions(&configured(&nodes.server, "u", 3, Duration::from_secs(60)).await);
    let changed: Vec<&str> = before.iter().zip(&after).filter(|(b, a)| b.3 != a.3).map(|(b, _)| b.0.as_str()).collect();
    assert_eq!(changed.len(), 1, "only the canary restarted (twice): {after:?}");
    assert!(after.iter().all(|(_, runs, to_run, _)| *runs == Some(1) && *to_run == Some(1)), "{after:?}");
    let pinned = nodes.server.admin().get::<AppClusterSpec>("u").await.unwrap().spec.app_revision;
    assert_eq!(pinned, Some(1), "pinned back: new members start as revision 1, nothing restarts it by itself");

    // Revision 3 migrates its data in a hook: upgraded to, it is never
    // taken back.
    let mut migrating = app(SETUP_OK, Some("it migrates the data"));
    let migrate = "echo \"migrating from $HERD_FROM_REVISION to $HERD_TO_REVISION\"";
    migrating["spec"]["upgrade"]["preUpgrade"] = serde_json::json!({"script": migrate});
    apply_app(&nodes.server, migrating).await;
    let out = upgrade(&nodes.server, "u --to-revision 3 --max-parallel 3 --min-healthy-time 1s").await;
    assert!(out.status.success(), "{}", said(&out));
    let at_3 = revisions(&list_members(&nodes.server, "u").await);
    assert!(at_3.iter().all(|(_, runs, _, _)| *runs == Some(3)), "{at_3:?}");
    for (member, ..) in &at_3 {
        let logs = said(&nodes.server.cli(&["logs", &format!("member/{member}"), "--setup"]));
        assert!(logs.contains("herd: preUpgrade (revision 1 to 3)"), "{member}: {logs}");
        assert!(logs.contains("migrating from 1 to 3"), "the hook's output in the setup's logs: {logs}");
    }
    let out = nodes.server.cli(&["appcluster", "upgrade", "u", "--to-revision", "1"]);
    let text = said(&out);
    assert!(!out.status.success() && text.contains("spec.action.toRevision"), "{text}");
    assert!(text.contains("irreversible (it migrates the data)"), "{text}");

    // Revision 4: paused at once, a second upgrade is refused naming the
    // first; resumed, it outlives a kill -9 of the server.
    apply_app(&nodes.server, app("exit 0 # revision 4", None)).await;
    let args = ["appcluster", "upgrade", "u", "--to-revision", "4", "--min-healthy-time", "2s", "--detach"];
    let out = nodes.server.cli(&args);
    assert!(out.status.success(), "{}", said(&out));
    let name = said(&out).split_whitespace().next().unwrap().trim_start_matches("operation/").to_string();
    let out = nodes.server.cli(&["operation", "pause", &name]);
    assert!(out.status.success(), "{}", said(&out));
    let out = nodes.server.cli(&args);
    assert_eq!(out.status.code(), Some(4), "{}", said(&out));
    assert!(said(&out).contains(&format!("by operation {name} already")), "{}", said(&out));
    let paused = eventually(Duration::from_secs(10), "the pause seen", || async {
        let op = nodes.server.admin().get::<OperationSpec>(&name).await.unwrap();
        op.status.blocker.filter(|b| b.message.starts_with("paused")).map(|_| op.status.done)
    })
    .await;
    assert!(paused < 3, "paused before the end ({paused} done)");
    let table = said(&nodes.server.cli(&["get", "operations"]));
    assert!(table.contains("Upgrade u to revision 4"), "{table}");
    let out = nodes.server.cli(&["operation", "resume", &name]);
    assert!(out.status.success(), "{}", said(&out));
    eventually(Duration::from_secs(30), "a member restarted as revision 4", || async {
        let members = list_members(&nodes.server, "u").await;
        members.iter().any(|m| m.status.app_revision == Some(4)).then_some(())
    })
    .await;
    // The leading replica is killed: the standby takes over and goes on.
    nodes.server.proc.kill9();
    nodes.server = nodes.standby.take().expect("a standby replica");
    let op = eventually(Duration::from_secs(90), "the upgrade done by the next leader", || async {
        let op = nodes.server.admin().get::<OperationSpec>(&name).await.ok()?;
        op.status.phase.is_finished().then_some(op)
    })
    .await;
    assert_eq!(op.status.phase, OperationPhase::Succeeded, "{:?}", op.status.message);
    let at_4 = revisions(&configured(&nodes.server, "u", 3, Duration::from_secs(30)).await);
    assert!(at_4.iter().all(|(_, runs, to_run, _)| *runs == Some(4) && *to_run == Some(4)), "{at_4:?}");
    let history: Vec<&str> = op.status.history.iter().map(|h| h.message.as_str()).collect();
    // Each member was restarted, and the upgrade dealt with each once. A
    // member restarted just before the kill is recorded by the next leader
    // as running revision 4 already, so both wordings count.
    for ((member, .., was), (.., is)) in at_3.iter().zip(&at_4) {
        assert_ne!(was, is, "{member} restarted: {history:#?}");
        let steps = history.iter().filter(|h| h.starts_with(&format!("{member}: runs revision 4 "))).count();
        assert_eq!(steps, 1, "{member} dealt with once: {history:#?}");
    }
    // The leader went last, and handed its lease over first.
    let handed = history.iter().position(|h| h.contains("hands the lease of role r over first"));
    let last = history.iter().rposition(|h| h.contains("restarted where it is as revision 4"));
    assert!(handed.is_some() && handed < last, "{history:#?}");

    // Unpinned under updatePolicy Rolling, the next revision of the App
    // rolls out by itself.
    let rolling = serde_json::json!({"spec": {
        "appRevision": null,
        "updatePolicy": {"type": "Rolling", "maxParallel": 3, "minHealthyTime": "1s"}
    }});
    eventually(Duration::from_secs(20), "the cluster following the App's latest", || async {
        nodes.server.admin().patch_value("appclusters", "u", &rolling).await.ok()
    })
    .await;
    apply_app(&nodes.server, app("exit 0 # revision 5", None)).await;
    let op = eventually(Duration::from_secs(60), "the rolling upgrade to revision 5 done", || async {
        let op = nodes.server.admin().get::<OperationSpec>("upgrade-u-r5").await.ok()?;
        op.status.phase.is_finished().then_some(op)
    })
    .await;
    assert_eq!(op.status.phase, OperationPhase::Succeeded, "{:?}", op.status.message);
    let at_5 = revisions(&list_members(&nodes.server, "u").await);
    assert!(at_5.iter().all(|(_, runs, _, _)| *runs == Some(5)), "{at_5:?}");
}

/// `etcdctl` against every member, reading `key` linearizably.
fn linearizable_read(endpoints: &str, key: &str) -> Result<String, String> {
    let out = std::process::Command::new("etcdctl")
        .args([&format!("--endpoints={endpoints}"), "--command-timeout=2s", "get", key, "--print-value-only"])
        .args(["--consistency=l"])
        .output()
        .map_err(|e| e.to_string())?;
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).trim().to_string()),
        false => Err(String::from_utf8_lossy(&out.stderr).trim().to_string()),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_five_member_etcd_is_upgraded_one_member_at_a_time_and_every_linearizable_read_succeeds() {
    require(&["etcd", "etcdctl"]);
    let nodes = nodes(5).await;
    let server = &nodes.server;
    let out = server.cli(&["apply", "-f", example("etcd").join("app.yaml").to_str().unwrap()]);
    assert!(out.status.success(), "{}", said(&out));
    let out = server.cli(&["apply", "-f", example("etcd").join("budget.yaml").to_str().unwrap()]);
    assert!(out.status.success(), "{}", said(&out));
    let cluster = serde_json::json!({
        "metadata": {"name": "etcd"},
        "spec": {"appRef": "etcd", "roles": [{"name": "member", "members": 5}]}
    });
    server.admin().create_value("appclusters", &cluster, Default::default()).await.unwrap();
    let members = configured(server, "etcd", 5, Duration::from_secs(120)).await;
    let endpoints: Vec<String> =
        members.iter().map(|m| format!("http://127.0.0.1:{}", m.spec.ports["client"])).collect();
    let endpoints = endpoints.join(",");
    let put = std::process::Command::new("etcdctl")
        .args([&format!("--endpoints={endpoints}"), "put", "upgrade-key", "before"])
        .output()
        .unwrap();
    assert!(put.status.success(), "{}", said(&put));

    // Revision 2 runs etcd with another flag.
    let mut app = server.admin().get_value("apps", "etcd").await.unwrap();
    let command = app["spec"]["roles"][0]["run"]["command"][2].as_str().unwrap().to_string();
    let flagged = command.replace("exec etcd", "exec etcd --snapshot-count=5000");
    assert_ne!(flagged, command);
    app["spec"]["roles"][0]["run"]["command"][2] = flagged.into();
    server.admin().replace_value("apps", "etcd", &app, Default::default()).await.unwrap();

    // A reader every 100 ms through all the members, all along.
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let reader = {
        let (stop, reads, endpoints) = (stop.clone(), reads.clone(), endpoints.clone());
        std::thread::spawn(move || -> Vec<String> {
            let mut failures = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                match linearizable_read(&endpoints, "upgrade-key") {
                    Ok(value) if value == "before" => drop(reads.fetch_add(1, Ordering::SeqCst)),
                    Ok(value) => failures.push(format!("read {value:?}")),
                    Err(error) => failures.push(error),
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            failures
        })
    };
    let started = std::time::Instant::now();
    let out = upgrade(server, "etcd --to-revision 2 --canary 1 --min-healthy-time 2s").await;
    let took = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let failures = reader.join().unwrap();
    assert!(out.status.success(), "{}", said(&out));
    assert!(failures.is_empty(), "{} of the reads failed: {failures:?}", failures.len());
    let reads = reads.load(Ordering::SeqCst);
    // One every 100 ms when the machine is idle; at least one a second
    // all along (each is an etcdctl process, slow to start on a busy one).
    assert!(reads as u64 >= took.as_secs().max(10), "reads all along: {reads} in {took:?}");
    eprintln!("etcd upgraded member by member in {took:?}: {reads} linearizable reads, none failed");
    let after = list_members(server, "etcd").await;
    assert!(after.iter().all(|m| m.status.app_revision == Some(2)), "{:?}", revisions(&after));
    for member in &after {
        let pid = common::apps::pid_of(server, member).await;
        let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(cmdline.contains("--snapshot-count=5000"), "{}: {cmdline:?}", member.metadata.name);
    }
    drop(nodes);
}
