//! The controllers together on a paused clock: what the operator sees of
//! a cluster's members as their nodes come and go.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use herd_core::Object;
use herd_core::kinds::app::{AppRole, LeaderHook, LeaderSpec};
use herd_core::kinds::app_cluster::{AppClusterSpec, ClusterRole};
use herd_core::kinds::command::{MemberRun, VolumeSpec};
use herd_core::kinds::disruption_budget::{Amount, DisruptionBudgetSpec};
use herd_core::kinds::operation::{OnDeadline, OperationAction, OperationPhase};
use herd_core::kinds::{AppSpec, MemberSpec, MemberState, NodeRole, NodeSpec, OperationSpec};
use herd_core::time::HumanDuration;

use super::TestCluster;
use crate::objects::{Objects, ObjectsError, Part};

const SECOND: Duration = Duration::from_secs(1);

/// An App of one role, three members of it, and a budget that needs two
/// healthy. `persistent`: its members keep a persistent volume (so that
/// a member waits for its node rather than moving).
async fn three_members_and_a_budget(cluster: &TestCluster, persistent: bool) {
    three_members_and_a_budget_led(cluster, persistent, None).await
}

/// The same, role `db` led as `leader` says.
async fn three_members_and_a_budget_led(cluster: &TestCluster, persistent: bool, leader: Option<LeaderSpec>) {
    let run = MemberRun {
        command: vec!["sleep".into(), "1000".into()],
        volumes: vec![VolumeSpec { name: "data".into(), persistent }],
        ..Default::default()
    };
    let role = AppRole { name: "db".into(), run, leader, ..Default::default() };
    let app = Object::new("app", AppSpec { roles: vec![role], ..Default::default() });
    cluster.objects.create(app, false, false).await.unwrap();
    let roles = vec![ClusterRole { name: "db".into(), members: 3, ..Default::default() }];
    let spec = AppClusterSpec { app_ref: "app".into(), roles, ..Default::default() };
    cluster.objects.create(Object::new("c", spec), false, false).await.unwrap();
    let budget = DisruptionBudgetSpec {
        selector: "herd.io/cluster=c".into(),
        min_available: Some(Amount::Count(2)),
        ..Default::default()
    };
    cluster.objects.create(Object::new("c", budget), false, false).await.unwrap();
}

async fn members(objects: &Objects) -> Vec<Object<MemberSpec>> {
    objects.list::<MemberSpec>().await.unwrap().0
}

async fn all_configured_and_ready(objects: &Objects) -> bool {
    let members = members(objects).await;
    members.len() == 3 && members.iter().all(|m| m.status.state == MemberState::Configured && m.status.ready)
}

/// (current healthy, disruptions allowed) of budget `c`.
async fn budget(objects: &Objects) -> (u32, u32) {
    let budget = objects.require::<DisruptionBudgetSpec>("c").await.unwrap();
    (budget.status.current_healthy, budget.status.disruptions_allowed)
}

#[tokio::test(start_paused = true)]
async fn a_silent_nodes_member_is_not_ready_and_not_counted_healthy_until_the_node_speaks_again() {
    let cluster = TestCluster::start(&["n1", "n2", "n3"]).await;
    three_members_and_a_budget(&cluster, true).await;
    let formed = cluster.until("every member configured and ready", 60 * SECOND, all_configured_and_ready).await;
    cluster.until("the budget counts three healthy", 10 * SECOND, async |o| budget(o).await == (3, 1)).await;
    let placed = members(&cluster.objects).await;
    let on_n2 = placed.iter().find(|m| m.spec.node.as_deref() == Some("n2")).expect("a member on each node");
    let name = on_n2.metadata.name.clone();

    cluster.silence("n2", true);
    let node_lost = cluster
        .until("n2 NotReady", 30 * SECOND, async |o| !o.require::<NodeSpec>("n2").await.unwrap().status.ready)
        .await;
    // The grace period (10 s by default) after the last heartbeat, and
    // no later than the lifecycle's next look.
    assert!(node_lost >= 8 * SECOND && node_lost <= 16 * SECOND, "NotReady after {node_lost:?}");
    let member_lost = cluster
        .until(&format!("{name} not ready"), 10 * SECOND, async |o| {
            !o.require::<MemberSpec>(&name).await.unwrap().status.ready
        })
        .await;
    let member = cluster.objects.require::<MemberSpec>(&name).await.unwrap();
    let why = member.status.not_ready_reason.clone().unwrap_or_default();
    assert!(why.contains("n2"), "the reason names the node: {why:?}");
    assert!(member.status.ready_changed_at.is_some(), "says since when: {:?}", member.status);
    cluster.until("the budget counts two healthy", 10 * SECOND, async |o| budget(o).await == (2, 0)).await;
    let others = members(&cluster.objects).await;
    assert!(
        others.iter().filter(|m| m.metadata.name != name).all(|m| m.status.ready),
        "the other members stay ready: {others:?}"
    );
    assert_eq!(
        cluster.objects.require::<MemberSpec>(&name).await.unwrap().spec.node.as_deref(),
        Some("n2"),
        "a member with persistent data waits for its node"
    );

    cluster.silence("n2", false);
    let back = cluster.until("every member ready again", 30 * SECOND, all_configured_and_ready).await;
    cluster.until("the budget counts three healthy again", 10 * SECOND, async |o| budget(o).await == (3, 1)).await;
    eprintln!(
        "formed in {formed:?}, n2 NotReady after {node_lost:?}, its member {member_lost:?} later, back in {back:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_member_whose_process_exits_is_not_ready_and_not_counted_healthy() {
    let cluster = TestCluster::start(&["n1", "n2", "n3"]).await;
    three_members_and_a_budget(&cluster, true).await;
    cluster.until("every member configured and ready", 60 * SECOND, all_configured_and_ready).await;
    let member = members(&cluster.objects).await.into_iter().find(|m| m.spec.node.as_deref() == Some("n1")).unwrap();
    let name = member.metadata.name.clone();

    cluster.exit("n1", &name);
    cluster
        .until(&format!("{name} not ready"), 10 * SECOND, async |o| {
            !o.require::<MemberSpec>(&name).await.unwrap().status.ready
        })
        .await;
    cluster.until("the budget counts two healthy", 10 * SECOND, async |o| budget(o).await == (2, 0)).await;
    let node = cluster.objects.require::<NodeSpec>("n1").await.unwrap();
    assert!(node.status.ready, "the node itself is fine");
}

/// Marks `node` unschedulable, or schedulable again.
async fn cordon(objects: &Objects, node: &str, cordoned: bool) {
    let change = |node: &mut Object<NodeSpec>| {
        node.spec.unschedulable = cordoned;
        Ok::<_, ObjectsError>(true)
    };
    objects.modify(node, Part::Spec, change).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_drain_moves_each_member_off_its_node_one_at_a_time_as_the_budget_allows() {
    let cluster = TestCluster::start(&["n1", "n2", "n3", "n4"]).await;
    // Three members on two nodes: one of them holds two.
    for node in ["n3", "n4"] {
        cordon(&cluster.objects, node, true).await;
    }
    three_members_and_a_budget(&cluster, false).await;
    cluster.until("every member configured and ready", 60 * SECOND, all_configured_and_ready).await;
    for node in ["n3", "n4"] {
        cordon(&cluster.objects, node, false).await;
    }
    let placed = members(&cluster.objects).await;
    let on = |node: &str| placed.iter().filter(|m| m.spec.node.as_deref() == Some(node)).count();
    let drained = if on("n1") == 2 { "n1" } else { "n2" };
    assert_eq!(on(drained), 2, "{placed:?}");
    let drain = OperationSpec {
        action: OperationAction::Drain { node: drained.into() },
        deadline: None,
        on_deadline: OnDeadline::default(),
        max_parallel: 3,
        cancel: false,
        paused: false,
    };
    cluster.objects.create(Object::new("drain", drain), false, false).await.unwrap();

    let fewest_ready = AtomicUsize::new(3);
    let took = cluster
        .until("the drain succeeded and every member is ready", 120 * SECOND, async |o| {
            let members = members(o).await;
            fewest_ready.fetch_min(members.iter().filter(|m| m.status.ready).count(), Ordering::SeqCst);
            let op = o.require::<OperationSpec>("drain").await.unwrap();
            op.status.phase == OperationPhase::Succeeded && all_configured_and_ready(o).await
        })
        .await;
    let after = members(&cluster.objects).await;
    assert!(after.iter().all(|m| m.spec.node.as_deref() != Some(drained)), "none left on {drained}: {after:?}");
    let role = cluster.objects.require::<NodeSpec>(drained).await.unwrap().spec.role;
    assert_eq!(role, NodeRole::Drained, "the drained node takes no new member");
    // The budget (two healthy of three) allows one disruption at a time,
    // whatever the drain's own parallelism.
    let fewest = fewest_ready.into_inner();
    assert_eq!(fewest, 2, "one member down at a time, and one was");
    eprintln!("drained {drained} (two members) in {took:?}; at least {fewest} of 3 ready throughout");
}

/// Role `db` of [`three_members_and_a_budget`]'s App leads: a lease of
/// 10 s, renewed by the holder's heartbeats, fenced at 7 s.
fn db_leader() -> LeaderSpec {
    let hook = |script: &str| LeaderHook { script: script.into(), timeout: HumanDuration::from_secs(30) };
    LeaderSpec {
        lease_duration: HumanDuration::from_secs(10),
        renew_deadline: HumanDuration::from_secs(7),
        retry_period: HumanDuration::from_secs(2),
        promote: hook("promote"),
        demote: hook("demote"),
        position: None,
        synchronous: false,
    }
}

/// (holder, its run, term) of role `db` in cluster `c`.
async fn leader(objects: &Objects) -> Option<(String, String, u64)> {
    let cluster = objects.require::<AppClusterSpec>("c").await.unwrap();
    let leader = cluster.status.leaders.into_iter().find(|l| l.role == "db")?;
    Some((leader.member?, leader.instance?, leader.term))
}

/// Three members of a leading role `db` on n1..n3, configured and ready,
/// one leading in term 1.
async fn led_cluster() -> TestCluster {
    let cluster = TestCluster::start(&["n1", "n2", "n3"]).await;
    three_members_and_a_budget_led(&cluster, true, Some(db_leader())).await;
    cluster.until("every member configured and ready", 60 * SECOND, all_configured_and_ready).await;
    cluster.until("a leader in term 1", 10 * SECOND, async |o| leader(o).await.is_some_and(|(_, _, t)| t == 1)).await;
    cluster
}

#[tokio::test(start_paused = true)]
async fn a_roles_leader_is_renewed_by_its_heartbeats_and_replaced_only_once_its_lease_expired() {
    let cluster = led_cluster().await;
    let (first, run, _) = leader(&cluster.objects).await.unwrap();
    let node = cluster.objects.require::<MemberSpec>(&first).await.unwrap().spec.node.unwrap();
    cluster.until("a renewal", 5 * SECOND, async |_| !cluster.renewed(&node).is_empty()).await;
    let renewal = &cluster.renewed(&node)[0];
    assert_eq!((&renewal.member, &renewal.instance, renewal.term), (&first, &run, 1));
    assert_eq!(renewal.renew_deadline, HumanDuration::from_secs(7));
    let others: Vec<String> = ["n1", "n2", "n3"].into_iter().filter(|n| *n != node).map(String::from).collect();
    assert!(others.iter().all(|n| cluster.renewed(n).is_empty()), "only the holder's node renews");

    // Its node falls silent: no one else leads before its lease expired.
    cluster.silence(&node, true);
    let held = cluster
        .until("the lease expires", 30 * SECOND, async |o| leader(o).await.is_none_or(|(m, _, _)| m != first))
        .await;
    assert!(held >= 9750 * Duration::from_millis(1) && held <= 12 * SECOND, "a new leader after {held:?}");
    let (second, _, term) = leader(&cluster.objects).await.unwrap();
    assert_eq!(term, 2);
    let second_node = cluster.objects.require::<MemberSpec>(&second).await.unwrap().spec.node.unwrap();
    cluster
        .until("the new leader renewed", 5 * SECOND, async |_| {
            cluster.renewed(&second_node).iter().any(|r| r.term == 2)
        })
        .await;

    // The old holder's node speaks again: its member leads nothing.
    cluster.silence(&node, false);
    cluster.beat().await;
    assert!(cluster.renewed(&node).is_empty(), "the old term is never renewed: {:?}", cluster.renewed(&node));
    eprintln!("{first} led in term 1; {second} in term 2, granted {held:?} after {node} fell silent");
}

/// A switchover of role `db` to `to`, with a deadline of `deadline_s`.
async fn switch_over(objects: &Objects, to: &str, deadline_s: u64) {
    let action = OperationAction::Switchover { cluster: "c".into(), role: "db".into(), to: Some(to.into()) };
    let spec = OperationSpec {
        action,
        deadline: Some(HumanDuration::from_secs(deadline_s)),
        on_deadline: OnDeadline::Fail,
        max_parallel: 1,
        cancel: false,
        paused: false,
    };
    objects.create(Object::new("switchover", spec), false, false).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_switchover_demotes_the_leader_and_promotes_the_member_asked_for_without_waiting_for_the_lease() {
    let cluster = led_cluster().await;
    let (first, _, _) = leader(&cluster.objects).await.unwrap();
    let node = cluster.objects.require::<MemberSpec>(&first).await.unwrap().spec.node.unwrap();
    let to = members(&cluster.objects).await.into_iter().map(|m| m.metadata.name).find(|m| *m != first).unwrap();

    switch_over(&cluster.objects, &to, 30).await;
    let took = cluster
        .until("the switchover succeeded", 10 * SECOND, async |o| {
            o.require::<OperationSpec>("switchover").await.unwrap().status.phase.is_finished()
        })
        .await;
    let op = cluster.objects.require::<OperationSpec>("switchover").await.unwrap();
    assert_eq!(op.status.phase, OperationPhase::Succeeded, "{:?}", op.status);
    let (second, _, term) = leader(&cluster.objects).await.unwrap();
    assert_eq!((second.as_str(), term), (to.as_str(), 2));
    // Far sooner than the 10 s lease: the old leader stood down.
    assert!(took < 3 * SECOND, "handed over in {took:?}");
    let old = cluster.objects.require::<MemberSpec>(&first).await.unwrap();
    assert_eq!(old.status.stood_down.map(|s| s.term), Some(1), "it stood down from term 1");
    cluster.beat().await;
    assert!(cluster.renewed(&node).is_empty(), "the old term is never renewed: {:?}", cluster.renewed(&node));
    eprintln!("{first} handed role db over to {second} in {took:?}: {}", op.status.message.unwrap_or_default());
}

#[tokio::test(start_paused = true)]
async fn a_switchover_the_budget_does_not_allow_asks_nothing_of_the_leader_and_fails_at_its_deadline() {
    let cluster = led_cluster().await;
    let (first, _, _) = leader(&cluster.objects).await.unwrap();
    let strict = |budget: &mut Object<DisruptionBudgetSpec>| {
        budget.spec.min_available = Some(Amount::Count(3));
        Ok::<_, ObjectsError>(true)
    };
    cluster.objects.modify("c", Part::Spec, strict).await.unwrap();
    cluster.until("the budget allows nothing", 10 * SECOND, async |o| budget(o).await == (3, 0)).await;
    let to = members(&cluster.objects).await.into_iter().map(|m| m.metadata.name).find(|m| *m != first).unwrap();

    switch_over(&cluster.objects, &to, 5).await;
    cluster
        .until("the switchover ended", 20 * SECOND, async |o| {
            o.require::<OperationSpec>("switchover").await.unwrap().status.phase.is_finished()
        })
        .await;
    let op = cluster.objects.require::<OperationSpec>("switchover").await.unwrap();
    assert_eq!(op.status.phase, OperationPhase::Failed);
    let message = op.status.message.unwrap_or_default();
    assert!(message.starts_with("the deadline (5s) passed with the leader not asked to stand down"), "{message}");
    assert_eq!(op.status.handover, None);
    assert_eq!(leader(&cluster.objects).await.map(|(m, _, t)| (m, t)), Some((first, 1)), "the leader stays");
}

#[tokio::test(start_paused = true)]
async fn a_cluster_deleted_and_created_again_under_its_name_gets_new_members_once_the_old_are_removed() {
    let cluster = TestCluster::start(&["n1", "n2", "n3"]).await;
    three_members_and_a_budget(&cluster, true).await;
    cluster.until("every member configured and ready", 60 * SECOND, all_configured_and_ready).await;
    let old = cluster.objects.require::<AppClusterSpec>("c").await.unwrap();
    cluster.objects.delete_if_present::<AppClusterSpec>("c").await.unwrap();
    let again = Object::new("c", old.spec.clone());
    let again = cluster.objects.create(again, false, false).await.unwrap();
    let uid = again.metadata.uid.clone();
    assert_ne!(uid, old.metadata.uid);
    cluster
        .until("three members of the new cluster, configured and ready", 60 * SECOND, async |o| {
            let members = members(o).await;
            all_configured_and_ready(o).await
                && members.iter().all(|m| m.metadata.owner_references.iter().all(|r| Some(&r.uid) == uid.as_ref()))
        })
        .await;
}
