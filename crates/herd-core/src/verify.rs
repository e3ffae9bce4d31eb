//! `herd cluster verify`, as `gnt-cluster verify`: what is wrong with the
//! nodes' roles, each finding an error or a warning, offline nodes listed
//! apart. Errors: no master, the master's node not a candidate, fewer
//! candidates than wanted, every candidate down (the configuration lives
//! on candidates). Warnings: a candidate down, a node not Ready, more
//! candidates than the pool size, a leader that runs on no node, a
//! candidate whose configuration copy lags (by how much), a copy on a
//! node that is no candidate.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::kinds::{Node, NodeRole};
use crate::roles::{NodeFacts, wanted_candidates};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Severity {
    Warning,
    Error,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    pub severity: Severity,
    /// The node it is about, if one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub message: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub findings: Vec<Finding>,
    /// Offline nodes, listed apart: never contacted, so nothing is known.
    pub offline: Vec<String>,
    pub candidates: usize,
    pub wanted_candidates: usize,
    pub pool_size: usize,
}

impl Report {
    /// 0 clean, 1 warnings, 2 errors.
    pub fn exit_code(&self) -> i32 {
        match self.findings.iter().map(|f| f.severity).max() {
            None => 0,
            Some(Severity::Warning) => 1,
            Some(Severity::Error) => 2,
        }
    }
}

pub fn verify(nodes: &[Node], pool_size: usize) -> Report {
    let facts: Vec<NodeFacts> = nodes.iter().map(|n| NodeFacts::of(n, Vec::new())).collect();
    let candidates: Vec<&Node> = nodes.iter().filter(|n| n.spec.role == NodeRole::Candidate).collect();
    let wanted = wanted_candidates(&facts, pool_size);
    let mut findings = Vec::new();
    let mut say = |severity, node: Option<&str>, message: String| {
        findings.push(Finding { severity, node: node.map(str::to_string), message })
    };
    match nodes.iter().find(|n| n.status.master) {
        None if !nodes.is_empty() => say(
            Severity::Warning,
            None,
            "no node is the master's: the leading server replica runs on no node (herd server --node NAME)".into(),
        ),
        Some(master) if master.spec.role != NodeRole::Candidate => say(
            Severity::Error,
            Some(&master.metadata.name),
            format!("the master's node {} is not a master candidate", master.metadata.name),
        ),
        _ => {}
    }
    if candidates.len() < wanted {
        say(
            Severity::Error,
            None,
            format!(
                "{} master candidates where {wanted} are wanted (pool size {pool_size}): the leader promotes Ready eligible nodes",
                candidates.len()
            ),
        );
    }
    if candidates.len() > pool_size {
        say(
            Severity::Warning,
            None,
            format!(
                "{} master candidates, more than the pool size {pool_size} (none is demoted by itself)",
                candidates.len()
            ),
        );
    }
    let down: Vec<&str> = candidates.iter().filter(|n| !n.status.ready).map(|n| n.metadata.name.as_str()).collect();
    if !candidates.is_empty() && down.len() == candidates.len() {
        say(
            Severity::Error,
            None,
            format!("every master candidate is down ({}): the configuration is on candidates only", down.join(", ")),
        );
    }
    for node in nodes.iter().filter(|n| n.spec.role != NodeRole::Offline && !n.status.ready) {
        let name = &node.metadata.name;
        let message = if node.spec.role == NodeRole::Candidate {
            format!("master candidate {name} is unreachable (NotReady): the configuration has one copy fewer")
        } else {
            format!("node {name} is unreachable (NotReady)")
        };
        say(Severity::Warning, Some(name), message);
    }
    // The newest serial any node holds stands for the cluster's.
    let newest = nodes.iter().map(|n| n.status.config_serial).max().unwrap_or(0);
    for node in nodes.iter().filter(|n| n.status.ready) {
        let (name, held) = (&node.metadata.name, node.status.config_serial);
        if node.spec.role == NodeRole::Candidate && held < newest {
            let message = format!(
                "master candidate {name}'s configuration copy lags by {} (serial {held}, newest {newest})",
                newest - held
            );
            say(Severity::Warning, Some(name), message);
        }
        if node.spec.role != NodeRole::Candidate && held > 0 {
            let message = format!("node {name} keeps a configuration copy (serial {held}) but is no master candidate");
            say(Severity::Warning, Some(name), message);
        }
    }
    let offline = nodes.iter().filter(|n| n.spec.role == NodeRole::Offline).map(|n| n.metadata.name.clone()).collect();
    Report { findings, offline, candidates: candidates.len(), wanted_candidates: wanted, pool_size }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::NodeSpec;
    use crate::resource::Object;

    fn node(name: &str, role: NodeRole, ready: bool) -> Node {
        let mut node = Object::new(name, NodeSpec { role, ..NodeSpec::default() });
        node.status.ready = ready;
        node
    }

    fn healthy() -> Vec<Node> {
        let mut nodes = vec![
            node("n1", NodeRole::Candidate, true),
            node("n2", NodeRole::Candidate, true),
            node("n3", NodeRole::Regular, true),
            node("n4", NodeRole::Offline, false),
        ];
        nodes[0].status.master = true;
        nodes
    }

    #[test]
    fn a_healthy_cluster_is_clean_and_lists_offline_nodes_apart() {
        let report = verify(&healthy(), 2);
        assert_eq!(report.findings, Vec::new());
        assert_eq!(report.exit_code(), 0);
        assert_eq!(report.offline, ["n4"]);
    }

    #[test]
    fn each_finding_is_named_with_its_severity() {
        let mut nodes = healthy();
        nodes[1].status.ready = false;
        let report = verify(&nodes, 2);
        assert_eq!(report.exit_code(), 1);
        assert!(report.findings[0].message.contains("master candidate n2 is unreachable"));

        let report = verify(&healthy(), 3);
        assert_eq!(report.exit_code(), 2, "too few candidates");
        assert!(report.findings[0].message.contains("2 master candidates where 3 are wanted"));

        let mut nodes = healthy();
        nodes[0].spec.role = NodeRole::Regular;
        nodes[1].status.ready = false;
        let messages: Vec<String> = verify(&nodes, 1).findings.into_iter().map(|f| f.message).collect();
        assert!(messages.iter().any(|m| m.contains("the master's node n1 is not a master candidate")), "{messages:?}");
        assert!(messages.iter().any(|m| m.contains("every master candidate is down (n2)")), "{messages:?}");

        let mut nodes = healthy();
        nodes[0].status.master = false;
        let mut copies = healthy();
        copies[0].status.config_serial = 7;
        copies[1].status.config_serial = 5;
        copies[2].status.config_serial = 7;
        let messages: Vec<String> = verify(&copies, 2).findings.into_iter().map(|f| f.message).collect();
        assert!(
            messages.iter().any(|m| m.contains("n2's configuration copy lags by 2 (serial 5, newest 7)")),
            "{messages:?}"
        );
        assert!(messages.iter().any(|m| m.contains("node n3 keeps a configuration copy (serial 7)")), "{messages:?}");
        let report = verify(&nodes, 2);
        assert!(report.findings.iter().any(|f| f.message.starts_with("no node is the master's")));
        assert_eq!(report.exit_code(), 1);
        assert!(
            verify(&healthy(), 1)
                .findings
                .iter()
                .any(|f| f.severity == Severity::Warning && f.message.contains("more than the pool size"))
        );
    }
}
