//! MigrateMember, carried out by the agent of the node the member moves
//! to: stop the member on the source, copy its persistent volumes here
//! (each in a detached worker, verified), start it here, check it runs
//! with volumes that match the source's, and only then have the source
//! forget its copy. Every step can be done again: an interrupted
//! migration is issued again and picks up where the last one got.

use std::collections::BTreeMap;

use herd_client::PeerClient;
use herd_core::kinds::command::MemberRun;
use herd_core::kinds::{AgentState, Answer, AnswerDetails};

use super::{Executor, Failure};

/// How far a failed migration got.
enum Moved {
    /// The member did not start here: it belongs on the source still.
    NotYet(Failure),
    /// It runs here; only the source's copy is left to remove.
    Started(Failure),
}
use crate::journal::Entry;
use crate::volumes;

impl Executor {
    pub(super) async fn migrate(
        &self,
        entry: &mut Entry,
        member: &str,
        from_node: &str,
        run: &MemberRun,
    ) -> Result<Answer, Failure> {
        let source = self.peer_client(entry, from_node)?;

        source.stop_member(member).await.map_err(|e| format!("stopping {member} on {from_node}: {e}"))?;
        match self.move_here(entry, &source, member, from_node, run).await {
            Ok(answer) => Ok(answer),
            Err(Moved::NotYet(failure)) => Err(self.back_to_source(entry, &source, member, from_node, failure).await),
            Err(Moved::Started(failure)) => Err(failure),
        }
    }

    /// The migration failed before the member started here: start it again
    /// on the source, where its volumes still are, and say where it runs.
    async fn back_to_source(
        &self,
        entry: &Entry,
        source: &PeerClient,
        member: &str,
        from_node: &str,
        failure: Failure,
    ) -> Failure {
        match source.start_member(member).await {
            Ok(instance) => format!(
                "{failure}; member {member} was started again on {from_node} (instance {instance}), where its volumes are"
            ),
            Err(error) => format!(
                "{failure}; member {member} is stopped on {from_node} and runs nowhere: starting it again there failed ({error}); \
                 once {from_node} answers, `herd command retry {}` migrates it again",
                entry.name
            ),
        }
    }

    /// Copies the persistent volumes, starts the member here, then has the
    /// source forget it. Which side of the start a failure came on decides
    /// what is undone.
    async fn move_here(
        &self,
        entry: &mut Entry,
        source: &PeerClient,
        member: &str,
        from_node: &str,
        run: &MemberRun,
    ) -> Result<Answer, Moved> {
        let mut checksums = BTreeMap::new();
        for volume in run.persistent_volumes() {
            let here = self.members.volume_dir(member, volume);
            let there =
                source.manifest(member, volume).await.map_err(|e| Moved::NotYet(format!("asking {from_node}: {e}")))?;
            match there {
                // Already moved by an earlier attempt: the source forgot it.
                None if here.is_dir() => {}
                None => {
                    let lost = format!("volume {member}/{volume} is on neither {from_node} nor here");
                    return Err(Moved::NotYet(lost));
                }
                Some(_) => {
                    let copied = self.copy_volume(entry, member, volume, from_node).await.map_err(Moved::NotYet)?;
                    if !copied.success {
                        return Err(Moved::NotYet(copied.message));
                    }
                    // Its worker is done: the migration goes on here (the
                    // next volume's worker is journaled afresh).
                    entry.worker = None;
                    if !self.advance(entry, AgentState::Processing, None) {
                        return Err(Moved::NotYet(format!("journaling the copy of {member}/{volume}")));
                    }
                }
            }
            let manifest =
                volumes::manifest(&here).map_err(|e| Moved::NotYet(format!("reading {}: {e}", here.display())))?;
            checksums.insert(volume.to_string(), manifest.checksum);
        }
        let instance = self.members.start(member, run.clone()).await.map_err(|e| Moved::NotYet(e.to_string()))?;
        // Verified here (copies checked against the source, the member
        // started): now the source may forget its copy. A failure now
        // leaves the member running here; a retry finishes the move.
        source.forget_member(member).await.map_err(|e| {
            Moved::Started(format!(
                "member {member} runs here (instance {instance}), but removing it from {from_node} failed: {e}; \
                 `herd command retry {}` finishes the move",
                entry.name
            ))
        })?;
        let message = format!("member {member} moved from {from_node}: runs here as instance {instance}");
        let details = AnswerDetails::Started { instance_id: instance, checksums };
        Ok(Answer { success: true, message, details })
    }
}
