//! Node roles with Ganeti 2.0's rules: one role per node
//! (candidate, regular, drained, offline) and whether it is master
//! capable; changed one at a time, as an operator asks (`herd node
//! modify`), or by the leader keeping the candidate pool full.
//!
//! The rules, each a refusal with its reason:
//! - the master's node keeps its role: only a failover moves the master;
//! - offline is refused while the node hosts members (they are named);
//! - promotion needs a master-capable node that is neither offline nor
//!   drained (a node that is not master capable is never promoted, by
//!   anyone);
//! - a demotion (to regular, drained or offline, or master capability
//!   taken away) that leaves fewer candidates than wanted, min(pool size,
//!   eligible nodes), is refused with the numbers, unless the caller asks
//!   for auto-promotion: then an eligible node is promoted in the same
//!   change (otherwise a full pool would make offline impossible).
//!
//! Offline and drained replace any other role, so offline clears drained,
//! and both demote. Lowering the pool size demotes nobody (as Ganeti).
//! Only a Ready node is promoted (by the pool keeper or an auto-promotion):
//! a candidate keeps the configuration, which a node that does not answer
//! cannot take.

use std::collections::BTreeMap;

use crate::kinds::{Node, NodeRole};

/// The label that places a node in a zone; promotions spread over zones.
pub const ZONE_LABEL: &str = "herd.io/zone";

/// What the operator asks of one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoleChange {
    Role(NodeRole),
    MasterCapable(bool),
}

/// A node's role and capability as they are, and the members it hosts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    pub name: String,
    pub role: NodeRole,
    pub master_capable: bool,
    pub zone: Option<String>,
    pub members: Vec<String>,
    /// Its agent's heartbeats arrive.
    pub ready: bool,
}

impl NodeFacts {
    pub fn of(node: &Node, members: Vec<String>) -> NodeFacts {
        NodeFacts {
            name: node.metadata.name.clone(),
            role: node.spec.role,
            master_capable: node.spec.master_capable,
            zone: node.metadata.labels.get(ZONE_LABEL).cloned(),
            members,
            ready: node.status.ready,
        }
    }

    /// May be a candidate: master capable, neither offline nor drained.
    pub fn eligible(&self) -> bool {
        self.master_capable && matches!(self.role, NodeRole::Candidate | NodeRole::Regular)
    }
}

/// One node's new role and capability.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeUpdate {
    pub name: String,
    pub role: NodeRole,
    pub master_capable: bool,
    /// Why, for its Event ("asked", "promoted to keep the pool full").
    pub why: String,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RoleRefusal {
    #[error("node {0} does not exist")]
    NoSuchNode(String),
    #[error(
        "node {0} is the master's node: its role changes only once another candidate's server replica leads (a failover)"
    )]
    MastersNode(String),
    #[error("node {node} still hosts members ({}): move or delete them before setting it offline", members.join(", "))]
    HostsMembers { node: String, members: Vec<String> },
    #[error("node {0} is not master capable: it cannot be a candidate (set --master-capable true first)")]
    NotMasterCapable(String),
    #[error("node {node} is {role}: make it regular before promoting it")]
    NotEligible { node: String, role: String },
    #[error("{}", pool_would_shrink(node, *left, *wanted, *pool, *eligible, *promotable))]
    PoolWouldShrink { node: String, left: usize, wanted: usize, pool: usize, eligible: usize, promotable: usize },
}

fn pool_would_shrink(
    node: &str,
    left: usize,
    wanted: usize,
    pool: usize,
    eligible: usize,
    promotable: usize,
) -> String {
    let why = format!(
        "demoting node {node} would leave {left} candidates where {wanted} are wanted (pool size {pool}, {eligible} eligible Ready nodes)"
    );
    if promotable == 0 {
        format!(
            "{why}, and no other eligible Ready node could take its place: lower candidatePoolSize, or take away its master capability (--master-capable false)"
        )
    } else {
        format!("{why}: add --auto-promote to promote another node in the same change")
    }
}

/// Candidates wanted: min(pool size, eligible nodes), where an eligible
/// node that is not Ready counts only while it is a candidate (it could not
/// be promoted).
pub fn wanted_candidates(nodes: &[NodeFacts], pool_size: usize) -> usize {
    pool_size.min(nodes.iter().filter(|n| n.eligible() && (n.ready || n.role == NodeRole::Candidate)).count())
}

fn role_name(role: NodeRole) -> String {
    match role {
        NodeRole::Candidate => "a candidate",
        NodeRole::Regular => "regular",
        NodeRole::Drained => "drained",
        NodeRole::Offline => "offline",
    }
    .to_string()
}

/// Decides one change to node `target`: the updates to write together
/// (none when it changes nothing), or why not.
pub fn decide(
    nodes: &[NodeFacts],
    master: Option<&str>,
    target: &str,
    change: RoleChange,
    pool_size: usize,
    auto_promote: bool,
) -> Result<Vec<NodeUpdate>, RoleRefusal> {
    let node = nodes.iter().find(|n| n.name == target).ok_or_else(|| RoleRefusal::NoSuchNode(target.into()))?;
    let (role, master_capable) = match change {
        RoleChange::Role(role) => (role, node.master_capable),
        // Capability taken away demotes a candidate.
        RoleChange::MasterCapable(false) if node.role == NodeRole::Candidate => (NodeRole::Regular, false),
        RoleChange::MasterCapable(capable) => (node.role, capable),
    };
    if (role, master_capable) == (node.role, node.master_capable) {
        return Ok(Vec::new());
    }
    if master == Some(target) {
        return Err(RoleRefusal::MastersNode(target.into()));
    }
    if role == NodeRole::Offline && !node.members.is_empty() {
        return Err(RoleRefusal::HostsMembers { node: target.into(), members: node.members.clone() });
    }
    if role == NodeRole::Candidate && node.role != NodeRole::Candidate {
        if !master_capable {
            return Err(RoleRefusal::NotMasterCapable(target.into()));
        }
        if !node.eligible() {
            return Err(RoleRefusal::NotEligible { node: target.into(), role: role_name(node.role) });
        }
    }
    let changed = NodeFacts { role, master_capable, ..node.clone() };
    let after: Vec<NodeFacts> =
        nodes.iter().map(|n| if n.name == target { changed.clone() } else { n.clone() }).collect();
    let mut updates = vec![NodeUpdate { name: target.into(), role, master_capable, why: "asked".into() }];
    let demoted = node.role == NodeRole::Candidate && role != NodeRole::Candidate;
    if demoted {
        let left = after.iter().filter(|n| n.role == NodeRole::Candidate).count();
        let wanted = wanted_candidates(&after, pool_size);
        if left < wanted {
            // The node demoted is not promoted again in its own change.
            let others: Vec<NodeFacts> = after.iter().filter(|n| n.name != target).cloned().collect();
            let promotable = others.iter().filter(|n| n.eligible() && n.ready && n.role != NodeRole::Candidate).count();
            let chosen = promotions(&others, wanted - left);
            if !auto_promote || chosen.is_empty() {
                return Err(RoleRefusal::PoolWouldShrink {
                    node: target.into(),
                    left,
                    wanted,
                    pool: pool_size,
                    eligible: after
                        .iter()
                        .filter(|n| n.eligible() && (n.ready || n.role == NodeRole::Candidate))
                        .count(),
                    promotable,
                });
            }
            updates.extend(chosen.into_iter().map(|name| promoted(&after, name, target)));
        }
    }
    Ok(updates)
}

fn promoted(nodes: &[NodeFacts], name: String, instead_of: &str) -> NodeUpdate {
    let master_capable = nodes.iter().find(|n| n.name == name).is_some_and(|n| n.master_capable);
    NodeUpdate {
        name,
        role: NodeRole::Candidate,
        master_capable,
        why: format!("promoted in place of {instead_of} to keep the candidate pool full"),
    }
}

/// Up to `count` eligible, Ready regular nodes to promote: first from the
/// zones with the fewest candidates, then by name.
pub fn promotions(nodes: &[NodeFacts], count: usize) -> Vec<String> {
    let mut per_zone: BTreeMap<Option<&str>, usize> = BTreeMap::new();
    for node in nodes.iter().filter(|n| n.role == NodeRole::Candidate) {
        *per_zone.entry(node.zone.as_deref()).or_default() += 1;
    }
    let mut waiting: Vec<&NodeFacts> =
        nodes.iter().filter(|n| n.eligible() && n.ready && n.role != NodeRole::Candidate).collect();
    let mut chosen = Vec::new();
    while chosen.len() < count && !waiting.is_empty() {
        let (index, _) = waiting
            .iter()
            .enumerate()
            .min_by_key(|(_, n)| (per_zone.get(&n.zone.as_deref()).copied().unwrap_or(0), n.name.clone()))
            .expect("not empty");
        let node = waiting.remove(index);
        *per_zone.entry(node.zone.as_deref()).or_default() += 1;
        chosen.push(node.name.clone());
    }
    chosen
}

/// What the leader does to keep the pool full: the promotions needed now
/// (never a demotion: a pool above its size only warns). The master's
/// node, when it is eligible, is promoted first, even beyond the pool.
pub fn fill_pool(nodes: &[NodeFacts], pool_size: usize, master: Option<&str>) -> Vec<NodeUpdate> {
    let candidates = nodes.iter().filter(|n| n.role == NodeRole::Candidate).count();
    let promote = |name: String, why: String| NodeUpdate { name, role: NodeRole::Candidate, master_capable: true, why };
    if let Some(node) = nodes.iter().find(|n| Some(n.name.as_str()) == master)
        && node.eligible()
        && node.role != NodeRole::Candidate
    {
        return vec![promote(node.name.clone(), "promoted: it is the master's node".into())];
    }
    let short = wanted_candidates(nodes, pool_size).saturating_sub(candidates);
    let why = format!("promoted: the pool had {candidates} candidates of {pool_size} wanted");
    promotions(nodes, short).into_iter().map(|name| promote(name, why.clone())).collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn node(name: &str, role: NodeRole) -> NodeFacts {
        NodeFacts { name: name.into(), role, master_capable: true, zone: None, members: Vec::new(), ready: true }
    }

    /// Five nodes, three of them candidates (a full pool of 3); n1 is the master's.
    fn five() -> Vec<NodeFacts> {
        let mut nodes: Vec<NodeFacts> = (1..=5).map(|i| node(&format!("n{i}"), NodeRole::Regular)).collect();
        for n in &mut nodes[..3] {
            n.role = NodeRole::Candidate;
        }
        nodes
    }

    fn change(
        nodes: &[NodeFacts],
        target: &str,
        change: RoleChange,
        auto: bool,
    ) -> Result<Vec<NodeUpdate>, RoleRefusal> {
        decide(nodes, Some("n1"), target, change, 3, auto)
    }

    #[test]
    fn the_masters_node_keeps_its_role() {
        for role in [NodeRole::Regular, NodeRole::Drained, NodeRole::Offline] {
            assert_eq!(change(&five(), "n1", RoleChange::Role(role), true), Err(RoleRefusal::MastersNode("n1".into())));
        }
        assert!(matches!(
            change(&five(), "n1", RoleChange::MasterCapable(false), true),
            Err(RoleRefusal::MastersNode(_))
        ));
    }

    #[test]
    fn offline_is_refused_while_the_node_hosts_members_and_names_them() {
        let mut nodes = five();
        nodes[4].members = vec!["web-0".into(), "web-1".into()];
        let refused = change(&nodes, "n5", RoleChange::Role(NodeRole::Offline), false).unwrap_err();
        assert!(refused.to_string().contains("web-0, web-1"), "{refused}");
        let drained = change(&nodes, "n5", RoleChange::Role(NodeRole::Drained), false).unwrap();
        assert_eq!(drained[0].role, NodeRole::Drained, "drained is allowed with members");
    }

    #[test]
    fn offline_clears_drained_and_both_demote() {
        let mut nodes = five();
        nodes[4].role = NodeRole::Drained;
        let offline = change(&nodes, "n5", RoleChange::Role(NodeRole::Offline), false).unwrap();
        assert_eq!(
            offline,
            vec![NodeUpdate { name: "n5".into(), role: NodeRole::Offline, master_capable: true, why: "asked".into() }]
        );
        // A candidate drained or set offline is no longer one (here n4 takes its place).
        for role in [NodeRole::Drained, NodeRole::Offline] {
            let updates = change(&five(), "n3", RoleChange::Role(role), true).unwrap();
            assert_eq!(updates[0].role, role);
            assert_eq!((updates[1].name.as_str(), updates[1].role), ("n4", NodeRole::Candidate));
        }
    }

    #[test]
    fn promotion_needs_a_master_capable_node_that_is_neither_offline_nor_drained() {
        let mut nodes = five();
        nodes[3].master_capable = false;
        nodes[4].role = NodeRole::Drained;
        assert_eq!(
            change(&nodes, "n4", RoleChange::Role(NodeRole::Candidate), false),
            Err(RoleRefusal::NotMasterCapable("n4".into()))
        );
        assert!(matches!(
            change(&nodes, "n5", RoleChange::Role(NodeRole::Candidate), false),
            Err(RoleRefusal::NotEligible { .. })
        ));
        nodes[4].role = NodeRole::Offline;
        assert!(matches!(
            change(&nodes, "n5", RoleChange::Role(NodeRole::Candidate), false),
            Err(RoleRefusal::NotEligible { .. })
        ));
        nodes[4].role = NodeRole::Regular;
        let promoted = change(&nodes, "n5", RoleChange::Role(NodeRole::Candidate), false).unwrap();
        assert_eq!(promoted.len(), 1, "a pool above its size is allowed: {promoted:?}");
    }

    #[test]
    fn ganeti_163_a_demotion_from_a_full_pool_is_refused_unless_another_is_promoted_with_it() {
        let refused = change(&five(), "n2", RoleChange::Role(NodeRole::Offline), false).unwrap_err();
        assert_eq!(
            refused,
            RoleRefusal::PoolWouldShrink { node: "n2".into(), left: 2, wanted: 3, pool: 3, eligible: 4, promotable: 2 }
        );
        assert!(refused.to_string().contains("--auto-promote"), "{refused}");
        let updates = change(&five(), "n2", RoleChange::Role(NodeRole::Offline), true).unwrap();
        assert_eq!(updates.len(), 2);
        assert_eq!((updates[1].name.as_str(), updates[1].role), ("n4", NodeRole::Candidate));
        assert!(updates[1].why.contains("in place of n2"));
    }

    #[test]
    fn a_demotion_is_allowed_when_no_eligible_node_could_replace_it() {
        // Three nodes, all candidates: the pool of 3 cannot be kept anyway.
        let nodes: Vec<NodeFacts> = (1..=3).map(|i| node(&format!("n{i}"), NodeRole::Candidate)).collect();
        let updates = decide(&nodes, Some("n1"), "n3", RoleChange::Role(NodeRole::Drained), 3, false).unwrap();
        assert_eq!(updates.len(), 1);
        // Made regular it stays eligible, so the pool still wants it, and
        // no one could replace it: the refusal says what would help.
        let refused = decide(&nodes, Some("n1"), "n3", RoleChange::Role(NodeRole::Regular), 3, true).unwrap_err();
        let why = refused.to_string();
        assert!(why.contains("no other eligible Ready node") && why.contains("lower candidatePoolSize"), "{why}");
        assert!(!why.contains("--auto-promote"), "{why}");
    }

    #[test]
    fn ganeti_1682_a_node_that_is_not_master_capable_is_never_promoted() {
        let mut nodes = five();
        nodes[3].master_capable = false;
        // Auto-promotion skips n4 for n5.
        let updates = change(&nodes, "n2", RoleChange::Role(NodeRole::Regular), true).unwrap();
        assert_eq!(updates[1].name, "n5");
        // Nor does the pool keeper pick it.
        nodes[1].role = NodeRole::Regular;
        let filled = fill_pool(&nodes, 3, None);
        assert_eq!(filled.iter().map(|u| u.name.as_str()).collect::<Vec<_>>(), ["n2"]);
        // Capability taken from a candidate demotes it, under the pool rule.
        let refused = change(&five(), "n2", RoleChange::MasterCapable(false), false).unwrap_err();
        assert!(matches!(refused, RoleRefusal::PoolWouldShrink { .. }));
    }

    #[test]
    fn only_a_ready_node_is_promoted() {
        let mut nodes = five();
        nodes[3].ready = false;
        let updates = change(&nodes, "n2", RoleChange::Role(NodeRole::Drained), true).unwrap();
        assert_eq!(updates[1].name, "n5", "n4 does not answer");
        // Nobody could take n2's place: the pool wanted is what can be had.
        nodes[4].ready = false;
        let alone = change(&nodes, "n2", RoleChange::Role(NodeRole::Drained), false).unwrap();
        assert_eq!(alone.len(), 1, "{alone:?}");
        nodes[1].role = NodeRole::Regular;
        assert!(fill_pool(&nodes, 3, None).iter().all(|u| u.name == "n2"));
    }

    #[test]
    fn the_pool_fills_to_its_size_over_zones_and_never_shrinks() {
        let mut nodes: Vec<NodeFacts> = (1..=6).map(|i| node(&format!("n{i}"), NodeRole::Regular)).collect();
        for (n, zone) in nodes.iter_mut().zip(["a", "a", "a", "b", "b", "c"]) {
            n.zone = Some(zone.into());
        }
        let filled: Vec<String> = fill_pool(&nodes, 3, None).into_iter().map(|u| u.name).collect();
        assert_eq!(filled, ["n1", "n4", "n6"], "one per zone first");
        for n in &mut nodes {
            n.role = NodeRole::Candidate;
        }
        assert!(fill_pool(&nodes, 3, None).is_empty(), "six candidates for a pool of 3: nobody is demoted");
        // The master's node is a candidate even beyond the pool.
        nodes[5].role = NodeRole::Regular;
        let master: Vec<String> = fill_pool(&nodes, 3, Some("n6")).into_iter().map(|u| u.name).collect();
        assert_eq!(master, ["n6"]);
    }

    fn roles() -> impl Strategy<Value = NodeRole> {
        prop_oneof![
            Just(NodeRole::Candidate),
            Just(NodeRole::Regular),
            Just(NodeRole::Drained),
            Just(NodeRole::Offline)
        ]
    }

    proptest! {
        /// Whatever is asked, an accepted change keeps the pool at
        /// min(wanted, what it was), never promotes an ineligible node,
        /// and never touches the master's node.
        #[test]
        fn accepted_changes_keep_the_rules(
            facts in proptest::collection::vec((roles(), any::<bool>(), any::<bool>()), 1..8),
            target in 0usize..8,
            asked in prop_oneof![roles().prop_map(RoleChange::Role), any::<bool>().prop_map(RoleChange::MasterCapable)],
            pool in 0usize..6,
            auto in any::<bool>(),
        ) {
            let nodes: Vec<NodeFacts> = facts.iter().enumerate().map(|(i, (role, capable, hosts))| NodeFacts {
                name: format!("n{i}"),
                role: *role,
                master_capable: *capable,
                zone: None,
                members: if *hosts { vec![format!("m{i}")] } else { Vec::new() },
                ready: i % 3 != 1,
            }).collect();
            let target = format!("n{}", target % nodes.len());
            let Ok(updates) = decide(&nodes, Some("n0"), &target, asked, pool, auto) else { return Ok(()) };
            let mut after = nodes.clone();
            for update in &updates {
                let node = after.iter_mut().find(|n| n.name == update.name).unwrap();
                let was = node.clone();
                if update.role == NodeRole::Candidate && was.role != NodeRole::Candidate {
                    prop_assert!(was.eligible() || update.name == target, "{update:?} promoted from {was:?}");
                    prop_assert!(was.ready || update.name == target, "{update:?} promoted while not Ready");
                    prop_assert!(update.master_capable);
                }
                if update.role == NodeRole::Offline {
                    prop_assert!(was.members.is_empty());
                }
                node.role = update.role;
                node.master_capable = update.master_capable;
            }
            prop_assert!(updates.is_empty() || target != "n0");
            let candidates = |ns: &[NodeFacts]| ns.iter().filter(|n| n.role == NodeRole::Candidate).count();
            let before = candidates(&nodes);
            prop_assert!(
                candidates(&after) >= before.min(wanted_candidates(&after, pool)),
                "{before} candidates became {} for {asked:?} on {target}: {updates:?}", candidates(&after)
            );
        }
    }
}
