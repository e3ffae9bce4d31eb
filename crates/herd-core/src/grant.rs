//! Grants: what one caller may do on one node's agent endpoint, until
//! when. The leader signs one grant per action a Command needs from
//! another agent (read volume V of member M, stop, start or forget member
//! M) and for its own reads (a log, the volumes); the serving agent checks
//! the signature (herd-tls), then [`check`]: that the caller its TLS
//! certificate names is the grant's holder, that the grant is for this
//! node, that it covers the request, and that it has not expired. A stolen
//! grant is of no use without its holder's key, and names one action.

use serde::{Deserialize, Serialize};

use crate::time::Timestamp;

/// Who holds a grant: a node's agent (or its copy worker), or the server.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Holder {
    Node(String),
    Server,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holder::Node(node) => write!(f, "node {node}"),
            Holder::Server => f.write_str("the server"),
        }
    }
}

/// One action on an agent's endpoint.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "action")]
pub enum Access {
    /// A volume's manifest, its files and how much of a copy is staged.
    #[serde(rename_all = "camelCase")]
    ReadVolume { member: String, volume: String },
    /// Every volume and partial copy on the node.
    ListVolumes,
    /// A member's logs (stdout, stderr, setup).
    #[serde(rename_all = "camelCase")]
    ReadLogs { member: String },
    #[serde(rename_all = "camelCase")]
    StopMember { member: String },
    #[serde(rename_all = "camelCase")]
    StartMember { member: String },
    /// Stop the member and remove its record and volumes.
    #[serde(rename_all = "camelCase")]
    ForgetMember { member: String },
    /// A master candidate's configuration copy (a master failover's).
    ReadConfiguration,
    /// Follow the master a failover started at `term`.
    AdoptMaster { term: u64 },
}

impl Access {
    pub fn read_volume(member: &str, volume: &str) -> Access {
        Access::ReadVolume { member: member.into(), volume: volume.into() }
    }
}

impl std::fmt::Display for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Access::ReadVolume { member, volume } => write!(f, "read volume {member}/{volume}"),
            Access::ListVolumes => f.write_str("list the volumes"),
            Access::ReadLogs { member } => write!(f, "read the logs of member {member}"),
            Access::StopMember { member } => write!(f, "stop member {member}"),
            Access::StartMember { member } => write!(f, "start member {member}"),
            Access::ForgetMember { member } => write!(f, "forget member {member}"),
            Access::ReadConfiguration => f.write_str("read the configuration copy"),
            Access::AdoptMaster { term } => write!(f, "announce the master of term {term}"),
        }
    }
}

/// What the signature covers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Grant {
    pub holder: Holder,
    /// The node whose agent serves it.
    pub node: String,
    pub access: Access,
    pub expires: Timestamp,
    /// Why it was given (a Command's name and attempt, or the server's
    /// request), for the refusal's Event.
    pub purpose: String,
}

/// Why a request was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no grant was shown")]
    Missing,
    #[error("the grant is not valid: {0}")]
    Invalid(String),
    #[error("the caller showed no certificate of the cluster")]
    Anonymous,
    #[error("the grant is for {holder}, but the caller is {caller}")]
    NotHolder { holder: Holder, caller: Holder },
    #[error("the grant is for node {grant_node}'s agent, not this one ({here})")]
    OtherNode { grant_node: String, here: String },
    #[error("the grant allows to {granted}, not to {asked}")]
    OutOfScope { granted: Access, asked: Access },
    #[error("the grant expired at {expires}")]
    Expired { expires: Timestamp },
}

/// Whether `caller` (as its certificate names it; None: no certificate)
/// may do `asked` on node `here` with `grant` at `now`.
pub fn check(
    grant: &Grant,
    caller: Option<&Holder>,
    here: &str,
    asked: &Access,
    now: Timestamp,
) -> Result<(), Refusal> {
    let Some(caller) = caller else { return Err(Refusal::Anonymous) };
    if *caller != grant.holder {
        return Err(Refusal::NotHolder { holder: grant.holder.clone(), caller: caller.clone() });
    }
    if grant.node != here {
        return Err(Refusal::OtherNode { grant_node: grant.node.clone(), here: here.to_string() });
    }
    if grant.access != *asked {
        return Err(Refusal::OutOfScope { granted: grant.access.clone(), asked: asked.clone() });
    }
    if now.system_time() >= grant.expires.system_time() {
        return Err(Refusal::Expired { expires: grant.expires });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;

    fn at(seconds: u64) -> Timestamp {
        Timestamp::from_system_time(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + seconds))
    }

    fn read(member: &str) -> Access {
        Access::ReadVolume { member: member.into(), volume: "data".into() }
    }

    fn grant() -> Grant {
        Grant {
            holder: Holder::Node("n2".into()),
            node: "n1".into(),
            access: read("m1"),
            expires: at(60),
            purpose: "copy-1 attempt 1".into(),
        }
    }

    #[test]
    fn the_holder_may_do_what_the_grant_names_on_its_node_until_it_expires() {
        let n2 = Holder::Node("n2".into());
        assert_eq!(check(&grant(), Some(&n2), "n1", &read("m1"), at(59)), Ok(()));
        assert_eq!(check(&grant(), Some(&n2), "n1", &read("m1"), at(60)), Err(Refusal::Expired { expires: at(60) }));
    }

    #[test]
    fn another_caller_another_node_or_another_action_is_refused() {
        let n2 = Holder::Node("n2".into());
        let n3 = Holder::Node("n3".into());
        assert!(matches!(check(&grant(), Some(&n3), "n1", &read("m1"), at(0)), Err(Refusal::NotHolder { .. })));
        assert!(matches!(
            check(&grant(), Some(&Holder::Server), "n1", &read("m1"), at(0)),
            Err(Refusal::NotHolder { .. })
        ));
        assert_eq!(check(&grant(), None, "n1", &read("m1"), at(0)), Err(Refusal::Anonymous));
        assert!(matches!(check(&grant(), Some(&n2), "n3", &read("m1"), at(0)), Err(Refusal::OtherNode { .. })));
        for asked in [
            read("m2"),
            Access::ReadVolume { member: "m1".into(), volume: "logs".into() },
            Access::StopMember { member: "m1".into() },
            Access::ListVolumes,
        ] {
            let refused = check(&grant(), Some(&n2), "n1", &asked, at(0));
            assert!(matches!(refused, Err(Refusal::OutOfScope { .. })), "{asked}: {refused:?}");
        }
    }

    #[test]
    fn a_refusal_says_who_what_and_where() {
        let n3 = Holder::Node("n3".into());
        let refused = check(&grant(), Some(&n3), "n1", &read("m1"), at(0)).unwrap_err().to_string();
        assert_eq!(refused, "the grant is for node n2, but the caller is node n3");
        let asked = Access::StopMember { member: "m1".into() };
        let refused = check(&grant(), Some(&Holder::Node("n2".into())), "n1", &asked, at(0)).unwrap_err();
        assert_eq!(refused.to_string(), "the grant allows to read volume m1/data, not to stop member m1");
    }
}
