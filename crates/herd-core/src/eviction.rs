//! Whether a voluntary disruption of one member may go ahead now, and
//! what it asks of the member: every budget that selects the member must
//! allow it ([`crate::disruption::verdict`]), and a move needs a node that
//! can take the member (an approval and the move it allows are one thing:
//! none is given for a member that would go down and wait). A member
//! already being evicted is not evicted twice. The server reads the
//! budgets and where the member could go, and writes the approval.

use crate::disruption::{Verdict, verdict};
use crate::kinds::{DisruptionBudget, Member};
use crate::placement::Placement;
use crate::time::Timestamp;

/// What a voluntary disruption does to the member once its budgets allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disruption {
    /// Moved to another node (the eviction API, a drain).
    Move,
    /// Restarted in place (a rolling restart).
    Restart,
    /// Restarted in place as another revision of its App (an upgrade, or
    /// its revert).
    Upgrade { to: i64 },
}

/// What an approved disruption asks of the member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// Placed again elsewhere as a new member (no data to keep).
    Replace,
    /// Moved elsewhere with its persistent volumes.
    Migrate,
    /// Restarted where it is.
    Restart,
    /// Restarted where it is as revision `to` of its App.
    Upgrade { to: i64 },
}

impl Request {
    /// The request for `how`; `persistent`: whether the member's role
    /// keeps persistent volumes (None: its App is not known, and nothing
    /// is moved with it).
    pub fn of(how: Disruption, persistent: Option<bool>) -> Request {
        match (how, persistent) {
            (Disruption::Restart, _) => Request::Restart,
            (Disruption::Upgrade { to }, _) => Request::Upgrade { to },
            (Disruption::Move, Some(true)) => Request::Migrate,
            (Disruption::Move, _) => Request::Replace,
        }
    }

    /// Asks it of `member` as of `at`; whether it was not asked already.
    pub fn ask(self, member: &mut Member, at: Timestamp) -> bool {
        if let Request::Upgrade { to } = self {
            member.spec.app_revision = Some(to);
        }
        let requests = &mut member.spec.requests;
        let asked = match self {
            Request::Replace => &mut requests.replace,
            Request::Migrate => &mut requests.migrate,
            Request::Restart | Request::Upgrade { .. } => &mut requests.restart,
        };
        asked.replace(at).is_none()
    }

    /// What it does to member `name`, for the answer and the Event.
    pub fn what(self, name: &str) -> String {
        match self {
            Request::Replace => format!("member {name} is placed again on another node"),
            Request::Migrate => format!("member {name} is moved to another node with its data"),
            Request::Restart => format!("member {name} is restarted where it is"),
            Request::Upgrade { to } => format!("member {name} is restarted where it is as revision {to} of its App"),
        }
    }
}

/// The decision on disrupting a member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// It is being evicted already (approved, asked for, or moving and not
    /// configured since): the same eviction, not a second move, which
    /// would chase the member from node to node.
    UnderWay,
    /// Not now, and why (every reason, joined).
    Refused(String),
    /// Allowed: for each selecting budget (by index), whether the
    /// approval takes one of its allowed disruptions.
    Approved(Vec<(usize, bool)>),
}

/// The decision on disrupting `member`, given the budgets that select it
/// (their statuses current) and, for a move, where it could go.
pub fn decide(member: &Member, selecting: &[DisruptionBudget], target: Option<&Placement>) -> Decision {
    let name = &member.metadata.name;
    let approved = selecting.iter().any(|b| b.status.disrupted_members.contains_key(name));
    let moving =
        (member.status.moved_from.is_some() && !member.status.was_configured()) || member.status.migration.is_some();
    if approved || moving || member.spec.requests.to_leave() {
        return Decision::UnderWay;
    }
    let mut refusals = Vec::new();
    let mut approvals = Vec::new();
    for (i, budget) in selecting.iter().enumerate() {
        match verdict(budget, member) {
            Verdict::Allowed { counts } => approvals.push((i, counts)),
            Verdict::Refused(why) => refusals.push(why),
        }
    }
    if let Some(Placement::Unplaceable(why)) = target {
        refusals.push(why.clone());
    }
    if refusals.is_empty() { Decision::Approved(approvals) } else { Decision::Refused(refusals.join("; and ")) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::disruption_budget::{Amount, DisruptionBudgetSpec, DisruptionBudgetStatus};
    use crate::kinds::member::{Migration, bound_member};

    fn budget(allowed: u32) -> DisruptionBudget {
        let mut budget = DisruptionBudget::new(
            "quorum",
            DisruptionBudgetSpec {
                selector: "herd.io/cluster=db".into(),
                min_available: Some(Amount::Count(2)),
                ..Default::default()
            },
        );
        budget.metadata.generation = 1;
        budget.status = DisruptionBudgetStatus {
            observed_generation: 1,
            current_healthy: 2 + allowed,
            desired_healthy: 2,
            expected_members: 3 + allowed,
            disruptions_allowed: allowed,
            counted_at: Some(Timestamp::default()),
            ..Default::default()
        };
        budget
    }

    fn ready() -> Member {
        let mut member = bound_member(0, "n1");
        member.status.ready = true;
        member
    }

    #[test]
    fn row_a_member_under_way_is_the_same_eviction() {
        let mut asked = ready();
        asked.spec.requests.migrate = Some(Timestamp::default());
        assert_eq!(decide(&asked, &[budget(0)], None), Decision::UnderWay, "asked for");
        let mut approved = budget(0);
        approved.status.disrupted_members.insert(ready().metadata.name.clone(), Timestamp::default());
        assert_eq!(decide(&ready(), &[approved], None), Decision::UnderWay, "approved");
        let mut moving = ready();
        moving.status.migration = Some(Migration { from: "n1".into(), to: "n2".into(), ..Default::default() });
        assert_eq!(decide(&moving, &[], None), Decision::UnderWay, "moving");
    }

    #[test]
    fn row_every_budget_must_allow_and_every_refusal_is_told() {
        assert_eq!(decide(&ready(), &[budget(1), budget(2)], None), Decision::Approved(vec![(0, true), (1, true)]));
        let Decision::Refused(why) = decide(&ready(), &[budget(1), budget(0), budget(0)], None) else { panic!() };
        assert_eq!(why.matches("budget quorum needs 2 healthy").count(), 2, "{why}");
        assert!(why.contains("; and "), "{why}");
        assert_eq!(decide(&ready(), &[], None), Decision::Approved(vec![]), "no budget selects it");
    }

    #[test]
    fn row_a_move_with_nowhere_to_go_is_refused_saying_why() {
        let nowhere = Placement::Unplaceable("no node can take db-member-0: n2 is cordoned".into());
        let Decision::Refused(why) = decide(&ready(), &[budget(1)], Some(&nowhere)) else { panic!() };
        assert_eq!(why, "no node can take db-member-0: n2 is cordoned");
        let somewhere = Placement::Bound("n2".into());
        assert_eq!(decide(&ready(), &[budget(1)], Some(&somewhere)), Decision::Approved(vec![(0, true)]));
    }

    #[test]
    fn what_is_asked_follows_the_disruption_and_the_roles_volumes() {
        assert_eq!(Request::of(Disruption::Restart, Some(true)), Request::Restart);
        assert_eq!(Request::of(Disruption::Move, Some(true)), Request::Migrate);
        assert_eq!(Request::of(Disruption::Move, Some(false)), Request::Replace);
        assert_eq!(Request::of(Disruption::Move, None), Request::Replace);
        let mut member = bound_member(0, "n1");
        assert!(Request::of(Disruption::Upgrade { to: 3 }, Some(true)).ask(&mut member, Timestamp::default()));
        assert_eq!((member.spec.app_revision, member.spec.requests.restart.is_some()), (Some(3), true));
        let mut member = ready();
        assert!(Request::Migrate.ask(&mut member, Timestamp::default()));
        assert!(!Request::Migrate.ask(&mut member, Timestamp::default()), "asked already");
        assert!(member.spec.requests.to_leave());
    }
}
