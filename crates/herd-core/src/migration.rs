//! Moving an app-cluster member with its data (an eviction of a member
//! with persistent volumes): a target chosen and recorded in
//! the member's status first, then a MigrateMember Command (stop it
//! where it is, copy its volumes verified, start it on the target), then
//! the member bound to the target and set up again there (its address
//! changed: the app's setup learns it), as a restart that keeps its data.
//! Each step is decided from the member's status alone, so a leader that
//! takes over goes on from the last one written. Pure.

use crate::disruption::APPROVAL_TIMEOUT;
use crate::kinds::member::{Member, MemberState, MemberStatus, Migration};
use crate::time::Timestamp;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MigrationStep {
    Nothing,
    /// Choose the target node and its ports (record them in the status).
    Choose,
    /// Issue the MigrateMember Command for the recorded target.
    Issue,
    /// It runs on the target: bind it there (`status` from [`rebound`]).
    Rebind,
    /// The Command failed: the request is dropped; it stays where it is.
    GiveUp(String),
}

/// The next step of the member's move; `busy`: a Command of its is not
/// settled yet.
pub fn migration_step(member: &Member, busy: bool) -> MigrationStep {
    let asked = member.spec.requests.migrate.is_some();
    match &member.status.migration {
        None if asked && member.spec.node.is_some() && !busy => MigrationStep::Choose,
        None => MigrationStep::Nothing,
        Some(Migration { failed: Some(why), .. }) => MigrationStep::GiveUp(why.clone()),
        Some(Migration { done: true, .. }) => MigrationStep::Rebind,
        Some(_) if busy => MigrationStep::Nothing,
        Some(_) => MigrationStep::Issue,
    }
}

/// Whether a move asked for with its data has waited so long to start (no
/// node could take it) that the approval it came with has lapsed
/// (`disruption::APPROVAL_TIMEOUT`): it is then dropped, and a drain asks
/// the budgets again, rather than moving the member minutes later on an
/// approval that no longer holds. `now` against the time the request
/// carries.
pub fn request_lapsed(member: &Member, now: Timestamp) -> bool {
    let asked = member.spec.requests.migrate;
    member.status.migration.is_none() && asked.is_some_and(|at| at.age(now) >= APPROVAL_TIMEOUT)
}

/// Records the MigrateMember Command's outcome.
pub fn record_migration(status: &mut MemberStatus, result: Result<(), String>) {
    let Some(migration) = &mut status.migration else { return };
    match result {
        Ok(()) => migration.done = true,
        Err(why) => migration.failed = Some(why),
    }
}

/// The status of a member that now runs on its target: the move is over,
/// it is not placed back on its old node, and it is created again from
/// its new instance, its setup run again (persistent data kept; its
/// address changed). Nothing is sent to its old instance any more, which
/// is retired.
pub fn rebound(status: &MemberStatus) -> MemberStatus {
    let mut next = status.clone();
    if let Some(migration) = next.migration.take() {
        next.moved_from = Some(migration.from.clone());
        next.reason = Some(format!("moved from {} to {} with its data", migration.from, migration.to));
        // Its instance on the node it left: the move stopped and removed it
        // there; a report of it from there is an old one.
        next.retired_instances = crate::node_loss::retired(status);
    }
    next.state = MemberState::CreatePending;
    let detail = &mut next.state_detail;
    detail.last_setup_generation = None;
    detail.configuring_instance = None;
    detail.setup_launched_instance = None;
    next.ready = false;
    next
}

/// The status of a member whose move failed: it stays where it is.
pub fn given_up(status: &MemberStatus, why: &str) -> MemberStatus {
    let mut next = status.clone();
    if let Some(migration) = next.migration.take() {
        next.reason = Some(format!("moving it to {} failed: {why}", migration.to));
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(asked: bool, migration: Option<Migration>) -> Member {
        let mut member = crate::kinds::member::bound_member(0, "n1");
        if asked {
            member.spec.requests.migrate = Some(Timestamp::default());
        }
        member.status.migration = migration;
        member.status.state_detail.last_setup_generation = Some(3);
        member
    }

    fn target() -> Migration {
        Migration { from: "n1".into(), to: "n3".into(), ..Default::default() }
    }

    #[test]
    fn each_step_follows_from_the_status_alone() {
        assert_eq!(migration_step(&member(false, None), false), MigrationStep::Nothing);
        assert_eq!(migration_step(&member(true, None), true), MigrationStep::Nothing, "busy: after its Command");
        assert_eq!(migration_step(&member(true, None), false), MigrationStep::Choose);
        assert_eq!(migration_step(&member(true, Some(target())), false), MigrationStep::Issue);
        assert_eq!(migration_step(&member(true, Some(target())), true), MigrationStep::Nothing, "under way");
        let mut done = member(true, Some(target()));
        record_migration(&mut done.status, Ok(()));
        assert_eq!(migration_step(&done, false), MigrationStep::Rebind);
        let mut failed = member(true, Some(target()));
        record_migration(&mut failed.status, Err("disk full".into()));
        assert_eq!(migration_step(&failed, false), MigrationStep::GiveUp("disk full".into()));
    }

    #[test]
    fn a_rebound_member_is_set_up_again_and_kept_off_its_old_node() {
        let moved = rebound(&member(true, Some(Migration { done: true, ..target() })).status);
        assert_eq!(moved.migration, None);
        assert_eq!(moved.moved_from.as_deref(), Some("n1"));
        assert_eq!(moved.state_detail.last_setup_generation, None, "its setup runs again");
        assert_eq!(moved.state, MemberState::CreatePending, "created again from its new instance");
        let failed = given_up(&member(true, Some(target())).status, "disk full");
        assert_eq!(failed.migration, None);
        assert_eq!(failed.reason.as_deref(), Some("moving it to n3 failed: disk full"));
        assert_eq!(failed.state_detail.last_setup_generation, Some(3), "nothing else changes");
    }

    #[test]
    fn a_request_that_could_not_start_within_an_approval_lapses() {
        let at = Timestamp::parse("2026-12-01T10:00:00Z").unwrap();
        let later = |secs| at.plus(std::time::Duration::from_secs(secs));
        let mut member = crate::kinds::member::bound_member(0, "n1");
        assert!(!request_lapsed(&member, later(600)), "nothing asked");
        member.spec.requests.migrate = Some(at);
        assert!(!request_lapsed(&member, later(119)));
        assert!(request_lapsed(&member, later(120)));
        member.status.migration = Some(Migration { from: "n1".into(), to: "n2".into(), ..Default::default() });
        assert!(!request_lapsed(&member, later(600)), "once under way, it goes on");
    }
}
