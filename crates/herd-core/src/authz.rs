//! Who may do what. Admins may do everything; a node identity may read its
//! own Node and the ClusterConfig, and write only its own Node's status and
//! heartbeat (the Kubernetes NodeRestriction idea). Everything else is
//! refused with a reason.

/// The identity behind a request's bearer token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    Admin,
    Node(String),
}

impl std::fmt::Display for Principal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Principal::Admin => f.write_str("admin"),
            Principal::Node(name) => write!(f, "node {name}"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    UpdateStatus,
    Delete,
    Heartbeat,
    /// List or watch the Commands for a node.
    ReadCommands,
}

/// What a request touches: a collection (`name` None) or one object.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    pub plural: &'a str,
    pub name: Option<&'a str>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Denied(pub String);

pub fn authorize(principal: &Principal, verb: Verb, target: Target<'_>) -> Result<(), Denied> {
    let node = match principal {
        Principal::Admin => return Ok(()),
        Principal::Node(node) => node,
    };
    let own_node = target.plural == "nodes" && target.name == Some(node.as_str());
    let allowed = match verb {
        Verb::Get => own_node || target.plural == "clusterconfigs",
        Verb::UpdateStatus | Verb::Heartbeat | Verb::ReadCommands => own_node,
        Verb::List | Verb::Watch | Verb::Create | Verb::Update | Verb::Delete => false,
    };
    if allowed {
        Ok(())
    } else {
        let what = match target.name {
            Some(name) => format!("{} {name}", target.plural),
            None => target.plural.to_string(),
        };
        Err(Denied(format!(
            "node {node} may not {verb:?} {what}: a node may read its own Node and Commands and write only its own Node's status"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str) -> Principal {
        Principal::Node(name.into())
    }

    #[test]
    fn node_restriction() {
        let own = Target { plural: "nodes", name: Some("a") };
        let other = Target { plural: "nodes", name: Some("b") };
        assert!(authorize(&node("a"), Verb::UpdateStatus, own).is_ok());
        assert!(authorize(&node("a"), Verb::Heartbeat, own).is_ok());
        assert!(authorize(&node("a"), Verb::ReadCommands, own).is_ok());
        assert!(authorize(&node("a"), Verb::ReadCommands, other).is_err(), "only its own Commands");
        assert!(authorize(&node("a"), Verb::Get, own).is_ok());
        let denied = authorize(&node("a"), Verb::UpdateStatus, other).unwrap_err();
        assert!(denied.0.contains("node a may not UpdateStatus nodes b"), "{denied}");
        assert!(authorize(&node("a"), Verb::Update, own).is_err(), "spec belongs to the operator");
        assert!(authorize(&node("a"), Verb::List, Target { plural: "nodes", name: None }).is_err());
        assert!(authorize(&node("a"), Verb::Get, Target { plural: "clusterconfigs", name: Some("cluster") }).is_ok());
        assert!(authorize(&Principal::Admin, Verb::Delete, other).is_ok());
    }
}
