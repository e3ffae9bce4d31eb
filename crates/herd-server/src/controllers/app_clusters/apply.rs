//! Carrying out a pass's plan (`herd_core::app_plan::Plan`). Each
//! member's program runs its writes in order, each over the revision the
//! one before it left (the first over the member as read), the programs
//! side by side so that their writes meet in the store's group commits. A
//! write that finds its member changed stops that program: a stale copy
//! decides nothing, and the next pass decides again. Only once every
//! program's writes landed are Commands created (the status each was
//! decided from is stored first, and none goes out decided beside a write
//! that did not land); the cluster's status goes with its members',
//! before the Commands; then the Events and the deletions. The settled
//! Commands a status records are deleted in that status's own
//! transaction: an outcome is never lost before it is recorded, nor left
//! behind after.

use std::sync::Arc;

use futures_util::future::join_all;
use herd_core::Resource;
use herd_core::app_plan::{Plan, Planned, Program, Write};
use herd_core::kinds::app_cluster::AppCluster;
use herd_core::kinds::{AppClusterSpec, Command, CommandSpec, Member, MemberSpec};
use herd_store::Op;

use super::AppClusterController;
use crate::objects::{ObjectsError, Part, object_key};

/// A program whose writes all landed, and its member as they left it
/// (None: a member gone before the pass wrote anything of it).
struct Landed {
    program: Program,
    member: Option<Member>,
}

impl AppClusterController {
    /// Carries out `plan` for `cluster`; whether something is in flight.
    pub(super) async fn apply(&self, cluster: &AppCluster, plan: Plan) -> Result<bool, ObjectsError> {
        let Plan { programs, status, mut in_flight, .. } = plan;
        let runs = join_all(programs.into_iter().map(|program| self.write_program(program))).await;
        let mut landed = Vec::new();
        let mut stale = false;
        for run in runs {
            match run? {
                Some(done) => landed.push(done),
                None => stale = true,
            }
        }
        in_flight |= stale;
        // The cluster's status with its members' (a reader that sees the
        // last member configured sees the cluster configured soon after).
        // Not when a program went stale: the status may record what its
        // Commands and notifies carry out (a leader granted, its promote),
        // and the pass that decides it again writes both.
        if let Some(status) = status.filter(|_| !stale) {
            self.objects
                .modify_from::<AppClusterSpec, ObjectsError>(cluster.clone(), Part::Status, |c| {
                    if c.metadata.generation != cluster.metadata.generation || c.status == status {
                        return Ok(false);
                    }
                    c.status = status.clone();
                    Ok(true)
                })
                .await?;
        }
        if !stale {
            let creations = landed.iter().flat_map(|l| &l.program.commands).map(|planned| self.create(planned));
            for created in join_all(creations).await {
                created?;
            }
        }
        for finished in join_all(landed.iter().map(|done| self.finish(done))).await {
            finished?;
        }
        Ok(in_flight)
    }

    /// Runs `program`'s writes in order, the settled Commands it records
    /// deleted with its first status write (after its writes, when it has
    /// none); None when a write found its member changed.
    async fn write_program(&self, mut program: Program) -> Result<Option<Landed>, ObjectsError> {
        let mut current: Option<Member> = self.members.get(&program.member);
        let mut outcomes = std::mem::take(&mut program.outcomes);
        for write in std::mem::take(&mut program.writes) {
            let written = match (write, current.as_ref()) {
                (Write::Create(member), _) => self.objects.create(member, true, false).await,
                (Write::Spec(target) | Write::Status(target), None) => {
                    tracing::info!(member = %target.metadata.name, "member gone before its write: to be done again");
                    return Ok(None);
                }
                (Write::Spec(mut target), Some(old)) => {
                    target.metadata.resource_version = old.metadata.resource_version.clone();
                    self.objects.write_over(old, target, Part::Spec, Vec::new()).await
                }
                (Write::Status(mut target), Some(old)) => {
                    target.metadata.resource_version = old.metadata.resource_version.clone();
                    let done_with = std::mem::take(&mut outcomes).iter().map(delete_op).collect();
                    self.objects.write_over(old, target, Part::Status, done_with).await
                }
            };
            match written {
                Ok(member) => current = Some(member),
                Err(ObjectsError::Conflict { .. } | ObjectsError::AlreadyExists { .. }) => {
                    tracing::info!(member = %program.member, "member changed meanwhile: to be done again");
                    self.ledger.release(&program.member);
                    return Ok(None);
                }
                Err(error) => return Err(error),
            }
        }
        // Outcomes no status write had to record.
        for deleted in join_all(outcomes.iter().map(|command| self.objects.delete_as_read(&**command))).await {
            deleted?;
        }
        Ok(Some(Landed { program, member: current }))
    }

    /// Creates a planned Command (issued at once, or left to the command
    /// controller).
    async fn create(&self, planned: &Planned) -> Result<(), ObjectsError> {
        let command = planned.command.clone();
        let created = if planned.issued {
            crate::commands::create_issued(&self.objects, &self.issuer, command).await
        } else {
            crate::commands::create(&self.objects, command, false).await
        };
        match created {
            Ok(_) => Ok(()),
            // Held by a Command the caches had not shown yet: next pass.
            Err(ObjectsError::Held(why)) => {
                tracing::info!(command = %planned.command.metadata.name, %why, "member busy");
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    /// A landed program's deletion, for a member that goes, and its Events.
    async fn finish(&self, done: &Landed) -> Result<(), ObjectsError> {
        let program = &done.program;
        if program.delete {
            self.objects.delete_if_present::<MemberSpec>(&program.member).await?;
            crate::commands::forget_holds(&self.objects, &program.member).await?;
        }
        if let Some(member) = &done.member {
            for note in &program.notes {
                self.events.record(member, note.type_, note.reason, note.message.clone()).await;
            }
        }
        Ok(())
    }
}

fn delete_op(command: &Arc<Command>) -> Op {
    Op::Delete { key: object_key(CommandSpec::PLURAL, &command.metadata.name) }
}
