//! Members restarted in place (a rolling restart, `herd_core::restart`):
//! the instance being replaced recorded in the member's status before its
//! StopMember is issued, then a StartMember with its usual settings; once
//! another instance runs the request is dropped (the spec first, so a
//! leader that stops in between never restarts it twice), and the new
//! instance goes through the cluster's restart path.

use herd_core::kinds::{Action, AppSpec, EventReason, EventType, Purpose};
use herd_core::restart::{RestartStep, begin_restart, restart_step};

use herd_core::member_sync::command_due;

use super::commands::member_run;
use super::issuing::Issue;
use super::{AppClusterController, Pass};
use crate::objects::{ObjectsError, now};

impl AppClusterController {
    pub(super) async fn restart_members(&self, pass: &mut Pass<'_>, app: &AppSpec) -> Result<(), ObjectsError> {
        let mut issues = Vec::new();
        for i in 0..pass.members.len() {
            let member = &pass.members[i];
            let (Some(app_role), Some(cluster_role)) =
                (app.role(&member.spec.role), pass.cluster.spec.role(&member.spec.role))
            else {
                continue;
            };
            let report = pass.nodes.report(member);
            let name = member.metadata.name.clone();
            let step = restart_step(member, report, pass.busy.contains(&name));
            // A stop or start that failed waits before the next (as any of its Commands).
            if matches!(step, RestartStep::Stop | RestartStep::Start) && !command_due(&member.status, now()) {
                continue;
            }
            match step {
                RestartStep::Nothing => {}
                RestartStep::Stop => {
                    let instance = report.and_then(|r| r.instance_id.clone()).unwrap_or_default();
                    pass.members[i].status = begin_restart(&pass.members[i].status, &instance);
                    let action = Action::StopMember { member: name };
                    issues.push(Issue { member: i, purpose: Purpose::Restart, action });
                }
                RestartStep::Start => {
                    let run = member_run(pass.cluster, app_role, cluster_role, member);
                    let action = Action::StartMember { member: name, run };
                    issues.push(Issue { member: i, purpose: Purpose::Start, action });
                }
                RestartStep::Finish => self.finish_restart(pass, i).await?,
            }
        }
        self.issue_all(pass, issues).await
    }

    async fn finish_restart(&self, pass: &mut Pass<'_>, i: usize) -> Result<(), ObjectsError> {
        let mut member = pass.members[i].clone();
        if member.spec.requests.restart.take().is_some() {
            let status = member.status.clone();
            member = self.objects.update(member, false).await?;
            member.status = status;
        }
        let replaced = member.status.restart.take().map(|r| r.instance).unwrap_or_default();
        member.status.reason = None;
        let written = self.objects.update_status(member, false).await?;
        let message = format!("restarted in place (instance {replaced} replaced)");
        self.events.record(&written, EventType::Normal, EventReason::MemberRestartedInPlace, message).await;
        pass.stored.insert(written.metadata.name.clone(), written.status.clone());
        pass.members[i] = written;
        Ok(())
    }
}
