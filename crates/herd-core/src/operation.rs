//! The drain's state machine, pure: what an
//! Operation does next, decided from its recorded steps and what the
//! members look like now. The leader (`herd-server`'s operations
//! controller) asks for the evictions decided here, records how each went
//! with [`record`], and writes the status, so a new leader resumes from it.
//!
//! Invariants:
//! - A member is asked for only while it is bound to the drained node and
//!   its step is Waiting or Refused; once Evicted it is never asked again
//!   (a leader that lost the record of an approval asks again, and the
//!   eviction API answers that it is under way: the same eviction).
//! - At most `maxParallel` members are on their way at once: evicted, and
//!   not yet ready elsewhere.
//! - A finished Operation never changes again; it is deleted
//!   [`FINISHED_KEPT`] after it finished ([`expired`]).

use std::collections::BTreeSet;
use std::time::Duration;

use crate::backoff::Backoff;
use crate::disruption::unhealthy_reason;
use crate::kinds::operation::{
    Blocker, HISTORY_KEPT, HistoryEntry, OnDeadline, Operation, OperationAction, OperationPhase, OperationStatus,
    OperationStep, StepState,
};
use crate::kinds::{Member, MemberState};
use crate::time::Timestamp;

/// How soon a refused eviction is asked again at most, when nothing
/// changed meanwhile (kubectl drain retries every 5 s); a change of any
/// budget makes every refused one due at once.
pub const RETRY_REFUSED: Duration = Duration::from_secs(5);

/// How long after its refusals in a row a member is asked again: 250 ms,
/// doubling, at most [`RETRY_REFUSED`] (a budget recounted just after the
/// refusal is not waited out).
const REFUSED_RETRIES: Backoff = Backoff::new(Duration::from_millis(250), RETRY_REFUSED);

fn refused_retry(attempts: u32) -> Duration {
    REFUSED_RETRIES.pause(attempts)
}

/// How long after its `attempts`-th failed move a member is asked for
/// again: 5 s more each time, at most a minute (a budget change does not
/// hurry it: the move itself failed).
fn move_retry(attempts: u32) -> Duration {
    RETRY_REFUSED.saturating_mul(attempts.clamp(1, 12))
}

/// What an Operation sees of the cluster at one moment.
pub struct View<'a> {
    /// Every member (the Operation picks those it works on).
    pub members: &'a [Member],
    /// The members whose process the drained node still reports.
    pub reported: &'a BTreeSet<String>,
    /// Whether that node is Ready: a NotReady node's report is not current.
    pub reporter_ready: bool,
}

/// An eviction the drain asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Order {
    pub member: String,
    /// Without asking the budgets (the deadline passed, `onDeadline: force`).
    pub force: bool,
}

/// How an eviction the drain asked for went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Approved (or under way already): the member is on its way.
    Evicted(String),
    /// Refused by a budget (or not possible now), with why; `never` when a
    /// budget that selects it can never allow an eviction as it stands.
    Refused { message: String, never: bool },
}

pub(crate) fn note(status: &mut OperationStatus, now: Timestamp, message: String) {
    status.history.push(HistoryEntry { at: now, message });
    let excess = status.history.len().saturating_sub(HISTORY_KEPT);
    status.history.drain(..excess);
}

/// Ends the Operation: nothing blocks a finished one (its message says
/// how it ended, and why, if something stood in its way).
pub(crate) fn finish(status: &mut OperationStatus, phase: OperationPhase, message: String, now: Timestamp) {
    status.phase = phase;
    status.blocker = None;
    status.finished_at = Some(now);
    status.message = Some(message.clone());
    note(status, now, message);
}

/// The Operation taken up by the leader.
pub fn begin(status: &OperationStatus, message: String, now: Timestamp) -> OperationStatus {
    let mut next = status.clone();
    next.phase = OperationPhase::Running;
    next.started_at = Some(now);
    next.message = Some(message.clone());
    note(&mut next, now, message);
    next
}

/// The Operation ended Failed before it could do anything (its node
/// cannot be drained, for one).
pub fn refuse(status: &OperationStatus, message: String, now: Timestamp) -> OperationStatus {
    let mut next = status.clone();
    finish(&mut next, OperationPhase::Failed, message, now);
    next
}

/// Whether an evicted member is still bound to `node` with no move asked
/// for or under way: its move failed and was dropped.
fn abandoned(member: &Member, node: &str) -> bool {
    member.spec.node.as_deref() == Some(node) && !member.spec.requests.to_leave() && member.status.migration.is_none()
}

/// Where a member bound elsewhere stands: ready, or why not.
fn arrived(member: &Member, node: &str, view: &View) -> Result<(), String> {
    let name = &member.metadata.name;
    if member.spec.node.as_deref() == Some(node) {
        return Err(format!("{name} is still bound to {node}"));
    }
    if view.reported.contains(name) {
        return Err(match view.reporter_ready {
            true => format!("{name}'s old process still runs on {node}"),
            false => format!("{node} is NotReady: whether {name}'s old process still runs there is not known"),
        });
    }
    if !member.status.ready {
        let place = member.spec.node.as_deref().map(|n| format!(" on {n}")).unwrap_or_default();
        return Err(format!("{name}{place} is {}", unhealthy_reason(member)));
    }
    Ok(())
}

/// Where a step's member stands, as its Operation judges it.
enum Standing {
    /// It did what was asked (moved and ready elsewhere, or restarted and ready).
    Done(String),
    /// On its way; why it is not done yet.
    Waiting(String),
    /// Its move was dropped (a failed migration): it stayed.
    Stayed(String),
    /// It did not come back (a restart that ended in config error): the
    /// Operation stops.
    Broken(String),
    /// Moved off the node by something else (a drain).
    Left,
    /// Still to be asked for.
    NotYet,
}

fn standing(action: &OperationAction, step: &OperationStep, member: &Member, view: &View) -> Standing {
    match action {
        OperationAction::Switchover { .. } => Standing::NotYet,
        OperationAction::Drain { node } => {
            let asked = step.state == StepState::Evicted;
            if asked && abandoned(member, node) {
                let why = member.status.reason.clone().unwrap_or_else(|| "its move was given up".into());
                return Standing::Stayed(format!("{} stayed on {node}: {why}", step.member));
            }
            if !asked {
                return if member.spec.node.as_deref() != Some(node) { Standing::Left } else { Standing::NotYet };
            }
            match arrived(member, node, view) {
                Ok(()) => Standing::Done(format!("ready on {}", member.spec.node.as_deref().unwrap_or_default())),
                Err(why) => Standing::Waiting(why),
            }
        }
        OperationAction::Restart { .. } => {
            if step.state != StepState::Evicted {
                return Standing::NotYet;
            }
            let detail = &member.status.state_detail;
            let name = &member.metadata.name;
            let other = |instance: &Option<String>| instance.is_some() && *instance != step.instance;
            match member.status.state {
                MemberState::ConfigError if other(&detail.configuring_instance) => Standing::Broken(format!(
                    "{name} did not come back configured after its restart: {}",
                    detail.config_error_detail.as_deref().unwrap_or("config error")
                )),
                MemberState::Configured if other(&detail.last_configured_instance) && member.status.ready => {
                    let instance = detail.last_configured_instance.as_deref().unwrap_or_default();
                    Standing::Done(format!("restarted: runs as instance {instance}"))
                }
                _ => Standing::Waiting(format!("{name} is {}", unhealthy_reason(member))),
            }
        }
    }
}

/// The members an Operation works on, in the order it takes them.
fn selected<'a>(action: &OperationAction, members: &'a [Member]) -> Vec<&'a Member> {
    let mut picked: Vec<&Member> = members
        .iter()
        .filter(|m| match action {
            OperationAction::Drain { node } => m.spec.node.as_deref() == Some(node.as_str()),
            OperationAction::Switchover { .. } => false,
            OperationAction::Restart { cluster, role, .. } => {
                m.spec.cluster == *cluster
                    && m.spec.role == *role
                    && !matches!(m.status.state, MemberState::DeletePending | MemberState::Deleting)
            }
        })
        .collect();
    picked.sort_by_key(|m| (m.spec.index, m.metadata.name.clone()));
    picked
}

/// What an Operation says of itself when done, cancelled or past its deadline.
fn said(action: &OperationAction, status: &OperationStatus, what: Said) -> String {
    let (done, total) = (status.done, status.total);
    match (action, what) {
        (OperationAction::Switchover { role, .. }, _) => format!("switching role {role} over"),
        (OperationAction::Drain { node }, Said::Done) => format!("node {node} drained: {total} members moved"),
        (OperationAction::Restart { cluster, role, .. }, Said::Done) => {
            format!("role {role} of {cluster} restarted: {total} members, each once")
        }
        (OperationAction::Drain { node }, Said::Cancelled(in_flight)) => format!(
            "cancelled with {done} of {total} members done ({in_flight} on their way go on); node {node} stays \
             drained (`herd node undrain {node}` takes members again)"
        ),
        (OperationAction::Restart { .. }, Said::Cancelled(in_flight)) => {
            format!("cancelled with {done} of {total} members restarted ({in_flight} restarting go on)")
        }
        (OperationAction::Drain { node }, Said::Progress) => {
            format!("draining {node}: {done} of {total} members moved")
        }
        (OperationAction::Restart { role, .. }, Said::Progress) => {
            format!("restarting role {role}: {done} of {total} members restarted")
        }
    }
}

enum Said {
    Done,
    Cancelled(usize),
    Progress,
}

/// One pass of an Operation at `now`: its steps brought up to date with
/// the members (new ones added, those that did what was asked done), then
/// what to ask for: as many evictions as `maxParallel` leaves room for
/// (a rolling restart's canaries first, alone), of members not yet asked
/// or refused and due again (`retry_refused`: a budget changed since, so
/// every refused one is). At the deadline the rest fail, stop or are
/// forced as the spec says; a restarted member that does not come back
/// configured stops a rolling restart.
pub fn pass(operation: &Operation, view: &View, retry_refused: bool, now: Timestamp) -> (OperationStatus, Vec<Order>) {
    let spec = &operation.spec;
    let mut status = operation.status.clone();
    if status.phase != OperationPhase::Running {
        return (status, Vec::new());
    }
    let action = &spec.action;
    // A switchover has no steps: `crate::switchover` decides its passes.
    if matches!(action, OperationAction::Switchover { .. }) {
        return (status, Vec::new());
    }
    for member in selected(action, view.members) {
        if !status.steps.iter().any(|s| s.member == member.metadata.name) {
            let step = OperationStep { member: member.metadata.name.clone(), since: now, ..Default::default() };
            status.steps.push(step);
        }
    }
    let mut notes = Vec::new();
    let mut waiting_on = Vec::new();
    let mut broken = None;
    for step in &mut status.steps {
        let moved = |step: &mut OperationStep, state: StepState, message: String| {
            step.state = state;
            step.since = now;
            step.message = Some(message);
        };
        if step.state == StepState::Done {
            continue;
        }
        let Some(member) = view.members.iter().find(|m| m.metadata.name == step.member) else {
            moved(step, StepState::Done, "gone (deleted)".into());
            notes.push(format!("{} is gone", step.member));
            continue;
        };
        match standing(action, step, member, view) {
            Standing::Done(how) => {
                notes.push(format!("{}: {how}", step.member));
                moved(step, StepState::Done, how);
            }
            Standing::Waiting(why) => waiting_on.push(why),
            Standing::Stayed(why) => {
                notes.push(why.clone());
                moved(step, StepState::MoveFailed, why);
            }
            Standing::Broken(why) => broken = Some(why),
            Standing::Left => {
                notes.push(format!("{} left the node (not by this drain)", step.member));
                moved(step, StepState::Evicted, "moved off the node by something else".into());
            }
            Standing::NotYet => {}
        }
    }
    for message in notes {
        note(&mut status, now, message);
    }
    status.total = u32::try_from(status.steps.len()).unwrap_or(u32::MAX);
    status.done = u32::try_from(status.steps.iter().filter(|s| s.state == StepState::Done).count()).unwrap_or(0);
    if let Some(why) = broken {
        finish(&mut status, OperationPhase::Failed, format!("{why}; the rest were left as they are"), now);
        return (status, Vec::new());
    }
    let left: Vec<&OperationStep> = status
        .steps
        .iter()
        .filter(|s| matches!(s.state, StepState::Waiting | StepState::Refused | StepState::MoveFailed))
        .collect();
    let in_flight = status.steps.iter().filter(|s| s.state == StepState::Evicted).count();
    if left.is_empty() && in_flight == 0 {
        let message = said(action, &status, Said::Done);
        finish(&mut status, OperationPhase::Succeeded, message, now);
        return (status, Vec::new());
    }
    if spec.cancel {
        let message = said(action, &status, Said::Cancelled(in_flight));
        finish(&mut status, OperationPhase::Cancelled, message, now);
        return (status, Vec::new());
    }
    // A rolling restart's canaries go first, and alone.
    let canaries = match action {
        OperationAction::Restart { canary, .. } => usize::try_from(*canary).unwrap_or(usize::MAX),
        OperationAction::Drain { .. } | OperationAction::Switchover { .. } => 0,
    };
    let canaries_done = status.steps.iter().take(canaries).all(|s| s.state == StepState::Done);
    let limit = if canaries_done { spec.max_parallel } else { u32::try_from(canaries).unwrap_or(u32::MAX) };
    let room = usize::try_from(limit).unwrap_or(usize::MAX).saturating_sub(in_flight);
    status.blocker = blocker(&status, &waiting_on, room, now);
    let past_deadline = match (spec.deadline, status.started_at) {
        (Some(deadline), Some(started)) => started.age(now) >= deadline.get(),
        _ => false,
    };
    if past_deadline && !left.is_empty() {
        let deadline = spec.deadline.unwrap_or_default();
        let why = status.blocker.as_ref().map(|b| b.message.clone()).unwrap_or_else(|| "not asked yet".into());
        let names: Vec<&str> = left.iter().map(|s| s.member.as_str()).collect();
        match spec.on_deadline {
            OnDeadline::Fail | OnDeadline::Stop => {
                let phase =
                    if spec.on_deadline == OnDeadline::Fail { OperationPhase::Failed } else { OperationPhase::Stopped };
                let message = format!(
                    "the deadline ({deadline}) passed with {} of {} members not done ({}): {why}",
                    names.len(),
                    status.total,
                    names.join(", ")
                );
                finish(&mut status, phase, message, now);
                return (status, Vec::new());
            }
            OnDeadline::Force => {
                let orders = names.iter().map(|m| Order { member: m.to_string(), force: true }).collect();
                return (status, orders);
            }
        }
    }
    let due = |s: &&OperationStep| match s.state {
        StepState::Waiting => true,
        StepState::Refused => retry_refused || tried(s).age(now) >= refused_retry(s.attempts),
        StepState::MoveFailed => s.since.age(now) >= move_retry(s.attempts),
        _ => false,
    };
    let eligible = status.steps.len().min(if canaries_done { usize::MAX } else { canaries });
    let orders: Vec<Order> = status.steps[..eligible]
        .iter()
        .filter(|s| left.iter().any(|l| l.member == s.member))
        .filter(due)
        .take(room)
        .map(|s| Order { member: s.member.clone(), force: false })
        .collect();
    // The instance each is asked for as: a restart is done once another runs.
    for order in &orders {
        let member = view.members.iter().find(|m| m.metadata.name == order.member);
        let instance = member.and_then(|m| m.status.state_detail.last_configured_instance.clone());
        if let Some(step) = status.steps.iter_mut().find(|s| s.member == order.member) {
            step.instance = instance;
        }
    }
    status.message = Some(said(action, &status, Said::Progress));
    (status, orders)
}

/// What keeps the Operation from going on now, and since when that has
/// held: a budget that can never allow (while a step is refused so);
/// else, when `room` is 0 (`maxParallel` on their way), the members on
/// their way that are not ready yet (no refused one can be asked before
/// one arrives, so its refusal is not what blocks); else the refusal
/// heard last (what the budgets say now, not what they said first); else
/// the members on their way.
fn blocker(status: &OperationStatus, waiting_on: &[String], room: usize, now: Timestamp) -> Option<Blocker> {
    let refused = status.steps.iter().filter(|s| matches!(s.state, StepState::Refused | StepState::MoveFailed));
    if let Some(old) = &status.blocker
        && old.never
        && refused.clone().any(|s| s.message.as_deref() == Some(old.message.as_str()))
    {
        return Some(old.clone());
    }
    // Since the first of those on their way was evicted.
    let in_flight = || -> Option<(String, Timestamp)> {
        let since = status.steps.iter().filter(|s| s.state == StepState::Evicted).map(|s| s.since).min();
        waiting_on.first().map(|why| (format!("waiting for {why}"), since.unwrap_or(now)))
    };
    let latest = refused.max_by_key(|s| (tried(s), s.since)).and_then(|s| Some((s.message.clone()?, s.since)));
    let (message, since) = match (room, latest) {
        (0, latest) => in_flight().or(latest)?,
        (_, Some(latest)) => latest,
        (_, None) => in_flight()?,
    };
    // A blocker that stays keeps the time it began.
    let since = match &status.blocker {
        Some(old) if old.message == message => old.since,
        _ => since,
    };
    Some(Blocker { message, since, never: false })
}

/// When a step's member was last asked for.
fn tried(step: &OperationStep) -> Timestamp {
    step.tried_at.unwrap_or(step.since)
}

/// Records how the eviction of `member` went.
pub fn record(status: &mut OperationStatus, member: &str, force: bool, outcome: Outcome, now: Timestamp) {
    let Some(step) = status.steps.iter_mut().find(|s| s.member == member) else { return };
    step.attempts += 1;
    step.tried_at = Some(now);
    match outcome {
        Outcome::Evicted(message) => {
            step.state = StepState::Evicted;
            step.since = now;
            step.forced = force;
            step.message = Some(message.clone());
            let how = if force { "forced at the deadline, budgets not asked" } else { "evicted" };
            note(status, now, format!("{member} {how}: {message}"));
        }
        Outcome::Refused { message, never } => {
            let first = step.state != StepState::Refused || step.message.as_deref() != Some(message.as_str());
            if step.state != StepState::Refused {
                step.since = now;
            }
            step.state = StepState::Refused;
            step.message = Some(message.clone());
            if first {
                note(status, now, format!("{member} refused: {message}"));
            }
            let since = status.blocker.as_ref().filter(|b| b.message == message).map_or(now, |b| b.since);
            if never || status.blocker.is_none() {
                status.blocker = Some(Blocker { message, since, never });
            }
        }
    }
}

/// How soon the next pass is due with nothing changing: a refused
/// eviction's retry, or the deadline.
pub fn next_pass(operation: &Operation, now: Timestamp) -> Option<Duration> {
    let status = &operation.status;
    if status.phase != OperationPhase::Running {
        return None;
    }
    let retry = status
        .steps
        .iter()
        .filter_map(|s| match s.state {
            StepState::Refused => Some(refused_retry(s.attempts).saturating_sub(tried(s).age(now))),
            StepState::MoveFailed => Some(move_retry(s.attempts).saturating_sub(s.since.age(now))),
            _ => None,
        })
        .min();
    let deadline = match (operation.spec.deadline, status.started_at) {
        (Some(deadline), Some(started)) => Some(deadline.get().saturating_sub(started.age(now))),
        _ => None,
    };
    retry.into_iter().chain(deadline).min()
}

/// How long a finished Operation is kept (its steps and history, for
/// `herd describe operation`) before the leader deletes it, as Kubernetes'
/// `ttlSecondsAfterFinished` does for Jobs: finished Operations would
/// otherwise pile up in the store and in every candidate's configuration
/// copy.
pub const FINISHED_KEPT: Duration = Duration::from_secs(24 * 3600);

/// Whether a finished Operation has been kept long enough to go.
pub fn expired(operation: &Operation, now: Timestamp) -> bool {
    let status = &operation.status;
    status.phase.is_finished() && status.finished_at.is_some_and(|at| at.age(now) > FINISHED_KEPT)
}

#[cfg(test)]
mod tests {
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
        let (status, orders) =
            super::pass(op, &View { members, reported: &reported, reporter_ready: true }, retry, now);
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
        assert_eq!(next_pass(&op, at(1)), Some(Duration::from_millis(250)), "first again after 250 ms");
        assert_eq!(pass(&mut op, &members, true, at(1)), vec!["db-r-0"], "a budget changed: due");
        for t in 2..12 {
            record(&mut op.status, "db-r-0", false, refused(), at(t));
        }
        assert!(pass(&mut op, &members, false, at(15)).is_empty(), "not due yet: every 5 s at most");
        assert_eq!(next_pass(&op, at(15)), Some(Duration::from_secs(1)));
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
            let view = View { members: &members, reported: &reported, reporter_ready: ready };
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
                let view = View { members: &members, reported: &BTreeSet::new(), reporter_ready: true };
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
}
