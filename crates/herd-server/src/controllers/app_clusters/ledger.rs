//! [`Ledger`]: what app-cluster members take of the nodes (the ports on
//! each host, the members bound to each node and what they request),
//! shared by every cluster's reconcile. It is counted from the caches,
//! with the bindings decided
//! since that the members cache does not show yet: reconciles of several
//! clusters run side by side, and a port must not be given twice on one
//! host, nor a burst pile onto the nodes whose counts do not show it yet.
//! A placement costs a lookup, not a walk of every member and node.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herd_core::app_plan::{PlaceOne, Placer, Refused};
use herd_core::kinds::app::NamedPort;
use herd_core::kinds::{Member, MemberSpec, Node, NodeSpec};
use herd_core::placement::{self, NodeLoad, Placement, allocate_ports, node_host};
use herd_core::resources::Amounts;
use herd_store::Revision;
use tokio::time::Instant;

use crate::reflector::Reflector;

/// How long a decided binding is counted without the members cache
/// showing it (its write failed, or its member went away).
const PENDING_KEPT: Duration = Duration::from_secs(30);

/// Where a node's ports are shared: its host (nodes on one host share its
/// ports), or the node alone when it has no address yet.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum HostKey {
    Host(String),
    Node(String),
}

/// A binding decided and not yet seen in the members cache.
struct Pending {
    node: String,
    ports: BTreeMap<String, u16>,
    requests: Amounts,
    at: Instant,
}

#[derive(Default)]
struct Counts {
    /// The caches' revisions (nodes, members) the counts were taken at.
    built: Option<(Option<Revision>, Option<Revision>)>,
    hosts: HashMap<String, HostKey>,
    ports: HashMap<HostKey, BTreeSet<u16>>,
    loads: HashMap<String, NodeLoad>,
    pending: HashMap<String, Pending>,
}

impl Counts {
    fn host(&self, node: &str) -> HostKey {
        self.hosts.get(node).cloned().unwrap_or_else(|| HostKey::Node(node.to_string()))
    }

    fn take(&mut self, node: &str, ports: impl IntoIterator<Item = u16>, requests: &Amounts) {
        let host = self.host(node);
        self.ports.entry(host).or_default().extend(ports);
        self.loads.entry(node.to_string()).or_default().add(requests);
    }
}

#[derive(Default)]
pub(super) struct Ledger {
    counts: Mutex<Counts>,
}

impl Ledger {
    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts again from the caches when either moved since (`revisions`:
    /// the nodes' and the members'), keeping the bindings decided since
    /// that the members cache does not show yet.
    pub(super) fn refresh(
        &self,
        revisions: (Option<Revision>, Option<Revision>),
        nodes: &[Arc<Node>],
        members: &[Arc<Member>],
    ) {
        let mut counts = self.counts();
        if counts.built == Some(revisions) {
            return;
        }
        let pending = std::mem::take(&mut counts.pending);
        let hosts = nodes
            .iter()
            .map(|n| {
                let key =
                    node_host(n).map_or_else(|| HostKey::Node(n.metadata.name.clone()), |h| HostKey::Host(h.into()));
                (n.metadata.name.clone(), key)
            })
            .collect();
        *counts = Counts { built: Some(revisions), hosts, ..Counts::default() };
        let mut shown = HashMap::new();
        for member in members {
            // A member on its way holds its place on its target too.
            for (node, ports) in placement::places_held(member) {
                counts.take(node, ports.values().copied(), &member.spec.resources);
                shown.insert(member.metadata.name.as_str(), node);
            }
        }
        for (member, booked) in pending {
            let seen = shown.get(member.as_str()).is_some_and(|node| *node == booked.node);
            if !seen && booked.at.elapsed() < PENDING_KEPT {
                counts.take(&booked.node, booked.ports.values().copied(), &booked.requests);
                counts.pending.insert(member, booked);
            }
        }
    }

    /// Places `member`, which requests `requests`, with `place` (given
    /// what each node has bound) and allocates its ports there, booking
    /// all three, in one step.
    pub(super) fn book(
        &self,
        member: &str,
        requests: &Amounts,
        place: impl FnOnce(&dyn Fn(&str) -> NodeLoad) -> Placement,
        wanted: &[NamedPort],
        range: RangeInclusive<u16>,
    ) -> Result<(String, BTreeMap<String, u16>), Refused> {
        let mut counts = self.counts();
        let node = match place(&|node: &str| counts.loads.get(node).copied().unwrap_or_default()) {
            Placement::Bound(node) => node,
            Placement::Unplaceable(why) => return Err(Refused::Unplaceable(why)),
        };
        let host = counts.host(&node);
        let on_host = counts.ports.entry(host).or_default();
        let ports =
            allocate_ports(wanted, on_host, range).map_err(|why| Refused::NoPorts(format!("on {node}: {why}")))?;
        counts.take(&node, ports.values().copied(), requests);
        let booked = Pending { node: node.clone(), ports: ports.clone(), requests: *requests, at: Instant::now() };
        counts.pending.insert(member.to_string(), booked);
        Ok((node, ports))
    }

    /// Books a member bound to `node` requesting `from` as requesting `to`
    /// instead, when the node has room for that.
    pub(super) fn rebook(&self, node: &Node, from: &Amounts, to: &Amounts) -> Result<(), String> {
        let mut counts = self.counts();
        let name = &node.metadata.name;
        let load = counts.loads.get(name).copied().unwrap_or_default();
        if let Some(why) = placement::no_room_to_rebook(node, &load, from, to) {
            return Err(why);
        }
        let load = counts.loads.entry(name.clone()).or_default();
        load.requested = load.requested.minus(from).plus(to);
        Ok(())
    }

    /// A booked binding that was not written: what it took is free again
    /// at the next count.
    pub(super) fn release(&self, member: &str) {
        let mut counts = self.counts();
        if counts.pending.remove(member).is_some() {
            counts.built = None;
        }
    }
}

/// The ledger as one pass's [`Placer`]: counted again from the caches
/// before the pass's first placement (a pass that places nothing counts
/// nothing).
pub(super) struct Placing<'a> {
    ledger: &'a Ledger,
    nodes: &'a Reflector<NodeSpec>,
    members: &'a Reflector<MemberSpec>,
    list: &'a [Arc<Node>],
    counted: bool,
}

impl<'a> Placing<'a> {
    pub(super) fn new(
        ledger: &'a Ledger,
        nodes: &'a Reflector<NodeSpec>,
        members: &'a Reflector<MemberSpec>,
        list: &'a [Arc<Node>],
    ) -> Self {
        Placing { ledger, nodes, members, list, counted: false }
    }
}

impl Placing<'_> {
    /// Counts the ledger again from the caches, once a pass.
    fn count(&mut self) {
        if !self.counted {
            let revisions = (self.nodes.revision_that_matters(), self.members.revision());
            self.ledger.refresh(revisions, self.list, &self.members.list_shared());
            self.counted = true;
        }
    }
}

impl Placer for Placing<'_> {
    fn book(
        &mut self,
        member: &str,
        requests: &Amounts,
        place: &PlaceOne<'_>,
        wanted: &[NamedPort],
        range: RangeInclusive<u16>,
    ) -> Result<(String, BTreeMap<String, u16>), Refused> {
        self.count();
        self.ledger.book(member, requests, |bound| place(bound), wanted, range)
    }

    fn rebook(&mut self, node: &Node, from: &Amounts, to: &Amounts) -> Result<(), String> {
        self.count();
        self.ledger.rebook(node, from, to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herd_core::Object;
    use herd_core::kinds::{MemberSpec, NodeSpec};

    fn node(name: &str, address: &str) -> Arc<Node> {
        let mut node = Object::new(name, NodeSpec::default());
        node.status.address = Some(address.into());
        Arc::new(node)
    }

    fn port() -> Vec<NamedPort> {
        vec![NamedPort { name: "client".into() }]
    }

    fn on(node: &'static str) -> impl FnOnce(&dyn Fn(&str) -> NodeLoad) -> Placement {
        move |_| Placement::Bound(node.into())
    }

    #[test]
    fn bindings_decided_side_by_side_never_share_a_port_until_the_cache_shows_them() {
        let ledger = Ledger::default();
        // Two nodes on one host share its ports.
        let nodes = vec![node("n1", "127.0.0.1:7000"), node("n2", "127.0.0.1:7001")];
        ledger.refresh((Some(1), Some(1)), &nodes, &[]);
        let (_, first) = ledger.book("a-r-0", &Amounts::default(), on("n1"), &port(), 20000..=20010).ok().unwrap();
        let (_, second) = ledger.book("b-r-0", &Amounts::default(), on("n2"), &port(), 20000..=20010).ok().unwrap();
        assert_ne!(first, second, "one host, two members: two ports");
        // The members cache moved on without showing them yet: still counted.
        ledger.refresh((Some(1), Some(2)), &nodes, &[]);
        let (_, third) = ledger.book("c-r-0", &Amounts::default(), on("n1"), &port(), 20000..=20010).ok().unwrap();
        assert!(third != first && third != second, "{third:?}");
        // Shown by the cache: counted once, from the cache.
        let shown = |name: &str, node: &str, ports: &BTreeMap<String, u16>| {
            let spec = MemberSpec { node: Some(node.into()), ports: ports.clone(), ..Default::default() };
            Arc::new(Object::new(name, spec))
        };
        let members = vec![shown("a-r-0", "n1", &first), shown("b-r-0", "n2", &second)];
        ledger.refresh((Some(1), Some(3)), &nodes, &members);
        assert_eq!(ledger.counts().pending.len(), 1, "c-r-0 is still pending");
        assert_eq!(ledger.counts().loads.get("n1").map(|l| l.members), Some(2));
        // One whose write failed is released.
        ledger.release("c-r-0");
        ledger.refresh((Some(1), Some(3)), &nodes, &members);
        assert_eq!(ledger.counts().loads.get("n1").map(|l| l.members), Some(1));
    }
}
