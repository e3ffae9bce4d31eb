//! Members of lost nodes, and members the operator asked to replace
//! (`crate::node_loss`): a replaced one is unbound and starts over as a
//! new member (the others told it left); one that keeps data on a lost
//! node says what `herd member replace` would cost. Whatever still runs
//! on the old node is removed there as a stray once it is back.

use crate::kinds::app::HERD_VOLUME;
use crate::kinds::{AppSpec, EventReason, EventType};
use crate::node_loss::{NodeLoss, Recovery, recovery, replaced_status};
use crate::notifies::{Change, queue_notifies};

use super::{Work, Write};

pub(super) fn recover_members(work: &mut Work<'_, '_>, app: &AppSpec) {
    let grace = work.snap.settings.node_loss_grace.get();
    for i in 0..work.members.len() {
        let member = &work.members[i];
        let Some(node) = member.spec.node.clone() else { continue };
        let Some(role) = work.snap.app_role(member) else { continue };
        let mut persistent: Vec<String> = role.run.persistent_volumes().map(str::to_string).collect();
        if !persistent.is_empty() {
            persistent.push(HERD_VOLUME.into());
        }
        let loss = NodeLoss { node: &node, not_ready_for: work.snap.not_ready.get(&node).copied(), grace };
        let asked = member.spec.requests.replace.is_some();
        match recovery(&member.metadata.name, &member.status, &persistent, loss, asked) {
            Recovery::Nothing => {}
            Recovery::WaitForReplace(why) => {
                if member.status.reason.as_deref() != Some(why.as_str()) {
                    work.note(i, EventType::Warning, EventReason::MemberWaitsForReplace, why.clone());
                    work.members[i].status.reason = Some(why);
                }
            }
            Recovery::Replace(why) => replace(work, i, app, why),
        }
    }
}

/// Starts member `i` over as a new member and unbinds it (the request
/// goes with the binding); the others hear it left. The status first: no
/// reader sees the new binding with the old state.
fn replace(work: &mut Work<'_, '_>, i: usize, app: &AppSpec, why: String) {
    let member = &mut work.members[i];
    let announced = member.status.was_configured();
    let from = member.spec.node.clone().unwrap_or_default();
    member.status = replaced_status(why.clone(), &from, &member.status);
    work.write(i, Write::Status);
    let member = &mut work.members[i];
    member.spec.node = None;
    member.spec.ports.clear();
    member.spec.requests.replace = None;
    work.write(i, Write::Spec);
    work.note(i, EventType::Warning, EventReason::MemberReplaced, why);
    let member = &work.members[i];
    let left = [(member.spec.role.clone(), member.metadata.name.clone())];
    if announced {
        queue_notifies(app, &mut work.members, Change::Deleted, &left, work.snap.now);
    }
}
