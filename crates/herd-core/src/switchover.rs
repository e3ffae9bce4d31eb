//! A planned switchover's state machine, pure: what a `Switchover`
//! Operation does next, decided from its status, the role's lease as the
//! cluster's status has it, and the role's members. The leader
//! (`herd-server`'s operations controller) writes what [`pass`] returns;
//! the handover itself is the app-cluster planner's
//! (`crate::app_plan`): it demotes the leader named in the handover, and
//! once that one has stood down grants the next term to the member asked
//! for, which catches up to where the old leader stood down before its
//! promote hook runs. So no write the old leader acknowledged is lost.
//!
//! Invariants:
//! - A handover is recorded only while the role has a leader whose lease
//!   is renewed, a target that may lead, and budgets that allow a
//!   disruption of the leader; it names the term it hands over from.
//! - Before the demote is asked for (the lease marked revoked), a cancel
//!   or the deadline ends it with nothing done; after, it goes on to the
//!   next term (the lease is not renewed again either way).
//! - It ends once the role's term has passed the handover's: Succeeded
//!   when the member asked for (or, with none named, another member)
//!   leads, Failed naming who leads otherwise.

use crate::disruption::unhealthy_reason;
use crate::kinds::app_cluster::RoleLeader;
use crate::kinds::operation::{
    Blocker, Handover, OnDeadline, Operation, OperationAction, OperationPhase, OperationStatus,
};
use crate::kinds::{Member, MemberState};
use crate::operation::{finish, note};
use crate::time::Timestamp;

/// What a switchover sees of its role at one moment.
pub struct View<'a> {
    /// The role's lease as the cluster's status has it (None: the
    /// cluster or its role's lease is not there).
    pub leader: Option<&'a RoleLeader>,
    /// The members of the role.
    pub members: &'a [Member],
    pub synchronous: bool,
    /// Whether the budgets that select the leader allow disrupting it now.
    pub budgets: Result<(), String>,
}

/// Why `member` may not be handed the lease now (None: it may).
fn why_not(member: &Member, leader: &RoleLeader, synchronous: bool) -> Option<String> {
    let name = &member.metadata.name;
    if member.status.state == MemberState::ConfigError || !member.status.ready {
        return Some(format!("{name} is {}", unhealthy_reason(member)));
    }
    if member.status.promote_failed.is_some_and(|term| term == leader.term) {
        return Some(format!("{name}'s promote hook failed in term {}", leader.term));
    }
    if synchronous && !leader.in_sync.contains(name) {
        let in_sync = match leader.in_sync.is_empty() {
            true => "none".to_string(),
            false => leader.in_sync.join(", "),
        };
        return Some(format!("{name} is not a synchronous replica (in sync with the leader: {in_sync})"));
    }
    None
}

/// The role's leader, when it leads with a lease that is renewed.
fn leading(leader: Option<&RoleLeader>) -> Result<(&RoleLeader, &str), String> {
    let Some(leader) = leader else { return Err("the role has no leader yet".into()) };
    match (&leader.member, &leader.waiting) {
        (_, Some(why)) => Err(format!("its leader is not renewed: {why}")),
        (None, None) => Err("the role has no leader".into()),
        (Some(_), None) if leader.revoked => Err("its leader's lease is being given up already".into()),
        (Some(member), None) => Ok((leader, member)),
    }
}

/// The handover a switchover asks for now, or why it cannot be made
/// (`Err((why, refused))`: refused ends the Operation; otherwise it
/// waits).
fn handover(to: Option<&str>, view: &View<'_>) -> Result<Handover, (String, bool)> {
    let (leader, from) = leading(view.leader).map_err(|why| (why, true))?;
    let others = view.members.iter().filter(|m| m.metadata.name != from);
    match to {
        Some(to) if to == from => return Err((format!("{to} leads already (term {})", leader.term), true)),
        Some(to) => {
            let Some(member) = view.members.iter().find(|m| m.metadata.name == to) else {
                return Err((format!("{to} is no member of the role"), true));
            };
            if let Some(why) = why_not(member, leader, view.synchronous) {
                return Err((why, true));
            }
        }
        None => {
            let reasons: Vec<String> = others.clone().filter_map(|m| why_not(m, leader, view.synchronous)).collect();
            if reasons.len() == others.count() {
                let why = match reasons.is_empty() {
                    true => "the role has no other member".to_string(),
                    false => format!("no other member may lead: {}", reasons.join("; ")),
                };
                return Err((why, true));
            }
        }
    }
    view.budgets.clone().map_err(|why| (why, false))?;
    Ok(Handover { from: from.to_string(), term: leader.term, to: to.map(str::to_string) })
}

/// One pass of a Running switchover at `now`.
pub fn pass(op: &Operation, view: &View<'_>, now: Timestamp) -> OperationStatus {
    let mut status = op.status.clone();
    let OperationAction::Switchover { cluster, role, to } = &op.spec.action else { return status };
    if status.phase != OperationPhase::Running {
        return status;
    }
    let asked = status.handover.clone();
    if let (Some(handover), Some(leader)) = (&asked, view.leader)
        && leader.term > handover.term
    {
        end(&mut status, handover, leader, role, now);
        return status;
    }
    // The demote was asked for: the lease is not renewed again, so the
    // next term comes whatever happens now.
    let demoting = asked.as_ref().is_some_and(|h| {
        view.leader.is_some_and(|l| l.term == h.term && l.revoked && l.member.as_deref() == Some(&h.from))
    });
    if demoting {
        let from = asked.as_ref().map(|h| h.from.as_str()).unwrap_or_default();
        status.blocker = None;
        status.message = Some(format!("{from} is standing down; the next leader is promoted once it has"));
        return status;
    }
    if op.spec.cancel {
        finish(
            &mut status,
            OperationPhase::Cancelled,
            "cancelled before the leader was asked to stand down".into(),
            now,
        );
        return status;
    }
    let wanted = handover(to.as_deref(), view);
    let why = match (wanted, &asked) {
        (Ok(handover), None) => {
            let target = handover.to.clone().unwrap_or_else(|| "the most advanced member that may lead".into());
            let message = format!(
                "handing role {role} of {cluster} over from {} (term {}) to {target}",
                handover.from, handover.term
            );
            note(&mut status, now, message.clone());
            status.message = Some(message);
            status.blocker = None;
            status.handover = Some(handover);
            return status;
        }
        // Recorded, and the planner demotes once it sees it.
        (Ok(_), Some(_)) => {
            status.blocker = None;
            return status;
        }
        (Err((why, true)), None) => {
            finish(&mut status, OperationPhase::Failed, format!("cannot switch role {role} over: {why}"), now);
            return status;
        }
        (Err((why, _)), _) => why,
    };
    let since = match &status.blocker {
        Some(old) if old.message == why => old.since,
        _ => now,
    };
    status.blocker = Some(Blocker { message: why.clone(), since, never: false });
    let past_deadline = match (op.spec.deadline, status.started_at) {
        (Some(deadline), Some(started)) => started.age(now) >= deadline.get(),
        _ => false,
    };
    if past_deadline {
        let phase = match op.spec.on_deadline {
            OnDeadline::Stop => OperationPhase::Stopped,
            OnDeadline::Fail | OnDeadline::Force => OperationPhase::Failed,
        };
        let deadline = op.spec.deadline.unwrap_or_default();
        finish(
            &mut status,
            phase,
            format!("the deadline ({deadline}) passed with the leader not asked to stand down: {why}"),
            now,
        );
    }
    status
}

/// The role's term passed the handover's: who leads now says how it went.
fn end(status: &mut OperationStatus, handover: &Handover, leader: &RoleLeader, role: &str, now: Timestamp) {
    let next = handover.term + 1;
    let granted = leader.transitions.iter().find(|t| t.term == next);
    let (member, at, reason) = match granted {
        Some(t) => (t.member.as_str(), t.at, t.reason.as_str()),
        None => (leader.member.as_deref().unwrap_or("no member"), now, ""),
    };
    let took =
        status.started_at.map(|started| format!(" in {:.2}s", started.age(at).as_secs_f64())).unwrap_or_default();
    let asked_for = handover.to.as_deref().is_none_or(|to| to == member) && member != handover.from;
    if asked_for {
        let message = format!(
            "role {role} handed over: {} (term {}) to {member} (term {next}){took}",
            handover.from, handover.term
        );
        finish(status, OperationPhase::Succeeded, message, now);
    } else {
        let message = format!("{member} leads role {role} in term {next}, not the member asked for: {reason}");
        finish(status, OperationPhase::Failed, message, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::app_cluster::LeaderTransition;
    use crate::kinds::operation::OperationSpec;
    use crate::kinds::{MemberSpec, OperationPhase};
    use crate::operation::begin;
    use std::time::Duration;

    fn at(secs: u64) -> Timestamp {
        Timestamp::parse("2026-12-01T10:00:00Z").unwrap().plus(Duration::from_secs(secs))
    }

    fn member(name: &str, ready: bool) -> Member {
        let mut m = Member::new(name, MemberSpec { cluster: "db".into(), role: "r".into(), ..Default::default() });
        m.status.state = MemberState::Configured;
        m.status.ready = ready;
        m
    }

    fn leader(member: &str, term: u64) -> RoleLeader {
        RoleLeader { role: "r".into(), member: Some(member.into()), term, ..Default::default() }
    }

    fn switchover(to: Option<&str>) -> Operation {
        let action = OperationAction::Switchover { cluster: "db".into(), role: "r".into(), to: to.map(Into::into) };
        let mut op = Operation::new("so", OperationSpec { action, ..Default::default() });
        op.status = begin(&op.status, "switching over".into(), at(0));
        op
    }

    fn view<'a>(leader: &'a RoleLeader, members: &'a [Member]) -> View<'a> {
        View { leader: Some(leader), members, synchronous: false, budgets: Ok(()) }
    }

    #[test]
    fn a_handover_is_recorded_then_ends_when_the_member_asked_for_leads_the_next_term() {
        let members = [member("a", true), member("b", true)];
        let mut lead = leader("a", 3);
        let mut op = switchover(Some("b"));
        op.status = pass(&op, &view(&lead, &members), at(1));
        let handover = op.status.handover.clone().unwrap();
        assert_eq!(handover, Handover { from: "a".into(), term: 3, to: Some("b".into()) });
        lead.revoked = true;
        op.status = pass(&op, &view(&lead, &members), at(1));
        assert_eq!(op.status.message.as_deref(), Some("a is standing down; the next leader is promoted once it has"));
        op.spec.cancel = true;
        op.status = pass(&op, &view(&lead, &members), at(1));
        assert_eq!(op.status.phase, OperationPhase::Running, "too late to cancel: the lease is given up");
        lead = leader("b", 4);
        let reason = "a stood down (term 3); b was asked for by a switchover and may lead".to_string();
        lead.transitions.push(LeaderTransition { term: 4, member: "b".into(), at: at(1), reason });
        op.status = pass(&op, &view(&lead, &members), at(2));
        assert_eq!(op.status.phase, OperationPhase::Succeeded);
        assert_eq!(op.status.message.as_deref(), Some("role r handed over: a (term 3) to b (term 4) in 1.00s"));
    }

    #[test]
    fn a_target_that_may_not_lead_is_refused_naming_why() {
        let mut members = [member("a", true), member("b", false), member("c", true)];
        let lead = leader("a", 3);
        let refused = |op: &Operation, view: &View| {
            let status = pass(op, view, at(1));
            assert_eq!(status.phase, OperationPhase::Failed);
            status.message.unwrap()
        };
        let message = refused(&switchover(Some("b")), &view(&lead, &members));
        assert!(message.starts_with("cannot switch role r over: b is configured, but"), "{message}");
        assert_eq!(
            refused(&switchover(Some("a")), &view(&lead, &members)),
            "cannot switch role r over: a leads already (term 3)"
        );
        assert_eq!(
            refused(&switchover(Some("x")), &view(&lead, &members)),
            "cannot switch role r over: x is no member of the role"
        );
        let sync = View { synchronous: true, ..view(&lead, &members) };
        assert_eq!(
            refused(&switchover(Some("c")), &sync),
            "cannot switch role r over: c is not a synchronous replica (in sync with the leader: none)"
        );
        members[2].status.state = MemberState::ConfigError;
        let message = refused(&switchover(None), &view(&lead, &members));
        assert!(
            message.starts_with("cannot switch role r over: no other member may lead: b is configured"),
            "{message}"
        );
        assert!(message.contains("; c is in config error"), "{message}");
        let mut leaderless = leader("a", 3);
        leaderless.waiting = Some("leader a (term 3) not ready; its lease runs 4s more".into());
        let message = refused(&switchover(None), &view(&leaderless, &members));
        assert_eq!(
            message,
            "cannot switch role r over: its leader is not renewed: leader a (term 3) not ready; its lease runs 4s more"
        );
    }

    #[test]
    fn budgets_that_do_not_allow_hold_it_until_its_deadline_and_cancel_ends_it_before_the_demote() {
        let members = [member("a", true), member("b", true)];
        let lead = leader("a", 3);
        let mut op = switchover(None);
        op.spec.deadline = Some(crate::time::HumanDuration::from_secs(30));
        let blocked = View { budgets: Err("budget q needs 2 healthy, has 2".into()), ..view(&lead, &members) };
        op.status = pass(&op, &blocked, at(1));
        assert_eq!(op.status.phase, OperationPhase::Running);
        assert_eq!(op.status.handover, None, "nothing asked for while the budgets do not allow");
        let blocker = op.status.blocker.clone().unwrap();
        assert_eq!((blocker.message.as_str(), blocker.since), ("budget q needs 2 healthy, has 2", at(1)));
        op.status = pass(&op, &blocked, at(30));
        assert_eq!(op.status.phase, OperationPhase::Failed);
        let message = op.status.message.clone().unwrap();
        assert!(message.starts_with("the deadline (30s) passed with the leader not asked to stand down: budget q"));
        let mut op = switchover(None);
        op.spec.cancel = true;
        op.status = pass(&op, &blocked, at(1));
        assert_eq!(op.status.phase, OperationPhase::Cancelled);
    }

    #[test]
    fn another_member_leading_the_next_term_fails_it_naming_who_and_why() {
        let members = [member("a", true), member("b", true), member("c", true)];
        let mut op = switchover(Some("b"));
        op.status = pass(&op, &view(&leader("a", 3), &members), at(1));
        let mut lead = leader("c", 4);
        let reason = "a stood down (term 3); c is the most advanced member that may lead".to_string();
        lead.transitions.push(LeaderTransition { term: 4, member: "c".into(), at: at(2), reason });
        op.status = pass(&op, &view(&lead, &members), at(2));
        assert_eq!(op.status.phase, OperationPhase::Failed);
        assert!(
            op.status.message.unwrap().starts_with("c leads role r in term 4, not the member asked for: a stood down")
        );
    }
}
