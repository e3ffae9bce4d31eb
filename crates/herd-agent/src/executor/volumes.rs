//! The volume actions: CopyVolume in a detached worker (journaled with
//! its pid before it is waited for), the wait for a worker that outlived
//! an earlier agent run, and DeleteVolume; and how this agent reaches
//! another node's agent (its endpoint as issued, this node's certificate,
//! the attempt's grants).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use herd_client::PeerClient;
use herd_core::kinds::{AgentState, Answer};
use herd_tls::ServingIdentity;

use super::{Executor, Failure};
use crate::fsutil::write_atomic;
use crate::journal::{Entry, WorkerRef};
use crate::procs;
use crate::worker::CopyJob;

impl Executor {
    /// The agent endpoint of `node` (as the leader issued it) and this
    /// node's certificate to show it.
    pub(super) fn peer(&self, entry: &Entry, node: &str) -> Result<(String, ServingIdentity), Failure> {
        let address = entry
            .peers
            .get(node)
            .cloned()
            .ok_or(format!("node {node} has no agent endpoint on record (has its agent ever reported?)"))?;
        let identity = self
            .workers
            .access
            .identity()
            .ok_or("this node has no certificate yet to show other agents (its next heartbeat asks for one)")?;
        Ok((address, identity))
    }

    /// A client for `node`'s agent with the grants of this attempt.
    pub(super) fn peer_client(&self, entry: &Entry, node: &str) -> Result<PeerClient, Failure> {
        let (address, identity) = self.peer(entry, node)?;
        PeerClient::new(&address, node, &identity, &entry.grants).map_err(|e| format!("talking to {node}: {e}"))
    }

    pub(super) fn worker_file(&self, entry: &Entry, suffix: &str) -> PathBuf {
        self.worker_dir.join(format!("{}-{}.{suffix}", entry.name, entry.attempt))
    }

    /// CopyVolume: in a detached worker, which the journal records before
    /// it is waited for.
    pub(super) async fn copy_volume(
        &self,
        entry: &mut Entry,
        member: &str,
        volume: &str,
        from_node: &str,
    ) -> Result<Answer, Failure> {
        let (member, volume) = (member.to_string(), volume.to_string());
        let (source, identity) = self.peer(entry, from_node)?;
        let result = self.worker_file(entry, "result.json");
        let _ = std::fs::remove_file(&result);
        let job = CopyJob {
            source,
            source_node: from_node.to_string(),
            grants: entry.grants.clone(),
            certificate_chain: identity.chain_pem,
            certificate_key: identity.key_pem,
            staging: self.members.staging_dir(&member, &volume),
            destination: self.members.volume_dir(&member, &volume),
            member,
            volume,
            result: result.clone(),
            bandwidth: self.workers.bandwidth,
            node: self.workers.node.clone(),
            data_dir: self.worker_dir.parent().map(Path::to_path_buf),
            total: Some(self.worker_file(entry, "total.json")),
        };
        let job_path = self.worker_file(entry, "job.json");
        let json = serde_json::to_vec_pretty(&job).map_err(|e| format!("writing the worker's job: {e}"))?;
        write_atomic(&job_path, &json, 0o600).map_err(|e| self.io_failure("writing the worker's job", &e))?;
        let log = std::fs::File::create(self.worker_file(entry, "log"))
            .map_err(|e| self.io_failure("creating the worker log", &e))?;
        let log_err = log.try_clone().map_err(|e| self.io_failure("creating the worker log", &e))?;
        let mut command = tokio::process::Command::new(&self.workers.program);
        command.arg("agent-worker").arg(&job_path).stdin(Stdio::null()).stdout(log).stderr(log_err);
        // Its own group, no link to the agent's life: it outlives a crash.
        command.process_group(0).kill_on_drop(false);
        let mut child = command.spawn().map_err(|e| format!("starting the copy worker: {e}"))?;
        let pid = child.id().unwrap_or_default();
        entry.worker =
            Some(WorkerRef { pid, start_ticks: procs::start_ticks(pid).unwrap_or_default(), result: result.clone() });
        // The worker outlives the agent: its pid must be on disk.
        if let Err(error) = self.advance_journaled(entry, AgentState::ProcessingInBackend, None) {
            let _ = procs::signal_group(pid, libc::SIGKILL);
            return Err(self.journal_failure("journaling the copy worker", &error));
        }
        let start_ticks = procs::start_ticks(pid).unwrap_or_default();
        self.set_hook(
            entry,
            Some(Arc::new(move || {
                let _ = procs::signal_run(pid, start_ticks, libc::SIGKILL);
            })),
        );
        let status = child.wait().await.map_err(|e| format!("waiting for the copy worker: {e}"))?;
        // A worker of an earlier attempt that was killed may have left its lock.
        crate::worker::remove_stale_locks(&self.members.incoming_dir());
        crate::worker::read_result(&result).ok_or_else(|| format!("the copy worker ended ({status}) without a result"))
    }

    /// Waits for a worker left running by an earlier agent run.
    pub(super) async fn reattach(&self, mut entry: Entry) {
        let Some(worker) = entry.worker.clone() else { return };
        if !self.advance(&mut entry, AgentState::ProcessingInBackend, None) {
            return;
        }
        let (pid, start_ticks) = (worker.pid, worker.start_ticks);
        self.set_hook(
            &entry,
            Some(Arc::new(move || {
                let _ = procs::signal_run(pid, start_ticks, libc::SIGKILL);
            })),
        );
        tracing::info!(command = %entry.name, pid = worker.pid, "re-attached to a running worker");
        while procs::is_alive(worker.pid, worker.start_ticks) {
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
        self.set_hook(&entry, None);
        let cancelled = self.take_cancel(&entry);
        let (state, answer) = match (crate::worker::read_result(&worker.result), cancelled) {
            (Some(result), _) if result.success => (AgentState::Completed, result),
            (Some(result), None) => (AgentState::Failed, result),
            (Some(mut result), Some(why)) => {
                result.message = format!("cancelled ({why}); {}", result.message);
                (AgentState::Interrupted, result)
            }
            (None, Some(why)) => {
                (AgentState::Interrupted, Answer::said(false, format!("cancelled ({why}); its worker was ended")))
            }
            (None, None) => (AgentState::Interrupted, Answer::said(false, "the worker ended without a result")),
        };
        if state == AgentState::Interrupted {
            // Not a move the journal makes by itself: written as found
            // (and reported even when the disk cannot take it).
            entry.state = state;
            entry.answer = Some(answer);
            entry.updated = crate::now();
            if let Err(error) = self.journal.write(&entry) {
                tracing::error!(%error, "journal");
            }
            self.lock().insert((entry.name.clone(), entry.attempt), entry);
            self.changed.notify_one();
            return;
        }
        self.advance(&mut entry, state, Some(answer));
    }

    /// DeleteVolume: the volume and any partial copy of it (no Command
    /// holds either: the server's admission refused this one otherwise).
    pub(super) fn delete_volume(&self, entry: &Entry, member: &str, volume: &str) -> Result<Answer, Failure> {
        if self.members.is_running(member) {
            return Err(format!("member {member} is running: stop it before deleting its volume {volume}"));
        }
        let dir = self.members.volume_dir(member, volume);
        let staging = self.members.staging_dir(member, volume);
        if !dir.is_dir() && !staging.is_dir() {
            // An earlier, interrupted attempt may have deleted it.
            return match entry.attempt {
                1 => Err(format!("volume {member}/{volume} does not exist on this node, nor a partial copy of it")),
                _ => Ok(Answer::said(true, format!("volume {member}/{volume} is gone"))),
            };
        }
        let mut removed = Vec::new();
        if dir.is_dir() {
            let bytes = crate::volumes::staged_bytes(&dir).unwrap_or(0);
            std::fs::remove_dir_all(&dir).map_err(|e| format!("deleting {}: {e}", dir.display()))?;
            // Deleted on purpose, not lost: a later start makes it afresh.
            self.members.forget_volume_mark(member, volume).map_err(|e| format!("deleting its mark: {e}"))?;
            removed.push(format!("volume {member}/{volume} ({})", herd_core::units::human_bytes(bytes)));
        }
        if staging.is_dir() {
            let bytes =
                crate::worker::remove_staging(&staging).map_err(|e| format!("deleting {}: {e}", staging.display()))?;
            removed.push(format!("the partial copy of {member}/{volume} ({})", herd_core::units::human_bytes(bytes)));
        }
        Ok(Answer::said(true, format!("deleted {}", removed.join(" and "))))
    }
}
