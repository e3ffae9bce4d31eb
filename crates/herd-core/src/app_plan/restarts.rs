//! Members restarted in place (a rolling restart or an upgrade,
//! `crate::restart`): the instance being replaced recorded in the
//! member's status before its StopMember is issued, then a StartMember
//! with the run of the revision it is to run (an upgrade changed that
//! first; a member restarted as another revision runs that revision's
//! setup again); once another instance runs the request is dropped (the
//! spec first, so a leader that stops in between never restarts it
//! twice), and the new instance goes through the cluster's restart path.

use crate::kinds::AppRole;
use crate::kinds::{Action, EventReason, EventType, MemberState, Purpose};
use crate::member_sync::command_due;
use crate::restart::{RestartStep, begin_restart, restart_step};

use super::sync::{issue, member_run};
use super::{Work, Write, report};

pub(super) fn restart_members(work: &mut Work<'_, '_>) {
    let cluster = work.snap.cluster;
    for i in 0..work.members.len() {
        let member = &work.members[i];
        let (Some(app_role), Some(cluster_role)) = (work.snap.app_role(member), cluster.spec.role(&member.spec.role))
        else {
            continue;
        };
        let report = report(work.snap.nodes, member);
        let name = member.metadata.name.clone();
        let step = restart_step(member, report, work.busy.contains(&name));
        // A stop or start that failed waits before the next (as any of its Commands).
        if matches!(step, RestartStep::Stop | RestartStep::Start) && !command_due(&member.status, work.snap.now) {
            continue;
        }
        match step {
            RestartStep::Nothing => {}
            RestartStep::Stop => stop(work, i, app_role, report.and_then(|r| r.instance_id.clone())),
            RestartStep::Start => {
                let run = member_run(cluster, app_role, cluster_role, member, work.snap.settings);
                issue(work, i, Purpose::Start, Action::StartMember { member: name, run });
            }
            // Its revision changed while it restarted (a revert that
            // overtook its upgrade): it restarts again, as that one.
            RestartStep::Finish if runs_another_revision(&work.members[i]) => {
                work.members[i].status.restart = None;
                stop(work, i, app_role, report.and_then(|r| r.instance_id.clone()));
            }
            RestartStep::Finish => finish(work, i),
        }
    }
}

/// Records the instance member `i` runs as the one its restart replaces,
/// and stops it; one restarted as another revision is first booked on its
/// node as requesting what that revision's role does (or, when the node
/// has no room, left running and saying why).
fn stop(work: &mut Work<'_, '_>, i: usize, app_role: &AppRole, instance: Option<String>) {
    if runs_another_revision(&work.members[i])
        && let Err(why) = rebook(work, i, app_role)
    {
        let member = &mut work.members[i];
        if member.status.restart_refused.as_deref() != Some(why.as_str()) {
            member.status.restart_refused = Some(why.clone());
            member.status.reason = Some(why.clone());
            work.note(i, EventType::Warning, EventReason::MemberRestartRefused, why);
        }
        return;
    }
    let member = &mut work.members[i];
    member.status.restart_refused = None;
    member.status = begin_restart(&member.status, &instance.unwrap_or_default());
    // Restarted as another revision (an upgrade, or its revert): that
    // revision's setup runs, data kept or not, with its upgrade hooks.
    if runs_another_revision(member) {
        member.status.state_detail.last_setup_generation = None;
        member.status.upgraded_from = member.status.app_revision;
    }
    let name = member.metadata.name.clone();
    issue(work, i, Purpose::Restart, Action::StopMember { member: name });
}

/// Member `i` booked on its node as requesting what `app_role` does, when
/// that is not what it was booked for.
fn rebook(work: &mut Work<'_, '_>, i: usize, app_role: &AppRole) -> Result<(), String> {
    let member = &work.members[i];
    let wanted = app_role.run.resources.requests();
    if wanted == member.spec.resources {
        return Ok(());
    }
    let to = work.snap.revision_of(member).map_or("?".to_string(), |r| r.to_string());
    let node = member.spec.node.as_deref().and_then(|n| work.snap.nodes.node(n));
    let Some(node) = node else { return Err(format!("not restarted as revision {to}: its node is not known")) };
    work.placer
        .rebook(node, &member.spec.resources, &wanted)
        .map_err(|why| format!("not restarted as revision {to}, for want of room on its node ({why})"))?;
    work.members[i].spec.resources = wanted;
    work.write(i, Write::Spec);
    Ok(())
}

/// Whether `member` was started as another revision than the one it is
/// to run.
fn runs_another_revision(member: &crate::kinds::Member) -> bool {
    member.status.app_revision.is_some() && member.spec.app_revision != member.status.app_revision
}

/// Gives each member made before members had a revision the one it runs
/// (or, not started yet, the cluster's); and one never configured the
/// cluster's revision when that changed (it runs nothing worth keeping:
/// a fixed App fixes it), restarting it if it runs. From then on a member
/// keeps its revision until an upgrade changes it.
pub(super) fn record_revisions(work: &mut Work<'_, '_>) {
    let Some(target) = work.snap.app_revision else { return };
    for i in 0..work.members.len() {
        let member = &work.members[i];
        let running = report(work.snap.nodes, member).is_some_and(|r| r.running);
        let name = member.metadata.name.clone();
        let deleting = matches!(member.status.state, MemberState::DeletePending | MemberState::Deleting);
        match member.spec.app_revision {
            None => {
                work.members[i].spec.app_revision = Some(member.status.app_revision.unwrap_or(target));
                work.write(i, Write::Spec);
            }
            Some(revision)
                if revision != target && !member.status.was_configured() && !deleting && !work.busy.contains(&name) =>
            {
                let member = &mut work.members[i];
                member.spec.app_revision = Some(target);
                if running {
                    member.spec.requests.restart.get_or_insert(work.snap.now);
                }
                work.write(i, Write::Spec);
                let message = format!("it takes revision {target} of its App: it was never configured as {revision}");
                work.note(i, EventType::Normal, EventReason::MemberTakesRevision, message);
            }
            Some(_) => {}
        }
    }
}

fn finish(work: &mut Work<'_, '_>, i: usize) {
    if work.members[i].spec.requests.restart.take().is_some() {
        work.write(i, Write::Spec);
    }
    let member = &mut work.members[i];
    let replaced = member.status.restart.take().map(|r| r.instance).unwrap_or_default();
    member.status.reason = None;
    work.write(i, Write::Status);
    let message = format!("restarted in place (instance {replaced} replaced)");
    work.note(i, EventType::Normal, EventReason::MemberRestartedInPlace, message);
}
