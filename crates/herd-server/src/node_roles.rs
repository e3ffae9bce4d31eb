//! Changing node roles under `herd_core::roles`: an operator's change
//! (`POST /api/v1/nodes/{name}/role`, `herd node modify`) and the leader's
//! promotions that keep the candidate pool full. Both read every node and
//! the members each hosts, decide, and write every node the decision
//! touches in one transaction, each at the revision read: a node that
//! changed meanwhile makes the whole decision be taken again. Each change
//! is a NodeRoleChanged Event on its node.

use std::collections::BTreeMap;

use herd_core::Resource;
use herd_core::backoff::Contention;
use herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME;
use herd_core::kinds::{ClusterConfigSpec, EventReason, EventType, MemberSpec, Node, NodeRole, NodeSpec};
use herd_core::roles::{NodeFacts, NodeUpdate, RoleChange, RoleRefusal, decide, fill_pool};

use crate::error::ApiError;
use crate::events::EventRecorder;
use crate::objects::{Objects, ObjectsError, try_again};

/// Why a role change was not made. Only [`RoleChangeError::Refused`] is
/// an answer about the node; the others decided nothing, and asking again
/// may get one.
#[derive(Debug, thiserror::Error)]
pub enum RoleChangeError {
    /// The roles' rules do not allow it (the reason says which).
    #[error(transparent)]
    Refused(#[from] RoleRefusal),
    /// Nodes changed under every attempt.
    #[error("nodes kept changing meanwhile; node {0} was not changed: try again")]
    Contended(String),
    /// Reading or writing the store failed.
    #[error(transparent)]
    Objects(#[from] ObjectsError),
}

fn role_word(role: NodeRole) -> &'static str {
    match role {
        NodeRole::Candidate => "candidate",
        NodeRole::Regular => "regular",
        NodeRole::Drained => "drained",
        NodeRole::Offline => "offline",
    }
}

/// Every node, what each knows about its role and the members it hosts
/// (placed there, or reported running there by its agent), and the
/// master's node.
async fn read(objects: &Objects) -> Result<(Vec<Node>, Vec<NodeFacts>, Option<String>), ObjectsError> {
    let (nodes, _) = objects.list::<NodeSpec>().await?;
    let (members, _) = objects.list::<MemberSpec>().await?;
    let mut hosted: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for member in &members {
        if let Some(node) = member.spec.node.as_deref() {
            hosted.entry(node).or_default().push(member.metadata.name.clone());
        }
    }
    for node in &nodes {
        let names = hosted.entry(node.metadata.name.as_str()).or_default();
        names.extend(node.status.members.iter().map(|m| m.name.clone()));
        names.sort();
        names.dedup();
    }
    let facts = nodes
        .iter()
        .map(|n| NodeFacts::of(n, hosted.get(n.metadata.name.as_str()).cloned().unwrap_or_default()))
        .collect();
    let master = nodes.iter().find(|n| n.status.master).map(|n| n.metadata.name.clone());
    Ok((nodes, facts, master))
}

/// Writes `updates` together; Ok(false) when a node changed since `nodes`
/// was read.
async fn write(objects: &Objects, nodes: &[Node], updates: &[NodeUpdate]) -> Result<bool, ObjectsError> {
    let mut changed = Vec::new();
    for update in updates {
        let Some(old) = nodes.iter().find(|n| n.metadata.name == update.name) else { continue };
        let mut new = old.clone();
        new.spec.role = update.role;
        new.spec.master_capable = update.master_capable;
        changed.push((old.clone(), new));
    }
    match objects.update_together(changed).await {
        Ok(()) => Ok(true),
        Err(ObjectsError::Conflict { .. }) => Ok(false),
        Err(other) => Err(other),
    }
}

async fn tell(events: &EventRecorder, nodes: &[Node], updates: &[NodeUpdate]) {
    for update in updates {
        let Some(node) = nodes.iter().find(|n| n.metadata.name == update.name) else { continue };
        let mut message = format!("role {} -> {}", role_word(node.spec.role), role_word(update.role));
        if update.master_capable != node.spec.master_capable {
            message = format!("master capable {} -> {}; {message}", node.spec.master_capable, update.master_capable);
        }
        events
            .record(node, EventType::Normal, EventReason::NodeRoleChanged, format!("{message}: {}", update.why))
            .await;
    }
}

/// An operator's change to node `name`: the updates written (none when it
/// changed nothing), or why not.
pub async fn change(
    objects: &Objects,
    events: &EventRecorder,
    pool_size: usize,
    name: &str,
    change: RoleChange,
    auto_promote: bool,
) -> Result<Vec<NodeUpdate>, RoleChangeError> {
    // Nodes that changed between the read and the write: decided again.
    let mut contention = Contention::new(std::time::Instant::now());
    loop {
        let (nodes, facts, master) = read(objects).await?;
        let updates = decide(&facts, master.as_deref(), name, change, pool_size, auto_promote)?;
        if updates.is_empty() || write(objects, &nodes, &updates).await? {
            tell(events, &nodes, &updates).await;
            return Ok(updates);
        }
        if !try_again(&mut contention).await {
            return Err(RoleChangeError::Contended(name.to_string()));
        }
    }
}

/// A Node replaced through the API (`herd apply`) that changes its role
/// or capability meets the same rules (without auto-promotion: it writes
/// one node). Nothing to say when the object is not at the revision
/// stored: the write itself reports the conflict.
pub async fn admit_replace(objects: &Objects, new: &Node) -> Result<(), ApiError> {
    let Some(old) = objects.get::<NodeSpec>(&new.metadata.name).await? else { return Ok(()) };
    if new.metadata.resource_version != old.metadata.resource_version {
        return Ok(());
    }
    let change = match (new.spec.role != old.spec.role, new.spec.master_capable != old.spec.master_capable) {
        (false, false) => return Ok(()),
        (true, false) => RoleChange::Role(new.spec.role),
        (false, true) => RoleChange::MasterCapable(new.spec.master_capable),
        (true, true) => {
            let errors = herd_core::ValidationErrors::single(
                "spec.role",
                "change one of role and masterCapable at a time (Ganeti's rule: each change is checked on its own)",
            );
            return Err(ApiError::invalid(NodeSpec::KIND, &new.metadata.name, errors));
        }
    };
    let pool = objects
        .get::<ClusterConfigSpec>(CLUSTER_CONFIG_NAME)
        .await?
        .map_or(ClusterConfigSpec::default().candidate_pool_size, |c| c.spec.candidate_pool_size);
    let (_, facts, master) = read(objects).await?;
    // Without auto-promotion only this node changes: the write itself does it.
    decide(&facts, master.as_deref(), &new.metadata.name, change, pool as usize, false)
        .map(|_| ())
        .map_err(|refusal| ApiError::Conflict(format!("{refusal}; or use `herd node modify`")))
}

/// The leader's promotions when the pool is short; what was promoted.
pub async fn keep_pool_full(
    objects: &Objects,
    events: &EventRecorder,
    pool_size: usize,
) -> Result<Vec<NodeUpdate>, ObjectsError> {
    let mut contention = Contention::new(std::time::Instant::now());
    loop {
        let (nodes, facts, master) = read(objects).await?;
        let updates = fill_pool(&facts, pool_size, master.as_deref());
        if updates.is_empty() || write(objects, &nodes, &updates).await? {
            tell(events, &nodes, &updates).await;
            return Ok(updates);
        }
        if !try_again(&mut contention).await {
            return Ok(Vec::new());
        }
    }
}
