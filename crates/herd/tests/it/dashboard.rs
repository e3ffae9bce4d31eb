//! The dashboard in a real browser: headless Chromium driven
//! through WebDriver against a live server with three agents. A bad token
//! is refused; a viewer sees three Ready nodes and no actions; as admin,
//! the etcd example reaches configured on the page without a reload, a
//! killed member passes through its states, a drain shows its progress
//! and its blocker and is cancelled and undone from the page, a stuck
//! Command is abandoned from the page, and a lost
//! connection to the server is shown and resumed. Screenshots of each page
//! go to `target/tmp/dashboard/`.

use crate::common;

use std::time::Duration;

use common::apps::{configured, example, nodes, pid_of};
use common::browser::{self, Browser};
use common::budgets::budget_yaml;
use fantoccini::Locator;
use herd_core::api::{JoinTokenRequest, NodeRoleRequest};
use herd_core::join::TokenKind;
use herd_core::kinds::{EventReason, MemberSpec, NodeRole, NodeSpec, OperationPhase, OperationSpec};

const WAIT: Duration = Duration::from_secs(30);

async fn log_in(browser: &Browser, token: &str) {
    let input = browser.client.wait().at_most(WAIT).for_element(Locator::Css("#token")).await.unwrap();
    input.clear().await.unwrap();
    input.send_keys(token).await.unwrap();
    browser.click("#login-submit").await;
}

/// Records every text the element matching `css` shows from now on, as
/// the page renders it (a MutationObserver: nothing shown is missed
/// between two looks of the test).
async fn record_texts(browser: &Browser, css: &str) {
    let script = format!(
        "window.herdSeen = []; const note = () => {{ const e = document.querySelector({css:?}); \
         const t = e ? e.textContent : null; if (t && window.herdSeen[window.herdSeen.length - 1] !== t) window.herdSeen.push(t); }}; \
         note(); new MutationObserver(note).observe(document.getElementById('page'), {{ childList: true, subtree: true, characterData: true }});"
    );
    browser.run(&script).await;
}

async fn recorded(browser: &Browser) -> Vec<String> {
    serde_json::from_value(browser.run("return window.herdSeen;").await).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_shows_the_cluster_live_and_acts_for_the_operator() {
    common::apps::require(&["etcd", "etcdctl"]);
    if !browser::available() {
        return;
    }
    let _turn = common::take_turn().await;
    let mut nodes = nodes(3).await;
    let admin = nodes.server.admin();
    let viewer = admin
        .create_join_token(&JoinTokenRequest { kind: TokenKind::Viewer, ..Default::default() })
        .await
        .unwrap()
        .token
        .unwrap();
    let browser = Browser::start("dashboard").await;
    let ui = format!("{}/ui", nodes.server.url);
    browser.client.goto(&ui).await.unwrap();

    // A token that is not valid is refused, saying so.
    log_in(&browser, "herdview.nothing.wrong").await;
    let refused = browser.wait_text("#login-error", WAIT, |t| !t.is_empty()).await;
    assert!(refused.contains("The token was refused") && refused.contains("not valid"), "{refused}");
    browser.screenshot("login-refused").await;
    // A node's own token is valid but opens nothing here: the page says
    // which tokens log in.
    let request = herd_core::api::JoinRequest {
        node_name: "not-a-viewer".into(),
        previous_node_token: None,
        report: herd_core::api::AgentReport { agent_boot_id: "b".into(), ..Default::default() },
    };
    let joined = nodes.server.anonymous().with_token(Some(common::JOIN_TOKEN.into())).join(&request).await.unwrap();
    log_in(&browser, &joined.node_token).await;
    let refused = browser.wait_text("#login-error", WAIT, |t| t.contains("does not open")).await;
    assert!(refused.contains("herd token create --viewer") && !refused.contains("replicas"), "{refused}");
    admin.delete_value("nodes", "not-a-viewer", Default::default()).await.unwrap();

    // A viewer: three Ready nodes, the leader, no action buttons.
    log_in(&browser, &viewer).await;
    browser.wait_text("#ready-nodes", WAIT, |t| t == "3 of 3 Ready").await;
    assert_eq!(browser.count("#nodes tbody tr").await, 3);
    browser.wait_text("#leader", WAIT, |t| t.contains("term")).await;
    browser.wait_text("#pool", WAIT, |t| t == "3 of 3 wanted").await;
    assert_eq!(browser.count("button[data-action]").await, 0, "a viewer gets no actions");
    assert_eq!(browser.text("#who").await.as_deref(), Some("viewer (read only)"));
    browser.screenshot("overview-viewer").await;

    // The admin. The page is never loaded again from here on: a marker
    // set now must survive to the end.
    browser.click("#logout").await;
    log_in(&browser, common::ADMIN_TOKEN).await;
    browser.wait_text("#ready-nodes", WAIT, |t| t == "3 of 3 Ready").await;
    assert_eq!(browser.count("button[data-action=drain]").await, 3);
    browser.run("window.herdMarker = 'still the same page';").await;

    // The etcd example reaches configured on the App clusters page.
    browser.click("a[data-page=clusters]").await;
    browser.wait_text("#page", WAIT, |t| t.contains("No app clusters")).await;
    let out = nodes.server.cli(&["apply", "-f", example("etcd").to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    browser.wait_text(".cluster-state[data-cluster=etcd]", Duration::from_secs(90), |t| t == "configured").await;
    let members = configured(&nodes.server, "etcd", 3, Duration::from_secs(30)).await;
    for member in &members {
        let css = format!(".member-state[data-member={}]", member.metadata.name);
        browser.wait_text(&css, WAIT, |t| t == "configured").await;
    }
    // What each uses, as its cgroup counts it (where the host has cgroups).
    let name = &members[0].metadata.name;
    let node = admin.get::<herd_core::kinds::NodeSpec>(members[0].spec.node.as_deref().unwrap()).await.unwrap();
    if node.status.condition(herd_core::node_health::RESOURCE_ISOLATION).is_some_and(|c| c.reason != "NoCgroups") {
        let css = format!(".member-usage[data-member={name}]");
        let shown =
            |t: &str| t.split_once(" / ").is_some_and(|(cpu, memory)| cpu.ends_with('m') && memory.ends_with('i'));
        browser.wait_text(&css, WAIT, shown).await;
    }
    browser.screenshot("app-clusters").await;
    browser.click("a[data-page=overview]").await;
    browser.wait_text("#nodes", WAIT, |t| t.contains("Drain")).await;
    browser.wait_text("#findings", WAIT, |t| !t.is_empty()).await;
    for node in ["n1", "n2", "n3"] {
        let members = format!("#nodes tbody tr:nth-child({}) .node-members", &node[1..]);
        browser.wait_text(&members, WAIT, |t| t == "1").await;
        let memory = format!("#nodes tbody tr:nth-child({}) .node-memory", &node[1..]);
        browser.wait_text(&memory, WAIT, |t| t.contains(" of ")).await;
    }
    browser.screenshot("overview").await;
    // A member started by a Command, not by an app cluster, counts on its node too.
    let start = herd_core::kinds::Action::StartMember { member: "loose".into(), run: common::cluster::member_run() };
    admin.create(&common::cluster::command("start-loose", "n1", start)).await.unwrap();
    browser.wait_text("#nodes tbody tr:nth-child(1) .node-members", WAIT, |t| t == "2").await;
    let stop = herd_core::kinds::Action::RemoveMember { member: "loose".into() };
    admin.create(&common::cluster::command("forget-loose", "n1", stop)).await.unwrap();
    browser.wait_text("#nodes tbody tr:nth-child(1) .node-members", WAIT, |t| t == "1").await;
    browser.click("a[data-page=clusters]").await;

    // A member killed: the page shows it leave configured and come back.
    let victim = &members[0];
    let css = format!(".last-known[data-member={}]", victim.metadata.name);
    browser.wait_text(&css, WAIT, |t| t == "running").await;
    record_texts(&browser, &css).await;
    // Its agent starts it again after half a second, twice as long after
    // each crash soon after a start: a blip shorter than a controller
    // pass and the page's one-second pacing may never be shown, so it is
    // killed again, down longer each time, until the page shows it down.
    for kill in 1.. {
        let pid = pid_of(&nodes.server, victim).await;
        common::apps::kill9(pid);
        if browser.try_wait_text(&css, Duration::from_secs(10), |t| t != "running").await.is_ok() {
            break;
        }
        assert!(kill < 5, "the page never showed member {} down in {kill} kills", victim.metadata.name);
        common::eventually(Duration::from_secs(30), "the member running again", || async {
            let node = nodes.server.admin().get::<NodeSpec>(victim.spec.node.as_deref()?).await.ok()?;
            let report = node.status.members.iter().find(|r| r.name == victim.metadata.name)?;
            (report.running && report.pid.is_some_and(|p| p != pid)).then_some(())
        })
        .await;
    }
    browser.wait_text(&css, Duration::from_secs(60), |t| t == "running").await;
    let state = format!(".member-state[data-member={}]", victim.metadata.name);
    browser.wait_text(&state, Duration::from_secs(60), |t| t == "configured").await;
    let seen = recorded(&browser).await;
    assert!(seen.first().map(String::as_str) == Some("running"), "{seen:?}");
    assert!(seen.iter().any(|t| t != "running"), "the page never showed the member down: {seen:?}");
    assert_eq!(seen.last().map(String::as_str), Some("running"), "{seen:?}");

    // A crash loop is shown where the member is, with its exit.
    let crashy = nodes.dir.path().join("crashy.yaml");
    std::fs::write(
        &crashy,
        "apiVersion: herd/v1\nkind: App\nmetadata: {name: crashy}\nspec:\n  roles:\n  - name: r\n    \
         run: {command: [sh, -c, 'exit 3']}\n    setup: {script: 'true'}\n---\napiVersion: herd/v1\n\
         kind: AppCluster\nmetadata: {name: crashy}\nspec: {appRef: crashy, roles: [{name: r, members: 1}]}\n",
    )
    .unwrap();
    let out = nodes.server.cli(&["apply", "-f", crashy.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    browser.wait_text(".member-state[data-member=crashy-r-0]", WAIT, |t| t.contains("crash loop")).await;
    let why = browser.wait_text(".member-why[data-member=crashy-r-0]", WAIT, |t| t.contains("exit status: 3")).await;
    assert!(why.contains("crash loop"), "{why}");
    browser.screenshot("crash-loop").await;
    let out = nodes.server.cli(&["delete", "appcluster", "crashy"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Its member is removed from its node before the drain below counts
    // that node's members.
    common::eventually(WAIT, "crashy's member removed", || async {
        admin.get::<MemberSpec>("crashy-r-0").await.is_err().then_some(())
    })
    .await;

    // A drain that a budget can never allow: its progress and blocker.
    let budget = nodes.dir.path().join("all.yaml");
    std::fs::write(&budget, budget_yaml("etcd-all", "herd.io/cluster=etcd", "minAvailable: 3")).unwrap();
    let out = nodes.server.cli(&["apply", "-f", budget.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let node = victim.spec.node.clone().unwrap();
    browser.click("a[data-page=overview]").await;
    browser.click(&format!("button[data-action=drain][data-target={node}]")).await;
    let question = browser.wait_text("#confirm-text", WAIT, |t| !t.is_empty()).await;
    assert!(question.starts_with(&format!("Drain node {node}?")), "{question}");
    browser.click("#confirm-yes").await;
    browser.wait_text("#flash", WAIT, |t| t.contains("draining node")).await;
    browser.click("a[data-page=operations]").await;
    let blocker = browser.wait_text(".blocker", WAIT, |t| t.contains("etcd-all")).await;
    assert!(blocker.contains("can never clear"), "{blocker}");
    assert_eq!(browser.text(".operation-progress").await.as_deref(), Some("0/1"));
    browser.screenshot("operations").await;

    // Cancelled from the page, then undrained from the overview.
    browser.click("button[data-action=cancel]").await;
    browser.click("#confirm-yes").await;
    browser.wait_text(".operation-phase", WAIT, |t| t == "Cancelled").await;
    let operations = admin.list::<OperationSpec>("").await.unwrap();
    assert_eq!(operations.len(), 1);
    assert_eq!(operations[0].status.phase, OperationPhase::Cancelled);
    let still = admin.get::<MemberSpec>(&victim.metadata.name).await.unwrap();
    assert_eq!(still.spec.node.as_deref(), Some(node.as_str()), "nothing was evicted");
    browser.click("a[data-page=overview]").await;
    browser.click(&format!("button[data-action=undrain][data-target={node}]")).await;
    browser.click("#confirm-yes").await;
    browser.wait_text("#flash", WAIT, |t| t.contains("takes new members again")).await;
    assert_ne!(admin.get::<NodeSpec>(&node).await.unwrap().spec.role, NodeRole::Drained);

    // A Command stuck on a node that has no agent: abandoned from the page.
    let stuck = herd_core::kinds::Action::StopMember { member: "m1".into() };
    admin.create(&common::cluster::command("stuck", "ghost", stuck)).await.unwrap();
    browser.click("a[data-page=operations]").await;
    browser.click("button[data-action=abandon][data-target=stuck]").await;
    let question = browser.wait_text("#confirm-text", WAIT, |t| t.contains("stuck")).await;
    assert!(question.starts_with("Abandon command stuck?"), "{question}");
    browser.click("#confirm-yes").await;
    browser.wait_text("#flash", WAIT, |t| t == "command/stuck abandoned").await;
    browser.wait_text(".command-state[data-command=stuck]", WAIT, |t| t == "ABANDONED").await;
    assert_eq!(browser.count("button[data-action=retry][data-target=stuck]").await, 1, "and may be retried");
    let abandoned = admin.get::<herd_core::kinds::CommandSpec>("stuck").await.unwrap();
    assert_eq!(abandoned.status.state_by_management, herd_core::kinds::ManagementState::Abandoned);

    // The events, live.
    browser.click("a[data-page=events]").await;
    browser
        .wait_text("#events", WAIT, |t| {
            t.contains(EventReason::MemberConfigured.as_str()) && t.contains(EventReason::NodeRegistered.as_str())
        })
        .await;
    browser.screenshot("events").await;

    // Every kind's table, from its descriptor alone (served at
    // /api/v1/kinds): a kind added to herd shows here without a change to
    // the dashboard's code.
    browser.click("a[data-page=objects]").await;
    for kind in herd_core::kinds::descriptors() {
        browser.click(&format!("a[data-kind={}]", kind.plural)).await;
        browser.wait_text("#objects-kind", WAIT, |t| t == format!("{} objects", kind.kind)).await;
        let empty = format!("No {} objects.", kind.kind);
        let headers: Vec<&str> = kind.columns.iter().filter(|c| !c.wide).map(|c| c.header).collect();
        browser.wait_text("#objects", WAIT, |t| t == empty || headers.iter().all(|h| t.contains(h))).await;
    }
    browser.click("a[data-kind=members]").await;
    browser.wait_text("#objects-kind", WAIT, |t| t == "Member objects").await;
    let members = browser.wait_text("#objects", WAIT, |t| t.contains(&victim.metadata.name)).await;
    assert!(members.contains("configured") && members.contains("yes"), "{members}");
    browser.screenshot("objects").await;

    // The server goes away: the page says so, and resumes when it is back.
    browser.click("a[data-page=overview]").await;
    browser.wait_text("#ready-nodes", WAIT, |t| t == "3 of 3 Ready").await;
    let listen = nodes.server.listen_addr();
    nodes.server.proc.kill9();
    browser.wait_text("#connection", WAIT, |t| t.starts_with("Connection lost")).await;
    browser.screenshot("connection-lost").await;
    let data_dir = nodes.server.data_dir.clone();
    nodes.server = common::TestServer::start_at(&data_dir, &listen);
    browser.wait_text("#ready-nodes", WAIT, |t| t == "3 of 3 Ready").await;
    let hidden = "return document.getElementById('connection').hidden;";
    common::eventually(WAIT, "the connection banner gone", || async {
        (browser.run(hidden).await == serde_json::json!(true)).then_some(())
    })
    .await;
    // A change after the outage reaches the page: the watch resumed.
    let request = NodeRoleRequest { role: Some(NodeRole::Drained), master_capable: None, auto_promote: true };
    nodes.server.admin().change_node_role("n3", &request).await.unwrap();
    browser.click("button[data-action=undrain][data-target=n3]").await;
    browser.click("#confirm-no").await;
    let marker = browser.run("return window.herdMarker;").await;
    assert_eq!(marker, serde_json::json!("still the same page"), "the page was loaded again");
    browser.client.clone().close().await.unwrap();
}
