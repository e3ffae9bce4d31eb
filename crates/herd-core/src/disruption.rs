//! Disruption budgets' counts and the eviction verdict, pure.
//!
//! Only ready members count as healthy, so an eviction approved now keeps
//! the next one waiting until the evicted member is back and ready: the
//! count is the rate limit. A member approved for eviction stops counting
//! at once (before it goes down), and its approval is forgotten once it
//! is seen not ready (the eviction took effect) or after
//! [`APPROVAL_TIMEOUT`] if it never went down. Crashes are never asked
//! about; they only lower the count.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::kinds::disruption_budget::{
    DisruptionBudget, DisruptionBudgetStatus, UnhealthyEvictionPolicy, UnhealthyMember,
};
use crate::kinds::{LastKnownState, Member, MemberState};
use crate::time::Timestamp;

/// How long an approved eviction may take to bring its member down before
/// the approval lapses and the member counts again (Kubernetes waits 2
/// minutes for an evicted pod's deletion).
pub const APPROVAL_TIMEOUT: Duration = Duration::from_secs(120);

/// Whether a budget covers a member.
pub fn selects(budget: &DisruptionBudget, member: &Member) -> bool {
    budget.spec.label_selector().is_some_and(|s| s.matches(&member.metadata.labels))
}

/// A member its cluster is removing is not expected: it is not coming back.
fn expected(member: &Member) -> bool {
    !matches!(member.status.state, MemberState::DeletePending | MemberState::Deleting)
}

/// Why a member does not count as healthy, in an operator's words: its
/// state, and why it is not ready (its node NotReady, its process down or
/// crash-looping, its check failing) or why it waits.
pub fn unhealthy_reason(member: &Member) -> String {
    let status = &member.status;
    let not_ready = status.not_ready_reason.as_deref();
    let what = match status.state {
        MemberState::CreatePending if member.spec.node.is_none() => "waiting to be placed".to_string(),
        MemberState::CreatePending => "waiting to be started".to_string(),
        MemberState::Creating => "creating (being set up)".to_string(),
        MemberState::ConfigError => "in config error".to_string(),
        MemberState::DeletePending | MemberState::Deleting => "being removed".to_string(),
        MemberState::Configured => match (not_ready, status.state_detail.last_known_state) {
            (Some(why), _) => return format!("configured, but {why}"),
            (None, LastKnownState::Unresponsive) => {
                "configured, but its readiness check fails (or has not passed yet)".to_string()
            }
            (None, LastKnownState::Terminated | LastKnownState::Absent) => {
                "configured, but its process is not running".to_string()
            }
            (None, LastKnownState::Unknown) => "configured, but its node does not report it".to_string(),
            (None, other) => format!("configured, but {other:?}"),
        },
    };
    let why = match status.state_detail.crash_loop {
        Some(_) => not_ready,
        None => status.reason.as_deref(),
    };
    match why {
        Some(why) => format!("{what}: {why}"),
        None => what,
    }
}

/// The number of healthy members the budget asks for out of `expected`.
pub fn desired_healthy(budget: &DisruptionBudget, expected: u32) -> u32 {
    match (budget.spec.min_available, budget.spec.max_unavailable) {
        (Some(min), _) => min.of(expected),
        (None, Some(max)) => expected.saturating_sub(max.of(expected)),
        // Not valid; counted as asking for everyone (fail closed).
        (None, None) => expected,
    }
}

/// Counts a budget over `members` (all members: the selector picks),
/// keeping the approvals of `budget.status` that still stand at `now`.
pub fn count(budget: &DisruptionBudget, members: &[Member], now: Timestamp) -> DisruptionBudgetStatus {
    // Parsed once: the keeper counts every budget over every member on each change.
    let selector = budget.spec.label_selector();
    let selected: Vec<&Member> = members
        .iter()
        .filter(|m| selector.as_ref().is_some_and(|s| s.matches(&m.metadata.labels)) && expected(m))
        .collect();
    let disrupted: BTreeMap<String, Timestamp> = budget
        .status
        .disrupted_members
        .iter()
        .filter(|(name, approved)| {
            approved.age(now) < APPROVAL_TIMEOUT && selected.iter().any(|m| &m.metadata.name == *name && m.status.ready)
        })
        .map(|(name, approved)| (name.clone(), *approved))
        .collect();
    let expected_members = u32::try_from(selected.len()).unwrap_or(u32::MAX);
    let current_healthy =
        u32::try_from(selected.iter().filter(|m| m.status.ready && !disrupted.contains_key(&m.metadata.name)).count())
            .unwrap_or(u32::MAX);
    let desired_healthy = desired_healthy(budget, expected_members);
    let disruptions_allowed = if expected_members == 0 { 0 } else { current_healthy.saturating_sub(desired_healthy) };
    let unhealthy = selected
        .iter()
        .filter(|m| !m.status.ready)
        .map(|m| UnhealthyMember { name: m.metadata.name.clone(), reason: unhealthy_reason(m) })
        .collect();
    DisruptionBudgetStatus {
        observed_generation: budget.metadata.generation,
        current_healthy,
        desired_healthy,
        expected_members,
        disruptions_allowed,
        disrupted_members: disrupted,
        unhealthy,
        counted_at: Some(now),
    }
}

/// Whether the status leaves nothing to decide from: counted for an older
/// spec, or never counted.
pub fn is_stale(budget: &DisruptionBudget) -> bool {
    budget.status.counted_at.is_none() || budget.status.observed_generation != budget.metadata.generation
}

/// Why a budget can never allow an eviction, even with every member
/// healthy (said, so that a drain does not wait on it silently). A
/// budget that selects no member (yet: it is often applied before its
/// members exist) is asked about no eviction, so it blocks none.
pub fn never_allows(budget: &DisruptionBudget) -> Option<String> {
    let status = &budget.status;
    (status.expected_members > 0 && status.desired_healthy >= status.expected_members).then(|| {
        let asks = match (budget.spec.min_available, budget.spec.max_unavailable) {
            (Some(min), _) => format!("minAvailable {min}"),
            (None, Some(max)) => format!("maxUnavailable {max}"),
            (None, None) => "no bound".to_string(),
        };
        format!(
            "budget {} can never allow an eviction: {asks} needs {} healthy of the {} members it selects; \
             lower it, or add members",
            budget.metadata.name, status.desired_healthy, status.expected_members
        )
    })
}

/// What one budget says to evicting one member it selects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed. `counts` when the member is healthy now: the approval takes
    /// one of the budget's allowed disruptions.
    Allowed { counts: bool },
    /// Refused, with the budget's numbers and who is not healthy.
    Refused(String),
}

/// The verdict of `budget` (whose status is current) on evicting `member`.
pub fn verdict(budget: &DisruptionBudget, member: &Member) -> Verdict {
    let status = &budget.status;
    let name = &budget.metadata.name;
    if is_stale(budget) {
        return Verdict::Refused(format!(
            "budget {name} has not been counted for its current spec yet (generation {}); try again shortly",
            budget.metadata.generation
        ));
    }
    if status.disrupted_members.contains_key(&member.metadata.name) {
        return Verdict::Allowed { counts: false };
    }
    let member_name = &member.metadata.name;
    let refused = || {
        let (desired, healthy) = (status.desired_healthy, status.current_healthy);
        let mut text = if member.status.ready {
            format!(
                "budget {name} needs {desired} healthy: evicting {member_name} would leave {}",
                healthy.saturating_sub(1)
            )
        } else {
            format!(
                "budget {name} needs {desired} healthy and has {healthy}: {member_name} is not healthy, and may go \
                 only while the budget holds without it"
            )
        };
        for (i, unhealthy) in status.unhealthy.iter().enumerate() {
            text.push_str(if i == 0 { "; " } else { ", " });
            text.push_str(&format!("{} is {}", unhealthy.name, unhealthy.reason));
        }
        if let Some(never) = never_allows(budget) {
            text = never;
        }
        Verdict::Refused(text)
    };
    if member.status.ready {
        if status.disruptions_allowed >= 1 { Verdict::Allowed { counts: true } } else { refused() }
    } else {
        match budget.spec.unhealthy_eviction_policy {
            UnhealthyEvictionPolicy::AlwaysAllow => Verdict::Allowed { counts: false },
            UnhealthyEvictionPolicy::IfHealthyBudget if status.current_healthy >= status.desired_healthy => {
                Verdict::Allowed { counts: false }
            }
            UnhealthyEvictionPolicy::IfHealthyBudget => refused(),
        }
    }
}

/// The status after approving the eviction of `member` at `now` (the
/// verdict allowed it): the approval is recorded, and a healthy member's
/// takes one allowed disruption.
pub fn approve(
    status: &DisruptionBudgetStatus,
    member: &Member,
    counts: bool,
    now: Timestamp,
) -> DisruptionBudgetStatus {
    let mut next = status.clone();
    if counts {
        next.disruptions_allowed = next.disruptions_allowed.saturating_sub(1);
        next.current_healthy = next.current_healthy.saturating_sub(1);
        next.disrupted_members.insert(member.metadata.name.clone(), now);
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::MemberSpec;
    use crate::kinds::disruption_budget::{Amount, DisruptionBudgetSpec};
    use crate::kinds::member::{CLUSTER_LABEL, ROLE_LABEL, member_name};
    use proptest::prelude::*;

    fn at(secs: u64) -> Timestamp {
        Timestamp::from_system_time(std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs))
    }

    fn member(index: u32, ready: bool) -> Member {
        let name = member_name("etcd", "member", index);
        let mut member = Member::new(
            &name,
            MemberSpec {
                cluster: "etcd".into(),
                role: "member".into(),
                index,
                node: Some("n1".into()),
                ..Default::default()
            },
        );
        member.metadata.labels.insert(CLUSTER_LABEL.into(), "etcd".into());
        member.metadata.labels.insert(ROLE_LABEL.into(), "member".into());
        member.status.ready = ready;
        member.status.state = if ready { MemberState::Configured } else { MemberState::Creating };
        member
    }

    fn budget(min: Option<Amount>, max: Option<Amount>) -> DisruptionBudget {
        let mut budget = DisruptionBudget::new(
            "etcd-quorum",
            DisruptionBudgetSpec {
                selector: format!("{CLUSTER_LABEL}=etcd"),
                min_available: min,
                max_unavailable: max,
                ..Default::default()
            },
        );
        budget.metadata.generation = 1;
        budget
    }

    fn counted(mut budget: DisruptionBudget, members: &[Member], now: Timestamp) -> DisruptionBudget {
        budget.status = count(&budget, members, now);
        budget
    }

    #[test]
    fn three_members_min_available_two_allow_one_eviction_at_a_time() {
        let mut members: Vec<Member> = (0..3).map(|i| member(i, true)).collect();
        let b = counted(budget(Some(Amount::Count(2)), None), &members, at(0));
        assert_eq!((b.status.expected_members, b.status.current_healthy, b.status.desired_healthy), (3, 3, 2));
        assert_eq!(b.status.disruptions_allowed, 1);
        assert_eq!(verdict(&b, &members[0]), Verdict::Allowed { counts: true });
        let mut b2 = b.clone();
        b2.status = approve(&b.status, &members[0], true, at(1));
        let Verdict::Refused(why) = verdict(&b2, &members[1]) else { panic!("a second eviction must be refused") };
        assert_eq!(why, "budget etcd-quorum needs 2 healthy: evicting etcd-member-1 would leave 1");
        // The evicted member goes down and is being set up again elsewhere.
        members[0].status.ready = false;
        members[0].status.state = MemberState::Creating;
        let b3 = counted(b2, &members, at(5));
        assert!(b3.status.disrupted_members.is_empty(), "the approval is forgotten once the member is down");
        let Verdict::Refused(why) = verdict(&b3, &members[1]) else { panic!("refused until the replacement is ready") };
        assert_eq!(
            why,
            "budget etcd-quorum needs 2 healthy: evicting etcd-member-1 would leave 1; etcd-member-0 is creating \
             (being set up)"
        );
        // Ready again: the next eviction is allowed.
        members[0].status.ready = true;
        members[0].status.state = MemberState::Configured;
        let b4 = counted(b3, &members, at(9));
        assert_eq!(verdict(&b4, &members[1]), Verdict::Allowed { counts: true });
    }

    #[test]
    fn a_budget_that_can_never_allow_says_so() {
        let members: Vec<Member> = (0..3).map(|i| member(i, true)).collect();
        let b = counted(budget(Some(Amount::Count(3)), None), &members, at(0));
        let never = never_allows(&b).unwrap();
        assert!(never.contains("can never allow an eviction: minAvailable 3 needs 3 healthy of the 3"), "{never}");
        assert_eq!(verdict(&b, &members[0]), Verdict::Refused(never));
        let b = counted(budget(None, Some(Amount::Count(0))), &members, at(0));
        assert!(never_allows(&b).unwrap().contains("maxUnavailable 0 needs 3 healthy"));
        let b = counted(budget(None, Some(Amount::Count(1))), &members, at(0));
        assert_eq!(never_allows(&b), None);
        let nothing = counted(budget(Some(Amount::Count(1)), None), &[], at(0));
        assert_eq!(nothing.status.disruptions_allowed, 0, "nothing expected: fail closed");
        assert_eq!(never_allows(&nothing), None, "one that selects no member (yet) is asked about no eviction");
    }

    #[test]
    fn percentages_are_counted_against_the_expected_members() {
        let members: Vec<Member> = (0..3).map(|i| member(i, true)).collect();
        let b = counted(budget(None, Some(Amount::Percent(34))), &members, at(0));
        assert_eq!((b.status.desired_healthy, b.status.disruptions_allowed), (1, 2), "34% of 3 rounds up to 2");
        let b = counted(budget(Some(Amount::Percent(50)), None), &members, at(0));
        assert_eq!((b.status.desired_healthy, b.status.disruptions_allowed), (2, 1), "50% of 3 needs 2");
    }

    #[test]
    fn unhealthy_members_follow_the_policy_and_crashes_only_lower_the_count() {
        let mut members: Vec<Member> = (0..3).map(|i| member(i, true)).collect();
        members[2].status.ready = false; // crashed: nothing asked, only counted
        members[2].status.state_detail.last_known_state = LastKnownState::Terminated;
        members[2].status.state = MemberState::Configured;
        let b = counted(budget(Some(Amount::Count(2)), None), &members, at(0));
        assert_eq!((b.status.current_healthy, b.status.disruptions_allowed), (2, 0));
        assert_eq!(b.status.unhealthy[0].reason, "configured, but its process is not running");
        // The budget holds (2 of 2): the unhealthy one may go, it takes nothing.
        assert_eq!(verdict(&b, &members[2]), Verdict::Allowed { counts: false });
        members[1].status.ready = false;
        let short = counted(b, &members, at(1));
        assert!(matches!(verdict(&short, &members[2]), Verdict::Refused(_)), "a short budget keeps them");
        let mut always = short.clone();
        always.spec.unhealthy_eviction_policy = UnhealthyEvictionPolicy::AlwaysAllow;
        assert_eq!(verdict(&always, &members[2]), Verdict::Allowed { counts: false });
    }

    #[test]
    fn a_stale_status_refuses_and_a_lapsed_approval_counts_again() {
        let members: Vec<Member> = (0..3).map(|i| member(i, true)).collect();
        let mut b = counted(budget(Some(Amount::Count(2)), None), &members, at(0));
        b.metadata.generation = 2;
        assert!(matches!(verdict(&b, &members[0]), Verdict::Refused(why) if why.contains("not been counted")));
        b.metadata.generation = 1;
        b.status = approve(&b.status, &members[0], true, at(0));
        let still = counted(b.clone(), &members, at(60));
        assert_eq!(still.status.current_healthy, 2, "approved and still up: not counted");
        assert_eq!(verdict(&still, &members[0]), Verdict::Allowed { counts: false }, "asking again is allowed");
        let lapsed = counted(b, &members, at(121));
        assert_eq!((lapsed.status.current_healthy, lapsed.status.disruptions_allowed), (3, 1));
    }

    #[test]
    fn members_being_removed_are_not_expected_and_others_are_not_selected() {
        let mut members: Vec<Member> = (0..4).map(|i| member(i, true)).collect();
        members[3].status.state = MemberState::DeletePending;
        let mut other = member(9, true);
        other.metadata.labels.insert(CLUSTER_LABEL.into(), "redis".into());
        members.push(other);
        let b = counted(budget(None, Some(Amount::Count(1))), &members, at(0));
        assert_eq!((b.status.expected_members, b.status.current_healthy), (3, 3));
    }

    proptest! {
        /// Evictions approved one after the other, each on the status the
        /// last approval left, never take the healthy count below the
        /// desired one, and approve at most the allowed number.
        #[test]
        fn approvals_never_break_the_budget(
            ready in proptest::collection::vec(any::<bool>(), 0..12),
            min in proptest::option::of(0u32..14),
            percent in 0u8..=100,
            use_percent in any::<bool>(),
            order in proptest::collection::vec(0usize..12, 0..24),
        ) {
            let members: Vec<Member> = ready.iter().enumerate().map(|(i, r)| member(i as u32, *r)).collect();
            let bound = if use_percent { Amount::Percent(percent) } else { Amount::Count(min.unwrap_or(0)) };
            let spec = if min.is_some() { (Some(bound), None) } else { (None, Some(bound)) };
            let mut b = counted(budget(spec.0, spec.1), &members, at(0));
            let (desired, start) = (b.status.desired_healthy, b.status.current_healthy);
            let allowed = b.status.disruptions_allowed;
            let mut counted_approvals = 0;
            for i in order.into_iter().filter(|i| *i < members.len()) {
                if let Verdict::Allowed { counts } = verdict(&b, &members[i]) {
                    counted_approvals += u32::from(counts);
                    b.status = approve(&b.status, &members[i], counts, at(1));
                }
                prop_assert!(b.status.current_healthy >= desired.min(start));
            }
            prop_assert!(counted_approvals <= allowed);
        }
    }
}
