//! Placing a pass's unbound members: each decided in turn (a decision sees
//! the ones before it, of its cluster and, through the [`PortBook`], of the
//! passes running beside it), then every binding written at once.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;
use std::sync::Mutex;

use herd_core::kinds::app::{AppRole, NamedPort};
use herd_core::kinds::{AppSpec, EventType, Member, MemberState};
use herd_core::placement::{Placement, allocate_ports, node_host, place};

use super::{AppClusterController, Pass};
use crate::objects::ObjectsError;

/// Ports bound this round by passes that run side by side, with their
/// node: the round's member list does not show them yet, and a port must
/// not be given twice on one host.
#[derive(Default)]
pub(super) struct PortBook(Mutex<Vec<(String, u16)>>);

impl PortBook {
    /// Ports for `wanted` on `node`, free of `taken` and of what passes
    /// beside this one claimed on the same host; claimed for this one.
    fn allocate(
        &self,
        node: &str,
        same_host: impl Fn(&str) -> bool,
        mut taken: BTreeSet<u16>,
        wanted: &[NamedPort],
        range: RangeInclusive<u16>,
    ) -> Result<BTreeMap<String, u16>, String> {
        let mut claimed = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        taken.extend(claimed.iter().filter(|(other, _)| same_host(other)).map(|(_, port)| *port));
        let ports = allocate_ports(wanted, &taken, range)?;
        claimed.extend(ports.values().map(|port| (node.to_string(), *port)));
        Ok(ports)
    }
}

impl AppClusterController {
    /// Binds every unbound member waiting to be created that can be
    /// placed; each binding is written before anything is started there.
    pub(super) async fn place_all(&self, pass: &mut Pass<'_>, app: &AppSpec) -> Result<(), ObjectsError> {
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
        let writes = bindings.iter().map(|(i, _)| self.objects.update(pass.members[*i].clone(), false));
        let written = futures_util::future::join_all(writes).await;
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
                Err(ObjectsError::Conflict { .. }) => pass.members[i] = before,
                Err(error) => return Err(error),
            }
        }
        let events = placed.iter().map(|&i| {
            let member = &pass.members[i];
            let message = format!("bound to node {}", member.spec.node.as_deref().unwrap_or("?"));
            self.events.record(member, EventType::Normal, "MemberPlaced", message)
        });
        futures_util::future::join_all(events).await;
        Ok(())
    }

    /// Member `i` bound to a node with its ports, or None (the reason in
    /// its status) when no node can take it now.
    async fn binding(&self, pass: &mut Pass<'_>, i: usize, app_role: &AppRole) -> Option<Member> {
        let member = &pass.members[i];
        let selector = pass.cluster.spec.role(&member.spec.role).map(|r| r.node_selector.clone()).unwrap_or_default();
        let peers: Vec<Member> = pass.members.iter().filter(|m| m.spec.role == member.spec.role).cloned().collect();
        let node = match place(member, &selector, app_role.placement.spread, pass.nodes, &peers) {
            Placement::Bound(node) => node,
            Placement::Unplaceable(why) => {
                if pass.members[i].status.reason.as_deref() != Some(why.as_str()) {
                    self.events.record(&pass.members[i], EventType::Warning, "Unplaceable", why.clone()).await;
                    pass.members[i].status.reason = Some(why);
                }
                return None;
            }
        };
        // Nodes on one host share its ports.
        let host_of = |name: &str| pass.nodes.iter().find(|n| n.metadata.name == name).and_then(node_host);
        let host = host_of(&node);
        let same_host = |other: &str| other == node || (host.is_some() && host_of(other) == host);
        let taken: BTreeSet<u16> = pass
            .all_members
            .iter()
            .chain(pass.members.iter())
            .filter(|m| m.spec.node.as_deref().is_some_and(same_host))
            .flat_map(|m| m.spec.ports.values().copied())
            .collect();
        let ports = match pass.ports.allocate(&node, same_host, taken, &app_role.ports, pass.settings.member_ports()) {
            Ok(ports) => ports,
            Err(why) => {
                pass.members[i].status.reason = Some(format!("on {node}: {why}"));
                return None;
            }
        };
        let mut bound = pass.members[i].clone();
        bound.spec.node = Some(node);
        bound.spec.ports = ports;
        Some(bound)
    }
}
