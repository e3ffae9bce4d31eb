//! The planner on snapshots: a rule each, and properties over random
//! clusters (one member per slot, no Command beside an unsettled one,
//! and a plan carried out plans nothing more until something changes).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::api::MemberReport;
use crate::kinds::app::{AppRole, NamedPort, SetupScript};
use crate::kinds::app_cluster::{AppClusterSpec, ClusterRole};
use crate::kinds::command::{MemberRun, VolumeSpec};
use crate::kinds::member::member_name;
use crate::kinds::{Action, Answer, CommandOrigin, CommandSpec, ManagementState, NodeSpec, Purpose};
use crate::placement::{NodeLoad, allocate_ports};
use crate::resources::Amounts;

struct Nodes(Vec<Arc<Node>>);

impl NodeIndex for Nodes {
    fn node(&self, name: &str) -> Option<&Node> {
        self.0.iter().find(|n| n.metadata.name == name).map(|n| &**n)
    }
    fn all(&self) -> &[Arc<Node>] {
        &self.0
    }
    fn runs(&self, name: &str) -> bool {
        self.0.iter().any(|n| n.status.members.iter().any(|r| r.name == name && r.wanted))
    }
}

/// Places on the node `place` picks, ports and loads counted per node.
#[derive(Default)]
struct Ledger {
    members: HashMap<String, NodeLoad>,
    ports: HashMap<String, BTreeSet<u16>>,
}

impl Placer for Ledger {
    fn book(
        &mut self,
        _member: &str,
        requests: &Amounts,
        place: &PlaceOne<'_>,
        wanted: &[NamedPort],
        range: RangeInclusive<u16>,
    ) -> Result<(String, BTreeMap<String, u16>), Refused> {
        let node = match place(&|node: &str| self.members.get(node).copied().unwrap_or_default()) {
            Placement::Bound(node) => node,
            Placement::Unplaceable(why) => return Err(Refused::Unplaceable(why)),
        };
        let taken = self.ports.entry(node.clone()).or_default();
        let ports = allocate_ports(wanted, taken, range).map_err(Refused::NoPorts)?;
        taken.extend(ports.values());
        self.members.entry(node.clone()).or_default().add(requests);
        Ok((node, ports))
    }

    fn rebook(&mut self, node: &Node, from: &Amounts, to: &Amounts) -> Result<(), String> {
        let load = self.members.entry(node.metadata.name.clone()).or_default();
        if let Some(why) = crate::placement::no_room_to_rebook(node, load, from, to) {
            return Err(why);
        }
        load.requested = load.requested.minus(from).plus(to);
        Ok(())
    }
}

fn at(secs: u64) -> Timestamp {
    Timestamp::parse("2026-12-06T10:00:00Z").unwrap().plus(Duration::from_secs(secs))
}

fn node(name: &str, ready: bool, reports: Vec<MemberReport>) -> Arc<Node> {
    let mut node = Node::new(name, NodeSpec::default());
    node.status.ready = ready;
    node.status.address = Some(format!("127.0.0.{}:7000", name.len()));
    node.status.members = reports;
    Arc::new(node)
}

fn app(persistent: bool) -> AppSpec {
    let run = MemberRun {
        command: vec!["sleep".into(), "1000".into()],
        volumes: vec![VolumeSpec { name: "data".into(), persistent }],
        ..Default::default()
    };
    let setup = Some(SetupScript { script: "true".into(), ..Default::default() });
    let role = |name: &str| AppRole {
        name: name.into(),
        run: run.clone(),
        ports: vec![NamedPort { name: "client".into() }],
        setup: setup.clone(),
        notifies: vec!["a".into(), "b".into()],
        ..Default::default()
    };
    AppSpec { roles: vec![role("a"), role("b")], ..Default::default() }
}

fn cluster(a: u32, b: u32) -> AppCluster {
    let role = |name: &str, members| ClusterRole { name: name.into(), members, ..Default::default() };
    let mut cluster = AppCluster::new(
        "db",
        AppClusterSpec { app_ref: "app".into(), roles: vec![role("a", a), role("b", b)], ..Default::default() },
    );
    cluster.metadata.uid = Some("uid-db".into());
    cluster.metadata.generation = 1;
    cluster
}

fn member(role: &str, index: u32, node: Option<&str>) -> Member {
    let mut member = crate::kinds::member::slot_member(role, index, node);
    member.metadata.resource_version = Some("1".into());
    member.spec.app_revision = Some(APP_REVISION);
    member.metadata.owner_references.push(crate::meta::OwnerReference {
        kind: "AppCluster".into(),
        name: "db".into(),
        uid: "uid-db".into(),
    });
    member
}

#[derive(Clone, Debug)]
struct World {
    cluster: AppCluster,
    app: Option<AppSpec>,
    members: Vec<Member>,
    commands: Vec<Arc<Command>>,
    nodes: Vec<Arc<Node>>,
    not_ready: BTreeMap<String, Duration>,
    leases: BTreeMap<String, Duration>,
    heard: BTreeMap<String, Duration>,
    handovers: Vec<(String, crate::kinds::operation::Handover)>,
    /// The App as of revisions other than the cluster's.
    revisions: BTreeMap<i64, AppSpec>,
    now: Timestamp,
}

impl World {
    /// The same world with the nodes Ready as `ready` says.
    fn clone_with_nodes(&self, ready: [bool; 3]) -> World {
        let nodes = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let mut n = Node::clone(n);
                n.status.ready = ready[i];
                Arc::new(n)
            })
            .collect();
        World {
            cluster: self.cluster.clone(),
            app: self.app.clone(),
            members: self.members.clone(),
            commands: self.commands.clone(),
            nodes,
            not_ready: self.not_ready.clone(),
            leases: self.leases.clone(),
            heard: self.heard.clone(),
            handovers: self.handovers.clone(),
            revisions: self.revisions.clone(),
            now: self.now,
        }
    }

    fn plan(&self) -> Plan {
        let nodes = Nodes(self.nodes.clone());
        let settings = AppClusterSettings::default();
        let revisions: BTreeMap<i64, &AppSpec> = self.revisions.iter().map(|(r, app)| (*r, app)).collect();
        let snapshot = Snapshot {
            cluster: &self.cluster,
            app: self.app.as_ref(),
            app_revision: self.app.as_ref().map(|_| APP_REVISION),
            revisions: &revisions,
            settings: &settings,
            members: self.members.clone(),
            commands: &self.commands,
            nodes: &nodes,
            not_ready: &self.not_ready,
            leases: &self.leases,
            heard: &self.heard,
            handovers: &self.handovers,
            now: self.now,
        };
        let mut ledger = Ledger::default();
        let mut next = 0;
        let mut ids = || {
            next += 1;
            format!("id{next}")
        };
        plan(&snapshot, &mut ledger, &mut ids)
    }

    /// The world after `plan` was carried out in full: every write landed,
    /// every Command created (issued, nothing reported yet), the outcomes
    /// recorded deleted.
    fn after(&self, plan: &Plan) -> World {
        let mut members: BTreeMap<String, Member> =
            self.members.iter().map(|m| (m.metadata.name.clone(), m.clone())).collect();
        let mut commands = self.commands.clone();
        for program in &plan.programs {
            for write in &program.writes {
                match write {
                    Write::Create(m) => {
                        let mut m = m.clone();
                        m.metadata.resource_version = Some("1".into());
                        members.insert(m.metadata.name.clone(), m);
                    }
                    Write::Spec(m) => {
                        let stored = members.get_mut(&program.member).expect("a member to write");
                        stored.spec = m.spec.clone();
                    }
                    Write::Status(m) => {
                        members.get_mut(&program.member).expect("a member to write").status = m.status.clone()
                    }
                }
            }
            let done: BTreeSet<&str> = program.outcomes.iter().map(|c| c.metadata.name.as_str()).collect();
            commands.retain(|c| !done.contains(c.metadata.name.as_str()));
            for planned in &program.commands {
                commands.push(Arc::new(planned.command.clone()));
            }
            if program.delete {
                members.remove(&program.member);
            }
        }
        let mut cluster = self.cluster.clone();
        let mut leases = self.leases.clone();
        if let Some(status) = &plan.status {
            // A new term's lease counts from its grant, as the leader's
            // clock counts it.
            for leader in &status.leaders {
                let before = cluster.status.leaders.iter().find(|l| l.role == leader.role).map(|l| l.term);
                if before != Some(leader.term) {
                    leases.insert(leader.role.clone(), Duration::ZERO);
                }
            }
            cluster.status = status.clone();
        }
        World {
            cluster,
            app: self.app.clone(),
            members: members.into_values().collect(),
            commands,
            nodes: self.nodes.clone(),
            not_ready: self.not_ready.clone(),
            leases,
            heard: self.heard.clone(),
            handovers: self.handovers.clone(),
            revisions: self.revisions.clone(),
            now: self.now,
        }
    }
}

/// The App's generation the worlds' passes read.
const APP_REVISION: i64 = 7;

fn settled(member: &Member, purpose: Purpose, action: Action, success: bool) -> Arc<Command> {
    let origin =
        CommandOrigin { cluster: "db".into(), member: member.metadata.name.clone(), purpose, app_revision: None };
    let spec =
        CommandSpec { node: member.spec.node.clone().unwrap_or_default(), timeout: None, action, origin: Some(origin) };
    let mut command = Command::new(format!("{}.c", member.metadata.name), spec);
    command.status.state_by_management = if success { ManagementState::Completed } else { ManagementState::Failed };
    command.status.answer = Some(Answer::said(success, if success { "done" } else { "no such program" }));
    Arc::new(command)
}

fn world(members: Vec<Member>, nodes: Vec<Arc<Node>>) -> World {
    World {
        cluster: cluster(2, 0),
        app: Some(app(false)),
        members,
        commands: Vec::new(),
        nodes,
        not_ready: BTreeMap::new(),
        leases: BTreeMap::new(),
        heard: BTreeMap::new(),
        handovers: Vec::new(),
        revisions: BTreeMap::new(),
        now: at(0),
    }
}

#[test]
fn rule_a_new_cluster_creates_its_members_bound_and_starts_them_once_created() {
    let plan = world(vec![], vec![node("n1", true, vec![]), node("n2", true, vec![])]).plan();
    assert_eq!(plan.programs.len(), 2);
    let mut nodes = BTreeSet::new();
    for program in &plan.programs {
        let [Write::Create(created)] = &program.writes[..] else { panic!("{program:?}") };
        nodes.insert(created.spec.node.clone().expect("bound as it is created"));
        assert!(created.spec.ports.contains_key("client"));
        assert!(program.notes.iter().any(|n| n.reason == EventReason::MemberPlaced), "{program:?}");
        let [planned] = &program.commands[..] else { panic!("{program:?}") };
        assert!(matches!(planned.command.spec.action, Action::StartMember { .. }) && planned.issued);
        let origin = planned.command.spec.origin.as_ref().unwrap();
        assert_eq!(origin.app_revision, Some(APP_REVISION), "the run is of the App as read");
    }
    assert_eq!(nodes.len(), 2, "spread over both nodes");
    assert_eq!(plan.status.and_then(|s| s.app_revision), Some(APP_REVISION));
    assert!(plan.in_flight);
}

#[test]
fn rule_no_command_goes_to_a_node_that_is_not_ready() {
    let bound = member("a", 0, Some("n1"));
    let plan = world(vec![bound], vec![node("n1", false, vec![]), node("n2", true, vec![])]).plan();
    let program = plan.programs.iter().find(|p| p.member == "db-a-0");
    assert!(program.is_none_or(|p| p.commands.is_empty()), "{program:?}");
}

#[test]
fn rule_a_settled_failure_is_recorded_and_its_command_deleted_with_that_status() {
    let bound = member("a", 0, Some("n1"));
    let start = Action::StartMember { member: bound.metadata.name.clone(), run: MemberRun::default() };
    let mut w = world(vec![bound.clone()], vec![node("n1", true, vec![])]);
    w.commands.push(settled(&bound, Purpose::Start, start, false));
    let plan = w.plan();
    let program = plan.programs.iter().find(|p| p.member == "db-a-0").unwrap();
    assert_eq!(program.outcomes.len(), 1, "the outcome goes with the status that records it");
    let Some(Write::Status(written)) = program.writes.last() else { panic!("{program:?}") };
    assert_eq!(written.status.reason.as_deref(), Some("starting it failed: no such program"));
    assert!(program.commands.is_empty(), "it waits before starting it again");
}

#[test]
fn rule_a_member_runs_the_app_revision_its_last_successful_start_was_of() {
    let bound = member("a", 0, Some("n1"));
    let start = || Action::StartMember { member: bound.metadata.name.clone(), run: MemberRun::default() };
    let of = |revision: i64, success: bool| {
        let mut command = (*settled(&bound, Purpose::Start, start(), success)).clone();
        command.spec.origin.as_mut().unwrap().app_revision = Some(revision);
        Arc::new(command)
    };
    let revision_after = |command: Arc<Command>, before: Option<i64>| {
        let mut member = bound.clone();
        member.status.app_revision = before;
        let mut w = world(vec![member], vec![node("n1", true, vec![])]);
        w.commands.push(command);
        let plan = w.plan();
        let program = plan.programs.iter().find(|p| p.member == "db-a-0").unwrap();
        let Some(Write::Status(written)) = program.writes.last() else { panic!("{program:?}") };
        written.status.app_revision
    };
    assert_eq!(revision_after(of(5, true), Some(4)), Some(5));
    assert_eq!(revision_after(of(5, false), Some(4)), Some(4), "a start that failed changes nothing it runs");
}

/// A configured member running instance `i1` on n1, at revision 6 of an
/// App whose revision 6 ran `sleep 6`, asked to restart as `to`.
fn restarting_as(to: i64) -> World {
    let mut bound = member("a", 0, Some("n1"));
    bound.spec.app_revision = Some(to);
    bound.spec.requests.restart = Some(at(0));
    bound.status.state = MemberState::Configured;
    bound.status.app_revision = Some(6);
    bound.status.state_detail.last_configured_instance = Some("i1".into());
    bound.status.state_detail.last_setup_generation = Some(1);
    let running =
        MemberReport { name: "db-a-0".into(), running: true, instance_id: Some("i1".into()), ..Default::default() };
    let mut w = world(vec![bound], vec![node("n1", true, vec![running])]);
    let mut old = app(false);
    old.roles[0].run.command = vec!["sleep".into(), "6".into()];
    w.revisions.insert(6, old);
    w
}

/// The run member db-a-0's StartMember asks for once its instance is
/// stopped, with the revision that start is stamped with; and whether its
/// setup is to run again.
fn started_run(w: World) -> (Vec<String>, Option<i64>, bool) {
    let stopping = w.plan();
    let program = stopping.programs.iter().find(|p| p.member == "db-a-0").unwrap();
    assert!(
        matches!(
            program.commands[..],
            [Planned { command: Command { spec: CommandSpec { action: Action::StopMember { .. }, .. }, .. }, .. }]
        ),
        "{program:?}"
    );
    let mut stopped = w.after(&stopping);
    stopped.commands.clear();
    stopped.nodes = vec![node("n1", true, vec![])];
    let member = &stopped.members[0];
    let setup_again = member.status.state_detail.last_setup_generation.is_none();
    let starting = stopped.plan();
    let program = starting.programs.iter().find(|p| p.member == "db-a-0").unwrap();
    let [Planned { command, .. }] = &program.commands[..] else { panic!("{program:?}") };
    let Action::StartMember { run, .. } = &command.spec.action else { panic!("{command:?}") };
    (run.command.clone(), command.spec.origin.as_ref().and_then(|o| o.app_revision), setup_again)
}

#[test]
fn rule_a_member_restarts_as_the_revision_it_is_to_run_and_runs_its_setup_again_when_that_changed() {
    let (command, revision, setup_again) = started_run(restarting_as(6));
    assert_eq!(
        (command.join(" "), revision, setup_again),
        ("sleep 6".into(), Some(6), false),
        "a rolling restart keeps its revision"
    );
    let (command, revision, setup_again) = started_run(restarting_as(APP_REVISION));
    assert_eq!(
        (command.join(" "), revision, setup_again),
        ("sleep 1000".into(), Some(APP_REVISION), true),
        "an upgrade"
    );
}

#[test]
fn rule_a_member_restarted_as_a_revision_that_asks_for_more_is_booked_for_it_or_left_running_saying_why() {
    for (cores, refused) in [(1, true), (4, false)] {
        let mut w = restarting_as(APP_REVISION);
        let mut app = w.app.clone().unwrap();
        app.roles[0].run.resources = serde_json::from_value(serde_json::json!({"cpu": "2"})).unwrap();
        w.app = Some(app);
        let mut n1 = Node::clone(&w.nodes[0]);
        n1.status.allocatable = Some(serde_json::from_value(serde_json::json!({"cpu": cores})).unwrap());
        w.nodes = vec![Arc::new(n1)];
        let plan = w.plan();
        let program = plan.programs.iter().find(|p| p.member == "db-a-0").unwrap();
        let last = program.writes.last().map(|w| match w {
            Write::Create(m) | Write::Spec(m) | Write::Status(m) => m.clone(),
        });
        let member = last.unwrap();
        match refused {
            true => {
                let stops =
                    program.commands.iter().filter(|p| matches!(p.command.spec.action, Action::StopMember { .. }));
                assert_eq!(stops.count(), 0, "not stopped: {program:?}");
                let why = member.status.restart_refused.unwrap_or_default();
                assert_eq!(
                    why,
                    "not restarted as revision 7, for want of room on its node (n1: cpu 2 requested, 1 of 1 allocatable left)"
                );
                assert!(program.notes.iter().any(|n| n.reason == EventReason::MemberRestartRefused));
            }
            false => {
                assert_eq!(member.spec.resources.cpu.to_string(), "2", "booked for what revision 7 requests");
                assert!(matches!(
                    program.commands[..],
                    [Planned {
                        command: Command { spec: CommandSpec { action: Action::StopMember { .. }, .. }, .. },
                        ..
                    }]
                ));
            }
        }
    }
}

#[test]
fn rule_a_member_whose_revision_is_not_kept_is_left_as_it_is_and_says_why() {
    let mut lost = member("a", 0, Some("n1"));
    lost.spec.app_revision = Some(3);
    lost.status.state = MemberState::Configured;
    lost.status.state_detail.last_configured_instance = Some("i1".into());
    let plan = world(vec![lost], vec![node("n1", true, vec![])]).plan();
    let program = plan.programs.iter().find(|p| p.member == "db-a-0").unwrap();
    assert!(program.commands.is_empty(), "{program:?}");
    let Some(Write::Status(written)) = program.writes.last() else { panic!("{program:?}") };
    let why = written.status.reason.as_deref().unwrap_or_default();
    assert!(why.contains("revision 3 of App app, which it is to run, is not kept"), "{why}");
}

#[test]
fn rule_a_member_never_configured_takes_the_clusters_new_revision_and_is_restarted_if_it_runs() {
    let mut broken = member("a", 0, Some("n1"));
    broken.spec.app_revision = Some(6);
    broken.status.state = MemberState::ConfigError;
    broken.status.state_detail.configuring_instance = Some("i1".into());
    let running =
        MemberReport { name: "db-a-0".into(), running: true, instance_id: Some("i1".into()), ..Default::default() };
    let plan = world(vec![broken], vec![node("n1", true, vec![running])]).plan();
    let program = plan.programs.iter().find(|p| p.member == "db-a-0").unwrap();
    let Some(Write::Spec(written)) = program.writes.first() else { panic!("{program:?}") };
    assert_eq!(written.spec.app_revision, Some(APP_REVISION));
    assert!(written.spec.requests.restart.is_some(), "it runs: restarted as the new revision");
    assert!(program.notes.iter().any(|n| n.reason == EventReason::MemberTakesRevision));
}

#[test]
fn rule_a_member_made_before_members_had_a_revision_is_given_the_one_it_runs() {
    let mut old = member("a", 0, Some("n1"));
    old.spec.app_revision = None;
    old.status.app_revision = Some(6);
    let mut unstarted = member("b", 0, None);
    unstarted.spec.app_revision = None;
    let plan = world(vec![old, unstarted], vec![node("n1", true, vec![])]).plan();
    for (name, revision) in [("db-a-0", 6), ("db-b-0", APP_REVISION)] {
        let program = plan.programs.iter().find(|p| p.member == name).unwrap();
        let Some(Write::Spec(written)) = program.writes.first() else { panic!("{program:?}") };
        assert_eq!(written.spec.app_revision, Some(revision), "{name}");
    }
}

#[test]
fn rule_a_member_of_a_node_lost_past_the_grace_is_replaced_status_first() {
    let mut lost = member("a", 0, Some("n1"));
    lost.status.state = MemberState::Configured;
    lost.status.state_detail.last_configured_instance = Some("i1".into());
    let mut w = world(vec![lost], vec![node("n1", false, vec![]), node("n2", true, vec![])]);
    w.not_ready.insert("n1".into(), Duration::from_secs(301));
    let plan = w.plan();
    let program = plan.programs.iter().find(|p| p.member == "db-a-0").unwrap();
    let [Write::Status(first), Write::Spec(unbound), ..] = &program.writes[..] else { panic!("{program:?}") };
    assert_eq!(first.spec.node.as_deref(), Some("n1"), "the status first, while still bound");
    assert_eq!(unbound.spec.node, None);
    assert!(program.notes.iter().any(|n| n.reason == EventReason::MemberReplaced));
}

#[test]
fn rule_a_cluster_whose_app_is_missing_says_so() {
    let mut w = world(vec![], vec![node("n1", true, vec![])]);
    w.app = None;
    let plan = w.plan();
    assert!(plan.programs.is_empty());
    let reason = plan.status.and_then(|s| s.reason).unwrap_or_default();
    assert!(reason.contains("does not exist"), "{reason}");
}

#[test]
fn rule_a_slot_whose_old_member_still_runs_is_filled_only_once_it_is_gone() {
    let running = MemberReport { name: "db-a-0".into(), wanted: true, running: true, ..Default::default() };
    let plan = world(vec![], vec![node("n1", true, vec![running]), node("n2", true, vec![])]).plan();
    assert!(plan.programs.iter().all(|p| p.member != "db-a-0"), "{plan:?}");
    assert!(plan.programs.iter().any(|p| p.member == "db-a-1"));
}

/// A random member of slot `index` of `role`.
fn any_member() -> impl Strategy<Value = (String, u32, Option<u8>, u8, Option<u8>, bool)> {
    (
        prop_oneof![Just("a".to_string()), Just("b".to_string())],
        0u32..5,
        proptest::option::of(0u8..3),
        0u8..6,
        proptest::option::of(0u8..3),
        any::<bool>(),
    )
}

/// A random cluster: its members in any state, bound to any of three
/// nodes (Ready or not), reported running or not, some with a Command.
fn any_world() -> impl Strategy<Value = World> {
    (
        0u32..4,
        0u32..4,
        any::<bool>(),
        proptest::collection::vec(any_member(), 0..8),
        proptest::collection::vec(any::<bool>(), 3),
        proptest::collection::vec((0usize..8, 0u8..4), 0..4),
    )
        .prop_map(|(a, b, persistent, picked, ready, commands)| {
            let states = [
                MemberState::CreatePending,
                MemberState::Creating,
                MemberState::Configured,
                MemberState::ConfigError,
                MemberState::DeletePending,
                MemberState::Deleting,
            ];
            let mut members: BTreeMap<String, Member> = BTreeMap::new();
            let mut reports: Vec<Vec<MemberReport>> = vec![Vec::new(); 3];
            for (role, index, on, state, instance, running) in picked {
                let node = on.map(|n| format!("n{n}"));
                let mut m = member(&role, index, node.as_deref());
                let instance = instance.map(|i| format!("i{i}"));
                // Only a bound member with an instance is being set up or was.
                m.status.state = match states[state as usize] {
                    MemberState::Creating | MemberState::Configured | MemberState::ConfigError
                        if node.is_none() || instance.is_none() =>
                    {
                        MemberState::CreatePending
                    }
                    state => state,
                };
                m.status.state_detail.configuring_instance = instance.clone();
                if matches!(m.status.state, MemberState::Configured | MemberState::ConfigError) {
                    m.status.state_detail.last_configured_instance = instance.clone();
                }
                if let Some(n) = on {
                    reports[n as usize].push(MemberReport {
                        name: m.metadata.name.clone(),
                        wanted: true,
                        running,
                        instance_id: instance,
                        cluster: Some("db".into()),
                        ..Default::default()
                    });
                }
                members.insert(m.metadata.name.clone(), m);
            }
            let members: Vec<Member> = members.into_values().collect();
            let mut unsettled = Vec::new();
            for (which, kind) in commands {
                let Some(m) = members.get(which) else { continue };
                let stop = Action::StopMember { member: m.metadata.name.clone() };
                let command = match kind {
                    0 => {
                        let mut c = (*settled(m, Purpose::Restart, stop, true)).clone();
                        c.status.state_by_management = ManagementState::Created;
                        c.status.answer = None;
                        Arc::new(c)
                    }
                    1 => settled(m, Purpose::Remove, Action::RemoveMember { member: m.metadata.name.clone() }, true),
                    2 => settled(m, Purpose::Start, stop, false),
                    _ => settled(m, Purpose::Restart, stop, true),
                };
                if unsettled.iter().all(|c: &Arc<Command>| c.metadata.name != command.metadata.name) {
                    unsettled.push(command);
                }
            }
            let nodes = (0..3).map(|n| node(&format!("n{n}"), ready[n], reports[n].clone())).collect();
            World {
                cluster: cluster(a, b),
                app: Some(app(persistent)),
                members,
                commands: unsettled,
                nodes,
                not_ready: BTreeMap::new(),
                leases: BTreeMap::new(),
                heard: BTreeMap::new(),
                handovers: Vec::new(),
                revisions: BTreeMap::new(),
                now: at(0),
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn one_member_per_slot_and_no_command_beside_an_unsettled_one(w in any_world()) {
        let plan = w.plan();
        let existing: BTreeSet<&str> = w.members.iter().map(|m| m.metadata.name.as_str()).collect();
        let mut created = BTreeSet::new();
        for program in &plan.programs {
            for write in &program.writes {
                if let Write::Create(m) = write {
                    prop_assert!(!existing.contains(m.metadata.name.as_str()), "{} exists", m.metadata.name);
                    prop_assert!(created.insert(m.metadata.name.clone()), "{} created twice", m.metadata.name);
                    let role = w.cluster.spec.role(&m.spec.role).expect("a role of the spec");
                    prop_assert!(m.spec.index < role.members, "{} is past its role's count", m.metadata.name);
                    prop_assert_eq!(&m.metadata.name, &member_name("db", &m.spec.role, m.spec.index));
                }
            }
            prop_assert!(program.commands.len() <= 1, "one Command at a time: {:?}", program);
            // One left on a node the member is no longer on does not hold it.
            let node = w.members.iter().find(|m| m.metadata.name == program.member).map(|m| m.spec.node.as_ref());
            let unsettled = w.commands.iter().any(|c| {
                c.spec.origin_member() == Some(program.member.as_str())
                    && !c.status.state_by_management.is_settled()
                    && node.is_none_or(|node| concerns(c, node))
            });
            prop_assert!(
                !unsettled || program.commands.is_empty(),
                "a second Command for {}: {:?}\nmembers {:?}\ncommands {:?}\nnodes {:?}",
                program.member,
                program.commands.iter().map(|c| &c.command.metadata.name).collect::<Vec<_>>(),
                w.members.iter().map(|m| (&m.metadata.name, m.status.state, &m.spec.node)).collect::<Vec<_>>(),
                w.commands.iter().map(|c| (&c.metadata.name, c.status.state_by_management)).collect::<Vec<_>>(),
                w.nodes.iter().map(|n| (&n.metadata.name, n.status.ready, n.status.members.len())).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn carried_out_with_no_agent_acting_its_plans_come_to_rest_and_give_no_member_two_commands(w in any_world()) {
        let mut world = w;
        let mut given: BTreeMap<String, usize> = BTreeMap::new();
        for _ in 0..6 {
            let plan = world.plan();
            if plan.programs.iter().all(|p| p.writes.is_empty() && p.commands.is_empty() && !p.delete) {
                return Ok(());
            }
            for program in &plan.programs {
                let count = given.entry(program.member.clone()).or_default();
                *count += program.commands.len();
                prop_assert!(*count <= 1, "{} given a second Command while its first is unsettled", program.member);
            }
            world = world.after(&plan);
        }
        prop_assert!(false, "still changing after six passes: {:?}", world.plan());
    }
}

/// Three members of role `a` configured and ready, each on its own node
/// (`n0`..`n2`, Ready as `ready` says), each running as `run-<index>`;
/// role `a` has a leader.
fn led_world(ready: [bool; 3]) -> World {
    let mut members = Vec::new();
    let mut nodes = Vec::new();
    for i in 0..3u32 {
        let node_name = format!("n{i}");
        let mut m = member("a", i, Some(&node_name));
        m.status.state = MemberState::Configured;
        m.status.ready = true;
        m.status.state_detail.last_configured_instance = Some(format!("run-{i}"));
        let report = MemberReport {
            name: m.metadata.name.clone(),
            wanted: true,
            running: true,
            instance_id: Some(format!("run-{i}")),
            ..MemberReport::default()
        };
        nodes.push(node(&node_name, ready[i as usize], vec![report]));
        members.push(m);
    }
    let mut app = app(false);
    app.roles.truncate(1);
    app.roles[0].notifies.clear();
    let hook = |script: &str| crate::kinds::app::LeaderHook {
        script: script.into(),
        timeout: crate::time::HumanDuration::from_secs(30),
    };
    app.roles[0].leader = Some(crate::kinds::app::LeaderSpec {
        lease_duration: crate::time::HumanDuration::from_secs(10),
        renew_deadline: crate::time::HumanDuration::from_secs(7),
        retry_period: crate::time::HumanDuration::from_secs(2),
        promote: hook("promote"),
        demote: hook("demote"),
        position: None,
        synchronous: false,
    });
    let mut world = world(members, nodes);
    world.heard = (0..3).map(|i| (format!("n{i}"), Duration::from_secs(1))).collect();
    world.cluster = cluster(3, 0);
    world.app = Some(app);
    world
}

fn leader_of(world: &World) -> &crate::kinds::app_cluster::RoleLeader {
    world.cluster.status.leaders.iter().find(|l| l.role == "a").expect("role a has a leader record")
}

/// The world after `passes` passes, each one's Commands carried out with
/// success before the next; the Events the passes told and the Commands
/// they planned.
fn carried_out(world: World, passes: usize) -> (World, Vec<Note>, Vec<Command>) {
    carried_out_answering(world, passes, &|_| None)
}

/// As [`carried_out`], a Command answered with what `answers` says of it
/// (a success with no facts when it says nothing).
fn carried_out_answering(
    mut world: World,
    passes: usize,
    answers: &dyn Fn(&Command) -> Option<Answer>,
) -> (World, Vec<Note>, Vec<Command>) {
    let (mut notes, mut planned) = (Vec::new(), Vec::new());
    for _ in 0..passes {
        let plan = world.plan();
        notes.extend(plan.programs.iter().flat_map(|p| p.notes.clone()));
        planned.extend(plan.programs.iter().flat_map(|p| p.commands.iter().map(|c| c.command.clone())));
        world = world.after(&plan);
        world.commands = world
            .commands
            .iter()
            .map(|c| {
                let mut c = Command::clone(c);
                if c.status.answer.is_none() {
                    let answer = answers(&c).unwrap_or_else(|| Answer::said(true, "done"));
                    c.status.state_by_management =
                        if answer.success { ManagementState::Completed } else { ManagementState::Failed };
                    c.status.answer = Some(answer);
                }
                Arc::new(c)
            })
            .collect();
    }
    (world, notes, planned)
}

#[test]
fn rule_a_leader_role_is_granted_a_term_kept_while_its_leader_runs_and_moved_once_its_lease_expired() {
    let (granted, notes, _) = carried_out(led_world([true; 3]), 4);
    let leader = leader_of(&granted).clone();
    assert_eq!((leader.member.as_deref(), leader.instance.as_deref(), leader.term), (Some("db-a-0"), Some("run-0"), 1));
    assert_eq!(leader.transitions.len(), 1);
    assert!(notes.iter().any(|n| n.reason == EventReason::RoleLeaderGranted), "{notes:?}");

    // Renewed: nothing changes. Its lease's end is looked at (no renewal
    // may come before it, and nothing else may make a pass then).
    let (steady, _, _) = carried_out(granted, 2);
    assert_eq!(leader_of(&steady), &leader);
    let mut renewed = steady.clone_with_nodes([true; 3]);
    renewed.leases.insert("a".into(), Duration::from_secs(3));
    assert_eq!(renewed.plan().look_again_in, Some(Duration::from_secs(7)), "looked at again when the lease would end");

    // Its node goes NotReady: the lease holds until it expires.
    let mut lost = steady.clone_with_nodes([false, true, true]);
    lost.leases.insert("a".into(), Duration::from_secs(4));
    assert_eq!(lost.plan().look_again_in, Some(Duration::from_secs(6)), "looked at again when the lease ends");
    let (waiting, _, _) = carried_out(lost, 1);
    let leader = leader_of(&waiting);
    assert_eq!((leader.member.as_deref(), leader.term), (Some("db-a-0"), 1));
    assert!(leader.waiting.as_deref().unwrap_or("").contains("waiting for its lease to run out"), "{leader:?}");

    // Expired: once the others' Commands (their new configmeta) are done,
    // the next term goes to one of them, told to promote itself.
    let mut expired = waiting;
    expired.leases.insert("a".into(), Duration::from_secs(10));
    let (moved, _, planned) = carried_out(expired, 3);
    let leader = leader_of(&moved);
    assert_eq!((leader.member.as_deref(), leader.term, leader.waiting.as_deref()), (Some("db-a-1"), 2, None));
    assert_eq!(leader.transitions.iter().map(|t| t.term).collect::<Vec<_>>(), [1, 2]);
    let is_promote = |c: &&Command| matches!(c.spec.origin.as_ref().map(|o| &o.purpose), Some(Purpose::Promote { .. }));
    let promotes: Vec<&Command> = planned.iter().filter(is_promote).collect();
    let [promote] = &promotes[..] else { panic!("one promote: {planned:?}") };
    let Action::Promote { member, script, expected_instance, catch_up_to } = &promote.spec.action else {
        panic!("{promote:?}")
    };
    assert_eq!(member, "db-a-1");
    assert_eq!(
        (script.as_str(), expected_instance.as_str(), catch_up_to),
        ("HERD_LEADER_TERM=2\nexport HERD_LEADER_TERM\npromote", "run-1", &None),
        "a lease that expired leaves nothing to catch up to"
    );
}

/// The world with each member's position command having printed
/// `positions[i]` (and, for the first, `sync` naming members in sync).
fn with_positions(world: &World, positions: [&str; 3], sync: &[&str]) -> World {
    let mut world = world.clone_with_nodes([true; 3]);
    world.nodes = world
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let mut n = Node::clone(n);
            for report in &mut n.status.members {
                let said = format!("{}\nsync {}\n", positions[i], sync.join(" "));
                let instance = report.instance_id.clone().unwrap_or_default();
                report.position = Some(crate::api::PositionReport::parse(&instance, &said));
            }
            Arc::new(n)
        })
        .collect();
    world
}

#[test]
fn rule_the_most_advanced_member_leads_and_with_synchronous_only_one_in_sync_may_follow() {
    let world = with_positions(&led_world([true; 3]), ["0/30", "0/10", "0/20"], &["db-a-1"]);
    let (led, _, _) = carried_out(world, 5);
    let leader = leader_of(&led).clone();
    assert_eq!((leader.member.as_deref(), leader.term), (Some("db-a-0"), 1), "the most advanced");
    assert_eq!(leader.in_sync, ["db-a-1"], "as the leader said");

    // A look that says nothing of who is in sync (its command failed: the
    // leader's server shutting down) keeps the record; `sync` alone
    // clears it.
    let mut silent = led.clone_with_nodes([true; 3]);
    let mut node = Node::clone(&silent.nodes[0]);
    for report in &mut node.status.members {
        let instance = report.instance_id.clone().unwrap_or_default();
        report.position = Some(crate::api::PositionReport { instance_id: instance, ..Default::default() });
    }
    silent.nodes[0] = Arc::new(node);
    let (kept, _, _) = carried_out(silent, 2);
    assert_eq!(leader_of(&kept).in_sync, ["db-a-1"], "kept: nothing was said of it");
    let none = with_positions(&led, ["0/30", "0/10", "0/20"], &[]);
    let (cleared, _, _) = carried_out(none, 2);
    assert!(leader_of(&cleared).in_sync.is_empty(), "the leader said none is in sync");

    // The leader is lost: the next is the most advanced of the others...
    let mut lost = led.clone_with_nodes([false, true, true]);
    lost.leases.insert("a".into(), Duration::from_secs(10));
    let (moved, _, _) = carried_out(lost.clone(), 3);
    assert_eq!(leader_of(&moved).member.as_deref(), Some("db-a-2"), "0/20 is ahead of 0/10");

    // ...unless synchronous: only the one in sync, even though behind.
    let mut synchronous = lost;
    if let Some(app) = &mut synchronous.app {
        let leader = app.roles[0].leader.as_mut().unwrap();
        leader.synchronous = true;
        leader.position = Some(crate::kinds::app::LeaderHook {
            script: "pos".into(),
            timeout: crate::time::HumanDuration::from_secs(5),
        });
    }
    let (moved, _, _) = carried_out(synchronous, 3);
    let leader = leader_of(&moved);
    assert_eq!((leader.member.as_deref(), leader.term), (Some("db-a-1"), 2), "{leader:?}");
}

#[test]
fn rule_a_leader_whose_promote_hook_failed_is_not_renewed_and_the_next_is_chosen_once_its_lease_expired() {
    let promote_fails = |c: &Command| {
        let promoting = matches!(c.spec.origin.as_ref().map(|o| &o.purpose), Some(Purpose::Promote { term: 1 }));
        promoting.then(|| script_failed("pg_ctl: could not promote"))
    };
    let (failed, notes, _) = carried_out_answering(led_world([true; 3]), 5, &promote_fails);
    let leader = leader_of(&failed).clone();
    assert_eq!((leader.member.as_deref(), leader.term, leader.revoked), (Some("db-a-0"), 1, true), "{leader:?}");
    let told = notes.iter().find(|n| n.reason == EventReason::RoleLeaderWaiting).expect("an Event says why");
    assert!(told.message.contains("pg_ctl: could not promote"), "{}", told.message);
    let member = failed.members.iter().find(|m| m.metadata.name == "db-a-0").unwrap();
    assert!(!member.status.leader, "it does not lead");

    // Its lease expires unrenewed: the next leader is another member.
    let mut expired = failed;
    expired.leases.insert("a".into(), Duration::from_secs(10));
    let (moved, _, _) = carried_out(expired, 3);
    let leader = leader_of(&moved);
    assert_eq!((leader.member.as_deref(), leader.term, leader.revoked), (Some("db-a-1"), 2, false), "{leader:?}");
}

/// A script's failure as its agent answers it.
fn script_failed(stderr: &str) -> Answer {
    let details = crate::kinds::AnswerDetails::Script { exit_code: 1, stdout: String::new(), stderr: stderr.into() };
    Answer { success: false, message: "the script exited with 1".into(), details }
}

#[test]
fn rule_a_new_leader_is_announced_to_the_members_that_listen_and_promoted_within_its_hooks_timeout() {
    let mut world = led_world([true; 3]);
    if let Some(app) = &mut world.app {
        app.roles[0].notifies = vec!["a".into()];
    }
    // One member of the role at a time (its notify order): enough passes for both.
    let (granted, _, planned) = carried_out(world, 8);
    assert_eq!(leader_of(&granted).member.as_deref(), Some("db-a-0"));
    let promote = planned
        .iter()
        .find(|c| matches!(c.spec.origin.as_ref().map(|o| &o.purpose), Some(Purpose::Promote { .. })))
        .expect("a promote");
    assert_eq!(promote.spec.timeout, Some(crate::time::HumanDuration::from_secs(30)), "the hook's timeout");
    let told: Vec<&Command> = planned
        .iter()
        .filter(|c| match c.spec.origin.as_ref().map(|o| &o.purpose) {
            Some(Purpose::Notify { arguments }) => arguments.first().map(String::as_str) == Some("--leader"),
            _ => false,
        })
        .collect();
    let mut who: Vec<&str> = told.iter().map(|c| c.spec.action.member()).collect();
    who.sort();
    assert_eq!(who, ["db-a-1", "db-a-2"], "every other member of the role, not the leader itself");
    let Some(Purpose::Notify { arguments }) = told[0].spec.origin.as_ref().map(|o| &o.purpose) else { unreachable!() };
    assert_eq!(arguments, &["--leader", "--role", "a", "--members", "db-a-0", "--term", "1"]);
}

#[test]
fn rule_a_handover_demotes_the_leader_first_and_promotes_the_one_asked_for_at_once_caught_up_to_it() {
    let world = with_positions(&led_world([true; 3]), ["0/30", "0/10", "0/20"], &[]);
    let (led, _, _) = carried_out(world, 5);
    assert_eq!((leader_of(&led).member.as_deref(), leader_of(&led).term), (Some("db-a-0"), 1));
    let mut asked = led;
    let handover = crate::kinds::operation::Handover { from: "db-a-0".into(), term: 1, to: Some("db-a-1".into()) };
    asked.handovers = vec![("a".into(), handover)];
    let stood_down = |c: &Command| {
        matches!(c.spec.action, Action::Demote { .. }).then(|| Answer {
            success: true,
            message: "stood down".into(),
            details: crate::kinds::AnswerDetails::StoodDown { position: "0/31".into() },
        })
    };
    // One pass asks the leader to stand down; its lease is renewed no more.
    let (demoting, _, planned) = carried_out_answering(asked.clone(), 1, &|_| Some(Answer::said(true, "x")));
    let [demote] = &planned[..] else { panic!("one Command: {planned:?}") };
    assert_eq!(demote.spec.action, Action::Demote { member: "db-a-0".into(), term: 1 });
    let leader = leader_of(&demoting);
    assert!(leader.revoked && leader.member.as_deref() == Some("db-a-0"), "{leader:?}");
    // Once it stood down, the one asked for (not the most advanced) leads
    // at once, its promote caught up to where the old leader stood down.
    let (moved, _, planned) = carried_out_answering(asked, 3, &stood_down);
    let leader = leader_of(&moved);
    assert_eq!((leader.member.as_deref(), leader.term, leader.revoked), (Some("db-a-1"), 2, false), "{leader:?}");
    assert!(leader.transitions[1].reason.starts_with("db-a-0 stood down (term 1); db-a-1 was asked for"));
    let promote = planned.iter().find(|c| matches!(c.spec.action, Action::Promote { .. })).expect("a promote");
    let Action::Promote { member, catch_up_to, .. } = &promote.spec.action else { unreachable!() };
    assert_eq!((member.as_str(), catch_up_to.as_deref()), ("db-a-1", Some("0/31")));
    let old = moved.members.iter().find(|m| m.metadata.name == "db-a-0").unwrap();
    assert!(!old.status.leader, "the old leader leads no more");
}

#[test]
fn rule_a_handover_waits_while_the_member_asked_for_may_not_lead() {
    let world = with_positions(&led_world([true; 3]), ["0/30", "0/10", "0/20"], &[]);
    let (led, _, _) = carried_out(world, 5);
    let mut led = led.clone_with_nodes([true, false, true]);
    let handover = crate::kinds::operation::Handover { from: "db-a-0".into(), term: 1, to: Some("db-a-1".into()) };
    led.handovers = vec![("a".into(), handover)];
    let (waiting, _, planned) = carried_out(led, 2);
    assert!(planned.iter().all(|c| !matches!(c.spec.action, Action::Demote { .. })), "{planned:?}");
    let leader = leader_of(&waiting);
    assert_eq!((leader.member.as_deref(), leader.term, leader.revoked), (Some("db-a-0"), 1, false));
}

#[test]
fn rule_a_leader_whose_promote_was_never_carried_out_is_asked_again_until_it_is_promoted() {
    let mut world = led_world([true; 3]);
    // The pass that grants term 1: its Commands are never created (its
    // writes went stale).
    let mut granted = loop {
        let after = world.after(&world.plan());
        if after.cluster.status.leaders.iter().any(|l| l.term == 1) {
            break after;
        }
        world = carried_out(world, 1).0;
    };
    granted.commands.retain(|c| !matches!(c.spec.action, Action::Promote { .. }));
    let (promoted, _, planned) = carried_out(granted, 3);
    let promotes: Vec<&Command> = planned.iter().filter(|c| matches!(c.spec.action, Action::Promote { .. })).collect();
    assert_eq!(promotes.len(), 1, "asked again, once: {planned:?}");
    let member = promoted.members.iter().find(|m| m.metadata.name == "db-a-0").unwrap();
    assert_eq!(member.status.promoted_in, Some(1));
    let (steady, _, planned) = carried_out(promoted, 2);
    assert!(planned.iter().all(|c| !matches!(c.spec.action, Action::Promote { .. })), "promoted: not again");
    assert_eq!(leader_of(&steady).term, 1);
}
