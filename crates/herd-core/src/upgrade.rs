//! What is particular to an upgrade among the Operations
//! (`crate::operation` runs its steps): which members it takes and in
//! what order, when a restarted member counts as healthy, the revert, and
//! when a cluster under `updatePolicy: Rolling` starts one by itself.
//! Pure.
//!
//! Invariants:
//! - A member is done only once it runs the revision its step is for, as
//!   a new instance, configured and ready for `minHealthyTime` (a revert's
//!   step: configured and ready; that revision ran here before).
//! - A leader role's leader is taken last of its cluster, and hands its
//!   lease to another member (a handover, as a switchover's) before it is
//!   restarted, when another member of its role is ready.
//! - A revert has no canary phase and takes only the members the upgrade
//!   touched (asked for); the rest are left as they are ([`StepState::Skipped`]).
//! - A revision marked irreversible is never reverted: the upgrade stops
//!   and says why.

use crate::disruption::unhealthy_reason;
use crate::kinds::app_cluster::AppCluster;
use crate::kinds::operation::{
    Handover, Operation, OperationAction, OperationSpec, OperationStatus, OperationStep, StepState, UpgradeProgress,
};
use crate::kinds::update_policy::{UpdateType, UpgradePace};
use crate::kinds::{Member, MemberState};
use crate::operation::{Order, Standing, View, note};
use crate::time::Timestamp;

/// The order an upgrade takes members in: by role and index, each leader
/// role's leader after every other member.
pub fn order_key(member: &Member) -> (bool, String, u32) {
    (member.status.leader, member.spec.role.clone(), member.spec.index)
}

/// Where the member of an upgrade's `step` stands (`reverting`: the
/// upgrade stopped, and the step returns its member).
pub(crate) fn standing(
    step: &OperationStep,
    member: &Member,
    pace: UpgradePace,
    reverting: bool,
    now: Timestamp,
) -> Standing {
    let name = &member.metadata.name;
    let Some(to) = step.to_revision else { return Standing::NotYet };
    let status = &member.status;
    let detail = &status.state_detail;
    let runs = status.app_revision == Some(to) && member.spec.app_revision == Some(to);
    if step.state != StepState::Evicted {
        // One that runs the revision already (a new member, or one a
        // former upgrade took) has nothing to do.
        let settled = status.state == MemberState::Configured && member.spec.requests.restart.is_none();
        return match runs && settled && step.attempts == 0 {
            true => Standing::Done(format!("runs revision {to} already")),
            false => Standing::NotYet,
        };
    }
    if let Some(why) = &status.restart_refused {
        return Standing::Broken(format!("{name} was {why}"));
    }
    // Asked for, but another request took its place (the same eviction
    // approved before, for another reason): asked again.
    if member.spec.app_revision != Some(to) && member.spec.requests.restart.is_none() && status.restart.is_none() {
        return Standing::Stayed(format!("{name} was not asked to run revision {to}: asked again"));
    }
    let new_instance = |instance: &Option<String>| instance.is_some() && *instance != step.instance;
    if status.state == MemberState::ConfigError && new_instance(&detail.configuring_instance) {
        return Standing::Broken(format!(
            "{name} did not come back configured as revision {to}: {}",
            detail.config_error_detail.as_deref().unwrap_or("config error")
        ));
    }
    let back = runs && status.state == MemberState::Configured && new_instance(&detail.last_configured_instance);
    if back && status.ready {
        let ready_for = status.ready_changed_at.map_or(std::time::Duration::ZERO, |at| at.age(now));
        if reverting || ready_for >= pace.min_healthy_time.get() {
            let instance = detail.last_configured_instance.as_deref().unwrap_or_default();
            return Standing::Done(format!("runs revision {to} as instance {instance}"));
        }
    }
    if !reverting && step.since.age(now) >= pace.healthy_deadline.get() {
        let why = match back && status.ready {
            true => "ready, not for long enough yet".to_string(),
            false => unhealthy_reason(member),
        };
        return Standing::Broken(format!(
            "{name} was not healthy within {} of its restart as revision {to} ({why})",
            pace.healthy_deadline
        ));
    }
    Standing::Waiting(match back && status.ready {
        true => format!("{name} to stay ready for {} as revision {to}", pace.min_healthy_time),
        false => format!("{name} is {}", unhealthy_reason(member)),
    })
}

/// How soon time alone makes a step of the upgrade done or broken: a
/// ready member's `minHealthyTime`, or a step's `healthyDeadline`.
pub fn next_due(
    status: &OperationStatus,
    members: &[Member],
    pace: UpgradePace,
    now: Timestamp,
) -> Option<std::time::Duration> {
    status
        .steps
        .iter()
        .filter(|s| s.state == StepState::Evicted)
        .flat_map(|step| {
            let deadline = pace.healthy_deadline.get().saturating_sub(step.since.age(now));
            let member = members.iter().find(|m| m.metadata.name == step.member);
            let healthy = member
                .filter(|m| m.status.ready)
                .and_then(|m| m.status.ready_changed_at)
                .map(|at| pace.min_healthy_time.get().saturating_sub(at.age(now)));
            [Some(deadline), healthy]
        })
        .flatten()
        .min()
}

/// Stops the upgrade for `why`: with a revert, every member it touched is
/// to return to the revision it ran before, and the rest are left; without
/// (`autoRevert: false`, or an irreversible revision), it fails.
pub(crate) fn stop(status: &mut OperationStatus, why: String, revert: Result<(), String>, now: Timestamp) {
    if let Err(no_revert) = revert {
        let message = format!("{why}; {no_revert}; the members it upgraded stay as they are");
        crate::operation::finish(status, crate::kinds::OperationPhase::Failed, message, now);
        return;
    }
    let progress = status.upgrade.get_or_insert_with(UpgradeProgress::default);
    progress.reverting = Some(why.clone());
    let mut returning = Vec::new();
    for step in &mut status.steps {
        let touched = matches!(step.state, StepState::Evicted | StepState::Done) && step.attempts > 0;
        match (touched, step.from_revision) {
            (true, Some(from)) => {
                step.state = StepState::Waiting;
                // From the revision it was upgraded to, back.
                step.from_revision = step.to_revision;
                step.to_revision = Some(from);
                step.attempts = 0;
                step.tried_at = None;
                step.since = now;
                step.message = Some(format!("to return to revision {from}"));
                returning.push(step.member.clone());
            }
            _ => {
                step.state = StepState::Skipped;
                step.since = now;
                step.message = Some("left as it was: the upgrade stopped before it".into());
            }
        }
    }
    status.blocker = None;
    let message = format!("{why}; reverting {} member(s): {}", returning.len(), returning.join(", "));
    status.message = Some(message.clone());
    note(status, now, message);
}

/// Holds back the order of a leader role's leader that has a member to
/// hand its lease to: a handover is asked for first (the app-cluster
/// planner carries it out, as a switchover's), and once the role's term
/// has passed it the former leader is ordered like any member.
pub(crate) fn hand_over_first(status: &mut OperationStatus, orders: &mut Vec<Order>, view: &View, now: Timestamp) {
    if let Some(asked) = &status.handover {
        let from = view.members.iter().find(|m| m.metadata.name == asked.from);
        let role = from.map(|m| m.spec.role.as_str());
        let passed = view.leaders.iter().any(|l| Some(l.role.as_str()) == role && l.term > asked.term);
        if !passed {
            orders.retain(|o| o.member != asked.from);
            return;
        }
        let message = format!("{} handed its lease over (term {})", asked.from, asked.term);
        status.handover = None;
        note(status, now, message);
    }
    for order in orders.iter() {
        let Some(member) = view.members.iter().find(|m| m.metadata.name == order.member) else { continue };
        let role = &member.spec.role;
        let Some(lease) = view.leaders.iter().find(|l| l.role == *role && l.member.as_ref() == Some(&order.member))
        else {
            continue;
        };
        let others = view.members.iter().filter(|m| m.spec.role == *role && m.metadata.name != order.member);
        if others.filter(|m| m.status.ready).count() == 0 {
            continue;
        }
        let handover = Handover { from: order.member.clone(), term: lease.term, to: None };
        let message = format!("{} hands the lease of role {role} over first (term {})", order.member, lease.term);
        status.handover = Some(handover);
        note(status, now, message);
        break;
    }
    if let Some(asked) = &status.handover {
        orders.retain(|o| o.member != asked.from);
    }
}

/// The upgrade a cluster under `updatePolicy: Rolling` starts by itself
/// (None under `Manual`): to `target`, the revision it is to run, when
/// one of `members` is to run another and none of its upgrades is under
/// way (`upgrading`). Named after the revision, so that it starts once.
pub fn rolling_upgrade(cluster: &AppCluster, members: &[Member], target: i64, upgrading: bool) -> Option<Operation> {
    let policy = &cluster.spec.update_policy;
    let behind = members.iter().any(|m| m.spec.app_revision.is_some_and(|r| r != target));
    if policy.type_ != UpdateType::Rolling || upgrading || !behind {
        return None;
    }
    let action = OperationAction::Upgrade {
        cluster: cluster.metadata.name.clone(),
        to_revision: target,
        canary: policy.canary,
        min_healthy_time: policy.min_healthy_time,
        healthy_deadline: policy.healthy_deadline,
        auto_revert: policy.auto_revert,
    };
    let spec = OperationSpec { action, max_parallel: policy.max_parallel, ..OperationSpec::default() };
    Some(Operation::new(format!("upgrade-{}-r{target}", cluster.metadata.name), spec))
}

/// The revision most of `revisions` are (the later of two as common): what
/// a cluster ran before its upgrade, and what its revert pins it to.
pub fn prevailing(revisions: impl Iterator<Item = i64>) -> Option<i64> {
    let mut counts = std::collections::BTreeMap::new();
    for revision in revisions {
        *counts.entry(revision).or_insert(0usize) += 1;
    }
    counts.into_iter().max_by_key(|(revision, count)| (*count, *revision)).map(|(revision, _)| revision)
}

/// Whether the upgrade is being reverted.
pub fn reverting(status: &OperationStatus) -> bool {
    status.upgrade.as_ref().is_some_and(|u| u.reverting.is_some())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::kinds::app_cluster::RoleLeader;
    use crate::kinds::{OperationPhase, StepState};
    use crate::operation::{Outcome, begin, pass, record};
    use crate::time::HumanDuration;

    fn at(secs: u64) -> Timestamp {
        Timestamp::from_system_time(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs))
    }

    /// Members db-r-0..n, configured and ready at revision 1 since t=0;
    /// db-r-0 leads.
    fn members(n: u32) -> Vec<Member> {
        (0..n)
            .map(|i| {
                let mut m = crate::kinds::member::bound_member(i, "n1");
                m.spec.app_revision = Some(1);
                m.status.app_revision = Some(1);
                m.status.state = MemberState::Configured;
                m.status.state_detail.last_configured_instance = Some(format!("{i}-a"));
                m.status.ready = true;
                m.status.ready_changed_at = Some(at(0));
                m.status.leader = i == 0;
                m
            })
            .collect()
    }

    fn upgrade(canary: u32, max_parallel: u32, auto_revert: bool) -> Operation {
        let action = OperationAction::Upgrade {
            cluster: "db".into(),
            to_revision: 2,
            canary,
            min_healthy_time: HumanDuration::from_secs(10),
            healthy_deadline: HumanDuration::from_secs(60),
            auto_revert,
        };
        let spec = OperationSpec {
            action,
            deadline: None,
            on_deadline: Default::default(),
            max_parallel,
            cancel: false,
            paused: false,
        };
        let mut op = Operation::new("up", spec);
        op.status = begin(&op.status, "upgrading".into(), at(0));
        op
    }

    /// One pass at `now`: the orders (member, revision), each approved and
    /// asked of its member as the eviction API would.
    fn step(op: &mut Operation, members: &mut [Member], irreversible: Option<&str>, now: u64) -> Vec<(String, i64)> {
        let reported = BTreeSet::new();
        let view = View {
            members,
            reported: &reported,
            reporter_ready: true,
            irreversible: irreversible.map(str::to_string),
            leaders: &[],
        };
        let (status, orders) = pass(op, &view, false, at(now));
        op.status = status;
        let mut asked = Vec::new();
        for order in orders {
            let to = order.to_revision.expect("an upgrade's order names its revision");
            record(&mut op.status, &order.member, false, Outcome::Evicted("allowed".into()), at(now));
            let m = members.iter_mut().find(|m| m.metadata.name == order.member).unwrap();
            m.spec.app_revision = Some(to);
            m.spec.requests.restart = Some(at(now));
            asked.push((order.member, to));
        }
        asked
    }

    /// Member `name` restarted as the revision it is to run at `now`:
    /// configured and ready (or, `broken`, in config error).
    fn restarted(members: &mut [Member], name: &str, broken: bool, now: u64) {
        let m = members.iter_mut().find(|m| m.metadata.name == name).unwrap();
        let instance = format!("{name}-{now}");
        m.spec.requests.restart = None;
        m.status.app_revision = m.spec.app_revision;
        if broken {
            m.status.state = MemberState::ConfigError;
            m.status.state_detail.configuring_instance = Some(instance);
            m.status.state_detail.config_error_detail = Some("setup exited 1".into());
            m.status.ready = false;
        } else {
            m.status.state = MemberState::Configured;
            m.status.state_detail.last_configured_instance = Some(instance);
            m.status.ready = true;
        }
        m.status.ready_changed_at = Some(at(now));
    }

    fn names(asked: &[(String, i64)]) -> Vec<&str> {
        asked.iter().map(|(m, _)| m.as_str()).collect()
    }

    #[test]
    fn a_rolling_cluster_upgrades_itself_once_a_member_is_behind_and_a_manual_one_never() {
        let mut cluster = AppCluster::new("db", Default::default());
        let ms = members(2);
        assert!(rolling_upgrade(&cluster, &ms, 2, false).is_none(), "Manual");
        cluster.spec.update_policy.type_ = UpdateType::Rolling;
        cluster.spec.update_policy.canary = 1;
        let op = rolling_upgrade(&cluster, &ms, 2, false).unwrap();
        assert_eq!(op.metadata.name, "upgrade-db-r2");
        assert_eq!(op.spec.action.pace().map(|p| p.canary), Some(1));
        assert!(rolling_upgrade(&cluster, &ms, 2, true).is_none(), "one under way");
        assert!(rolling_upgrade(&cluster, &ms, 1, false).is_none(), "every member runs it");
        assert_eq!(prevailing([1, 2, 2, 1, 3].into_iter()), Some(2));
        assert_eq!(prevailing(std::iter::empty()), None);
    }

    #[test]
    fn canaries_go_alone_the_leader_last_and_a_member_is_done_once_ready_for_min_healthy_time() {
        let mut op = upgrade(1, 2, true);
        let mut ms = members(4);
        assert_eq!(step(&mut op, &mut ms, None, 1), vec![("db-r-1".to_string(), 2)], "a canary, not the leader");
        assert_eq!(op.status.steps.last().map(|s| s.member.as_str()), Some("db-r-0"), "the leader last");
        assert_eq!(op.status.steps[0].from_revision, Some(1));
        restarted(&mut ms, "db-r-1", false, 5);
        assert!(step(&mut op, &mut ms, None, 14).is_empty(), "ready 9 s of 10: the canary is not healthy yet");
        let due = crate::operation::next_pass(&op, &ms, at(14)).unwrap();
        assert_eq!(due, Duration::from_secs(1), "woken when it has been ready long enough");
        assert_eq!(names(&step(&mut op, &mut ms, None, 15)), ["db-r-2", "db-r-3"], "then maxParallel at a time");
        restarted(&mut ms, "db-r-2", false, 16);
        restarted(&mut ms, "db-r-3", false, 16);
        assert_eq!(names(&step(&mut op, &mut ms, None, 26)), ["db-r-0"]);
        restarted(&mut ms, "db-r-0", false, 27);
        assert!(step(&mut op, &mut ms, None, 37).is_empty());
        assert_eq!(op.status.phase, OperationPhase::Succeeded, "{:?}", op.status.message);
        assert_eq!(op.status.message.as_deref(), Some("db upgraded to revision 2: 4 members"));
    }

    #[test]
    fn a_leader_hands_its_lease_over_before_it_is_restarted() {
        let mut op = upgrade(0, 1, true);
        let mut ms = members(3);
        let lease = |member: &str, term| RoleLeader {
            role: "r".into(),
            member: Some(member.into()),
            term,
            ..Default::default()
        };
        let mut leaders = vec![lease("db-r-0", 1)];
        let pass_with = |op: &mut Operation, ms: &mut [Member], leaders: &[RoleLeader], now| {
            let reported = BTreeSet::new();
            let view = View { members: ms, reported: &reported, reporter_ready: true, irreversible: None, leaders };
            let (status, orders) = pass(op, &view, false, at(now));
            op.status = status;
            for order in &orders {
                record(&mut op.status, &order.member, false, Outcome::Evicted("allowed".into()), at(now));
                let m = ms.iter_mut().find(|m| m.metadata.name == order.member).unwrap();
                m.spec.app_revision = order.to_revision;
            }
            orders.into_iter().map(|o| o.member).collect::<Vec<_>>()
        };
        assert_eq!(pass_with(&mut op, &mut ms, &leaders, 1), ["db-r-1"]);
        restarted(&mut ms, "db-r-1", false, 2);
        assert_eq!(pass_with(&mut op, &mut ms, &leaders, 12), ["db-r-2"]);
        restarted(&mut ms, "db-r-2", false, 13);
        assert!(pass_with(&mut op, &mut ms, &leaders, 23).is_empty(), "the leader is held back");
        let asked = op.status.handover.clone().expect("a handover asked for");
        assert_eq!((asked.from.as_str(), asked.term, asked.to), ("db-r-0", 1, None));
        assert!(pass_with(&mut op, &mut ms, &leaders, 24).is_empty(), "until the term passed");
        leaders[0] = lease("db-r-1", 2);
        ms[0].status.leader = false;
        assert_eq!(pass_with(&mut op, &mut ms, &leaders, 25), ["db-r-0"]);
        assert_eq!(op.status.handover, None);
    }

    #[test]
    fn a_canary_in_config_error_is_returned_without_a_canary_phase_and_the_rest_are_left() {
        let mut op = upgrade(1, 1, true);
        let mut ms = members(3);
        assert_eq!(names(&step(&mut op, &mut ms, None, 1)), ["db-r-1"]);
        restarted(&mut ms, "db-r-1", true, 5);
        let back = step(&mut op, &mut ms, None, 6);
        assert_eq!(back, vec![("db-r-1".to_string(), 1)], "the canary returns to revision 1 at once");
        let reverting = op.status.upgrade.as_ref().and_then(|u| u.reverting.clone()).unwrap();
        assert!(reverting.contains("db-r-1 did not come back configured as revision 2: setup exited 1"), "{reverting}");
        let skipped: Vec<&str> =
            op.status.steps.iter().filter(|s| s.state == StepState::Skipped).map(|s| s.member.as_str()).collect();
        assert_eq!(skipped, ["db-r-2", "db-r-0"], "never touched, so left as they are");
        restarted(&mut ms, "db-r-1", false, 8);
        assert!(step(&mut op, &mut ms, None, 8).is_empty());
        assert_eq!(op.status.phase, OperationPhase::Reverted, "{:?}", op.status.message);
        assert_eq!(ms[1].status.app_revision, Some(1));
    }

    #[test]
    fn a_member_not_healthy_within_the_deadline_stops_it_and_an_irreversible_revision_is_not_reverted() {
        for (irreversible, auto_revert, said) in [
            (Some("it migrates the schema"), true, "revision 2 is marked irreversible (it migrates the schema)"),
            (None, false, "autoRevert is off"),
        ] {
            let mut op = upgrade(0, 1, auto_revert);
            let mut ms = members(2);
            assert_eq!(names(&step(&mut op, &mut ms, irreversible, 1)), ["db-r-1"]);
            restarted(&mut ms, "db-r-1", false, 5);
            assert_eq!(names(&step(&mut op, &mut ms, irreversible, 15)), ["db-r-0"]);
            // The leader's new instance never gets ready.
            ms[0].status.state = MemberState::Creating;
            ms[0].status.ready = false;
            assert!(step(&mut op, &mut ms, irreversible, 74).is_empty(), "59 s: not yet");
            assert!(step(&mut op, &mut ms, irreversible, 75).is_empty());
            assert_eq!(op.status.phase, OperationPhase::Failed);
            let message = op.status.message.clone().unwrap();
            assert!(message.contains("db-r-0 was not healthy within 1m of its restart as revision 2"), "{message}");
            assert!(message.contains(said) && message.contains("stay as they are"), "{message}");
        }
    }
}
