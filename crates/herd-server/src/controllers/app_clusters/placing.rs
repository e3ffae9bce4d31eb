//! Placing a pass's unbound members: each decided in turn (a decision
//! sees the ones before it, of its cluster and, through the controller's
//! [`Ledger`], of the reconciles running beside it), then every binding
//! written at once.

use std::collections::BTreeMap;

use futures_util::future::join_all;
use herd_core::kinds::app::AppRole;
use herd_core::kinds::{AppSpec, EventReason, EventType, Member, MemberState};
use herd_core::member_check::{Seen, check_member};
use herd_core::placement::place;

use super::ledger::Refused;
use super::{AppClusterController, Nodes, Pass};
use crate::objects::ObjectsError;

impl AppClusterController {
    /// Binds every unbound member waiting to be created that can be
    /// placed; each binding is written before anything is started there.
    pub(super) async fn place_all(&self, pass: &mut Pass<'_>, app: &AppSpec) -> Result<(), ObjectsError> {
        let unbound =
            pass.members.iter().any(|m| m.spec.node.is_none() && m.status.state == MemberState::CreatePending);
        if unbound {
            self.refresh_ledger(pass.nodes);
        }
        let mut bindings = Vec::new();
        for i in 0..pass.members.len() {
            let member = &pass.members[i];
            if member.spec.node.is_some() || member.status.state != MemberState::CreatePending {
                continue;
            }
            let Some(app_role) = app.role(&member.spec.role) else { continue };
            if let Some(bound) = self.binding(pass, i, app_role).await {
                // Tentatively, so that the next decision sees it.
                bindings.push((i, std::mem::replace(&mut pass.members[i], bound)));
            }
        }
        let writes = bindings.iter().map(|(i, before)| {
            self.objects.write_over(before, pass.members[*i].clone(), crate::objects::Part::Spec, Vec::new())
        });
        let written = join_all(writes).await;
        let mut placed = Vec::new();
        for ((i, before), outcome) in bindings.into_iter().zip(written) {
            match outcome {
                Ok(mut written) => {
                    // The status being worked on stays this pass's (written at its end).
                    written.status = before.status;
                    pass.members[i] = written;
                    placed.push(i);
                }
                // Placed on a stale copy: the next pass places it again.
                Err(ObjectsError::Conflict { .. }) => {
                    self.ledger.release(&before.metadata.name);
                    pass.members[i] = before;
                }
                Err(error) => return Err(error),
            }
        }
        self.record_placed(pass, &placed).await;
        Ok(())
    }

    /// Creates `fresh` members, each placed first when a node can take it:
    /// one write, bound, instead of a creation and then a binding. One no
    /// node can take now is created unbound (why, in its status) and placed
    /// by a later pass.
    pub(super) async fn create_placed(
        &self,
        pass: &mut Pass<'_>,
        app: &AppSpec,
        fresh: Vec<Member>,
    ) -> Result<(), ObjectsError> {
        if !fresh.is_empty() {
            self.refresh_ledger(pass.nodes);
        }
        let first = pass.members.len();
        pass.members.extend(fresh);
        for i in first..pass.members.len() {
            let Some(app_role) = app.role(&pass.members[i].spec.role) else { continue };
            if let Some(mut bound) = self.binding(pass, i, app_role).await {
                // What checking a bound member that its node does not report yet says.
                let persistent = app_role.run.volumes.iter().any(|v| v.persistent);
                let seen = Seen::from_report(None, app_role.readiness.is_some());
                check_member(&mut bound.status, seen, persistent, crate::objects::now());
                pass.members[i] = bound;
            }
        }
        let fresh: Vec<Member> = pass.members.drain(first..).collect();
        let names: Vec<String> = fresh.iter().map(|m| m.metadata.name.clone()).collect();
        let created = join_all(fresh.into_iter().map(|member| self.objects.create(member, true, false))).await;
        let mut placed = Vec::new();
        for (name, outcome) in names.iter().zip(created) {
            if outcome.is_err() {
                self.ledger.release(name);
            }
            match outcome {
                Ok(created) => {
                    // As stored: a status this pass does not change is not written again.
                    pass.stored.insert(created.metadata.name.clone(), created.status.clone());
                    if created.spec.node.is_some() {
                        placed.push(pass.members.len());
                    }
                    pass.members.push(created);
                }
                // Created by an earlier pass whose cache had not seen it.
                Err(ObjectsError::AlreadyExists { .. }) => {}
                Err(error) => return Err(error),
            }
        }
        self.record_placed(pass, &placed).await;
        Ok(())
    }

    /// Brings the ledger up to the caches before a placement is decided.
    fn refresh_ledger(&self, nodes: &Nodes) {
        let revisions = (self.nodes.revision_that_matters(), self.members.revision());
        self.ledger.refresh(revisions, &nodes.list, &self.members.list_shared());
    }

    /// A MemberPlaced Event for each of the members `placed` (indices).
    async fn record_placed(&self, pass: &Pass<'_>, placed: &[usize]) {
        let events = placed.iter().map(|&i| {
            let member = &pass.members[i];
            let message = format!("bound to node {}", member.spec.node.as_deref().unwrap_or("?"));
            self.events.record(member, EventType::Normal, EventReason::MemberPlaced, message)
        });
        join_all(events).await;
    }

    /// Where bound member `i` would move with its data: another node that
    /// could take it now, and its ports there (booked), or why none can.
    pub(super) fn move_target(
        &self,
        pass: &Pass<'_>,
        i: usize,
        app_role: &AppRole,
    ) -> Result<(String, BTreeMap<String, u16>), String> {
        self.refresh_ledger(pass.nodes);
        let mut moving = pass.members[i].clone();
        moving.status.moved_from = moving.spec.node.take();
        book_node(pass, &moving, app_role).map_err(|refused| match refused {
            Refused::Unplaceable(why) | Refused::NoPorts(why) => why,
        })
    }

    /// Member `i` bound to a node with its ports, or None (the reason in
    /// its status) when no node can take it now.
    async fn binding(&self, pass: &mut Pass<'_>, i: usize, app_role: &AppRole) -> Option<Member> {
        match book_node(pass, &pass.members[i], app_role) {
            Ok((node, ports)) => {
                let mut bound = pass.members[i].clone();
                bound.spec.node = Some(node);
                bound.spec.ports = ports;
                Some(bound)
            }
            Err(Refused::Unplaceable(why)) => {
                if pass.members[i].status.reason.as_deref() != Some(why.as_str()) {
                    self.events
                        .record(&pass.members[i], EventType::Warning, EventReason::Unplaceable, why.clone())
                        .await;
                    pass.members[i].status.reason = Some(why);
                }
                None
            }
            Err(Refused::NoPorts(why)) => {
                pass.members[i].status.reason = Some(why);
                None
            }
        }
    }
}

/// Picks a node for `member` among the pass's nodes (its role's selector
/// and spread, its role's peers in the pass) and books its ports there.
fn book_node(pass: &Pass<'_>, member: &Member, app_role: &AppRole) -> Result<(String, BTreeMap<String, u16>), Refused> {
    let no_selector = BTreeMap::new();
    let selector = pass.cluster.spec.role(&member.spec.role).map_or(&no_selector, |r| &r.node_selector);
    let peers: Vec<&Member> = pass.members.iter().filter(|m| m.spec.role == member.spec.role).collect();
    let spread = app_role.placement.spread;
    let place = |bound: &dyn Fn(&str) -> usize| place(member, selector, spread, &pass.nodes.list, &peers, bound);
    pass.ledger.book(&member.metadata.name, place, &app_role.ports, pass.settings.member_ports())
}
