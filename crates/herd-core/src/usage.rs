//! What nodes and members use, against what they request and have: the
//! rows of `herd top`, the dashboard and /metrics, from the nodes'
//! reports (each member's usage, as its cgroup counts it) and the
//! members' requests. Pure.

use std::collections::HashMap;

use crate::kinds::{Member, Node};
use crate::placement;
use crate::quantity::{Bytes, Millicores};
use crate::resources::Amounts;

/// One node: what its members use and request, and what it has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeUse {
    pub node: String,
    pub ready: bool,
    /// The CPU and memory its members use (those whose usage it reports).
    pub cpu: Millicores,
    pub memory: Bytes,
    /// What the members bound to it (or moving to it) request.
    pub requested: Amounts,
    pub allocatable: Option<Amounts>,
    pub members: usize,
}

/// One member, as its node reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberUse {
    pub member: String,
    pub node: String,
    pub cluster: Option<String>,
    pub running: bool,
    /// None until its node reports a rate (two reads), or without a cgroup.
    pub cpu: Option<Millicores>,
    pub memory: Option<Bytes>,
    /// What it requests (None: not an app-cluster member herd knows).
    pub requested: Option<Amounts>,
}

/// Each node, by name.
pub fn nodes(nodes: &[impl std::borrow::Borrow<Node>], members: &[impl std::borrow::Borrow<Member>]) -> Vec<NodeUse> {
    let loads = placement::loads(members.iter().map(std::borrow::Borrow::borrow));
    let mut rows: Vec<NodeUse> = nodes
        .iter()
        .map(std::borrow::Borrow::borrow)
        .map(|node| {
            let name = &node.metadata.name;
            let load = loads.get(name).copied().unwrap_or_default();
            let usage = node.status.members.iter().filter(|r| r.running).filter_map(|r| r.usage);
            let (cpu, memory) = usage.fold((0u64, 0u64), |(cpu, memory), u| {
                (cpu.saturating_add(u.cpu.unwrap_or_default().0), memory.saturating_add(u.memory.unwrap_or_default().0))
            });
            NodeUse {
                node: name.clone(),
                ready: node.status.ready,
                cpu: Millicores(cpu),
                memory: Bytes(memory),
                requested: load.requested,
                allocatable: node.status.allocatable,
                members: load.members.max(node.status.members.len()),
            }
        })
        .collect();
    rows.sort_by(|a, b| a.node.cmp(&b.node));
    rows
}

/// Every member each node reports, by node then name.
pub fn members(
    nodes: &[impl std::borrow::Borrow<Node>],
    members: &[impl std::borrow::Borrow<Member>],
) -> Vec<MemberUse> {
    let requested: HashMap<&str, Amounts> =
        members.iter().map(std::borrow::Borrow::borrow).map(|m| (m.metadata.name.as_str(), m.spec.resources)).collect();
    let mut rows: Vec<MemberUse> = nodes
        .iter()
        .map(std::borrow::Borrow::borrow)
        .flat_map(|node| {
            node.status.members.iter().filter(|r| r.wanted || r.running).map(|report| MemberUse {
                member: report.name.clone(),
                node: node.metadata.name.clone(),
                cluster: report.cluster.clone(),
                running: report.running,
                cpu: report.usage.and_then(|u| u.cpu),
                memory: report.usage.and_then(|u| u.memory),
                requested: requested.get(report.name.as_str()).copied(),
            })
        })
        .collect();
    rows.sort_by(|a, b| (&a.node, &a.member).cmp(&(&b.node, &b.member)));
    rows
}

/// `part` as a share of `whole`, in whole percent (None: nothing to share).
pub fn percent(part: u64, whole: u64) -> Option<u64> {
    (u128::from(part) * 100).checked_div(u128::from(whole)).map(|p| u64::try_from(p).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{MemberReport, MemberUsage};
    use crate::kinds::{MemberSpec, NodeSpec};

    fn report(name: &str, cpu: u64, memory: u64) -> MemberReport {
        MemberReport {
            name: name.into(),
            wanted: true,
            running: true,
            usage: Some(MemberUsage { cpu: Some(Millicores(cpu)), memory: Some(Bytes(memory)) }),
            ..Default::default()
        }
    }

    #[test]
    fn a_node_sums_what_its_members_use_and_request() {
        let mut n1 = Node::new("n1", NodeSpec::default());
        n1.status.ready = true;
        n1.status.allocatable = Some(Amounts { cpu: Millicores(2000), memory: Bytes(8 << 30), disk: Bytes(0) });
        n1.status.members = vec![report("a", 300, 100 << 20), report("b", 200, 50 << 20), report("stray", 5, 1 << 20)];
        n1.status.members[2].running = false;
        let n2 = Node::new("n2", NodeSpec::default());
        let member = |name: &str, cpu: u64| {
            let resources = Amounts { cpu: Millicores(cpu), ..Default::default() };
            Member::new(name, MemberSpec { node: Some("n1".into()), resources, ..Default::default() })
        };
        let members = [member("a", 500), member("b", 250)];
        let rows = nodes(&[n2.clone(), n1.clone()], &members);
        assert_eq!(rows[0].node, "n1", "by name");
        assert_eq!((rows[0].cpu, rows[0].memory), (Millicores(500), Bytes(150 << 20)), "a stopped member uses nothing");
        assert_eq!(rows[0].requested.cpu, Millicores(750));
        assert_eq!((rows[1].members, rows[1].allocatable), (0, None));

        let each = super::members(&[n1], &members);
        assert_eq!(each.len(), 3);
        assert_eq!(
            (each[0].member.as_str(), each[0].cpu, each[0].requested.map(|r| r.cpu)),
            ("a", Some(Millicores(300)), Some(Millicores(500)))
        );
        assert_eq!(each[2].requested, None, "a member herd does not know");
        assert_eq!((percent(750, 2000), percent(1, 0)), (Some(37), None));
    }
}
