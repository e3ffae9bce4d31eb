//! Members moved with their data (`herd_core::migration`): an evicted
//! member with persistent volumes gets a target (recorded in its status
//! before anything is issued), a MigrateMember Command on the target, and
//! once that succeeded its binding moves there; its new instance is then
//! a restart that keeps its data and runs its setup again. A failed move
//! leaves it where it was, saying why.

use herd_core::disruption::APPROVAL_TIMEOUT;
use herd_core::kinds::{Action, AppSpec, EventReason, EventType, Migration, Purpose};
use herd_core::migration::{MigrationStep, given_up, migration_step, rebound, request_lapsed};

use super::commands::{command_for, member_run};
use super::{AppClusterController, Pass};
use crate::objects::{ObjectsError, now};

impl AppClusterController {
    pub(super) async fn migrate_members(&self, pass: &mut Pass<'_>, app: &AppSpec) -> Result<(), ObjectsError> {
        for i in 0..pass.members.len() {
            let member = &pass.members[i];
            if pass.unwritten.contains(&member.metadata.name) {
                continue;
            }
            let Some(app_role) = app.role(&member.spec.role) else { continue };
            match migration_step(member, pass.busy.contains(&member.metadata.name)) {
                MigrationStep::Nothing => {}
                MigrationStep::Choose => match self.move_target(pass, i, app_role) {
                    Ok((to, ports)) => {
                        let member = &mut pass.members[i];
                        let from = member.spec.node.clone().unwrap_or_default();
                        member.status.reason = Some(format!("moving to {to} with its data"));
                        member.status.migration = Some(Migration { from, to, ports, ..Default::default() });
                        self.issue_migration(pass, i, app).await?;
                    }
                    Err(why) if request_lapsed(&pass.members[i], now()) => self.lapse(pass, i, &why).await?,
                    Err(why) => pass.members[i].status.reason = Some(format!("cannot move it now: {why}")),
                },
                MigrationStep::Issue => self.issue_migration(pass, i, app).await?,
                MigrationStep::Rebind => self.rebind(pass, i).await?,
                MigrationStep::GiveUp(why) => {
                    let member = &mut pass.members[i];
                    member.status = given_up(&member.status, &why);
                    let mut kept = self.objects.update_status(member.clone(), false).await?;
                    kept.spec.requests.migrate = None;
                    let kept = self.objects.update(kept, false).await?;
                    let message = kept.status.reason.clone().unwrap_or_default();
                    self.events.record(&kept, EventType::Warning, EventReason::MemberMoveFailed, message).await;
                    pass.stored.insert(kept.metadata.name.clone(), kept.status.clone());
                    pass.members[i] = kept;
                }
            }
        }
        Ok(())
    }

    /// Drops a move that could not start while its approval held: the
    /// member stays, and whoever asked (a drain) asks the budgets again.
    async fn lapse(&self, pass: &mut Pass<'_>, i: usize, why: &str) -> Result<(), ObjectsError> {
        let mut member = pass.members[i].clone();
        member.spec.requests.migrate = None;
        let status = member.status.clone();
        let mut kept = self.objects.update(member, false).await?;
        kept.status = status;
        let message = format!(
            "its eviction lapsed: no node could take it within {}s of its approval ({why}); it stays, and is \
             evicted again only if its budgets allow then",
            APPROVAL_TIMEOUT.as_secs()
        );
        kept.status.reason = Some(message.clone());
        self.events.record(&kept, EventType::Warning, EventReason::MemberEvictionLapsed, message).await;
        pass.members[i] = kept;
        Ok(())
    }

    /// Stores the member's status (its target) and issues the
    /// MigrateMember Command on the target; a stale copy issues nothing.
    async fn issue_migration(&self, pass: &mut Pass<'_>, i: usize, app: &AppSpec) -> Result<(), ObjectsError> {
        self.write_statuses(pass, [i]).await?;
        let member = &pass.members[i];
        let (Some(migration), Some(app_role), Some(cluster_role)) =
            (member.status.migration.as_ref(), app.role(&member.spec.role), pass.cluster.spec.role(&member.spec.role))
        else {
            return Ok(());
        };
        if pass.unwritten.contains(&member.metadata.name) {
            return Ok(());
        }
        let mut there = member.clone();
        there.spec.node = Some(migration.to.clone());
        there.spec.ports = migration.ports.clone();
        let run = member_run(pass.cluster, app_role, cluster_role, &there);
        let action =
            Action::MigrateMember { member: member.metadata.name.clone(), from_node: migration.from.clone(), run };
        let Some(command) = command_for(&pass.cluster.metadata.name, &there, Purpose::Migrate, action) else {
            return Ok(());
        };
        match crate::commands::create(&self.objects, command, false).await {
            Ok(_) => {
                let message = format!("moving from {} to {} with its data", migration.from, migration.to);
                self.events.record(member, EventType::Normal, EventReason::MemberMoving, message).await;
            }
            // Held by a Command the caches had not shown yet: next pass.
            Err(ObjectsError::Held(why)) => tracing::info!(member = %member.metadata.name, %why, "member busy"),
            Err(error) => return Err(error),
        }
        pass.busy.insert(member.metadata.name.clone());
        Ok(())
    }

    /// Binds a member that runs on its target there (the spec first: a
    /// leader that stops in between finds it bound there and the move
    /// done, and only writes the status).
    async fn rebind(&self, pass: &mut Pass<'_>, i: usize) -> Result<(), ObjectsError> {
        let Some(migration) = pass.members[i].status.migration.clone() else { return Ok(()) };
        let mut member = pass.members[i].clone();
        if member.spec.node.as_deref() != Some(migration.to.as_str()) {
            member.spec.node = Some(migration.to.clone());
            member.spec.ports = migration.ports.clone();
            member.spec.requests.migrate = None;
            let status = member.status.clone();
            member = self.objects.update(member, false).await?;
            member.status = status;
        }
        member.status = rebound(&member.status);
        let written = self.objects.update_status(member, false).await?;
        let message = written.status.reason.clone().unwrap_or_default();
        self.events.record(&written, EventType::Normal, EventReason::MemberMoved, message).await;
        pass.stored.insert(written.metadata.name.clone(), written.status.clone());
        pass.members[i] = written;
        Ok(())
    }
}
