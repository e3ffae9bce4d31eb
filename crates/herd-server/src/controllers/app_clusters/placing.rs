//! Placing a pass's unbound members: each decided in turn (a decision sees
//! the ones before it, of its cluster and, through the round's
//! [`Bookings`], of the passes running beside it), then every binding
//! written at once. The bookings keep the ports taken per host and the
//! members bound per node, so a placement costs a lookup, not a walk of
//! every member and node.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};

use futures_util::future::join_all;
use herd_core::kinds::app::{AppRole, NamedPort};
use herd_core::kinds::{AppSpec, EventReason, EventType, Member, MemberState, Node};
use herd_core::member_check::{Seen, check_member};
use herd_core::placement::{Placement, allocate_ports, node_host, place};

use super::{AppClusterController, Pass};
use crate::objects::ObjectsError;

/// Where a node's ports are shared: its host (nodes on one host share its
/// ports), or the node alone when it has no address yet.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum HostKey {
    Host(String),
    Node(String),
}

/// What the round's members take, as the round goes on: the ports on each
/// host and the members bound to each node, from every member read at its
/// start and every binding the passes running side by side have decided
/// since (a port must not be given twice on one host, and a burst must
/// not pile onto the nodes whose reports do not show it yet).
pub(super) struct Bookings {
    hosts: HashMap<String, HostKey>,
    taken: Mutex<Taken>,
}

#[derive(Default)]
struct Taken {
    ports: HashMap<HostKey, BTreeSet<u16>>,
    members: HashMap<String, usize>,
}

impl Bookings {
    pub(super) fn of<'m>(nodes: &[Arc<Node>], members: impl IntoIterator<Item = &'m Member>) -> Bookings {
        let hosts = nodes
            .iter()
            .map(|n| {
                let key =
                    node_host(n).map_or_else(|| HostKey::Node(n.metadata.name.clone()), |h| HostKey::Host(h.into()));
                (n.metadata.name.clone(), key)
            })
            .collect();
        let book = Bookings { hosts, taken: Mutex::default() };
        let mut taken = Taken::default();
        for member in members {
            if let Some(node) = &member.spec.node {
                taken.ports.entry(book.host(node)).or_default().extend(member.spec.ports.values());
                *taken.members.entry(node.clone()).or_default() += 1;
            }
            // A member on its way holds its ports on its target too.
            if let Some(migration) = &member.status.migration {
                taken.ports.entry(book.host(&migration.to)).or_default().extend(migration.ports.values());
                *taken.members.entry(migration.to.clone()).or_default() += 1;
            }
        }
        Bookings { taken: Mutex::new(taken), ..book }
    }

    fn host(&self, node: &str) -> HostKey {
        self.hosts.get(node).cloned().unwrap_or_else(|| HostKey::Node(node.to_string()))
    }

    /// Places `member` with `place` (given each node's bound members) and
    /// allocates its ports there, booking both, in one step.
    fn book(
        &self,
        place: impl FnOnce(&dyn Fn(&str) -> usize) -> Placement,
        wanted: &[NamedPort],
        range: RangeInclusive<u16>,
    ) -> Result<(String, BTreeMap<String, u16>), Refused> {
        let mut taken = self.taken.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let node = match place(&|node: &str| taken.members.get(node).copied().unwrap_or(0)) {
            Placement::Bound(node) => node,
            Placement::Unplaceable(why) => return Err(Refused::Unplaceable(why)),
        };
        let on_host = taken.ports.entry(self.host(&node)).or_default();
        let ports =
            allocate_ports(wanted, on_host, range).map_err(|why| Refused::NoPorts(format!("on {node}: {why}")))?;
        on_host.extend(ports.values());
        *taken.members.entry(node.clone()).or_default() += 1;
        Ok((node, ports))
    }
}

/// Why a member was not bound now.
enum Refused {
    /// No node can take it (an Event says so).
    Unplaceable(String),
    /// The node it would go to has no free ports.
    NoPorts(String),
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
                Err(ObjectsError::Conflict { .. }) => pass.members[i] = before,
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
        let created = join_all(fresh.into_iter().map(|member| self.objects.create(member, true, false))).await;
        let mut placed = Vec::new();
        for outcome in created {
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
    pass.bookings.book(place, &app_role.ports, pass.settings.member_ports())
}
