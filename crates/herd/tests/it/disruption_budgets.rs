//! Disruption budgets on real agents and members: applied from
//! YAML with the CLI, counted by the leader over the members they select,
//! a crash only lowers the count (nothing asks the budget), a budget that
//! can never allow an eviction says so, and bad budgets are refused naming
//! the field. Evictions ask every budget that selects the member; an
//! evicted member is placed again, and until it is back and ready the next
//! eviction is refused; concurrent evictions never share one allowance.

use crate::common;

use std::time::Duration;

use common::apps::{configured, instance, kill9, list_members, nodes, pid_of};
use common::budgets::{apply_web, budget, budget_yaml, counted};
use common::{TestServer, eventually};
use herd_core::api::StatusReason;
use herd_core::kinds::{DisruptionBudgetSpec, EventReason, EventSpec};

#[tokio::test(flavor = "multi_thread")]
async fn a_budget_counts_ready_members_and_a_crash_only_lowers_the_count() {
    let nodes = nodes(3).await;
    let server = &nodes.server;
    let budgets = budget_yaml("web-quorum", "herd.io/cluster=web", "minAvailable: 2")
        + &budget_yaml("web-all", "herd.io/cluster=web", "minAvailable: 100%");
    apply_web(server, nodes.dir.path(), "web", 3, &budgets);
    let members = configured(server, "web", 3, Duration::from_secs(60)).await;

    let counted = counted(server, "web-quorum", 3, 1).await;
    assert_eq!((counted.status.desired_healthy, counted.status.expected_members), (2, 3));
    assert!(counted.status.unhealthy.is_empty());
    let out = server.cli(&["get", "budgets"]);
    let table = String::from_utf8_lossy(&out.stdout);
    let row = table.lines().find(|l| l.starts_with("web-quorum")).unwrap_or_else(|| panic!("{table}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[1..6], ["herd.io/cluster=web", "2", "-", "3/3", "1"], "{table}");

    // 100% of 3 can never allow an eviction: said as a Warning Event; that
    // it selected no member before its members were made was not one.
    let never = eventually(Duration::from_secs(20), "a BudgetNeverAllows event about 100%", || async {
        let events = server.admin().list::<EventSpec>("").await.ok()?;
        events.into_iter().find(|e| {
            e.spec.reason_is(EventReason::BudgetNeverAllows)
                && e.spec.involved_object.name == "web-all"
                && e.spec.message.contains("minAvailable 100%")
        })
    })
    .await;
    assert!(
        never.spec.message.contains("can never allow an eviction: minAvailable 100% needs 3 healthy of the 3"),
        "{}",
        never.spec.message
    );
    let events = server.admin().list::<EventSpec>("").await.unwrap();
    let warned: Vec<&str> = events
        .iter()
        .filter(|e| e.spec.reason_is(EventReason::BudgetNeverAllows))
        .map(|e| e.spec.message.as_str())
        .collect();
    assert!(warned.iter().all(|m| !m.contains("selects no member")), "{warned:?}");

    // A crash is never asked about: the member comes back (set up again),
    // and meanwhile the budget shows it unhealthy and allows nothing.
    let victim = &members[0];
    kill9(pid_of(server, victim).await);
    let short = eventually(Duration::from_secs(20), "the crash counted against the budget", || async {
        let b = budget(server, "web-quorum").await;
        (b.status.current_healthy == 2).then_some(b)
    })
    .await;
    assert_eq!(short.status.disruptions_allowed, 0);
    assert_eq!(short.status.unhealthy.len(), 1, "{:?}", short.status);
    assert_eq!(short.status.unhealthy[0].name, victim.metadata.name);
    configured(server, "web", 3, Duration::from_secs(60)).await;
    eventually(Duration::from_secs(20), "the budget healthy again", || async {
        let b = budget(server, "web-quorum").await;
        (b.status.current_healthy == 3 && b.status.disruptions_allowed == 1).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_budgets_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    for (spec, field, reason) in [
        ("{selector: 'a=b', minAvailable: 1, maxUnavailable: 1}", "spec.maxUnavailable", "give either"),
        ("{selector: 'a=b'}", "spec.minAvailable", "one of minAvailable and maxUnavailable is required"),
        ("{selector: 'a=b', minAvailable: '101%'}", "spec.minAvailable", "is not a percentage from 0% to 100%"),
        ("{selector: '', maxUnavailable: 1}", "spec.selector", "must not be empty"),
    ] {
        let manifest = dir.path().join("budget.yaml");
        std::fs::write(
            &manifest,
            format!("apiVersion: herd/v1\nkind: DisruptionBudget\nmetadata: {{name: b}}\nspec: {spec}\n"),
        )
        .unwrap();
        let out = server.cli(&["apply", "-f", manifest.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{spec} was accepted");
        assert!(stderr.contains(field) && stderr.contains(reason), "{spec}: {stderr}");
        assert!(stderr.contains("budget.yaml document 1 (line 4)"), "the line the field is on: {stderr}");
    }
    // Several documents: the line in the file, the document's offset counted.
    let manifest = dir.path().join("two.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: herd/v1\nkind: DisruptionBudget\nmetadata: {name: a}\nspec: {selector: 'a=b', maxUnavailable: 1}\n\
         ---\napiVersion: herd/v1\nkind: DisruptionBudget\nmetadata:\n  name: b\nspec:\n  selector: 'a=b'\n  \
         minAvailable: '101%'\n",
    )
    .unwrap();
    let out = server.cli(&["apply", "-f", manifest.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("two.yaml document 2 (line 12): spec.minAvailable"), "{stderr}");
    assert!(server.admin().get::<DisruptionBudgetSpec>("b").await.is_err(), "nothing was written");
}

fn evict(server: &TestServer, member: &str, dry_run: bool) -> std::process::Output {
    let mut args = vec!["member", "evict", member];
    if dry_run {
        args.push("--dry-run");
    }
    server.cli(&args)
}

/// The budget rule at work: 3 members under minAvailable 2 allow one
/// eviction; the next is refused (429 naming the budget) until the evicted
/// member is back and ready; a second budget that blocks is named (exit 4
/// from the CLI), the one that allows is not.
#[tokio::test(flavor = "multi_thread")]
async fn an_eviction_waits_for_the_last_one_to_be_ready_again() {
    let nodes = nodes(3).await;
    let server = &nodes.server;
    apply_web(server, nodes.dir.path(), "web", 3, &budget_yaml("web-quorum", "herd.io/cluster=web", "minAvailable: 2"));
    let before = configured(server, "web", 3, Duration::from_secs(60)).await;
    counted(server, "web-quorum", 3, 1).await;

    let out = evict(server, "web-w-0", true);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("dry run: nothing changed"), "{out:?}");
    assert!(budget(server, "web-quorum").await.status.disrupted_members.is_empty(), "a dry run approves nothing");

    // Back to back (the replacement is quick): the second is refused.
    let admin = server.admin();
    let first = admin.evict_member("web-w-0", false).await.unwrap();
    assert!(first.message.contains("allowed by web-quorum"), "{first:?}");
    let second = admin.evict_member("web-w-1", false).await.unwrap_err();
    assert_eq!(second.reason(), Some(StatusReason::TooManyRequests), "{second}");
    assert!(
        second.to_string().contains("budget web-quorum needs 2 healthy: evicting web-w-1 would leave 1"),
        "{second}"
    );

    // The evicted member is placed again as a new member; once it is
    // configured and ready, the next eviction is allowed.
    let after = configured(server, "web", 3, Duration::from_secs(60)).await;
    assert_ne!(instance(&after[0]), instance(&before[0]), "web-w-0 runs as a new instance");
    assert_eq!(instance(&after[1]), instance(&before[1]), "web-w-1 was never evicted");
    counted(server, "web-quorum", 3, 1).await;
    let out = evict(server, "web-w-1", false);
    assert!(out.status.success(), "allowed once web-w-0 is ready again: {out:?}");
    configured(server, "web", 3, Duration::from_secs(60)).await;
    counted(server, "web-quorum", 3, 1).await;

    // Two budgets select web-w-2: web-quorum allows, web-frozen blocks.
    let frozen = nodes.dir.path().join("frozen.yaml");
    std::fs::write(&frozen, budget_yaml("web-frozen", "herd.io/role=w", "maxUnavailable: 0")).unwrap();
    assert!(server.cli(&["apply", "-f", frozen.to_str().unwrap()]).status.success());
    counted(server, "web-frozen", 3, 0).await;
    let out = evict(server, "web-w-2", false);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("budget web-frozen can never allow an eviction: maxUnavailable 0"), "{stderr}");
    assert!(!stderr.contains("web-quorum"), "only the blocking budget is named: {stderr}");
    let events = server.admin().list::<EventSpec>("").await.unwrap();
    let mut evicted: Vec<&str> = events
        .iter()
        .filter(|e| e.spec.reason_is(EventReason::MemberEvicted))
        .map(|e| e.spec.involved_object.name.as_str())
        .collect();
    evicted.sort();
    assert_eq!(evicted, ["web-w-0", "web-w-1"], "each eviction is an Event on its member");

    // `herd describe budget`: the counts, what is allowed now, the evictions.
    let described = String::from_utf8_lossy(&server.cli(&["describe", "budget", "web-quorum"]).stdout).into_owned();
    assert!(described.contains("3 healthy of 3 expected, 2 needed: 1 eviction(s) allowed now"), "{described}");
    assert!(described.contains("evicted: web-w-0") && described.contains("evicted: web-w-1"), "{described}");
    let described = String::from_utf8_lossy(&server.cli(&["describe", "budget", "web-frozen"]).stdout).into_owned();
    assert!(described.contains("warning: budget web-frozen can never allow an eviction"), "{described}");
}

/// Twenty evictions at once against a budget that allows one: exactly one
/// member is approved; the others are refused (or told it is under way).
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_evictions_never_share_one_allowance() {
    let nodes = nodes(3).await;
    let server = &nodes.server;
    apply_web(server, nodes.dir.path(), "big", 6, &budget_yaml("big-five", "herd.io/cluster=big", "minAvailable: 5"));
    configured(server, "big", 6, Duration::from_secs(60)).await;
    counted(server, "big-five", 6, 1).await;
    let admin = server.admin();
    let answers = futures_util::future::join_all((0..20).map(|i| {
        let admin = admin.clone();
        async move { admin.evict_member(&format!("big-w-{}", i % 6), false).await }
    }))
    .await;
    let mut approved = std::collections::BTreeSet::new();
    for answer in &answers {
        match answer {
            Ok(eviction) => {
                approved.insert(eviction.member.clone());
            }
            Err(error) => assert_eq!(error.reason(), Some(StatusReason::TooManyRequests), "{error}"),
        }
    }
    assert_eq!(approved.len(), 1, "exactly one member approved: {approved:?}");
    let marked: Vec<String> = list_members(server, "big")
        .await
        .into_iter()
        .filter(|m| m.spec.requests.replace.is_some())
        .map(|m| m.metadata.name)
        .collect();
    assert!(marked.len() <= 1 && marked.iter().all(|m| approved.contains(m)), "{marked:?}");
    let refused = answers.iter().filter(|a| a.is_err()).count();
    assert!(refused >= 20 - 4, "the requests for the other five members were refused ({refused} of 20)");
    configured(server, "big", 6, Duration::from_secs(60)).await;
    counted(server, "big-five", 6, 1).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_member_on_a_node_that_is_not_ready_is_not_ready_and_counted_so_everywhere() {
    let mut nodes = nodes(3).await;
    let budgets = budget_yaml("web-quorum", "herd.io/cluster=web", "minAvailable: 2");
    apply_web(&nodes.server, nodes.dir.path(), "web", 3, &budgets);
    let members = configured(&nodes.server, "web", 3, Duration::from_secs(60)).await;
    counted(&nodes.server, "web-quorum", 3, 1).await;
    let lost = members.iter().find(|m| m.spec.node.as_deref() == Some("n3")).unwrap().clone();
    let other = members.iter().find(|m| m.spec.node.as_deref() == Some("n1")).unwrap().clone();

    // n3's agent stops: its member keeps running, but nothing can see it.
    nodes.agents[2].kill9();
    let server = &nodes.server;
    let seen = eventually(Duration::from_secs(30), "the member on n3 not ready", || async {
        let member = server.admin().get::<herd_core::kinds::MemberSpec>(&lost.metadata.name).await.ok()?;
        (!member.status.ready).then_some(member)
    })
    .await;
    assert_eq!(seen.status.state_detail.last_known_state, herd_core::kinds::LastKnownState::Unknown);
    let why = seen.status.not_ready_reason.clone().unwrap_or_default();
    assert!(why.starts_with("node n3 is NotReady since") && why.contains("no heartbeat"), "{why}");
    assert!(seen.status.ready_changed_at.is_some());
    // The budget counts it unhealthy: an eviction now would take quorum away.
    let short = counted(server, "web-quorum", 2, 0).await;
    assert_eq!(short.status.unhealthy.len(), 1);
    assert!(short.status.unhealthy[0].reason.contains("node n3 is NotReady"), "{:?}", short.status.unhealthy);
    // What the operator reads says so.
    let out = server.cli(&["get", "members"]);
    let table = String::from_utf8_lossy(&out.stdout);
    let row = table.lines().find(|l| l.starts_with(&lost.metadata.name)).unwrap_or_else(|| panic!("{table}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[3..6], ["configured", "no", "n3"], "{table}");
    let out = server.cli(&["describe", "member", &lost.metadata.name]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("not ready since") && text.contains("not ready: node n3 is NotReady"), "{text}");
    // And so does the configmeta the others are given.
    let path = nodes.dir_of(&other).join(format!("volumes/{}/herd/configmeta.json", other.metadata.name));
    let meta = eventually(Duration::from_secs(20), "the others' configmeta says it is not ready", || async {
        let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
        let listed =
            meta["roles"][0]["members"].as_array()?.iter().find(|m| m["name"] == lost.metadata.name.as_str())?;
        (listed["ready"] == false).then_some(meta)
    })
    .await;
    let me = meta["roles"][0]["members"].as_array().unwrap().iter().find(|m| m["name"] == other.metadata.name.as_str());
    assert_eq!(me.unwrap()["ready"], true, "{meta}");
    // A refused eviction names it.
    let out = server.cli(&["member", "evict", &other.metadata.name]);
    assert!(!out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_eviction_no_node_can_take_is_refused_and_says_why() {
    let nodes = nodes(3).await;
    let server = &nodes.server;
    let admin = server.admin();
    // n3 takes no new members: with one member per node required, a member
    // of n1 or n2 has nowhere to go.
    common::apps::cordon(server, "n3", true).await;
    let app = serde_json::json!({"metadata": {"name": "solo"}, "spec": {"roles": [{
        "name": "s", "run": {"command": ["sleep", "600"]}, "setup": {"script": "true"},
        "placement": {"spread": "Required"}
    }]}});
    admin.create_value("apps", &app, Default::default()).await.unwrap();
    let cluster = serde_json::json!({"metadata": {"name": "solo"},
        "spec": {"appRef": "solo", "roles": [{"name": "s", "members": 2}]}});
    admin.create_value("appclusters", &cluster, Default::default()).await.unwrap();
    let members = configured(server, "solo", 2, Duration::from_secs(60)).await;
    let victim = &members[0].metadata.name;
    for args in [vec!["member", "evict", victim, "--dry-run"], vec!["member", "evict", victim]] {
        let out = server.cli(&args);
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!out.status.success(), "{args:?}: {said}");
        assert!(said.contains("no node can take") || said.contains("spread is required"), "{said}");
        assert!(said.contains("n3 is cordoned"), "{said}");
    }
    let member = admin.get::<herd_core::kinds::MemberSpec>(victim).await.unwrap();
    assert!(member.metadata.annotations.is_empty(), "nothing was asked of it: {:?}", member.metadata.annotations);
    assert!(member.status.ready);
    // A node frees up: the eviction is approved, and carried out.
    common::apps::cordon(server, "n3", false).await;
    let out = server.cli(&["member", "evict", victim]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    eventually(Duration::from_secs(30), "the member placed on n3", || async {
        let member = admin.get::<herd_core::kinds::MemberSpec>(victim).await.ok()?;
        (member.spec.node.as_deref() == Some("n3") && member.status.ready).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_restart_leaves_its_members_ready_and_its_budgets_whole() {
    let mut nodes = nodes(1).await;
    let admin = nodes.server.admin();
    let app = serde_json::json!({"metadata": {"name": "checked"}, "spec": {"roles": [{
        "name": "c", "run": {"command": ["sleep", "600"]}, "setup": {"script": "true"},
        "readiness": {"command": ["true"], "period": "2s"}
    }]}});
    admin.create_value("apps", &app, Default::default()).await.unwrap();
    let cluster = serde_json::json!({"metadata": {"name": "checked"},
        "spec": {"appRef": "checked", "roles": [{"name": "c", "members": 2}]}});
    admin.create_value("appclusters", &cluster, Default::default()).await.unwrap();
    configured(&nodes.server, "checked", 2, Duration::from_secs(60)).await;
    // The agent restarts; its members never stopped, and their checks passed.
    nodes.agents[0].kill9();
    nodes.agents[0] = common::start_agent(&nodes.server.url, &nodes.dirs[0], "n1");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
    while tokio::time::Instant::now() < deadline {
        for member in list_members(&nodes.server, "checked").await {
            assert!(
                member.status.ready,
                "{} not ready across its agent's restart: {:?}",
                member.metadata.name, member.status
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
