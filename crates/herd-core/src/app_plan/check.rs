//! What happened since the last pass: settled Commands read into their
//! members' statuses (and deleted with the status that records them),
//! unsettled ones keeping their members busy; then each member checked
//! against its node's report (a changed instance is a restart).

use crate::kinds::{EventReason, EventType, Member, Purpose};
use crate::member_check::{NodeSeen, Restart, Seen, check_member, crash_news, lost_news, oom_news};
use crate::node_health::READY;
use crate::outcomes::{Recorded, record_outcome};
use crate::time::Timestamp;

use super::sync::concerns;
use super::{NodeIndex, Program, Work, report};

/// Reads every settled Command of the cluster's members into their
/// statuses; a member with an unsettled Command is busy.
pub(super) fn read_commands(work: &mut Work<'_, '_>) {
    let mut commands: Vec<_> = work.snap.commands.to_vec();
    commands.sort_by_key(|c| c.metadata.creation_timestamp);
    for command in commands {
        let Some(origin) = &command.spec.origin else { continue };
        let name = origin.member.clone();
        let at = work.members.iter().position(|m| m.metadata.name == name);
        if !command.status.state_by_management.is_settled() {
            // One left on a node the member no longer is on does not hold it here.
            if at.is_none_or(|i| concerns(&command, work.members[i].spec.node.as_ref())) {
                work.busy.insert(name.clone());
                if matches!(origin.purpose, Purpose::Notify { .. }) {
                    work.notifying.insert(name);
                }
            }
            continue;
        }
        // One for another node (a stray removed there) says nothing of it here.
        match at {
            Some(i) => {
                let member = &mut work.members[i];
                if concerns(&command, member.spec.node.as_ref())
                    && record_outcome(&command, &mut member.status, work.snap.now) == Recorded::Removed
                {
                    work.removed.insert(name);
                }
                work.programs[i].outcomes.push(command.clone());
            }
            // A member not of this cluster (any more): its outcome is
            // deleted all the same.
            None => match work.gone.iter_mut().find(|p| p.member == name) {
                Some(program) => program.outcomes.push(command.clone()),
                None => work.gone.push(Program { member: name, outcomes: vec![command.clone()], ..Program::default() }),
            },
        }
    }
}

/// What a pass sees of `member`: its node's report of it, taken as
/// current only while the node is Ready.
pub(super) fn seen<'n>(nodes: &'n dyn NodeIndex, member: &Member, has_check: bool) -> Seen<'n> {
    let seen = Seen::from_report(report(nodes, member), has_check);
    match member.spec.node.as_deref().and_then(|name| nodes.node(name)) {
        Some(node) if !node.status.ready => {
            let condition = node.status.condition(READY);
            seen.on(NodeSeen::NotReady {
                node: &node.metadata.name,
                since: condition.map(|c| c.last_transition_time),
                why: condition.map_or("it has not sent a heartbeat", |c| c.message.as_str()),
            })
        }
        _ => seen,
    }
}

/// Checks member `i` against what its node reports (None: it is not
/// bound); its restart, if it restarted.
pub(super) fn check(work: &mut Work<'_, '_>, i: usize, now: Timestamp) -> Option<Option<Restart>> {
    let member = &work.members[i];
    member.spec.node.as_ref()?;
    let role = work.snap.app_role(member);
    let persistent = role.is_some_and(|r| r.run.volumes.iter().any(|v| v.persistent));
    let seen = seen(work.snap.nodes, member, role.is_some_and(|r| r.readiness.is_some()));
    Some(check_member(&mut work.members[i].status, seen, persistent, now))
}

/// Each member against its node's report. A restart, and a crash loop or
/// lost volumes new since the status as stored, are Events.
pub(super) fn check_members(work: &mut Work<'_, '_>) {
    let now = work.snap.now;
    for i in 0..work.members.len() {
        let stored = work.stored[i].as_ref().map(|s| &s.state_detail);
        let crash_before = stored.and_then(|d| d.crash_loop.clone());
        let lost_before = stored.map(|d| d.lost_volumes.clone()).unwrap_or_default();
        let oom_before = stored.and_then(|d| d.last_oom_kill.clone());
        let Some(restart) = check(work, i, now) else { continue };
        if let Some(restart) = restart {
            let how = match restart {
                Restart::Persistent => "persistent restart: its setup is not run again if it succeeded",
                Restart::CleanSlate => "clean-slate restart: it is set up from scratch",
                Restart::ErrorRetry => "error-retry restart: it was in config error and is set up again",
            };
            work.note(i, EventType::Normal, EventReason::MemberRestarted, format!("a new instance runs ({how})"));
        }
        let detail = &work.members[i].status.state_detail;
        let crash = crash_news(crash_before.as_ref(), detail.crash_loop.as_ref(), now);
        let lost = lost_news(&lost_before, &detail.lost_volumes);
        let oom = oom_news(oom_before.as_ref(), detail.last_oom_kill.as_ref());
        if let Some(news) = oom {
            work.note(i, EventType::Warning, EventReason::MemberOOMKilled, news);
        }
        if let Some(news) = crash {
            work.note(i, EventType::Warning, EventReason::MemberCrashLooping, news);
        }
        if let Some(news) = lost {
            work.note(i, EventType::Warning, EventReason::MemberVolumesLost, news);
        }
    }
}
