//! Role sync and member sync: members created for the slots the spec asks
//! for (placed first when a node can take them) and sent away from the
//! others; each member then moved one step further (placed, started,
//! configured, removed), with the Command that does it; joins and
//! departures queue notifies, and the members whose turn it is are sent
//! their first pending one.

use std::collections::{BTreeMap, BTreeSet};

use crate::configmeta::{configmeta, digest_of};
use crate::kinds::app::{AppRole, HERD_VOLUME, SetupScript, UpgradeRules};
use crate::kinds::app_cluster::{AppCluster, ClusterRole};
use crate::kinds::cluster_config::AppClusterSettings;
use crate::kinds::command::{DrainHook, MemberRun, VolumeSpec};
use crate::kinds::{
    Action, AppSpec, Command, CommandOrigin, CommandSpec, EventReason, EventType, Member, MemberSpec, MemberState,
    Node, Purpose,
};
use crate::member_check::{Seen, check_member};
use crate::member_sync::{MemberFacts, Step, command_due, member_sync};
use crate::meta::OwnerReference;
use crate::notifies::{Change, notify_script, queue_notifies, to_send};
use crate::placement::{NodeLoad, place};
use crate::role_sync::{MemberChange, role_sync};
use crate::time::HumanDuration;
use crate::upgrade_hooks::setup_to_run;

use super::check::check;
use super::{Refused, Snapshot, Work, Write, report};

/// How a member of `role` runs: the App's process with the cluster's
/// overrides, herd's variables (`HERD_CLUSTER`, `HERD_ROLE`, a
/// `HERD_PORT_<NAME>` per named port), herd's own volume (persistent
/// when any of the role's volumes is) and its log rotation (the role's,
/// or the cluster-wide `settings`').
pub fn member_run(
    cluster: &AppCluster,
    app_role: &AppRole,
    cluster_role: &ClusterRole,
    member: &Member,
    settings: &AppClusterSettings,
) -> MemberRun {
    let mut run = app_role.run.clone();
    run.logs = Some(app_role.run.logs.unwrap_or(settings.member_logs));
    run.env.extend(cluster_role.env.clone());
    run.env.insert("HERD_CLUSTER".into(), cluster.metadata.name.clone());
    run.env.insert("HERD_ROLE".into(), app_role.name.clone());
    for port in &app_role.ports {
        if let Some(number) = member.spec.ports.get(&port.name) {
            run.env.insert(port.variable(), number.to_string());
        }
    }
    let persistent = app_role.run.volumes.iter().any(|v| v.persistent);
    run.volumes.push(VolumeSpec { name: HERD_VOLUME.into(), persistent });
    run.readiness = app_role.readiness.clone();
    let hook = |h: &crate::kinds::app::LeaderHook| DrainHook { script: h.script.clone(), timeout: h.timeout };
    run.demote = app_role.leader.as_ref().map(|l| hook(&l.demote));
    run.position = app_role.leader.as_ref().and_then(|l| l.position.as_ref()).map(hook);
    run
}

/// A new Command (named with `id`) for `member` on its node, with its
/// origin; None when the member is not bound.
pub fn command_for(cluster: &str, member: &Member, purpose: Purpose, action: Action, id: &str) -> Option<Command> {
    let node = member.spec.node.clone()?;
    let name = format!("{}.{}.{id}", member.metadata.name, purpose.word());
    let timeout = match &action {
        Action::RunScript { .. } => Some(HumanDuration::from_secs(300)),
        _ => None,
    };
    let origin = CommandOrigin {
        cluster: cluster.to_string(),
        member: member.metadata.name.clone(),
        purpose,
        app_revision: None,
    };
    Some(Command::new(name, CommandSpec { node, timeout, action, origin: Some(origin) }))
}

/// Whether a Command concerns the member's node: it runs there, or moves
/// the member away from there.
pub fn concerns(command: &Command, node: Option<&String>) -> bool {
    let from = match &command.spec.action {
        Action::MigrateMember { from_node, .. } => Some(from_node),
        _ => None,
    };
    node.is_some_and(|node| *node == command.spec.node || from == Some(node))
}

/// Gives member `i` a Command created issued, when its node is Ready (a
/// NotReady node takes none; it is given its members' once back).
pub(super) fn issue(work: &mut Work<'_, '_>, i: usize, purpose: Purpose, action: Action) {
    let member = &work.members[i];
    let ready = member.spec.node.as_deref().and_then(|n| work.snap.nodes.node(n)).is_some_and(|n| n.status.ready);
    if !ready {
        return;
    }
    let id = work.fresh_id();
    if let Some(command) = command_for(&work.snap.cluster.metadata.name, &work.members[i], purpose, action, &id) {
        work.command(i, command, true);
    }
}

/// Picks a node for `member` among every node (its role's selector and
/// spread, its role's peers in the pass) and books its ports there.
fn book_node(
    work: &mut Work<'_, '_>,
    member: &Member,
    app_role: &AppRole,
) -> Result<(String, BTreeMap<String, u16>), Refused> {
    let no_selector = BTreeMap::new();
    let cluster = work.snap.cluster;
    let selector = cluster.spec.role(&member.spec.role).map_or(&no_selector, |r| &r.node_selector);
    let peers: Vec<&Member> = work.members.iter().filter(|m| m.spec.role == member.spec.role).collect();
    let spread = app_role.placement.spread;
    let nodes = work.snap.nodes.all();
    let place = |bound: &dyn Fn(&str) -> NodeLoad| place(member, selector, spread, nodes, &peers, bound);
    let (requests, range) = (&member.spec.resources, work.snap.settings.member_ports());
    work.placer.book(&member.metadata.name, requests, &place, &app_role.ports, range)
}

/// Where bound member `i` would move with its data: another node that
/// could take it now, and its ports there (booked), or why none can.
pub(super) fn move_target(
    work: &mut Work<'_, '_>,
    i: usize,
    app_role: &AppRole,
) -> Result<(String, BTreeMap<String, u16>), String> {
    let mut moving = work.members[i].clone();
    moving.status.moved_from = moving.spec.node.take();
    moving.spec.resources = app_role.run.resources.requests();
    book_node(work, &moving, app_role).map_err(|refused| match refused {
        Refused::Unplaceable(why) | Refused::NoPorts(why) => why,
    })
}

/// Member `i` bound to a node with its ports, or None (the reason in its
/// status, and an Event when no node can take it) when none can now.
fn binding(work: &mut Work<'_, '_>, i: usize, app_role: &AppRole) -> Option<Member> {
    let mut member = work.members[i].clone();
    member.spec.resources = app_role.run.resources.requests();
    match book_node(work, &member, app_role) {
        Ok((node, ports)) => {
            let mut bound = member;
            bound.spec.node = Some(node);
            bound.spec.ports = ports;
            Some(bound)
        }
        Err(Refused::Unplaceable(why)) => {
            if member.status.reason.as_deref() != Some(why.as_str()) {
                work.note(i, EventType::Warning, EventReason::Unplaceable, why.clone());
                work.members[i].status.reason = Some(why);
            }
            None
        }
        Err(Refused::NoPorts(why)) => {
            work.members[i].status.reason = Some(why);
            None
        }
    }
}

fn placed(work: &mut Work<'_, '_>, i: usize) {
    let message = format!("bound to node {}", work.members[i].spec.node.as_deref().unwrap_or("?"));
    work.note(i, EventType::Normal, EventReason::MemberPlaced, message);
}

/// Creates the members the spec asks for (each placed first when a node
/// can take it: one write, bound) and sends away the surplus.
pub(super) fn sync_roles(work: &mut Work<'_, '_>) {
    let cluster = work.snap.cluster;
    for change in role_sync(&cluster.metadata.name, &cluster.spec, &work.members) {
        match change {
            MemberChange::Create { name, role, index } => {
                // A slot whose former member still runs on a node (its
                // Member deleted) is filled once that is removed there.
                if work.snap.nodes.runs(&name) {
                    continue;
                }
                let mut member = Member::new(
                    name,
                    MemberSpec { cluster: cluster.metadata.name.clone(), role, index, ..Default::default() },
                );
                member.metadata.owner_references.push(OwnerReference {
                    kind: "AppCluster".into(),
                    name: cluster.metadata.name.clone(),
                    uid: cluster.metadata.uid.clone().unwrap_or_default(),
                });
                create(work, member);
            }
            MemberChange::MarkDeletePending { name } => {
                if let Some(member) = work.members.iter_mut().find(|m| m.metadata.name == name) {
                    member.status.state = MemberState::DeletePending;
                }
            }
            MemberChange::Delete { name } => {
                if let Some(member) = work.members.iter_mut().find(|m| m.metadata.name == name) {
                    member.status.state = MemberState::Deleting;
                }
            }
        }
    }
}

/// A new member, bound when a node can take it (checked as a bound member
/// its node does not report yet), or unbound with why in its status.
fn create(work: &mut Work<'_, '_>, mut member: Member) {
    member.spec.app_revision = work.snap.app_revision;
    let i = work.add(member);
    let Some(app_role) = work.snap.app_role(&work.members[i]) else {
        work.write(i, Write::Create);
        return;
    };
    if let Some(mut bound) = binding(work, i, app_role) {
        let persistent = app_role.run.volumes.iter().any(|v| v.persistent);
        let seen = Seen::from_report(None, app_role.readiness.is_some());
        check_member(&mut bound.status, seen, persistent, work.snap.now);
        work.members[i] = bound;
        work.write(i, Write::Create);
        placed(work, i);
    } else {
        work.write(i, Write::Create);
    }
}

/// Binds every unbound member waiting to be created that can be placed;
/// each binding is written before anything is started there.
fn place_all(work: &mut Work<'_, '_>) {
    for i in 0..work.members.len() {
        let member = &work.members[i];
        if member.spec.node.is_some() || member.status.state != MemberState::CreatePending {
            continue;
        }
        // Not one this pass creates: that was placed as it was created.
        if work.stored[i].is_none() {
            continue;
        }
        let Some(app_role) = work.snap.app_role(member) else { continue };
        if let Some(bound) = binding(work, i, app_role) {
            work.members[i].spec = bound.spec;
            work.write(i, Write::Spec);
            placed(work, i);
        }
    }
}

/// The nodes `members` are bound to.
fn near<'n>(work: &Work<'n, '_>) -> Vec<&'n Node> {
    let names: BTreeSet<&str> = work.members.iter().filter_map(|m| m.spec.node.as_deref()).collect();
    names.into_iter().filter_map(|name| work.snap.nodes.node(name)).collect()
}

/// Each member one step further; joins and departures queue notifies.
pub(super) fn sync_members(work: &mut Work<'_, '_>, app: &AppSpec) {
    let cluster = work.snap.cluster;
    let generation = cluster.metadata.generation;
    let now = work.snap.now;
    let (mut joined, mut leaving) = (Vec::new(), Vec::new());
    let mut forgotten = BTreeSet::new();
    place_all(work);
    let near = near(work);
    let digest = digest_of(cluster, &work.members, &near);
    for i in 0..work.members.len() {
        let Some(app_role) = work.snap.app_role(&work.members[i]) else {
            // Said, so that a member left as it is does not look stuck.
            let why = unknown_revision(work.snap, &work.members[i]);
            work.members[i].status.reason = Some(why);
            continue;
        };
        let member = &work.members[i];
        let setup = setup_of(work.snap, member, app_role);
        let was_configured = member.status.was_configured();
        let name = member.metadata.name.clone();
        let facts = MemberFacts {
            generation,
            bound: member.spec.node.is_some(),
            report: report(work.snap.nodes, member),
            has_setup: setup.is_some(),
            persistent: app_role.run.volumes.iter().any(|v| v.persistent),
            busy: work.busy.contains(&name),
            removed: work.removed.contains(&name),
            digest: Some(digest.as_str()),
        };
        let step = member_sync(&mut work.members[i].status, &facts);
        if !was_configured && work.members[i].status.state == MemberState::Configured {
            // Ready as of now when it runs (not a pass later): its
            // configmeta and the others' say so at once.
            check(work, i, now);
            let member = &work.members[i];
            joined.push((member.spec.role.clone(), name.clone()));
            let instance = member.status.state_detail.last_configured_instance.as_deref().unwrap_or("?");
            let message = format!("configured as instance {instance}");
            work.note(i, EventType::Normal, EventReason::MemberConfigured, message);
        }
        let member = &work.members[i];
        match step {
            // Placed by `place_all`, or by a later pass.
            Step::Place | Step::Wait => {}
            Step::Forget { announce } => {
                if announce {
                    leaving.push((member.spec.role.clone(), name.clone()));
                }
                let message = match &member.spec.node {
                    Some(node) => {
                        format!("removed from node {node} with its volumes: its cluster no longer asks for it")
                    }
                    None => "removed: its cluster no longer asks for it".to_string(),
                };
                work.note(i, EventType::Normal, EventReason::MemberRemoved, message);
                forgotten.insert(name);
            }
            Step::Start | Step::Configure { .. } | Step::Remove => {
                if let Some((purpose, action)) = step_command(work, i, step, &near) {
                    issue(work, i, purpose, action);
                }
            }
        }
    }
    while let Some(i) = work.members.iter().position(|m| forgotten.contains(&m.metadata.name)) {
        work.forget(i);
    }
    queue_notifies(app, &mut work.members, Change::Added, &joined, now);
    queue_notifies(app, &mut work.members, Change::Deleted, &leaving, now);
}

/// The Command that carries out `step` for member `i`, if one is due.
fn step_command(work: &Work<'_, '_>, i: usize, step: Step, near: &[&Node]) -> Option<(Purpose, Action)> {
    let cluster = work.snap.cluster;
    let member = &work.members[i];
    let (app_role, cluster_role) = (work.snap.app_role(member)?, cluster.spec.role(&member.spec.role)?);
    if !command_due(&member.status, work.snap.now) {
        return None;
    }
    let name = member.metadata.name.clone();
    match step {
        Step::Start => {
            let run = member_run(cluster, app_role, cluster_role, member, work.snap.settings);
            Some((Purpose::Start, Action::StartMember { member: name, run }))
        }
        Step::Configure { run_setup } => {
            let instance = match member.status.state {
                MemberState::Configured => member.status.state_detail.last_configured_instance.clone(),
                _ => member.status.state_detail.configuring_instance.clone(),
            };
            let instance = instance?;
            let meta = configmeta(cluster, &work.members, near, &name)?;
            let purpose = Purpose::Configure { generation: cluster.metadata.generation, digest: meta.digest() };
            // Compact: it is stored, watched and replicated with the
            // Command; the agent writes it out indented for people.
            let configmeta = serde_json::to_string(&meta).unwrap_or_default();
            let setup = setup_of(work.snap, member, app_role);
            let setup = setup.as_ref();
            let action = Action::ConfigureMember {
                member: name,
                expected_instance: instance,
                configmeta,
                setup_script: setup.map(|s| s.script.clone()),
                run_setup,
                setup_timeout: setup.map(|s| s.timeout),
            };
            Some((purpose, action))
        }
        Step::Remove => Some((Purpose::Remove, Action::RemoveMember { member: name })),
        _ => None,
    }
}

/// Why `member` has no role to run: the revision it is to run is not
/// kept, or has no role of its name.
fn unknown_revision(snap: &Snapshot<'_>, member: &Member) -> String {
    let app = &snap.cluster.spec.app_ref;
    let revision = snap.revision_of(member).map_or("?".to_string(), |r| r.to_string());
    match snap.app_of(member) {
        Some(_) => format!("revision {revision} of App {app} has no role {:?}: it is left as it is", member.spec.role),
        None => format!(
            "revision {revision} of App {app}, which it is to run, is not kept: it is left as it is until an upgrade \
             (`herd appcluster upgrade {}`) gives it a revision that is",
            snap.cluster.metadata.name
        ),
    }
}

/// What `member`'s setup runs: its role's, with the upgrade hooks of its
/// revision around it when it was restarted as that revision from another.
fn setup_of(snap: &Snapshot<'_>, member: &Member, app_role: &AppRole) -> Option<SetupScript> {
    let status = &member.status;
    let upgrade = status.upgraded_from.zip(status.app_revision).filter(|(from, to)| from != to);
    let rules = snap.app_of(member).map(|app| &app.upgrade);
    setup_to_run(app_role.setup.as_ref(), rules.unwrap_or(&UpgradeRules::default()), upgrade)
}

/// The members whose turn it is (one of a role at a time, unless its App
/// role asks for all at once) are sent their first pending notify.
pub(super) fn send_notifies(work: &mut Work<'_, '_>, app: &AppSpec) {
    let busy = work.busy.clone();
    let notifying = work.notifying.clone();
    let due = to_send(app, &work.members, &|m: &str| busy.contains(m), &|m: &str| notifying.contains(m), work.snap.now);
    for i in due {
        let member = &work.members[i];
        let (Some(notify), Some(setup)) = (
            member.status.state_detail.pending_notify_cmds.first(),
            work.snap.app_role(member).and_then(|r| r.setup.as_ref()),
        ) else {
            continue;
        };
        let action = Action::RunScript {
            member: member.metadata.name.clone(),
            script: notify_script(&setup.script, &notify.arguments),
            expected_instance: member.status.state_detail.last_configured_instance.clone(),
        };
        let purpose = Purpose::Notify { arguments: notify.arguments.clone() };
        issue(work, i, purpose, action);
    }
}
