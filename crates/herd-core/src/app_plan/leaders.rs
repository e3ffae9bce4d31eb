//! Each leader role's lease ([`crate::role_leader`]), decided over the
//! role's members as this pass leaves them and kept in the cluster's
//! status: renewals are not written (this leader renews in its heartbeat
//! answers and judges expiry on its own clock, given as
//! [`super::Snapshot::leases`]), grants are, with the transition kept and
//! told on the new leader's program.
//!
//! A switchover's handover ([`super::Snapshot::handovers`]) is carried
//! out here: once the member asked for may lead and the leader has no
//! other Command under way, the leader is asked to stand down (a Demote
//! Command; its lease is renewed no more). Once it has, its lease ends at
//! once and the next term goes to the member asked for, whose promote
//! waits until it has caught up to where the old leader stood down.

use super::sync::issue;
use super::{Work, report};
use crate::kinds::app::LeaderHook;
use crate::kinds::app_cluster::{KEPT_TRANSITIONS, LeaderTransition, RoleLeader};
use crate::kinds::operation::Handover;
use crate::kinds::{Action, AppSpec, EventReason, EventType, MemberState, Purpose};
use crate::notifies::{Change, queue_notifies};
use crate::role_leader::{self, Contender, Decision, Holder, Position, RoleLease, RoleView};

/// The leader of each of `app`'s leader roles, as this pass leaves it.
pub(super) fn lead_roles(work: &mut Work<'_, '_>, app: &AppSpec) -> Vec<RoleLeader> {
    let snap = work.snap;
    let mut leaders = Vec::new();
    for role in &app.roles {
        let Some(spec) = &role.leader else { continue };
        let stored = snap.cluster.status.leaders.iter().find(|l| l.role == role.name);
        let mut leader =
            stored.cloned().unwrap_or_else(|| RoleLeader { role: role.name.clone(), ..RoleLeader::default() });
        leader.lease_duration = Some(spec.lease_duration);
        leader.renew_deadline = Some(spec.renew_deadline);
        let holder = leader.member.clone().zip(leader.instance.clone());
        let lease =
            RoleLease { holder: holder.map(|(member, instance)| Holder { member, instance }), term: leader.term };
        let contenders: Vec<Contender> = work
            .members
            .iter()
            .filter(|m| m.spec.role == role.name)
            .map(|m| {
                let node = m.spec.node.as_deref();
                let node_ready = node.and_then(|n| snap.nodes.node(n)).is_some_and(|n| n.status.ready);
                let heard = node.and_then(|n| snap.heard.get(n)).is_some_and(|d| *d < spec.renew_deadline.get());
                let running = report(snap.nodes, m).filter(|r| node_ready && heard && r.running);
                let instance = running.and_then(|r| r.instance_id.clone());
                let position = running
                    .and_then(|r| r.position.as_ref())
                    .filter(|p| Some(&p.instance_id) == instance.as_ref())
                    .and_then(|p| p.position.parse::<Position>().ok());
                Contender {
                    member: m.metadata.name.clone(),
                    instance,
                    ready: m.status.ready,
                    config_error: m.status.state == MemberState::ConfigError,
                    position,
                    in_sync: leader.in_sync.contains(&m.metadata.name),
                    busy: work.busy.contains(&m.metadata.name),
                    promote_failed: m.status.promote_failed == Some(leader.term) && leader.term > 0,
                    demoted: leader.term > 0
                        && (running.and_then(|r| r.demoted_in).is_some_and(|t| t >= leader.term)
                            || m.status.stood_down.as_ref().is_some_and(|s| s.term == leader.term)),
                }
            })
            .collect();
        let handover = snap
            .handovers
            .iter()
            .find(|(r, h)| *r == role.name && h.term == leader.term && leader.member.as_ref() == Some(&h.from))
            .map(|(_, h)| h);
        let view = RoleView {
            lease: &lease,
            since_renewed: snap.leases.get(&role.name).copied().unwrap_or_default(),
            contenders: &contenders,
            synchronous: spec.synchronous,
            times: spec.times(),
            preferred: handover.and_then(|h| h.to.as_deref()),
        };
        // A holder whose promote hook failed leads nothing: its lease is
        // no longer renewed, and once it expired another is chosen.
        let failed = contenders.iter().find(|c| Some(&c.member) == leader.member.as_ref() && c.promote_failed);
        if let Some(failed) = failed
            && !leader.revoked
        {
            leader.revoked = true;
            if let Some(i) = work.index(&failed.member) {
                let why = work.members[i].status.reason.clone().unwrap_or_default();
                let message = format!("not the leader of role {} in term {}: {why}", role.name, leader.term);
                work.note(i, EventType::Warning, EventReason::RoleLeaderWaiting, message);
            }
        }
        let decision = role_leader::decide(&view);
        if let (Some(handover), Decision::Renew { .. }) = (handover, &decision) {
            ask_to_stand_down(work, &mut leader, handover, &view);
        }
        // Time alone changes the decision at the lease's end, unless a
        // heartbeat renews it first: looked at again then, however quiet
        // the cluster (its holder's node silent, not NotReady yet).
        if let Decision::Renew { remaining, .. } | Decision::Wait { remaining, .. } = decision {
            work.look_again_in = Some(work.look_again_in.map_or(remaining, |soonest| soonest.min(remaining)));
        }
        match decision {
            Decision::Renew { instance, .. } => {
                // Promoted in its term, or promoted again: the Command that
                // did it may never have been created (a pass whose writes
                // went stale), or been lost.
                if let Some(i) = leader.member.as_deref().and_then(|name| work.index(name)) {
                    let status = &work.members[i].status;
                    let term = leader.term;
                    if status.promoted_in != Some(term)
                        && status.promote_failed != Some(term)
                        && !work.busy.contains(&work.members[i].metadata.name)
                    {
                        let catch_up_to = stood_down_before(work, &leader);
                        promote(work, i, &spec.promote, term, instance.clone(), catch_up_to);
                    }
                }
                // The leader's own word on who is in sync, when it gave one:
                // a look that failed (its server shutting down for a
                // handover, say) keeps the record, or no member would be
                // left to take over.
                let holder = leader.member.as_deref().and_then(|name| work.index(name)).map(|i| &work.members[i]);
                let said = holder.and_then(|m| report(snap.nodes, m)).and_then(|r| r.position.as_ref());
                if let Some(in_sync) = said.filter(|p| p.instance_id == instance).and_then(|p| p.in_sync.as_ref()) {
                    leader.in_sync.clone_from(in_sync);
                }
                leader.instance = Some(instance);
                leader.waiting = None;
            }
            Decision::Wait { why, .. } => wait(work, &mut leader, why),
            Decision::Leaderless { why } => wait(work, &mut leader, why),
            Decision::Grant { holder, term, why } => {
                let transition =
                    LeaderTransition { term, member: holder.member.clone(), at: snap.now, reason: why.clone() };
                leader.transitions.push(transition);
                let excess = leader.transitions.len().saturating_sub(KEPT_TRANSITIONS);
                leader.transitions.drain(..excess);
                // A leader that stood down for a handover said where: the
                // next catches up to there before it is promoted.
                let stood_down = leader.member.as_deref().and_then(|m| work.index(m)).and_then(|i| {
                    let stood = work.members[i].status.stood_down.as_ref()?;
                    (stood.term == leader.term).then(|| stood.position.clone())?
                });
                if let Some(i) = work.index(&holder.member) {
                    let message = format!("leader of role {} in term {term}: {why}", role.name);
                    work.note(i, EventType::Normal, EventReason::RoleLeaderGranted, message);
                    promote(work, i, &spec.promote, term, holder.instance.clone(), stood_down);
                }
                let leads = [(role.name.clone(), holder.member.clone())];
                queue_notifies(app, &mut work.members, Change::Leader { term }, &leads, snap.now);
                leader.member = Some(holder.member);
                leader.instance = Some(holder.instance);
                leader.term = term;
                leader.since = Some(snap.now);
                leader.waiting = None;
                leader.revoked = false;
                // The new leader says who is in sync with it.
                leader.in_sync.clear();
            }
        }
        // Each member of the role says whether it leads now, and in which term.
        let leads = leader.member.clone().filter(|_| leader.waiting.is_none());
        for member in work.members.iter_mut().filter(|m| m.spec.role == role.name) {
            let leading = leads.as_deref() == Some(member.metadata.name.as_str());
            member.status.leader = leading;
            member.status.leader_term = leading.then_some(leader.term);
        }
        leaders.push(leader);
    }
    leaders
}

/// The role waits, saying `why`: told once, on the last holder. The last
/// holder stays named: it is renewed if it comes back before anyone else
/// may lead.
fn wait(work: &mut Work<'_, '_>, leader: &mut RoleLeader, why: String) {
    if leader.waiting.as_ref() != Some(&why)
        && let Some(i) = leader.member.as_ref().and_then(|m| work.index(m))
    {
        work.note(i, EventType::Warning, EventReason::RoleLeaderWaiting, why.clone());
    }
    leader.waiting = Some(why);
}

/// Member `i` promoted to lead in `term` as run `instance` (its promote
/// hook, once it caught up to `catch_up_to`), given the hook's time.
fn promote(
    work: &mut Work<'_, '_>,
    i: usize,
    hook: &LeaderHook,
    term: u64,
    instance: String,
    catch_up_to: Option<String>,
) {
    let action = Action::Promote {
        member: work.members[i].metadata.name.clone(),
        script: promote_script(&hook.script, term),
        expected_instance: instance,
        catch_up_to,
    };
    let before = work.programs[i].commands.len();
    issue(work, i, Purpose::Promote { term }, action);
    if work.programs[i].commands.len() > before
        && let Some(planned) = work.programs[i].commands.last_mut()
    {
        planned.command.spec.timeout = Some(hook.timeout);
    }
}

/// Where the leader before `leader`'s term stood down for a handover, if
/// it did: its successor's promote catches up to there first.
fn stood_down_before(work: &Work<'_, '_>, leader: &RoleLeader) -> Option<String> {
    let before = leader.transitions.iter().rev().find(|t| t.term < leader.term)?;
    let stood = work.members[work.index(&before.member)?].status.stood_down.as_ref()?;
    (stood.term == before.term).then(|| stood.position.clone())?
}

/// Asks the leader to stand down for `handover`, once the member it asks
/// for (or, with none named, some other member) may lead and the leader
/// has no other Command under way: its lease is renewed no more. Asked
/// again while it has not stood down and nothing is under way (the
/// Command asked for may never have been created).
fn ask_to_stand_down(work: &mut Work<'_, '_>, leader: &mut RoleLeader, handover: &Handover, view: &RoleView<'_>) {
    let last = Some(handover.from.as_str());
    let may_lead = |c: &&Contender| {
        c.member != handover.from
            && handover.to.as_ref().is_none_or(|to| *to == c.member)
            && role_leader::not_eligible(c, last, view.synchronous).is_none()
    };
    let next = view.contenders.iter().find(may_lead);
    if next.is_none() && !leader.revoked {
        return;
    }
    let Some(i) = work.index(&handover.from).filter(|_| !work.busy.contains(&handover.from)) else { return };
    let term = leader.term;
    let action = Action::Demote { member: handover.from.clone(), term };
    issue(work, i, Purpose::Demote { term }, action);
    if work.programs[i].commands.is_empty() || leader.revoked {
        return;
    }
    leader.revoked = true;
    let Some(next) = next else { return };
    let to = handover
        .to
        .as_deref()
        .map_or_else(|| format!("the most advanced member (now {})", next.member), str::to_string);
    let message = format!("standing down as leader of role {} (term {term}) for a switchover to {to}", leader.role);
    work.note(i, EventType::Normal, EventReason::RoleLeaderGranted, message);
}

/// The script a promote runs: the role's promote hook, with the term it
/// leads in as `HERD_LEADER_TERM`.
pub fn promote_script(hook: &str, term: u64) -> String {
    format!("HERD_LEADER_TERM={term}\nexport HERD_LEADER_TERM\n{hook}")
}
