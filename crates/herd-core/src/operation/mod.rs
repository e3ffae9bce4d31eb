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
use crate::kinds::app_cluster::RoleLeader;
use crate::kinds::operation::{
    Blocker, HISTORY_KEPT, HistoryEntry, OnDeadline, Operation, OperationAction, OperationPhase, OperationStatus,
    OperationStep, StepState,
};
use crate::kinds::{Member, MemberState};
use crate::time::Timestamp;
use crate::upgrade;

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
    /// An upgrade's: why the revision it upgrades to may not be reverted
    /// (its App says so), if it may not.
    pub irreversible: Option<String>,
    /// An upgrade's: the leases of its cluster's leader roles (a leader
    /// hands its lease over before it is restarted).
    pub leaders: &'a [RoleLeader],
}

/// An eviction the drain asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Order {
    pub member: String,
    /// Without asking the budgets (the deadline passed, `onDeadline: force`).
    pub force: bool,
    /// An upgrade's: the revision the member is to restart as.
    pub to_revision: Option<i64>,
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
pub(crate) enum Standing {
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

fn standing(
    action: &OperationAction,
    status: &OperationStatus,
    step: &OperationStep,
    member: &Member,
    view: &View,
    now: Timestamp,
) -> Standing {
    match action {
        OperationAction::Upgrade { .. } => {
            let pace = action.pace().unwrap_or_default();
            upgrade::standing(step, member, pace, upgrade::reverting(status), now)
        }
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
            OperationAction::Upgrade { cluster, .. } => {
                m.spec.cluster == *cluster
                    && !matches!(m.status.state, MemberState::DeletePending | MemberState::Deleting)
            }
        })
        .collect();
    match action {
        OperationAction::Upgrade { .. } => picked.sort_by_key(|m| upgrade::order_key(m)),
        _ => picked.sort_by_key(|m| (m.spec.index, m.metadata.name.clone())),
    }
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
        (OperationAction::Upgrade { cluster, to_revision, .. }, what) => {
            let back = status.upgrade.as_ref().and_then(|u| u.reverting.as_ref());
            match (back, what) {
                (Some(why), Said::Done) => {
                    format!("reverted: {why}; the {done} member(s) it touched run the revision they ran before")
                }
                (Some(why), _) => format!("reverting ({why}): {done} of {total} returned"),
                (None, Said::Done) => format!("{cluster} upgraded to revision {to_revision}: {total} members"),
                (None, Said::Cancelled(in_flight)) => format!(
                    "cancelled with {done} of {total} members at revision {to_revision} ({in_flight} restarting go on)"
                ),
                (None, Said::Progress) => {
                    format!("upgrading {cluster} to revision {to_revision}: {done} of {total} members done")
                }
            }
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
    let reverting = upgrade::reverting(&status);
    for member in selected(action, view.members) {
        if !status.steps.iter().any(|s| s.member == member.metadata.name) {
            let mut step = OperationStep { member: member.metadata.name.clone(), since: now, ..Default::default() };
            if let OperationAction::Upgrade { to_revision, .. } = action {
                step.to_revision = Some(*to_revision);
                // One that came while the upgrade is reverted is left to its cluster.
                if reverting {
                    step.state = StepState::Skipped;
                }
            }
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
        if matches!(step.state, StepState::Done | StepState::Skipped) {
            continue;
        }
        let Some(member) = view.members.iter().find(|m| m.metadata.name == step.member) else {
            moved(step, StepState::Done, "gone (deleted)".into());
            notes.push(format!("{} is gone", step.member));
            continue;
        };
        match standing(action, &operation.status, step, member, view, now) {
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
    match (broken, action) {
        (None, _) => {}
        (Some(why), OperationAction::Upgrade { .. }) if reverting => {
            let message = format!("the revert failed too: {why}; the rest were left as they are");
            finish(&mut status, OperationPhase::Failed, message, now);
            return (status, Vec::new());
        }
        (Some(why), OperationAction::Upgrade { to_revision, auto_revert, .. }) => {
            let revert = match (&view.irreversible, auto_revert) {
                (Some(reason), _) => {
                    Err(format!("revision {to_revision} is marked irreversible ({reason}), so it is not reverted"))
                }
                (None, false) => Err("autoRevert is off, so it is not reverted".to_string()),
                (None, true) => Ok(()),
            };
            upgrade::stop(&mut status, why, revert, now);
            if status.phase.is_finished() {
                return (status, Vec::new());
            }
            return pass(&Operation { status, ..operation.clone() }, view, retry_refused, now);
        }
        (Some(why), _) => {
            finish(&mut status, OperationPhase::Failed, format!("{why}; the rest were left as they are"), now);
            return (status, Vec::new());
        }
    }
    let left: Vec<&OperationStep> = status
        .steps
        .iter()
        .filter(|s| matches!(s.state, StepState::Waiting | StepState::Refused | StepState::MoveFailed))
        .collect();
    let in_flight = status.steps.iter().filter(|s| s.state == StepState::Evicted).count();
    if left.is_empty() && in_flight == 0 {
        let message = said(action, &status, Said::Done);
        let phase = if reverting { OperationPhase::Reverted } else { OperationPhase::Succeeded };
        finish(&mut status, phase, message, now);
        return (status, Vec::new());
    }
    if spec.cancel {
        let message = said(action, &status, Said::Cancelled(in_flight));
        finish(&mut status, OperationPhase::Cancelled, message, now);
        return (status, Vec::new());
    }
    // A rolling restart's canaries go first, and alone.
    // (A revert has none: the revision it returns to ran here before.)
    let canaries = match action {
        OperationAction::Restart { canary, .. } => usize::try_from(*canary).unwrap_or(usize::MAX),
        OperationAction::Upgrade { canary, .. } if !reverting => usize::try_from(*canary).unwrap_or(usize::MAX),
        OperationAction::Drain { .. } | OperationAction::Switchover { .. } | OperationAction::Upgrade { .. } => 0,
    };
    let canaries_done = status.steps.iter().take(canaries).all(|s| s.state == StepState::Done);
    let limit = if canaries_done { spec.max_parallel } else { u32::try_from(canaries).unwrap_or(u32::MAX) };
    let room = usize::try_from(limit).unwrap_or(usize::MAX).saturating_sub(in_flight);
    status.blocker = blocker(&status, &waiting_on, room, now);
    if spec.paused {
        let since = status.blocker.as_ref().filter(|b| b.message == PAUSED).map_or(now, |b| b.since);
        status.blocker = Some(Blocker { message: PAUSED.into(), since, never: false });
        status.message = Some(format!("paused: {}", said(action, &status, Said::Progress)));
        return (status, Vec::new());
    }
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
                let orders = left
                    .iter()
                    .map(|s| Order { member: s.member.clone(), force: true, to_revision: s.to_revision })
                    .collect();
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
    let mut orders: Vec<Order> = status.steps[..eligible]
        .iter()
        .filter(|s| left.iter().any(|l| l.member == s.member))
        .filter(due)
        .take(room)
        .map(|s| Order { member: s.member.clone(), force: false, to_revision: s.to_revision })
        .collect();
    // A leader hands its lease over before it is restarted.
    if matches!(action, OperationAction::Upgrade { .. }) {
        upgrade::hand_over_first(&mut status, &mut orders, view, now);
    }
    // The instance each is asked for as: a restart is done once another
    // runs; and an upgrade's, the revision it runs (what a revert returns
    // it to).
    for order in &orders {
        let member = view.members.iter().find(|m| m.metadata.name == order.member);
        // (One in config error runs the instance whose setup failed.)
        let detail = member.map(|m| &m.status.state_detail);
        let instance = detail.and_then(|d| d.configuring_instance.clone().or(d.last_configured_instance.clone()));
        let revision = member.and_then(|m| m.status.app_revision.or(m.spec.app_revision));
        if let Some(step) = status.steps.iter_mut().find(|s| s.member == order.member) {
            step.instance = instance;
            if step.to_revision.is_some() && step.from_revision.is_none() {
                step.from_revision = revision;
            }
        }
    }
    status.message = Some(said(action, &status, Said::Progress));
    (status, orders)
}

/// What a paused Operation's blocker says.
const PAUSED: &str = "paused: nothing more is started until `herd operation resume`";

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
/// eviction's retry, the deadline, or (an upgrade's) when a member of
/// `members` has been ready long enough or a step's deadline passes.
pub fn next_pass(operation: &Operation, members: &[Member], now: Timestamp) -> Option<Duration> {
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
    let healthy = operation.spec.action.pace().and_then(|pace| upgrade::next_due(status, members, pace, now));
    retry.into_iter().chain(deadline).chain(healthy).min()
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
mod tests;
