//! What a settled Command of an app-cluster member means for the member:
//! its outcome (success, or why not in the agent's words with the tail of
//! a script's standard error) read into the member's status by what the
//! Command was for ([`Purpose`]). The app-cluster controller reads each
//! settled Command once, records it here, and deletes it with the write
//! of the status that recorded it.

use crate::kinds::member::StoodDown;
use crate::kinds::{Action, AnswerDetails, Command, ManagementState, MemberStatus, Purpose};
use crate::member_sync::{record_command, record_configure};
use crate::migration::record_migration;
use crate::notifies::record_delivery;
use crate::time::Timestamp;

/// How much of a failed script's standard error a member's status keeps.
pub const STDERR_TAIL: usize = 500;

/// The outcome of a settled Command: Ok, or why not (the agent's message,
/// with the tail of a script's standard error).
pub fn outcome(command: &Command) -> Result<(), String> {
    let status = &command.status;
    match (&status.answer, status.state_by_management) {
        (Some(answer), ManagementState::Completed | ManagementState::Reconciled) if answer.success => Ok(()),
        (Some(answer), _) => Err(match answer.stderr_tail(STDERR_TAIL) {
            Some(tail) => format!("{}: {tail}", answer.message),
            None => answer.message.clone(),
        }),
        (None, state) => Err(format!("command {} ended {state}: {}", command.metadata.name, status.reason)),
    }
}

/// What recording a settled Command found beyond the member's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    Nothing,
    /// A removal succeeded: the member is gone from its node.
    Removed,
}

/// Records settled `command`'s outcome in its member's `status` at `now`;
/// a Command without an origin (an operator's) records nothing.
pub fn record_outcome(command: &Command, status: &mut MemberStatus, now: Timestamp) -> Recorded {
    let Some(origin) = &command.spec.origin else { return Recorded::Nothing };
    let result = outcome(command);
    if !matches!(origin.purpose, Purpose::Notify { .. }) {
        record_command(status, result.is_ok(), now);
    }
    let failed = |status: &mut MemberStatus, doing: &str, why: String| {
        status.reason = Some(format!("{doing} failed: {why}"));
    };
    // The run it started (or moved) is of this revision of the App.
    if result.is_ok() && origin.app_revision.is_some() {
        status.app_revision = origin.app_revision;
    }
    match (&origin.purpose, &command.spec.action) {
        (Purpose::Start, _) => {
            if let Err(why) = result {
                failed(status, "starting it", why);
            }
        }
        (Purpose::Configure { generation, digest }, Action::ConfigureMember { expected_instance, run_setup, .. }) => {
            record_configure(status, expected_instance, (*generation, Some(digest.as_str())), *run_setup, result);
        }
        (Purpose::Configure { .. }, _) => {}
        (Purpose::Notify { arguments }, _) => {
            record_delivery(status, arguments, result, now);
        }
        (Purpose::Remove, _) => match result {
            Ok(()) => return Recorded::Removed,
            Err(why) => failed(status, "removing it", why),
        },
        (Purpose::Migrate, _) => record_migration(status, result),
        (Purpose::Restart, _) => {
            if let Err(why) = result {
                failed(status, "stopping it for its restart", why);
            }
        }
        (Purpose::Promote { term }, _) => match result {
            Ok(()) => status.promoted_in = Some(*term),
            Err(why) => {
                failed(status, &format!("promoting it (term {term})"), why);
                status.promote_failed = Some(*term);
            }
        },
        // A demote that failed leaves the lease unrenewed: it expires, and
        // the holder's agent fences it first.
        (Purpose::Demote { term }, _) => match result {
            Ok(()) => {
                let position = match &command.status.answer.as_ref().map(|a| &a.details) {
                    Some(AnswerDetails::StoodDown { position }) => Some(position.clone()),
                    _ => None,
                };
                status.stood_down = Some(StoodDown { term: *term, position });
            }
            Err(why) => failed(status, &format!("demoting it (term {term})"), why),
        },
    }
    Recorded::Nothing
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::command::MemberRun;
    use crate::kinds::member::PendingNotify;
    use crate::kinds::{Answer, AnswerDetails, CommandOrigin, CommandSpec, MemberState, Migration};

    fn at(secs: u64) -> Timestamp {
        Timestamp::parse("2026-12-01T10:00:00Z").unwrap().plus(std::time::Duration::from_secs(secs))
    }

    fn settled(purpose: Purpose, action: Action, answer: Option<Answer>) -> Command {
        let origin = CommandOrigin { cluster: "db".into(), member: "db-r-0".into(), purpose, app_revision: None };
        let mut command =
            Command::new("c1", CommandSpec { node: "n1".into(), timeout: None, action, origin: Some(origin) });
        command.status.state_by_management = if answer.as_ref().is_some_and(|a| a.success) {
            ManagementState::Completed
        } else {
            ManagementState::Failed
        };
        command.status.answer = answer;
        command
    }

    fn start() -> Action {
        Action::StartMember { member: "db-r-0".into(), run: MemberRun::default() }
    }

    fn script_failed(stderr: &str) -> Answer {
        let details = AnswerDetails::Script { exit_code: 3, stdout: String::new(), stderr: stderr.into() };
        Answer { success: false, message: "the script exited with 3".into(), details }
    }

    #[test]
    fn an_outcome_says_why_with_the_tail_of_the_scripts_stderr() {
        let ok = settled(Purpose::Start, start(), Some(Answer::said(true, "runs")));
        assert_eq!(outcome(&ok), Ok(()));
        let failed = settled(Purpose::Start, start(), Some(script_failed(&format!("{}end\n", "x".repeat(600)))));
        let why = outcome(&failed).unwrap_err();
        assert!(why.starts_with("the script exited with 3: xxx") && why.ends_with("end"), "{why}");
        assert_eq!(why.len(), "the script exited with 3: ".len() + STDERR_TAIL);
        let mut lost = settled(Purpose::Start, start(), None);
        lost.status.reason = "given up".into();
        assert_eq!(outcome(&lost), Err("command c1 ended FAILED: given up".into()));
    }

    #[test]
    fn row_a_failed_start_counts_toward_the_pause_and_says_why() {
        let mut status = MemberStatus::default();
        let failed = settled(Purpose::Start, start(), Some(Answer::said(false, "no such program")));
        assert_eq!(record_outcome(&failed, &mut status, at(1)), Recorded::Nothing);
        assert_eq!(status.reason.as_deref(), Some("starting it failed: no such program"));
        assert_eq!((status.failed_commands, status.last_failure), (1, Some(at(1))));
        let ok = settled(Purpose::Start, start(), Some(Answer::said(true, "runs")));
        record_outcome(&ok, &mut status, at(2));
        assert_eq!(status.failed_commands, 0, "a success ends the pause");
    }

    #[test]
    fn row_a_configure_records_the_generation_and_digest_it_was_decided_on() {
        let mut status = MemberStatus { state: MemberState::Creating, ..Default::default() };
        status.state_detail.configuring_instance = Some("i-1".into());
        let action = Action::ConfigureMember {
            member: "db-r-0".into(),
            expected_instance: "i-1".into(),
            configmeta: "{}".into(),
            setup_script: None,
            run_setup: true,
            setup_timeout: None,
        };
        let purpose = Purpose::Configure { generation: 4, digest: "d4".into() };
        record_outcome(&settled(purpose, action, Some(Answer::said(true, "configured"))), &mut status, at(1));
        assert_eq!(status.state_detail.last_config_data_generation, Some(4));
        assert_eq!(status.state_detail.config_data_digest.as_deref(), Some("d4"));
        assert_eq!(status.state_detail.setup_launched_instance.as_deref(), Some("i-1"));
    }

    #[test]
    fn row_a_notify_is_delivered_or_counted_without_the_command_pause() {
        let arguments = vec!["--addnodes".to_string(), "--role".into(), "r".into()];
        let mut status = MemberStatus::default();
        status
            .state_detail
            .pending_notify_cmds
            .push(PendingNotify { arguments: arguments.clone(), ..Default::default() });
        let script = Action::RunScript { member: "db-r-0".into(), script: "x".into(), expected_instance: None };
        let purpose = Purpose::Notify { arguments: arguments.clone() };
        record_outcome(&settled(purpose.clone(), script.clone(), Some(script_failed("refused"))), &mut status, at(1));
        let pending = &status.state_detail.pending_notify_cmds[0];
        assert_eq!(pending.attempts, 1);
        assert!(pending.last_error.as_deref().is_some_and(|e| e.contains("refused")), "{pending:?}");
        assert_eq!(status.failed_commands, 0, "a notify has its own pause");
        record_outcome(&settled(purpose, script, Some(Answer::said(true, "ok"))), &mut status, at(5));
        assert!(status.state_detail.pending_notify_cmds.is_empty(), "delivered");
    }

    #[test]
    fn row_a_removal_that_succeeded_is_told_and_one_that_failed_says_why() {
        let remove = Action::RemoveMember { member: "db-r-0".into() };
        let mut status = MemberStatus::default();
        let ok = settled(Purpose::Remove, remove.clone(), Some(Answer::said(true, "removed")));
        assert_eq!(record_outcome(&ok, &mut status, at(1)), Recorded::Removed);
        let failed = settled(Purpose::Remove, remove, Some(Answer::said(false, "busy")));
        assert_eq!(record_outcome(&failed, &mut status, at(2)), Recorded::Nothing);
        assert_eq!(status.reason.as_deref(), Some("removing it failed: busy"));
    }

    #[test]
    fn row_a_move_and_a_restart_record_their_own_outcomes() {
        let mut status = MemberStatus {
            migration: Some(Migration { from: "n1".into(), to: "n2".into(), ..Default::default() }),
            ..Default::default()
        };
        let migrate =
            Action::MigrateMember { member: "db-r-0".into(), from_node: "n1".into(), run: MemberRun::default() };
        record_outcome(&settled(Purpose::Migrate, migrate, Some(Answer::said(true, "moved"))), &mut status, at(1));
        assert!(status.migration.as_ref().is_some_and(|m| m.done));
        let stop = Action::StopMember { member: "db-r-0".into() };
        record_outcome(&settled(Purpose::Restart, stop, Some(Answer::said(false, "hung"))), &mut status, at(2));
        assert_eq!(status.reason.as_deref(), Some("stopping it for its restart failed: hung"));
    }

    #[test]
    fn an_operators_command_records_nothing() {
        let mut command = settled(Purpose::Start, start(), Some(Answer::said(false, "no")));
        command.spec.origin = None;
        let mut status = MemberStatus::default();
        assert_eq!(record_outcome(&command, &mut status, at(1)), Recorded::Nothing);
        assert_eq!(status, MemberStatus::default());
    }
}
