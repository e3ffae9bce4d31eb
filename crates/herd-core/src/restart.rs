//! Restarting an app-cluster member in place (a rolling restart,
//! asked of its budgets first): its instance recorded, the process
//! stopped, then started again on its node with the same settings; the new
//! instance then goes through the cluster's restart path (set up again
//! from scratch, or not for a member that keeps persistent data and was
//! set up before). Each step is decided from the member's status and its
//! node's report, so a leader that takes over goes on. Pure.

use crate::api::MemberReport;
use crate::kinds::member::{Member, MemberStatus, RestartProgress};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestartStep {
    Nothing,
    /// Record the running instance (`status.restart`) and stop it.
    Stop,
    /// It is stopped: start it again.
    Start,
    /// A new instance runs: drop the request and the record.
    Finish,
}

/// The next step of the member's restart; `busy`: a Command of its is
/// not settled yet; `report`: what its node says of it.
pub fn restart_step(member: &Member, report: Option<&MemberReport>, busy: bool) -> RestartStep {
    let asked = member.spec.requests.restart.is_some();
    let running = report.filter(|r| r.running).and_then(|r| r.instance_id.as_deref());
    if busy || member.spec.node.is_none() {
        return RestartStep::Nothing;
    }
    match &member.status.restart {
        None if asked && running.is_some() => RestartStep::Stop,
        None => RestartStep::Nothing,
        Some(progress) => match running {
            Some(now) if now != progress.instance => RestartStep::Finish,
            // Not stopped yet (or its node's report is behind): stopping
            // again is harmless.
            Some(_) => RestartStep::Stop,
            None => RestartStep::Start,
        },
    }
}

/// The status with the restart begun: the instance it replaces.
pub fn begin_restart(status: &MemberStatus, instance: &str) -> MemberStatus {
    let mut next = status.clone();
    next.restart.get_or_insert_with(|| RestartProgress { instance: instance.to_string() });
    next.reason = Some(format!("restarting (instance {instance} is stopped, then started again)"));
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(asked: bool, restart: Option<RestartProgress>) -> Member {
        let mut member = crate::kinds::member::bound_member(0, "n1");
        if asked {
            member.spec.requests.restart = Some(crate::Timestamp::default());
        }
        member.status.restart = restart;
        member
    }

    fn report(instance: Option<&str>) -> MemberReport {
        MemberReport {
            name: "db-r-0".into(),
            running: instance.is_some(),
            instance_id: instance.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn stop_then_start_then_finish_once_a_new_instance_runs() {
        let i1 = report(Some("i1"));
        assert_eq!(restart_step(&member(false, None), Some(&i1), false), RestartStep::Nothing);
        assert_eq!(restart_step(&member(true, None), Some(&i1), false), RestartStep::Stop);
        assert_eq!(restart_step(&member(true, None), Some(&i1), true), RestartStep::Nothing, "busy");
        let begun = RestartProgress { instance: "i1".into() };
        assert_eq!(restart_step(&member(true, Some(begun.clone())), Some(&i1), false), RestartStep::Stop);
        let stopped = begun;
        assert_eq!(restart_step(&member(true, Some(stopped.clone())), Some(&report(None)), false), RestartStep::Start);
        assert_eq!(restart_step(&member(true, Some(stopped.clone())), None, false), RestartStep::Start);
        let i2 = report(Some("i2"));
        assert_eq!(restart_step(&member(true, Some(stopped)), Some(&i2), false), RestartStep::Finish);
        let status = begin_restart(&MemberStatus::default(), "i1");
        assert_eq!(status.restart, Some(RestartProgress { instance: "i1".into() }));
    }
}
