//! Who may do what. Admins may do everything; a node identity may do what
//! each kind's descriptor grants nodes (`Access::node`: its own Node read,
//! its status and heartbeat written, its Commands read, the Kubernetes
//! NodeRestriction idea; the ClusterConfig read); a viewer may read what
//! the descriptors let it (every kind) and no token, and change nothing
//! (the dashboard). Everything else is refused with a reason.

use crate::descriptor::NodeAccess;

/// The identity behind a request's bearer token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    Admin,
    Node(String),
    /// A viewer token's holder.
    Viewer,
}

impl std::fmt::Display for Principal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Principal::Admin => f.write_str("admin"),
            Principal::Node(name) => write!(f, "node {name}"),
            Principal::Viewer => f.write_str("viewer"),
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
        Principal::Viewer => return authorize_viewer(verb, target),
        Principal::Node(node) => node,
    };
    let granted = crate::kinds::by_plural(target.plural).map_or(NodeAccess::None, |d| d.access.node);
    let own = target.name == Some(node.as_str());
    let allowed = match (granted, verb) {
        (NodeAccess::Own, Verb::Get | Verb::UpdateStatus | Verb::Heartbeat | Verb::ReadCommands) => own,
        (NodeAccess::Get, Verb::Get) => true,
        _ => false,
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

/// Token plurals: a viewer sees no token, not even a join token's record.
const TOKEN_PLURALS: [&str; 1] = ["jointokens"];

fn authorize_viewer(verb: Verb, target: Target<'_>) -> Result<(), Denied> {
    let reads = matches!(verb, Verb::Get | Verb::List | Verb::Watch);
    let readable = crate::kinds::by_plural(target.plural)
        .map_or(!TOKEN_PLURALS.contains(&target.plural), |d| d.access.viewer_reads);
    if reads && readable {
        return Ok(());
    }
    Err(Denied(format!(
        "a viewer may not {verb:?} {}: a viewer token reads everything but tokens and changes nothing (ask an admin)",
        target.plural
    )))
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

    #[test]
    fn a_viewer_reads_everything_but_tokens_and_writes_nothing() {
        let members = Target { plural: "members", name: None };
        for verb in [Verb::Get, Verb::List, Verb::Watch] {
            assert!(authorize(&Principal::Viewer, verb, members).is_ok(), "{verb:?}");
            let tokens = Target { plural: "jointokens", name: None };
            assert!(authorize(&Principal::Viewer, verb, tokens).is_err(), "{verb:?} tokens");
        }
        for verb in [Verb::Create, Verb::Update, Verb::UpdateStatus, Verb::Delete, Verb::Heartbeat, Verb::ReadCommands]
        {
            let denied = authorize(&Principal::Viewer, verb, members).unwrap_err();
            assert!(denied.0.starts_with("a viewer may not"), "{denied}");
        }
    }
}
