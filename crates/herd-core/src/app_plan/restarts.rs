//! Members restarted in place (a rolling restart, `crate::restart`): the
//! instance being replaced recorded in the member's status before its
//! StopMember is issued, then a StartMember with its usual settings; once
//! another instance runs the request is dropped (the spec first, so a
//! leader that stops in between never restarts it twice), and the new
//! instance goes through the cluster's restart path.

use crate::kinds::{Action, AppSpec, EventReason, EventType, Purpose};
use crate::member_sync::command_due;
use crate::restart::{RestartStep, begin_restart, restart_step};

use super::sync::{issue, member_run};
use super::{Work, Write, report};

pub(super) fn restart_members(work: &mut Work<'_, '_>, app: &AppSpec) {
    let cluster = work.snap.cluster;
    for i in 0..work.members.len() {
        let member = &work.members[i];
        let (Some(app_role), Some(cluster_role)) = (app.role(&member.spec.role), cluster.spec.role(&member.spec.role))
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
            RestartStep::Stop => {
                let instance = report.and_then(|r| r.instance_id.clone()).unwrap_or_default();
                work.members[i].status = begin_restart(&work.members[i].status, &instance);
                issue(work, i, Purpose::Restart, Action::StopMember { member: name });
            }
            RestartStep::Start => {
                let run = member_run(cluster, app_role, cluster_role, member, work.snap.settings);
                issue(work, i, Purpose::Start, Action::StartMember { member: name, run });
            }
            RestartStep::Finish => finish(work, i),
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
