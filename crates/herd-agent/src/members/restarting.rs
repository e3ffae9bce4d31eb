//! A wanted member started again: after its run ended (watched here, or
//! polled when an earlier agent run started it), and after a start that
//! failed. A start that fails (a disk full for a moment, a cgroup not
//! made) counts as a run that ended at once: the same backoff, the same
//! crash loop in the heartbeat, its last exit saying why; and it is tried
//! again, never left undone while the member is wanted (a member once
//! stayed down for good after a full disk was freed).

use std::time::Duration;

use herd_core::restarts;

use super::{ADOPTED_POLL, MemberError, Members, Running, end_instance, oom_kill_of};
use crate::procs;

impl Members {
    /// Watches a member started by an earlier agent run.
    pub(super) fn watch_adopted(&self, member: String, generation: u64, process: Running) {
        let members = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = members.stop.cancelled() => return,
                    _ = tokio::time::sleep(ADOPTED_POLL) => {}
                }
                if !procs::is_alive(process.pid, process.start_ticks) {
                    break;
                }
            }
            members.exited(&member, generation, "exited (status unknown: adopted)".into()).await;
        });
    }

    /// A run ended: record it, and start the member again (with backoff)
    /// if it is still wanted.
    pub(super) async fn exited(&self, member: &str, generation: u64, exit: String) {
        let oom_kill = self.record(member).and_then(|record| oom_kill_of(&record));
        let exit = match &oom_kill {
            Some(kill) => format!("OOMKilled: {kill} ({exit})"),
            None => exit,
        };
        let (ended, delay) = {
            let mut slots = self.lock();
            let Some(slot) = slots.get_mut(member).filter(|s| s.generation == generation) else { return };
            slot.record.last_exit = Some(exit.clone());
            if oom_kill.is_some() {
                slot.record.oom_kill = oom_kill;
            }
            let ended = slot.record.process.as_ref().map(|p| p.instance_id.clone());
            let ran = slot.record.process.as_ref().map(|p| p.started_at.age(crate::now())).unwrap_or_default();
            let delay = slot.record.wanted.then(|| count_run(&mut slot.record, ran));
            (ended, delay)
        };
        // A fence under way (its demote hook is the instance's too) runs
        // to its end first; a lease that lapsed while the agent was
        // stopped is fenced now.
        self.fence_due().await;
        // Everything that belonged to the instance that ended ends with it:
        // its setup, scripts and checks, and what it left running.
        crate::setup::kill_setup(&self.member_dir(member));
        if let Some(instance) = &ended {
            end_instance(instance);
        }
        let _ = self.persist(member);
        self.tell_changed();
        let Some(delay) = delay else { return };
        tracing::warn!(member, %exit, ?delay, "a member exited; starting it again");
        self.start_again(member, generation, delay).await;
    }

    /// Starts `member` again after `delay`, and again after each start
    /// that fails, for as long as it is wanted and nothing else started or
    /// stopped it (its run is still `generation`). A lost volume is not
    /// tried again: the member's data is gone, and the server replaces it.
    pub(super) async fn start_again(&self, member: &str, generation: u64, mut delay: Duration) {
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
            // A leader whose lease ran out while it was down is demoted
            // before it runs again.
            self.fence_due().await;
            let still_wanted = self.lock().get(member).is_some_and(|s| s.generation == generation && s.record.wanted);
            if !still_wanted {
                return;
            }
            match self.launch(member) {
                Ok(_) => return,
                Err(error @ MemberError::VolumeLost { .. }) => {
                    tracing::error!(member, %error, "could not start a member again; its volume is lost");
                    return;
                }
                Err(error) => {
                    delay = self.start_failed(member, &error);
                    tracing::error!(member, %error, ?delay, "could not start a member again; trying again");
                }
            }
        }
    }

    /// A start of `member` that failed: recorded as a run that ended at
    /// once, saying why; the pause before the next try.
    pub(super) fn start_failed(&self, member: &str, error: &MemberError) -> Duration {
        let delay = {
            let mut slots = self.lock();
            let Some(slot) = slots.get_mut(member) else { return restarts::RESTART_DELAYS.max };
            count_run(&mut slot.record, Duration::ZERO)
        };
        // A disk too full to keep the record: the try goes on regardless,
        // and the heartbeat still tells.
        if self.not_started(member, &error.to_string()).is_err() {
            self.tell_changed();
        }
        delay
    }
}

/// Counts a run of a wanted member that lasted `ran` (a short one makes
/// the next start wait longer); the pause before the next start, also
/// recorded as when it is due.
fn count_run(record: &mut super::MemberRecord, ran: Duration) -> Duration {
    let (short_runs, delay) = restarts::after_exit(record.short_runs, ran);
    record.short_runs = short_runs;
    record.next_start = Some(crate::now().plus(delay));
    delay
}
