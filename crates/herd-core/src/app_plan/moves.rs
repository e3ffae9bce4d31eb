//! Members moved with their data (`crate::migration`): an evicted member
//! with persistent volumes gets a target (recorded in its status before
//! anything is issued), a MigrateMember Command on the target, and once
//! that succeeded its binding moves there; its new instance is then a
//! restart that keeps its data and runs its setup again. A failed move
//! leaves it where it was, saying why.

use crate::disruption::APPROVAL_TIMEOUT;
use crate::kinds::{Action, EventReason, EventType, Migration, Purpose};
use crate::migration::{MigrationStep, given_up, migration_step, rebound, request_lapsed};

use super::sync::{command_for, member_run, move_target};
use super::{Work, Write};

pub(super) fn migrate_members(work: &mut Work<'_, '_>) {
    let now = work.snap.now;
    for i in 0..work.members.len() {
        let member = &work.members[i];
        let Some(app_role) = work.snap.app_role(member) else { continue };
        match migration_step(member, work.busy.contains(&member.metadata.name)) {
            MigrationStep::Nothing => {}
            MigrationStep::Choose => match move_target(work, i, app_role) {
                Ok((to, ports)) => {
                    let member = &mut work.members[i];
                    let from = member.spec.node.clone().unwrap_or_default();
                    member.status.reason = Some(format!("moving to {to} with its data"));
                    member.status.migration = Some(Migration { from, to, ports, ..Default::default() });
                    issue_migration(work, i);
                }
                Err(why) if request_lapsed(&work.members[i], now) => lapse(work, i, &why),
                Err(why) => work.members[i].status.reason = Some(format!("cannot move it now: {why}")),
            },
            MigrationStep::Issue => issue_migration(work, i),
            MigrationStep::Rebind => rebind(work, i),
            MigrationStep::GiveUp(why) => {
                let member = &mut work.members[i];
                member.status = given_up(&member.status, &why);
                work.write(i, Write::Status);
                work.members[i].spec.requests.migrate = None;
                work.write(i, Write::Spec);
                let message = work.members[i].status.reason.clone().unwrap_or_default();
                work.note(i, EventType::Warning, EventReason::MemberMoveFailed, message);
            }
        }
    }
}

/// Drops a move that could not start while its approval held: the
/// member stays, and whoever asked (a drain) asks the budgets again.
fn lapse(work: &mut Work<'_, '_>, i: usize, why: &str) {
    work.members[i].spec.requests.migrate = None;
    work.write(i, Write::Spec);
    let message = format!(
        "its eviction lapsed: no node could take it within {}s of its approval ({why}); it stays, and is \
         evicted again only if its budgets allow then",
        APPROVAL_TIMEOUT.as_secs()
    );
    work.members[i].status.reason = Some(message.clone());
    work.note(i, EventType::Warning, EventReason::MemberEvictionLapsed, message);
}

/// The MigrateMember Command on the target, issued once the status that
/// names the target is stored.
fn issue_migration(work: &mut Work<'_, '_>, i: usize) {
    let cluster = work.snap.cluster;
    let member = &work.members[i];
    let (Some(migration), Some(app_role), Some(cluster_role)) =
        (member.status.migration.as_ref(), work.snap.app_role(member), cluster.spec.role(&member.spec.role))
    else {
        return;
    };
    let mut there = member.clone();
    there.spec.node = Some(migration.to.clone());
    there.spec.ports = migration.ports.clone();
    let run = member_run(cluster, app_role, cluster_role, &there, work.snap.settings);
    let action = Action::MigrateMember { member: member.metadata.name.clone(), from_node: migration.from.clone(), run };
    let message = format!("moving from {} to {} with its data", migration.from, migration.to);
    let id = work.fresh_id();
    let Some(command) = command_for(&cluster.metadata.name, &there, Purpose::Migrate, action, &id) else { return };
    work.command(i, command, false);
    work.note(i, EventType::Normal, EventReason::MemberMoving, message);
}

/// Binds a member that runs on its target there (the spec first: a
/// leader that stops in between finds it bound there and the move done,
/// and only writes the status).
fn rebind(work: &mut Work<'_, '_>, i: usize) {
    let Some(migration) = work.members[i].status.migration.clone() else { return };
    let member = &mut work.members[i];
    if member.spec.node.as_deref() != Some(migration.to.as_str()) {
        member.spec.node = Some(migration.to.clone());
        member.spec.ports = migration.ports.clone();
        member.spec.requests.migrate = None;
        work.write(i, Write::Spec);
    }
    let member = &mut work.members[i];
    member.status = rebound(&member.status);
    work.write(i, Write::Status);
    let message = work.members[i].status.reason.clone().unwrap_or_default();
    work.note(i, EventType::Normal, EventReason::MemberMoved, message);
}
