//! What the agents' facts mean for a Command being reconciled, per
//! action: it happened (here is the answer), it did not (issue it again),
//! something is still moving (look again later), or nobody could be
//! asked. The reconciler gathers the facts (its node's report, a copy's
//! two ends looked at twice) and records the [`Finding`]; the decision
//! is here, one row per action.

use std::collections::BTreeMap;

use crate::api::MemberReport;
use crate::kinds::{Action, Answer, AnswerDetails};
use crate::reconcile::CopyVerdict;

/// What reconciling found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// It is settled: this is the truth.
    Done(Answer),
    /// It did not happen (or not wholly): issue it again.
    Again(String),
    /// Something is still moving: look again at the next pass.
    Later(String),
    /// The agents could not be asked.
    Unknown(String),
}

/// What looking at a copy's two ends found: the verdict, and the
/// destination's checksum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyLook {
    pub verdict: CopyVerdict,
    pub checksum: String,
}

/// Why a copy's ends could not be looked at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LookError {
    /// The agent did not answer at all (as opposed to answering wrongly).
    pub unreachable: bool,
    pub message: String,
}

/// The facts a finding is made of.
#[derive(Clone, Copy, Debug)]
pub struct Facts<'a> {
    /// The Command's node.
    pub node: &'a str,
    /// That node exists and is Ready.
    pub node_ready: bool,
    /// What that node reports of the action's member.
    pub member: Option<&'a MemberReport>,
    /// For a move: its source node still lists the member (or is not
    /// known, so cannot be said not to).
    pub source_has_member: bool,
    /// For a copy: what looking at its two ends found.
    pub copy: Option<&'a Result<CopyLook, LookError>>,
}

/// What `facts` mean for a Command carrying out `action`.
pub fn find_out(action: &Action, facts: &Facts<'_>) -> Finding {
    let node = facts.node;
    let running = facts.member.filter(|m| m.wanted && m.running);
    let done = |success: bool, message: String| Finding::Done(Answer::said(success, message));
    let started = |instance_id: String, message: String| {
        let details = AnswerDetails::Started { instance_id, checksums: BTreeMap::new() };
        Finding::Done(Answer { success: true, message, details })
    };
    match action {
        Action::StartMember { member, .. } => match running {
            Some(m) => {
                let instance = m.instance_id.clone().unwrap_or_default();
                let message = format!("member {member} runs (instance {instance})");
                started(instance, message)
            }
            None => Finding::Again(format!("member {member} is not running")),
        },
        Action::StopMember { member } => match facts.member {
            Some(m) if m.running => Finding::Again(format!("member {member} still runs")),
            _ if facts.node_ready => done(true, format!("member {member} is not running")),
            _ => Finding::Unknown(format!("node {node} is not Ready")),
        },
        // Whether a script ran cannot be told from outside: say so rather
        // than run it twice.
        Action::RunScript { member, .. } => done(
            false,
            format!(
                "interrupted: whether the script ran in member {member} is unknown; `herd command retry` runs it again"
            ),
        ),
        // A promote half run is not run again: the lease it was for goes
        // unrenewed, and the next leader is chosen once it expired.
        Action::Promote { member, .. } => {
            done(false, format!("interrupted: whether member {member}'s promote hook ran is unknown"))
        }
        Action::Demote { member, .. } => Finding::Again(format!("member {member}: demoting it again is safe")),
        Action::CopyVolume { member, volume, from_node } => match facts.copy {
            Some(Ok(CopyLook { verdict: CopyVerdict::Completed, checksum })) => {
                let message = format!("volume {member}/{volume} on {node} matches the source (checksum {checksum})");
                let details =
                    AnswerDetails::Copied { checksum: checksum.clone(), size: None, files: None, bytes_fetched: None };
                Finding::Done(Answer { success: true, message, details })
            }
            Some(Ok(CopyLook { verdict: CopyVerdict::StillChanging, .. })) => {
                Finding::Later("the destination is still changing".into())
            }
            Some(Ok(CopyLook { verdict: CopyVerdict::NotCopied, .. })) => {
                Finding::Again(format!("volume {member}/{volume} is not (fully) on {node}"))
            }
            Some(Ok(CopyLook { verdict: CopyVerdict::Lost, .. })) => {
                done(false, format!("neither {from_node} nor {node} has volume {member}/{volume}"))
            }
            // An agent of a Ready node that does not answer is most likely
            // restarting (its next heartbeat brings its new endpoint): look
            // again soon, without counting it as a failed reconciliation,
            // whose pause grows each time.
            Some(Err(LookError { unreachable: true, message })) if facts.node_ready => {
                Finding::Later(format!("{message} (it may be restarting)"))
            }
            Some(Err(error)) => Finding::Unknown(error.message.clone()),
            None => Finding::Unknown(format!("volume {member}/{volume} was not looked at")),
        },
        Action::DeleteVolume { member, volume } => {
            Finding::Again(format!("volume {member}/{volume}: deleting again is safe"))
        }
        // The agent never launches a member's setup twice for one instance
        // (the status file says it was), so doing it again is safe.
        Action::ConfigureMember { member, .. } => {
            Finding::Again(format!("member {member}: configuring it again is safe"))
        }
        Action::RemoveMember { member } => Finding::Again(format!("member {member}: removing it again is safe")),
        Action::MigrateMember { member, from_node, .. } => match running {
            Some(m) if !facts.source_has_member => {
                let instance = m.instance_id.clone().unwrap_or_default();
                let message =
                    format!("member {member} runs on {node} (instance {instance}) and {from_node} no longer has it");
                started(instance, message)
            }
            _ => Finding::Again(format!("the migration of {member} is not finished")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::command::MemberRun;

    fn report(running: bool) -> MemberReport {
        MemberReport {
            name: "m".into(),
            wanted: true,
            running,
            instance_id: Some("i-2".into()),
            ..MemberReport::default()
        }
    }

    fn facts(member: Option<&MemberReport>) -> Facts<'_> {
        Facts { node: "n2", node_ready: true, member, source_has_member: false, copy: None }
    }

    fn start() -> Action {
        Action::StartMember { member: "m".into(), run: MemberRun::default() }
    }

    #[test]
    fn row_a_start_that_runs_is_done_with_its_instance_and_one_that_does_not_is_issued_again() {
        let running = report(true);
        let Finding::Done(answer) = find_out(&start(), &facts(Some(&running))) else { panic!() };
        assert!(answer.success);
        assert_eq!(answer.details.instance_id(), Some("i-2"));
        assert!(matches!(find_out(&start(), &facts(Some(&report(false)))), Finding::Again(_)));
        assert!(matches!(find_out(&start(), &facts(None)), Finding::Again(_)));
    }

    #[test]
    fn row_a_stop_is_done_once_the_ready_node_says_it_is_not_running() {
        let stop = Action::StopMember { member: "m".into() };
        assert!(matches!(find_out(&stop, &facts(Some(&report(true)))), Finding::Again(_)));
        assert!(matches!(find_out(&stop, &facts(None)), Finding::Done(Answer { success: true, .. })));
        let down = Facts { node_ready: false, ..facts(None) };
        assert_eq!(find_out(&stop, &down), Finding::Unknown("node n2 is not Ready".into()));
    }

    #[test]
    fn row_a_script_is_never_run_twice_by_the_reconciler() {
        let script = Action::RunScript { member: "m".into(), script: "true".into(), expected_instance: None };
        let Finding::Done(answer) = find_out(&script, &facts(None)) else { panic!() };
        assert!(!answer.success && answer.message.contains("is unknown"), "{answer:?}");
    }

    #[test]
    fn row_a_copy_follows_what_its_two_ends_showed() {
        let copy = Action::CopyVolume { member: "m".into(), volume: "data".into(), from_node: "n1".into() };
        let looked = |verdict| Ok(CopyLook { verdict, checksum: "c1".into() });
        let finding = |look: &Result<CopyLook, LookError>, ready| {
            find_out(&copy, &Facts { copy: Some(look), node_ready: ready, ..facts(None) })
        };
        let Finding::Done(answer) = finding(&looked(CopyVerdict::Completed), true) else { panic!() };
        assert!(matches!(&answer.details, AnswerDetails::Copied { checksum, .. } if checksum == "c1"));
        assert!(matches!(finding(&looked(CopyVerdict::StillChanging), true), Finding::Later(_)));
        assert!(matches!(finding(&looked(CopyVerdict::NotCopied), true), Finding::Again(_)));
        assert!(matches!(finding(&looked(CopyVerdict::Lost), true), Finding::Done(Answer { success: false, .. })));
        let silent = Err(LookError { unreachable: true, message: "asking n2: refused".into() });
        assert_eq!(finding(&silent, true), Finding::Later("asking n2: refused (it may be restarting)".into()));
        assert_eq!(finding(&silent, false), Finding::Unknown("asking n2: refused".into()), "its node is down");
        let wrong = Err(LookError { unreachable: false, message: "node n1 does not exist".into() });
        assert_eq!(finding(&wrong, true), Finding::Unknown("node n1 does not exist".into()));
    }

    #[test]
    fn row_idempotent_actions_are_issued_again() {
        for action in [
            Action::DeleteVolume { member: "m".into(), volume: "data".into() },
            Action::RemoveMember { member: "m".into() },
        ] {
            assert!(matches!(find_out(&action, &facts(None)), Finding::Again(_)), "{action:?}");
        }
    }

    #[test]
    fn row_a_move_is_done_only_once_it_runs_on_the_target_and_the_source_forgot_it() {
        let migrate = Action::MigrateMember { member: "m".into(), from_node: "n1".into(), run: MemberRun::default() };
        let running = report(true);
        let moved = find_out(&migrate, &facts(Some(&running)));
        assert!(matches!(&moved, Finding::Done(answer) if answer.details.instance_id() == Some("i-2")), "{moved:?}");
        let both = Facts { source_has_member: true, ..facts(Some(&running)) };
        assert!(matches!(find_out(&migrate, &both), Finding::Again(_)), "the source still has it");
        assert!(matches!(find_out(&migrate, &facts(None)), Finding::Again(_)), "not on the target");
    }
}
