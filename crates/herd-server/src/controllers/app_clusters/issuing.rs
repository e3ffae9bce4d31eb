//! Writing a pass's member statuses and issuing its Commands, each batch
//! at once: the store commits writes made side by side in one
//! transaction, so a pass waits for one commit, not one per member. A
//! status that records Commands' outcomes deletes them in its own
//! transaction: an outcome is never lost before it is recorded, nor
//! left behind after.

use futures_util::future::join_all;
use herd_core::Resource;
use herd_core::kinds::{Action, CommandSpec, Purpose};
use herd_store::Op;

use super::commands::command_for;
use super::{AppClusterController, Pass};
use crate::objects::{ObjectsError, Part, object_key};

/// A Command the pass gives member `member` (an index into its members).
pub(super) struct Issue {
    pub member: usize,
    pub purpose: Purpose,
    pub action: Action,
}

impl AppClusterController {
    /// Writes the statuses this pass changed of the members `which`; a
    /// member whose copy proved stale is marked unwritten (and left to the
    /// next pass).
    pub(super) async fn write_statuses(
        &self,
        pass: &mut Pass<'_>,
        which: impl IntoIterator<Item = usize>,
    ) -> Result<(), ObjectsError> {
        let due: Vec<usize> = which
            .into_iter()
            .filter(|&i| {
                let member = &pass.members[i];
                let name = &member.metadata.name;
                !pass.unwritten.contains(name)
                    && pass.stored.get(name) != Some(&member.status)
                    && member.metadata.resource_version.is_some()
            })
            .collect();
        // The Commands whose outcomes a status records go with it.
        let done_with = |name: &str| -> Vec<Op> {
            let commands = pass.outcomes.get(name).into_iter().flatten();
            commands.map(|c| Op::Delete { key: object_key(CommandSpec::PLURAL, &c.metadata.name) }).collect()
        };
        let writes = due.iter().map(|&i| {
            let member = &pass.members[i];
            self.objects.write_over(member, member.clone(), Part::Status, done_with(&member.metadata.name))
        });
        let outcomes = join_all(writes).await;
        let mut failed = None;
        for (i, outcome) in due.into_iter().zip(outcomes) {
            let name = pass.members[i].metadata.name.clone();
            match outcome {
                Ok(written) => {
                    pass.members[i].metadata.resource_version = written.metadata.resource_version;
                    pass.outcomes.remove(&name);
                    pass.stored.insert(name, written.status);
                }
                Err(ObjectsError::Conflict { .. }) => {
                    pass.unwritten.insert(name);
                }
                Err(error) => {
                    failed.get_or_insert(error);
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Issues `issues` (created issued: their nodes are Ready). The status
    /// each Command is decided from is stored first: its outcome is read
    /// against that status, and a stale copy issues nothing.
    pub(super) async fn issue_all(&self, pass: &mut Pass<'_>, issues: Vec<Issue>) -> Result<(), ObjectsError> {
        self.write_statuses(pass, issues.iter().map(|issue| issue.member)).await?;
        // A NotReady node takes no Command; it is given its members' once back.
        let node_ready = |name: &String| pass.nodes.get(name).is_some_and(|n| n.status.ready);
        let mut commands = Vec::new();
        for Issue { member, purpose, action } in issues {
            let member = &pass.members[member];
            if pass.unwritten.contains(&member.metadata.name) || !member.spec.node.as_ref().is_some_and(node_ready) {
                continue;
            }
            if let Some(command) = command_for(&pass.cluster.metadata.name, member, purpose, action) {
                commands.push((member.metadata.name.clone(), command));
            }
        }
        let creations = commands.into_iter().map(|(member, command)| async move {
            (member, crate::commands::create_issued(&self.objects, &self.issuer, command).await)
        });
        let mut failed = None;
        for (member, outcome) in join_all(creations).await {
            match outcome {
                Ok(_) => {
                    pass.busy.insert(member);
                }
                // Held by a Command the caches had not shown yet: next pass.
                Err(ObjectsError::Held(why)) => {
                    tracing::info!(%member, %why, "member busy");
                    pass.busy.insert(member);
                }
                Err(error) => {
                    failed.get_or_insert(error);
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }
}
