use std::time::SystemTime;

use proptest::prelude::*;

use super::*;
use crate::kinds::MemberState;
use crate::kinds::operation::OperationSpec;
use crate::time::HumanDuration;

fn at(secs: u64) -> Timestamp {
    Timestamp::from_system_time(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs))
}

fn member(index: u32, node: &str, ready: bool) -> Member {
    let mut member = crate::kinds::member::bound_member(index, node);
    member.status.ready = ready;
    member.status.state = if ready { MemberState::Configured } else { MemberState::Creating };
    member
}

fn drain(max_parallel: u32, deadline: Option<u64>, on_deadline: OnDeadline) -> Operation {
    let spec = OperationSpec {
        action: OperationAction::Drain { node: "n1".into() },
        deadline: deadline.map(HumanDuration::from_secs),
        on_deadline,
        max_parallel,
        cancel: false,
        paused: false,
    };
    let mut operation = Operation::new("drain-n1", spec);
    operation.status = begin(&operation.status, "draining n1".into(), at(0));
    operation
}

/// An approved eviction: recorded, and the member asked to move.
fn evicted(op: &mut Operation, members: &mut [Member], name: &str, now: Timestamp) {
    record(&mut op.status, name, false, Outcome::Evicted("allowed".into()), now);
    let member = members.iter_mut().find(|m| m.metadata.name == name).unwrap();
    member.spec.requests.replace = Some(now);
}

fn pass(op: &mut Operation, members: &[Member], retry: bool, now: Timestamp) -> Vec<String> {
    let reported = BTreeSet::new();
    let (status, orders) = super::pass(
        op,
        &View { members, reported: &reported, reporter_ready: true, irreversible: None, leaders: &[] },
        retry,
        now,
    );
    op.status = status;
    orders.into_iter().map(|o| o.member).collect()
}

#[test]
fn members_are_asked_for_max_parallel_at_a_time_and_done_when_ready_elsewhere() {
    let mut op = drain(2, None, OnDeadline::Fail);
    let mut members: Vec<Member> = (0..3).map(|i| member(i, "n1", true)).collect();
    members.push(member(9, "n2", true));
    assert_eq!(pass(&mut op, &members, false, at(1)), vec!["db-r-0", "db-r-1"]);
    assert_eq!(op.status.total, 3, "only the drained node's members");
    for name in ["db-r-0", "db-r-1"] {
        evicted(&mut op, &mut members, name, at(1));
    }
    assert!(pass(&mut op, &members, false, at(2)).is_empty(), "two on their way: no room");
    members[0].spec.node = Some("n3".into());
    members[0].status.ready = false;
    members[0].status.state = MemberState::Creating;
    assert!(pass(&mut op, &members, false, at(3)).is_empty(), "moved but not ready: still on its way");
    assert!(op.status.blocker.as_ref().unwrap().message.starts_with("waiting for db-r-0 on n3 is creating"));
    members[0].status.ready = true;
    assert_eq!(pass(&mut op, &members, false, at(4)), vec!["db-r-2"]);
    assert_eq!((op.status.done, op.status.total), (1, 3));
    for (i, name) in [(1, "db-r-1"), (2, "db-r-2")] {
        evicted(&mut op, &mut members, name, at(4));
        members[i].spec.node = Some("n2".into());
    }
    pass(&mut op, &members, false, at(5));
    assert_eq!(op.status.phase, OperationPhase::Succeeded);
    assert_eq!(op.status.message.as_deref(), Some("node n1 drained: 3 members moved"));
    assert_eq!(op.status.finished_at, Some(at(5)));
}

#[test]
fn a_move_given_up_is_asked_for_again_after_a_pause() {
    let mut op = drain(1, None, OnDeadline::Fail);
    let mut members = vec![member(0, "n1", true)];
    assert_eq!(pass(&mut op, &members, false, at(1)), vec!["db-r-0"]);
    record(&mut op.status, "db-r-0", false, Outcome::Evicted("allowed".into()), at(1));
    members[0].spec.requests.migrate = Some(at(1));
    assert!(pass(&mut op, &members, false, at(2)).is_empty(), "moving");
    members[0].spec.requests = Default::default();
    members[0].status.reason = Some("moving it to n3 failed: disk full".into());
    assert!(pass(&mut op, &members, false, at(3)).is_empty(), "given up: a pause first");
    assert_eq!(op.status.steps[0].state, StepState::MoveFailed);
    assert!(pass(&mut op, &members, true, at(4)).is_empty(), "a budget change does not hurry it");
    assert!(op.status.blocker.as_ref().unwrap().message.contains("stayed on n1: moving it to n3 failed"));
    assert_eq!(pass(&mut op, &members, false, at(8)), vec!["db-r-0"]);
}

#[test]
fn an_evicted_member_is_never_asked_for_again_even_while_still_bound() {
    let mut op = drain(3, None, OnDeadline::Fail);
    let mut members = vec![member(0, "n1", true)];
    assert_eq!(pass(&mut op, &members, false, at(1)), vec!["db-r-0"]);
    evicted(&mut op, &mut members, "db-r-0", at(1));
    for t in 2..20 {
        assert!(pass(&mut op, &members, true, at(t)).is_empty());
    }
    assert_eq!(op.status.steps[0].attempts, 1);
}

#[test]
fn refused_ones_are_retried_after_a_pause_or_when_a_budget_changed_and_the_blocker_keeps_its_since() {
    let mut op = drain(1, None, OnDeadline::Fail);
    let members = vec![member(0, "n1", true)];
    assert_eq!(pass(&mut op, &members, false, at(1)), vec!["db-r-0"]);
    let refused = || Outcome::Refused { message: "budget q needs 2 healthy, has 2".into(), never: false };
    record(&mut op.status, "db-r-0", false, refused(), at(1));
    assert_eq!(next_pass(&op, &[], at(1)), Some(Duration::from_millis(250)), "first again after 250 ms");
    assert_eq!(pass(&mut op, &members, true, at(1)), vec!["db-r-0"], "a budget changed: due");
    for t in 2..12 {
        record(&mut op.status, "db-r-0", false, refused(), at(t));
    }
    assert!(pass(&mut op, &members, false, at(15)).is_empty(), "not due yet: every 5 s at most");
    assert_eq!(next_pass(&op, &[], at(15)), Some(Duration::from_secs(1)));
    assert_eq!(pass(&mut op, &members, false, at(16)), vec!["db-r-0"], "5 s after the last refusal");
    let blocker = op.status.blocker.clone().unwrap();
    assert_eq!((blocker.message.as_str(), blocker.since), ("budget q needs 2 healthy, has 2", at(1)));
    assert_eq!(op.status.history.iter().filter(|h| h.message.contains("refused")).count(), 1, "said once");
}

#[test]
fn the_blocker_is_what_blocks_now_not_the_first_refusal() {
    let mut op = drain(1, None, OnDeadline::Fail);
    let mut members = vec![member(0, "n1", true), member(1, "n1", true)];
    assert_eq!(pass(&mut op, &members, false, at(1)), vec!["db-r-0"]);
    let refused = |message: &str| Outcome::Refused { message: message.into(), never: false };
    record(&mut op.status, "db-r-0", false, refused("budget q needs 2 healthy, has 2"), at(1));
    // Asked again later, the budgets say something else: that is the blocker.
    assert_eq!(pass(&mut op, &members, false, at(7)), vec!["db-r-0"]);
    record(&mut op.status, "db-r-0", false, refused("no node can take db-r-0: n2 is cordoned"), at(7));
    pass(&mut op, &members, false, at(8));
    let blocker = op.status.blocker.clone().unwrap();
    assert_eq!((blocker.message.as_str(), blocker.since), ("no node can take db-r-0: n2 is cordoned", at(1)));
    // One on its way fills maxParallel: no refused one can be asked
    // before it arrives, so it is what blocks.
    evicted(&mut op, &mut members, "db-r-0", at(20));
    members[0].spec.node = Some("n3".into());
    members[0].status.ready = false;
    members[0].status.state = MemberState::Creating;
    assert!(pass(&mut op, &members, false, at(21)).is_empty());
    let blocker = op.status.blocker.clone().unwrap();
    assert!(blocker.message.starts_with("waiting for db-r-0 on n3 is creating"), "{}", blocker.message);
    assert_eq!(blocker.since, at(20));
    assert!(pass(&mut op, &members, false, at(300)).is_empty());
    assert_eq!(op.status.blocker.unwrap().since, at(20), "it keeps when it began");
}

#[test]
fn a_drained_node_that_is_not_ready_is_not_taken_at_its_word() {
    let mut op = drain(1, None, OnDeadline::Fail);
    let mut members = vec![member(0, "n1", true)];
    pass(&mut op, &members, false, at(1));
    evicted(&mut op, &mut members, "db-r-0", at(1));
    members[0].spec.node = Some("n2".into());
    let reported = BTreeSet::from(["db-r-0".to_string()]);
    for (ready, said) in [(true, "db-r-0's old process still runs on n1"), (false, "n1 is NotReady: whether")] {
        let view =
            View { members: &members, reported: &reported, reporter_ready: ready, irreversible: None, leaders: &[] };
        let (status, _) = super::pass(&op, &view, false, at(2));
        let blocker = status.blocker.unwrap().message;
        assert!(blocker.contains(said), "{blocker}");
    }
}

#[test]
fn a_budget_that_never_allows_is_the_blocker_at_once() {
    let mut op = drain(1, None, OnDeadline::Fail);
    let members = vec![member(0, "n1", true)];
    pass(&mut op, &members, false, at(1));
    let never = "budget q can never allow an eviction: minAvailable 3 needs 3 healthy of the 3 members it selects";
    record(&mut op.status, "db-r-0", false, Outcome::Refused { message: never.into(), never: true }, at(1));
    pass(&mut op, &members, false, at(2));
    let blocker = op.status.blocker.unwrap();
    assert!(blocker.never && blocker.message == never);
}

#[test]
fn at_the_deadline_the_rest_fail_stop_or_are_forced() {
    for (on_deadline, phase) in [
        (OnDeadline::Fail, OperationPhase::Failed),
        (OnDeadline::Stop, OperationPhase::Stopped),
        (OnDeadline::Force, OperationPhase::Running),
    ] {
        let mut op = drain(2, Some(30), on_deadline);
        let members = vec![member(0, "n1", true), member(1, "n1", true)];
        for name in pass(&mut op, &members, false, at(1)) {
            let refused = Outcome::Refused { message: "budget q needs 2 healthy, has 2".into(), never: false };
            record(&mut op.status, &name, false, refused, at(1));
        }
        assert_eq!(pass(&mut op, &members, false, at(29)).len(), 2, "asked again before the deadline");
        assert_eq!(op.status.phase, OperationPhase::Running);
        let orders = pass(&mut op, &members, false, at(30));
        assert_eq!(op.status.phase, phase, "{on_deadline:?}");
        if on_deadline == OnDeadline::Force {
            assert_eq!(orders, vec!["db-r-0", "db-r-1"]);
        } else {
            assert!(orders.is_empty());
            let message = op.status.message.clone().unwrap();
            assert!(
                message.starts_with("the deadline (30s) passed with 2 of 2 members not done (db-r-0, db-r-1)")
                    && message.ends_with("budget q needs 2 healthy, has 2"),
                "{message}"
            );
            let view = View {
                members: &members,
                reported: &BTreeSet::new(),
                reporter_ready: true,
                irreversible: None,
                leaders: &[],
            };
            let (status, orders) = super::pass(&op, &view, true, at(40));
            assert!(orders.is_empty() && status == op.status, "a finished Operation never changes");
        }
    }
}

#[test]
fn cancel_ends_it_and_nothing_more_is_asked_for() {
    let mut op = drain(1, None, OnDeadline::Fail);
    let mut members = vec![member(0, "n1", true), member(1, "n1", true)];
    pass(&mut op, &members, false, at(1));
    evicted(&mut op, &mut members, "db-r-0", at(1));
    pass(&mut op, &members, false, at(1));
    assert!(op.status.blocker.is_some(), "db-r-1 waits for db-r-0: {:?}", op.status);
    op.spec.cancel = true;
    assert!(pass(&mut op, &members, true, at(2)).is_empty());
    assert_eq!(op.status.phase, OperationPhase::Cancelled);
    assert_eq!(op.status.blocker, None, "nothing blocks a cancelled Operation");
    assert!(op.status.message.unwrap().starts_with("cancelled with 0 of 2 members done (1 on their way go on)"));
}

#[test]
fn a_finished_operation_goes_a_day_after_it_finished_a_running_one_never() {
    let mut op = drain(1, None, OnDeadline::Fail);
    let day = FINISHED_KEPT.as_secs();
    assert!(!expired(&op, at(2 * day)), "running");
    pass(&mut op, &[], false, at(1));
    assert_eq!(op.status.phase, OperationPhase::Succeeded);
    assert!(!expired(&op, at(day)), "kept a day");
    assert!(expired(&op, at(day + 2)));
}

#[test]
fn an_empty_node_is_drained_at_once_and_a_member_gone_is_done() {
    let mut op = drain(1, None, OnDeadline::Fail);
    pass(&mut op, &[member(0, "n2", true)], false, at(1));
    assert_eq!(op.status.phase, OperationPhase::Succeeded);
    let mut op = drain(1, None, OnDeadline::Fail);
    pass(&mut op, &[member(0, "n1", true)], false, at(1));
    pass(&mut op, &[], false, at(2));
    assert_eq!((op.status.phase, op.status.done), (OperationPhase::Succeeded, 1));
}

#[test]
fn a_rolling_restart_takes_its_canary_alone_first_and_stops_when_one_does_not_come_back() {
    let restart = |canary| {
        let spec = OperationSpec {
            action: OperationAction::Restart { cluster: "db".into(), role: "r".into(), canary },
            max_parallel: 2,
            ..Default::default()
        };
        let mut op = Operation::new("restart-db", spec);
        op.status = begin(&op.status, "restarting".into(), at(0));
        op
    };
    let mut members: Vec<Member> = (0..4).map(|i| member(i, "n1", true)).collect();
    for m in &mut members {
        m.status.state_detail.last_configured_instance = Some(format!("{}-a", m.metadata.name));
    }
    let mut op = restart(1);
    assert_eq!(pass(&mut op, &members, false, at(1)), vec!["db-r-0"], "the canary alone");
    assert_eq!(op.status.steps[0].instance.as_deref(), Some("db-r-0-a"));
    evicted(&mut op, &mut members, "db-r-0", at(1));
    assert!(pass(&mut op, &members, false, at(2)).is_empty(), "nothing else until it is back");
    members[0].status.state_detail.last_configured_instance = Some("db-r-0-b".into());
    assert_eq!(pass(&mut op, &members, false, at(3)), vec!["db-r-1", "db-r-2"], "then max parallel");
    assert_eq!(op.status.done, 1);

    // A broken canary: config error as a new instance stops it all.
    let mut members: Vec<Member> = (0..4).map(|i| member(i, "n1", true)).collect();
    for m in &mut members {
        m.status.state_detail.last_configured_instance = Some(format!("{}-a", m.metadata.name));
    }
    let mut op = restart(1);
    pass(&mut op, &members, false, at(1));
    evicted(&mut op, &mut members, "db-r-0", at(1));
    members[0].status.state = MemberState::ConfigError;
    members[0].status.ready = false;
    members[0].status.state_detail.configuring_instance = Some("db-r-0-b".into());
    members[0].status.state_detail.config_error_detail = Some("setup exited with 1".into());
    assert!(pass(&mut op, &members, false, at(2)).is_empty());
    assert_eq!(op.status.phase, OperationPhase::Failed);
    let message = op.status.message.unwrap();
    assert!(
        message.starts_with("db-r-0 did not come back configured after its restart: setup exited with 1"),
        "{message}"
    );
}

proptest! {
    /// Whatever happens to the members between passes, no more than
    /// maxParallel are ever on their way, and none is asked for twice
    /// once evicted.
    #[test]
    fn never_more_than_max_parallel_on_the_way_and_never_twice(
        max_parallel in 1u32..4,
        moves in proptest::collection::vec((0usize..6, any::<bool>(), any::<bool>(), any::<bool>()), 1..60),
    ) {
        let mut op = drain(max_parallel, None, OnDeadline::Fail);
        let mut members: Vec<Member> = (0..6).map(|i| member(i, "n1", true)).collect();
        let mut gone_out = BTreeSet::new();
        for (t, (i, allow, ready, retry)) in moves.into_iter().enumerate() {
            let now = at(t as u64 + 1);
            for name in pass(&mut op, &members, retry, now) {
                prop_assert!(!gone_out.contains(&name), "{name} asked for again");
                if allow {
                    gone_out.insert(name.clone());
                    evicted(&mut op, &mut members, &name, now);
                } else {
                    record(&mut op.status, &name, false, Outcome::Refused { message: "no".into(), never: false }, now);
                }
            }
            let on_the_way = op.status.steps.iter().filter(|s| s.state == StepState::Evicted).count();
            prop_assert!(on_the_way <= max_parallel as usize);
            // An evicted member moves away, and becomes ready (or not).
            let name = format!("db-r-{i}");
            if gone_out.contains(&name) {
                members[i].spec.node = Some("n2".into());
                members[i].status.ready = ready;
            }
        }
    }
}
