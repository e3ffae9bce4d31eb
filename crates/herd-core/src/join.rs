//! Who may join under a node name. A name that has joined is taken: the
//! agent that holds it comes back with its own node token (kept in its
//! data dir), and a join for that name is refused (409) unless it is the
//! same agent run retrying its join, until an admin deletes the node. So
//! a join token cannot take a live node's identity, its address or its
//! Commands. Pure.

use crate::kinds::Node;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JoinVerdict {
    /// A new node.
    Register,
    /// The agent run that joined it, retrying (its answer was lost).
    Retry,
    /// The name is taken; why, and what to do.
    Refuse(String),
}

/// The verdict on a join for `name` by the agent run `boot_id`.
pub fn join_verdict(name: &str, existing: Option<&Node>, boot_id: &str) -> JoinVerdict {
    let Some(node) = existing else { return JoinVerdict::Register };
    if node.status.agent_boot_id.as_deref() == Some(boot_id) {
        return JoinVerdict::Retry;
    }
    let state = if node.status.ready { "Ready" } else { "NotReady" };
    JoinVerdict::Refuse(format!(
        "node {name} has joined already ({state}): its agent comes back with the node token kept in its data dir, \
         not with a join token; to put another (or a reinstalled) host under this name, delete the node first \
         (`herd delete node {name}`)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::NodeSpec;

    #[test]
    fn rule_a_new_name_registers_the_same_run_retries_anyone_else_is_refused() {
        assert_eq!(join_verdict("n3", None, "b1"), JoinVerdict::Register);
        let mut node = Node::new("n3", NodeSpec::default());
        node.status.agent_boot_id = Some("b1".into());
        node.status.ready = true;
        assert_eq!(join_verdict("n3", Some(&node), "b1"), JoinVerdict::Retry);
        let JoinVerdict::Refuse(why) = join_verdict("n3", Some(&node), "b2") else { panic!() };
        assert!(why.starts_with("node n3 has joined already (Ready)") && why.contains("herd delete node n3"), "{why}");
    }
}
