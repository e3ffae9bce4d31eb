//! Placement: which node a member is bound to, and its ports there. Pure.
//!
//! A node can take a member when it is Ready, schedulable (not cordoned,
//! not drained, not offline) and carries the labels the role's node
//! selector asks for. Members of one role spread across nodes: preferred
//! (the node with the fewest members of the role, then the fewest members
//! at all, then by name) or required (never two on one node). A node's
//! members are the more of those it reports and those bound to it (a
//! burst's bindings show in reports only later). A node never has more
//! requested of it than it has allocatable: a member whose requests do
//! not fit what is left is not placed there. A member
//! that cannot be placed gets the reason, naming each node and why not.
//! A member replaced or evicted from a node is never placed back on it.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::RangeInclusive;

use crate::kinds::app::{NamedPort, Spread};
use crate::kinds::member::Member;
use crate::kinds::node::{Node, NodeRole};
use crate::resources::Amounts;

/// What is bound to a node: how many members, and what they request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeLoad {
    pub members: usize,
    pub requested: Amounts,
}

impl NodeLoad {
    pub fn add(&mut self, requests: &Amounts) {
        self.members += 1;
        self.requested = self.requested.plus(requests);
    }
}

/// Each node's load from `members`: a member counts on the node it is
/// bound to and, while it moves, on the node it moves to as well (its
/// data is on the way there, and it holds both until it has arrived).
pub fn loads<'a>(members: impl IntoIterator<Item = &'a Member>) -> HashMap<String, NodeLoad> {
    let mut loads: HashMap<String, NodeLoad> = HashMap::new();
    for member in members {
        for node in nodes_held(member) {
            loads.entry(node.to_string()).or_default().add(&member.spec.resources);
        }
    }
    loads
}

/// The nodes `member` holds a place on: the one it is bound to, and the
/// one it moves to.
fn nodes_held(member: &Member) -> impl Iterator<Item = &str> {
    places_held(member).map(|(node, _)| node)
}

/// The places `member` holds, each with the ports it takes there: the
/// node it is bound to, and the node it moves to.
pub fn places_held(member: &Member) -> impl Iterator<Item = (&str, &BTreeMap<String, u16>)> {
    let bound = member.spec.node.as_deref();
    let moving_to = member.status.migration.as_ref().filter(|m| Some(m.to.as_str()) != bound);
    let bound = bound.map(|node| (node, &member.spec.ports));
    bound.into_iter().chain(moving_to.map(|m| (m.to.as_str(), &m.ports)))
}

/// Why `node`, with `load` bound to it, has no room for `requests` (None:
/// it has).
pub fn no_room_because(node: &Node, load: &NodeLoad, requests: &Amounts) -> Option<String> {
    if requests.is_zero() {
        return None;
    }
    let name = &node.metadata.name;
    let Some(allocatable) = &node.status.allocatable else {
        return Some(format!("{name} has not reported its capacity"));
    };
    Amounts::shortfall(allocatable, &load.requested, requests).map(|short| format!("{name}: {short}"))
}

/// Why `node`, with `load` bound to it (a member requesting `from` among
/// it), has no room for that member to request `to` instead (None: it
/// has): a restart as a revision that requests more.
pub fn no_room_to_rebook(node: &Node, load: &NodeLoad, from: &Amounts, to: &Amounts) -> Option<String> {
    let others = NodeLoad { members: load.members, requested: load.requested.minus(from) };
    no_room_because(node, &others, to)
}

/// Where a member goes, or why it goes nowhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    Bound(String),
    Unplaceable(String),
}

/// Why `node` cannot take new members (None: it can).
pub fn unschedulable_because(node: &Node, selector: &BTreeMap<String, String>) -> Option<String> {
    let name = &node.metadata.name;
    if !node.status.ready {
        return Some(format!("{name} is NotReady"));
    }
    match node.spec.role {
        NodeRole::Drained => return Some(format!("{name} is drained")),
        NodeRole::Offline => return Some(format!("{name} is offline")),
        NodeRole::Candidate | NodeRole::Regular => {}
    }
    if node.spec.unschedulable {
        return Some(format!("{name} is cordoned"));
    }
    let missing: Vec<String> = selector
        .iter()
        .filter(|(key, value)| node.metadata.labels.get(*key) != Some(*value))
        .map(|(key, value)| format!("{key}={value}"))
        .collect();
    (!missing.is_empty()).then(|| format!("{name} lacks label {}", missing.join(",")))
}

/// The node for `member`, given the other members of its role (`peers`,
/// bound or not), every node and what is bound to each (`bound`, which
/// does not count `member` itself).
pub fn place(
    member: &Member,
    selector: &BTreeMap<String, String>,
    spread: Spread,
    nodes: &[impl Borrow<Node>],
    peers: &[impl Borrow<Member>],
    bound: &dyn Fn(&str) -> NodeLoad,
) -> Placement {
    let mut refusals = Vec::new();
    let mut eligible = Vec::new();
    let requests = &member.spec.resources;
    for node in nodes.iter().map(Borrow::borrow) {
        let why = unschedulable_because(node, selector)
            .or_else(|| no_room_because(node, &bound(&node.metadata.name), requests));
        match why {
            Some(why) => refusals.push(why),
            None => eligible.push(node),
        }
    }
    if let Some(from) = &member.status.moved_from
        && eligible.iter().any(|n| &n.metadata.name == from)
    {
        eligible.retain(|n| &n.metadata.name != from);
        refusals.push(format!("{from} is the node it is moving away from"));
    }
    if eligible.is_empty() {
        let why = if refusals.is_empty() { "no node has joined".to_string() } else { refusals.join("; ") };
        return Placement::Unplaceable(format!("no node can take {}: {why}", member.metadata.name));
    }
    // A peer moving to a node (its data on the way there) is there already:
    // two moves at once must not pick one node for two members. Gathered
    // once: a walk of the peers for each of a thousand nodes adds up.
    let mut peers_by_node: HashMap<&str, Vec<&str>> = HashMap::new();
    for peer in peers.iter().map(Borrow::borrow).filter(|p| p.metadata.name != member.metadata.name) {
        for node in nodes_held(peer) {
            peers_by_node.entry(node).or_default().push(peer.metadata.name.as_str());
        }
    }
    let peers_on = |node: &str| peers_by_node.get(node).map_or(&[][..], Vec::as_slice);
    if spread == Spread::Required {
        let taken: Vec<String> = eligible
            .iter()
            .filter_map(|n| {
                let on = peers_on(&n.metadata.name);
                (!on.is_empty()).then(|| format!("{} ({})", n.metadata.name, on.join(", ")))
            })
            .collect();
        eligible.retain(|n| peers_on(&n.metadata.name).is_empty());
        if eligible.is_empty() {
            let others = if refusals.is_empty() { String::new() } else { format!("; and {}", refusals.join("; ")) };
            return Placement::Unplaceable(format!(
                "{}: spread is required and every node that can take it has a member of role {} already: {}{others}",
                member.metadata.name,
                member.spec.role,
                taken.join("; ")
            ));
        }
    }
    // The node with the fewest peers, then the fewest members, then the
    // first name. A burst asks this of a thousand nodes for each member:
    // the peers are looked up only when there are any, and the members
    // only of a node with no more peers than the best so far.
    let mut best: Option<((usize, usize), &Node)> = None;
    for node in eligible {
        let name = &node.metadata.name;
        let peers = if peers_by_node.is_empty() { 0 } else { peers_on(name).len() };
        if best.is_some_and(|((fewest, _), _)| peers > fewest) {
            continue;
        }
        let key = (peers, node.status.members.len().max(bound(name).members));
        if best.is_none_or(|(best_key, best_node)| (key, name) < (best_key, &best_node.metadata.name)) {
            best = Some((key, node));
        }
    }
    match best {
        Some((_, node)) => Placement::Bound(node.metadata.name.clone()),
        None => Placement::Unplaceable(format!("no node can take {}", member.metadata.name)),
    }
}

/// The host a node's members are reached at: its agent's address
/// without the port. Nodes on one host (several agents on one machine)
/// share it, and with it one port space.
pub fn node_host(node: &Node) -> Option<&str> {
    let address = node.status.address.as_deref()?;
    Some(address.rsplit_once(':').map_or(address, |(host, _)| host))
}

/// The lowest free ports in `range` for each named port, none of them in
/// `taken` (the ports of the other members bound to the node).
pub fn allocate_ports(
    ports: &[NamedPort],
    taken: &BTreeSet<u16>,
    range: RangeInclusive<u16>,
) -> Result<BTreeMap<String, u16>, String> {
    let mut free = range.clone().filter(|p| !taken.contains(p));
    let mut allocated = BTreeMap::new();
    for port in ports {
        let Some(number) = free.next() else {
            return Err(format!(
                "no free port left in {}-{} for port {:?} ({} in use on the node)",
                range.start(),
                range.end(),
                port.name,
                taken.len()
            ));
        };
        allocated.insert(port.name.clone(), number);
    }
    Ok(allocated)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_PEERS: &[Member] = &[];
    use crate::kinds::member::MemberSpec;
    use crate::kinds::node::NodeSpec;
    use crate::quantity::{Bytes, Millicores};
    use proptest::prelude::*;

    fn node(name: &str, ready: bool) -> Node {
        let mut node = Node::new(name, NodeSpec::default());
        node.status.ready = ready;
        node
    }

    fn member(index: u32, on: Option<&str>) -> Member {
        Member::new(
            format!("db-member-{index}"),
            MemberSpec {
                cluster: "db".into(),
                role: "member".into(),
                index,
                node: on.map(str::to_string),
                ..Default::default()
            },
        )
    }

    fn members(members: usize) -> NodeLoad {
        NodeLoad { members, ..Default::default() }
    }

    fn no_selector() -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    #[test]
    fn rule_a_member_moving_away_from_a_node_is_not_placed_back_on_it() {
        let nodes = [node("n1", true), node("n2", true)];
        let mut moving = member(0, None);
        moving.status.moved_from = Some("n1".into());
        assert_eq!(
            place(&moving, &no_selector(), Spread::Preferred, &nodes, NO_PEERS, &|n| members(usize::from(n == "n2"))),
            Placement::Bound("n2".into())
        );
        assert_eq!(
            place(&moving, &no_selector(), Spread::Preferred, &nodes[..1], NO_PEERS, &|_| NodeLoad::default()),
            Placement::Unplaceable("no node can take db-member-0: n1 is the node it is moving away from".into())
        );
    }

    #[test]
    fn rule_only_ready_schedulable_nodes_with_the_labels_take_members() {
        let mut drained = node("n2", true);
        drained.spec.role = NodeRole::Drained;
        let mut cordoned = node("n3", true);
        cordoned.spec.unschedulable = true;
        let nodes = [node("n1", false), drained, cordoned, node("n4", true)];
        let selector = BTreeMap::from([("zone".to_string(), "a".to_string())]);
        let placed = place(&member(0, None), &selector, Spread::Preferred, &nodes, NO_PEERS, &|_| NodeLoad::default());
        assert_eq!(
            placed,
            Placement::Unplaceable(
                "no node can take db-member-0: n1 is NotReady; n2 is drained; n3 is cordoned; n4 lacks label zone=a"
                    .into()
            )
        );
        let mut labelled = node("n4", true);
        labelled.metadata.labels.insert("zone".into(), "a".into());
        let nodes = [node("n1", false), labelled];
        assert_eq!(
            place(&member(0, None), &selector, Spread::Preferred, &nodes, NO_PEERS, &|_| NodeLoad::default()),
            Placement::Bound("n4".into())
        );
    }

    #[test]
    fn rule_members_bound_but_not_yet_reported_count_as_a_nodes_load() {
        let nodes = [node("n1", true), node("n2", true)];
        let bound = |name: &str| members(if name == "n1" { 5 } else { 0 });
        assert_eq!(
            place(&member(0, None), &no_selector(), Spread::Preferred, &nodes, NO_PEERS, &bound),
            Placement::Bound("n2".into())
        );
    }

    #[test]
    fn rule_preferred_spread_picks_the_node_with_the_fewest_of_the_role() {
        let nodes = [node("n1", true), node("n2", true), node("n3", true)];
        let peers = [member(0, Some("n1")), member(1, Some("n2"))];
        assert_eq!(
            place(&member(2, None), &no_selector(), Spread::Preferred, &nodes, &peers, &|_| NodeLoad::default()),
            Placement::Bound("n3".into())
        );
        let crowded = [member(0, Some("n1")), member(1, Some("n2")), member(2, Some("n3"))];
        assert_eq!(
            place(&member(3, None), &no_selector(), Spread::Preferred, &nodes, &crowded, &|_| NodeLoad::default()),
            Placement::Bound("n1".into()),
            "doubled up on the first by name"
        );
    }

    #[test]
    fn rule_required_spread_never_doubles_up_and_says_why() {
        let nodes = [node("n1", true), node("n2", true)];
        let peers = [member(0, Some("n1")), member(1, Some("n2"))];
        let placed =
            place(&member(2, None), &no_selector(), Spread::Required, &nodes, &peers, &|_| NodeLoad::default());
        assert_eq!(
            placed,
            Placement::Unplaceable(
                "db-member-2: spread is required and every node that can take it has a member of role member already: n1 (db-member-0); n2 (db-member-1)".into()
            )
        );
        let with_down = [node("n1", true), node("n2", true), node("n3", false)];
        let Placement::Unplaceable(why) =
            place(&member(2, None), &no_selector(), Spread::Required, &with_down, &peers, &|_| NodeLoad::default())
        else {
            panic!("placed")
        };
        assert!(why.ends_with("n2 (db-member-1); and n3 is NotReady"), "the other nodes' reasons too: {why}");
    }

    #[test]
    fn rule_a_peer_moving_to_a_node_counts_as_there_for_required_spread() {
        let nodes = [node("n1", true), node("n2", true), node("n3", true), node("n4", true)];
        let mut first = member(0, Some("n1"));
        first.status.migration =
            Some(crate::kinds::Migration { from: "n1".into(), to: "n3".into(), ..Default::default() });
        let mut second = member(1, Some("n2"));
        second.status.moved_from = second.spec.node.take();
        let peers = [first, member(1, Some("n2"))];
        assert_eq!(
            place(&second, &no_selector(), Spread::Required, &nodes, &peers, &|_| NodeLoad::default()),
            Placement::Bound("n4".into()),
            "n3 is taken by the first move, n1 still by its source"
        );
    }

    const GI: u64 = 1 << 30;

    fn with_room(name: &str, cpu: u64, memory: u64) -> Node {
        let mut node = node(name, true);
        node.status.allocatable = Some(Amounts { cpu: Millicores(cpu), memory: Bytes(memory), disk: Bytes(0) });
        node
    }

    fn asking(index: u32, cpu: u64, memory: u64) -> Member {
        let mut member = member(index, None);
        member.spec.resources = Amounts { cpu: Millicores(cpu), memory: Bytes(memory), disk: Bytes(0) };
        member
    }

    #[test]
    fn rule_a_node_never_takes_more_than_it_has_allocatable_and_a_refusal_says_which_resource() {
        let nodes = [with_room("node-1", 4000, 8 * GI), with_room("node-2", 4000, 8 * GI), node("node-3", true)];
        let taken = |name: &str| match name {
            "node-1" => NodeLoad { members: 1, requested: Amounts { cpu: Millicores(3500), ..Default::default() } },
            "node-2" => NodeLoad {
                members: 1,
                requested: Amounts { memory: Bytes(8 * GI - GI * 12 / 10), ..Default::default() },
            },
            _ => NodeLoad::default(),
        };
        let placed = place(&asking(0, 1000, GI * 7 / 2), &no_selector(), Spread::Preferred, &nodes, NO_PEERS, &taken);
        assert_eq!(
            placed,
            Placement::Unplaceable(
                "no node can take db-member-0: node-1: cpu 1 requested, 500m of 4 allocatable left; node-2: memory 3.5Gi requested, 1.2Gi of 8Gi allocatable left; node-3 has not reported its capacity"
                    .into()
            )
        );
        assert_eq!(
            place(&asking(0, 500, GI), &no_selector(), Spread::Preferred, &nodes, NO_PEERS, &taken),
            Placement::Bound("node-1".into()),
            "what is left fits exactly"
        );
        assert_eq!(
            place(&member(0, None), &no_selector(), Spread::Preferred, &nodes, NO_PEERS, &taken),
            Placement::Bound("node-3".into()),
            "a member that requests nothing goes anywhere, a node that has said nothing too"
        );
    }

    #[test]
    fn rule_a_moving_member_holds_room_on_both_nodes() {
        let mut moving = asking(0, 1000, GI);
        moving.spec.node = Some("n1".into());
        moving.status.migration =
            Some(crate::kinds::Migration { from: "n1".into(), to: "n2".into(), ..Default::default() });
        let loads = loads([&moving, &asking(1, 500, 0)]);
        assert_eq!(loads["n1"].requested.cpu, Millicores(1000));
        assert_eq!(loads["n2"], NodeLoad { members: 1, requested: moving.spec.resources });
        assert_eq!(loads.len(), 2, "an unbound member takes nothing");
    }

    #[test]
    fn rule_ports_are_the_lowest_free_ones() {
        let ports = [NamedPort { name: "client".into() }, NamedPort { name: "peer".into() }];
        let taken = BTreeSet::from([20000, 20002]);
        let got = allocate_ports(&ports, &taken, 20000..=29999).unwrap();
        assert_eq!(got, BTreeMap::from([("client".into(), 20001), ("peer".into(), 20003)]));
        let error = allocate_ports(&ports, &BTreeSet::from([1]), 1..=2).unwrap_err();
        assert!(error.starts_with("no free port left in 1-2 for port \"peer\""), "{error}");
    }

    proptest! {
        /// The node picked is the one with the fewest peers of the role,
        /// then the fewest members (bound or reported), then the first
        /// name, whatever order the nodes come in.
        #[test]
        fn the_pick_is_the_least_loaded_node_by_peers_members_and_name(
            loads in proptest::collection::vec((0usize..3, 0usize..4, 0usize..4), 1..12),
            rotate in 0usize..12,
        ) {
            let mut nodes: Vec<Node> = Vec::new();
            let mut peers: Vec<Member> = Vec::new();
            for (i, &(peer_count, reported, _)) in loads.iter().enumerate() {
                let mut node = node(&format!("n{i:02}"), true);
                node.status.members =
                    (0..reported).map(|r| crate::api::MemberReport { name: format!("x{i}-{r}"), ..Default::default() }).collect();
                for p in 0..peer_count {
                    peers.push(member(100 + (i * 10 + p) as u32, Some(&node.metadata.name)));
                }
                nodes.push(node);
            }
            let count = nodes.len();
            nodes.rotate_left(rotate % count);
            let bound = |name: &str| members(loads[name[1..].parse::<usize>().unwrap()].2);
            let expected = nodes
                .iter()
                .min_by_key(|n| {
                    let name = &n.metadata.name;
                    let on = peers.iter().filter(|p| p.spec.node.as_deref() == Some(name)).count();
                    (on, n.status.members.len().max(bound(name).members), name.clone())
                })
                .map(|n| n.metadata.name.clone())
                .unwrap();
            let picked = place(&member(0, None), &no_selector(), Spread::Preferred, &nodes, &peers, &bound);
            prop_assert_eq!(picked, Placement::Bound(expected));
        }

        /// With required spread and enough nodes, members placed one after
        /// another never share a node; with preferred spread, no node has
        /// two more of the role than another.
        #[test]
        fn placing_members_one_by_one_spreads_them(nodes in 1usize..6, members in 1u32..12, required: bool) {
            let nodes: Vec<Node> = (0..nodes).map(|i| node(&format!("n{i}"), true)).collect();
            let spread = if required { Spread::Required } else { Spread::Preferred };
            let mut placed: Vec<Member> = Vec::new();
            for index in 0..members {
                match place(&member(index, None), &no_selector(), spread, &nodes, &placed, &|_| NodeLoad::default()) {
                    Placement::Bound(node) => placed.push(member(index, Some(&node))),
                    Placement::Unplaceable(_) => prop_assert!(required && placed.len() == nodes.len()),
                }
            }
            let mut per_node = BTreeMap::<String, usize>::new();
            for m in &placed {
                *per_node.entry(m.spec.node.clone().unwrap_or_default()).or_default() += 1;
            }
            let most = per_node.values().max().copied().unwrap_or(0);
            let least = if per_node.len() < nodes.len() { 0 } else { per_node.values().min().copied().unwrap_or(0) };
            if required { prop_assert!(most <= 1); } else { prop_assert!(most - least <= 1); }
        }

        /// Members placed one after another, of random requests on random
        /// nodes (some that never reported their capacity), never leave a
        /// node with more requested than allocatable; a member refused
        /// fits on no node that can take members.
        #[test]
        fn placement_never_overcommits_a_node(
            nodes in proptest::collection::vec(proptest::option::weighted(0.9, (0u64..8000, 0u64..16 * GI)), 1..8),
            members in proptest::collection::vec((0u64..3000, 0u64..6 * GI, any::<bool>()), 1..30),
            required: bool,
        ) {
            let nodes: Vec<Node> = nodes
                .iter()
                .enumerate()
                .map(|(i, room)| match room {
                    Some((cpu, memory)) => with_room(&format!("n{i}"), *cpu, *memory),
                    None => node(&format!("n{i}"), true),
                })
                .collect();
            let spread = if required { Spread::Required } else { Spread::Preferred };
            let mut placed: Vec<Member> = Vec::new();
            for (index, &(cpu, memory, asks)) in members.iter().enumerate() {
                let candidate = if asks { asking(index as u32, cpu, memory) } else { member(index as u32, None) };
                let taken = loads(&placed);
                let load = |name: &str| taken.get(name).copied().unwrap_or_default();
                match place(&candidate, &no_selector(), spread, &nodes, &placed, &load) {
                    Placement::Bound(node) => {
                        let mut bound = candidate;
                        bound.spec.node = Some(node);
                        placed.push(bound);
                    }
                    Placement::Unplaceable(why) => {
                        let roomy = nodes.iter().filter(|n| no_room_because(n, &load(&n.metadata.name), &candidate.spec.resources).is_none());
                        let without_peer = |n: &&Node| !placed.iter().any(|p| p.spec.node.as_ref() == Some(&n.metadata.name));
                        let could = if required { roomy.filter(without_peer).count() } else { roomy.count() };
                        prop_assert_eq!(could, 0, "refused though a node had room: {}", why);
                    }
                }
            }
            for (name, load) in loads(&placed) {
                let node = nodes.iter().find(|n| n.metadata.name == name).unwrap();
                match node.status.allocatable {
                    Some(allocatable) => for kind in crate::resources::Kind::ALL {
                        prop_assert!(load.requested.get(kind) <= allocatable.get(kind), "{} over on {}", kind.name(), name);
                    },
                    None => prop_assert!(load.requested.is_zero(), "{} never said what it has", name),
                }
            }
        }

        /// Allocated ports are distinct, in the range, and never taken.
        #[test]
        fn allocated_ports_never_collide(taken in proptest::collection::btree_set(20000u16..20020, 0..15), count in 0usize..5) {
            let ports: Vec<NamedPort> = (0..count).map(|i| NamedPort { name: format!("p{i}") }).collect();
            if let Ok(got) = allocate_ports(&ports, &taken, 20000..=20019) {
                let values: BTreeSet<u16> = got.values().copied().collect();
                prop_assert_eq!(values.len(), count);
                prop_assert!(values.iter().all(|p| !taken.contains(p) && (20000..=20019).contains(p)));
            } else {
                prop_assert!(taken.len() + count > 20);
            }
        }
    }
}
