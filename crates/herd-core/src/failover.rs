//! Master failover without a shared store (Ganeti's `gnt-cluster
//! master-failover`): the vote that decides it. Every node's agent is
//! asked which master it follows and whether it still reaches it; the
//! failover goes ahead only when a majority of all nodes answer and none
//! still reaches the master, and starts the new master from the freshest
//! configuration copy among the candidates, at a term above every term
//! any node has seen. Pure.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What an agent answers about the master it follows (`GET /v1/master`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MasterView {
    pub node: String,
    /// The term of the master it follows.
    pub term: u64,
    pub master_urls: Vec<String>,
    /// The serial of its configuration copy (a master candidate's only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<u64>,
    /// Its last heartbeat went through recently.
    pub master_reachable: bool,
    /// Seconds since its last heartbeat went through (None: none did).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_contact_secs: Option<u64>,
}

/// Who the master is from now on (`POST /v1/master`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Announcement {
    pub term: u64,
    pub master_urls: Vec<String>,
}

/// One node's answer to the vote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Seen(MasterView),
    /// Its agent could not be asked (why).
    Unreachable(String),
}

/// The failover won: where to start from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Won {
    pub term: u64,
    /// The candidate with the freshest configuration copy, and its serial.
    pub source: String,
    pub serial: u64,
    /// The nodes that agreed the master is down.
    pub agreeing: Vec<String>,
    /// Said to the operator before going ahead (`--no-voting`).
    pub warnings: Vec<String>,
}

/// Decides the failover asked on node `me`, from every node's answer (all
/// nodes the configuration knows, `me` included).
pub fn decide(me: &str, answers: &BTreeMap<String, Answer>, no_voting: bool) -> Result<Won, String> {
    let seen: Vec<&MasterView> = answers
        .values()
        .filter_map(|a| match a {
            Answer::Seen(view) => Some(view),
            Answer::Unreachable(_) => None,
        })
        .collect();
    match answers.get(me) {
        Some(Answer::Seen(view)) if view.serial.is_some() => {}
        Some(Answer::Seen(_)) => {
            return Err(format!("node {me} holds no configuration copy: run the failover on a master candidate"));
        }
        _ => return Err(format!("node {me} is not in the configuration, or its own agent does not answer")),
    }
    if let Some(still) = seen.iter().find(|v| v.master_reachable) {
        return Err(format!(
            "node {} still reaches the master at {}: it is not down (stop it first, or wait until its nodes lose it)",
            still.node,
            still.master_urls.join(", ")
        ));
    }
    let agreeing: Vec<String> = seen.iter().map(|v| v.node.clone()).collect();
    let needed = answers.len() / 2 + 1;
    let mut warnings = Vec::new();
    if agreeing.len() < needed {
        let unreachable: Vec<String> = answers
            .iter()
            .filter_map(|(node, a)| match a {
                Answer::Unreachable(why) => Some(format!("{node} ({why})")),
                Answer::Seen(_) => None,
            })
            .collect();
        let summary = format!(
            "only {} of {} nodes answered and agree that the master is down; {needed} are needed (unreachable: {})",
            agreeing.len(),
            answers.len(),
            unreachable.join(", ")
        );
        if !no_voting {
            return Err(format!("{summary}. With two nodes, --no-voting goes ahead without a majority"));
        }
        warnings
            .push(format!("{summary}; going ahead without a majority (--no-voting): make sure the old master is down"));
    }
    let (source, serial) = seen
        .iter()
        .filter_map(|v| v.serial.map(|s| (v.node.clone(), s)))
        .max_by_key(|(node, serial)| (*serial, node == me))
        .ok_or_else(|| "no candidate holds a configuration copy".to_string())?;
    let term = seen.iter().map(|v| v.term).max().unwrap_or(0) + 1;
    Ok(Won { term, source, serial, agreeing, warnings })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(node: &str, term: u64, serial: Option<u64>, reachable: bool) -> (String, Answer) {
        let view = MasterView {
            node: node.into(),
            term,
            master_urls: vec!["https://old:8443".into()],
            serial,
            master_reachable: reachable,
            since_contact_secs: Some(30),
        };
        (node.into(), Answer::Seen(view))
    }

    fn down(node: &str) -> (String, Answer) {
        (node.into(), Answer::Unreachable("connection refused".into()))
    }

    #[test]
    fn a_majority_that_lost_the_master_wins_from_the_freshest_copy_at_a_new_term() {
        let answers = BTreeMap::from([down("n1"), seen("n2", 3, Some(40), false), seen("n3", 4, Some(41), false)]);
        let won = decide("n2", &answers, false).unwrap();
        assert_eq!((won.term, won.source.as_str(), won.serial), (5, "n3", 41));
        assert_eq!(won.agreeing, vec!["n2", "n3"]);
        assert!(won.warnings.is_empty());
    }

    #[test]
    fn without_a_majority_it_is_refused_unless_no_voting() {
        let answers = BTreeMap::from([down("n1"), seen("n2", 3, Some(40), false), down("n3")]);
        let refused = decide("n2", &answers, false).unwrap_err();
        assert!(refused.contains("only 1 of 3") && refused.contains("2 are needed"), "{refused}");
        assert!(refused.contains("n3 (connection refused)"), "{refused}");
        let two = BTreeMap::from([down("n1"), seen("n2", 3, Some(40), false)]);
        assert!(decide("n2", &two, false).is_err(), "two nodes: one is no majority");
        let won = decide("n2", &two, true).unwrap();
        assert!(won.warnings[0].contains("--no-voting"));
    }

    #[test]
    fn a_node_that_still_reaches_the_master_stops_it() {
        let answers = BTreeMap::from([down("n1"), seen("n2", 3, Some(40), false), seen("n3", 3, None, true)]);
        let refused = decide("n2", &answers, true).unwrap_err();
        assert!(refused.contains("node n3 still reaches the master"), "{refused}");
    }

    #[test]
    fn it_runs_on_a_candidate_only() {
        let answers = BTreeMap::from([down("n1"), seen("n2", 3, None, false), seen("n3", 3, Some(9), false)]);
        assert!(decide("n2", &answers, false).unwrap_err().contains("no configuration copy"));
        assert!(decide("n9", &answers, false).unwrap_err().contains("not in the configuration"));
    }

    #[test]
    fn equal_copies_prefer_the_local_one() {
        let answers = BTreeMap::from([down("n1"), seen("n2", 3, Some(7), false), seen("n3", 3, Some(7), false)]);
        assert_eq!(decide("n2", &answers, false).unwrap().source, "n2");
        assert_eq!(decide("n3", &answers, false).unwrap().source, "n3");
    }
}
