//! Members restarted in place (a rolling restart or an upgrade,
//! `crate::restart`): the instance being replaced recorded in the
//! member's status before its StopMember is issued, then a StartMember
//! with the run of the revision it is to run (an upgrade changed that
//! first; a member restarted as another revision runs that revision's
//! setup again); once another instance runs the request is dropped (the
//! spec first, so a leader that stops in between never restarts it
//! twice), and the new instance goes through the cluster's restart path.

use crate::kinds::{Action, EventReason, EventType, Purpose};
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
            RestartStep::Stop => stop(work, i, report.and_then(|r| r.instance_id.clone())),
            RestartStep::Start => {
                let run = member_run(cluster, app_role, cluster_role, member, work.snap.settings);
                issue(work, i, Purpose::Start, Action::StartMember { member: name, run });
            }
            // Its revision changed while it restarted (a revert that
            // overtook its upgrade): it restarts again, as that one.
            RestartStep::Finish if runs_another_revision(&work.members[i]) => {
                work.members[i].status.restart = None;
                stop(work, i, report.and_then(|r| r.instance_id.clone()));
            }
            RestartStep::Finish => finish(work, i),
        }
    }
}

/// Records the instance member `i` runs as the one its restart replaces,
/// and stops it.
fn stop(work: &mut Work<'_, '_>, i: usize, instance: Option<String>) {
    let member = &mut work.members[i];
    member.status = begin_restart(&member.status, &instance.unwrap_or_default());
    // Restarted as another revision (an upgrade, or its revert): that
    // revision's setup runs, data kept or not.
    if runs_another_revision(member) {
        member.status.state_detail.last_setup_generation = None;
    }
    let name = member.metadata.name.clone();
    issue(work, i, Purpose::Restart, Action::StopMember { member: name });
}

/// Whether `member` was started as another revision than the one it is
/// to run.
fn runs_another_revision(member: &crate::kinds::Member) -> bool {
    member.status.app_revision.is_some() && member.spec.app_revision != member.status.app_revision
}

/// Gives each member made before members had a revision the one it runs
/// (or, not started yet, the cluster's): from then on it keeps it until an
/// upgrade changes it.
pub(super) fn record_revisions(work: &mut Work<'_, '_>) {
    for i in 0..work.members.len() {
        let member = &mut work.members[i];
        if member.spec.app_revision.is_none() {
            member.spec.app_revision = member.status.app_revision.or(work.snap.app_revision);
            if member.spec.app_revision.is_some() {
                work.write(i, Write::Spec);
            }
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
