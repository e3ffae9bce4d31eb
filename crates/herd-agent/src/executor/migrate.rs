//! MigrateMember, carried out by the agent of the node the member moves
//! to: stop the member on the source, copy its persistent volumes here
//! (each in a detached worker, verified), start it here, check it runs
//! with volumes that match the source's, and only then have the source
//! forget its copy. Every step can be done again: an interrupted
//! migration is issued again and picks up where the last one got.

use std::collections::BTreeMap;

use herd_client::PeerClient;
use herd_core::kinds::Answer;
use herd_core::kinds::command::MemberRun;

use super::{Executor, Failure};
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
        let (address, token) = self.peer(entry, from_node)?;
        let source = PeerClient::new(&address, &token);

        source.stop_member(member).await.map_err(|e| format!("stopping {member} on {from_node}: {e}"))?;
        let mut details = BTreeMap::new();
        for volume in run.volumes.iter().filter(|v| v.persistent) {
            let here = self.members.volume_dir(member, &volume.name);
            let there = source.manifest(member, &volume.name).await.map_err(|e| format!("asking {from_node}: {e}"))?;
            match there {
                // Already moved by an earlier attempt: the source forgot it.
                None if here.is_dir() => {}
                None => return Err(format!("volume {member}/{} is on neither {from_node} nor here", volume.name)),
                Some(_) => {
                    let copied = self.copy_volume(entry, member, &volume.name, from_node).await?;
                    if !copied.success {
                        return Err(copied.message);
                    }
                }
            }
            let manifest = volumes::manifest(&here).map_err(|e| format!("reading {}: {e}", here.display()))?;
            details.insert(format!("checksum.{}", volume.name), manifest.checksum);
        }
        let instance = self.members.start(member, run.clone()).await.map_err(|e| e.to_string())?;
        details.insert("instanceId".into(), instance.clone());
        // Verified here (copies checked against the source, the member
        // started): now the source may forget its copy.
        source.forget_member(member).await.map_err(|e| format!("removing {member} from {from_node}: {e}"))?;
        let message = format!("member {member} moved from {from_node}: runs here as instance {instance}");
        Ok(Answer { success: true, message, details })
    }
}
