//! Members that lead their role: the leases heartbeats renew, the term
//! file the app reads, and the fence. A leader's lease holds, on this
//! agent's monotonic clock, until its renew deadline after the heartbeat
//! that renewed it was sent; one not renewed by then is fenced: its
//! demote hook runs, then its processes end (the agent starts it again,
//! a follower). The herd leader grants the next term only once the lease
//! has gone unrenewed for its whole duration, on its own clock, so the
//! fence comes first (`herd_core::role_leader`).
//!
//! The term file, `leader.json` in the member's herd volume, says the
//! term the member last led in and whether it leads now; it is written
//! atomically when a term begins and when the member is fenced.

use std::collections::HashMap;
use std::time::Duration;

use herd_core::api::LeaseRenewal;
use serde::Serialize;
use tokio::time::Instant;

use super::Members;
use crate::fsutil::write_atomic;

/// How often leases are looked at for their deadline.
pub const FENCE_LOOK: Duration = Duration::from_millis(100);

/// A member's lease as this agent holds it.
#[derive(Clone, Debug)]
pub struct Lead {
    pub term: u64,
    /// Until when it leads, unless renewed again.
    pub deadline: Instant,
}

/// What `leader.json` says.
#[derive(Serialize)]
struct TermFile {
    term: u64,
    leading: bool,
}

impl Members {
    /// The leases a heartbeat sent at `sent` renewed: each holds until its
    /// renew deadline after `sent`. A new term is written to the
    /// member's term file.
    pub fn leases_renewed(&self, sent: Instant, renewals: &[LeaseRenewal]) {
        for renewal in renewals {
            let deadline = sent + renewal.renew_deadline.get();
            let began = {
                let mut leads = self.leads();
                let lead = leads.entry(renewal.member.clone()).or_insert(Lead { term: 0, deadline });
                let began = lead.term != renewal.term;
                *lead = Lead { term: renewal.term, deadline: deadline.max(lead.deadline) };
                began
            };
            if began {
                tracing::info!(member = %renewal.member, term = renewal.term, "leads its role");
                self.write_term(&renewal.member, renewal.term, true);
            }
        }
    }

    /// Fences every leader whose lease was not renewed in time: demote
    /// hook, then its processes end.
    pub async fn fence_due(&self) {
        let now = Instant::now();
        let due: Vec<(String, Lead)> = {
            let mut leads = self.leads();
            let due: Vec<(String, Lead)> =
                leads.iter().filter(|(_, l)| l.deadline <= now).map(|(m, l)| (m.clone(), l.clone())).collect();
            for (member, _) in &due {
                leads.remove(member);
            }
            due
        };
        for (member, lead) in due {
            tracing::warn!(member, term = lead.term, "its leader lease was not renewed in time: fencing it");
            self.write_term(&member, lead.term, false);
            let Some(record) = self.record(&member) else { continue };
            if let Some(demote) = &record.run.demote {
                self.hook(&record, demote, "demote", &[("HERD_LEADER_TERM", lead.term.to_string())]).await;
            }
            if let Some(process) = &record.process
                && let Err(error) = crate::procs::signal_group(process.pid, libc::SIGKILL)
            {
                tracing::error!(member, %error, "could not end a fenced leader's processes");
            }
        }
    }

    /// The lease `member` holds now, if any.
    pub fn lead(&self, member: &str) -> Option<Lead> {
        self.leads().get(member).cloned()
    }

    fn leads(&self) -> std::sync::MutexGuard<'_, HashMap<String, Lead>> {
        self.leads.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write_term(&self, member: &str, term: u64, leading: bool) {
        let Some(record) = self.record(member) else { return };
        let Some(dir) = crate::setup::herd_volume(self, &record) else { return };
        let text = serde_json::to_vec(&TermFile { term, leading }).unwrap_or_default();
        if let Err(error) =
            std::fs::create_dir_all(&dir).and_then(|()| write_atomic(&dir.join("leader.json"), &text, 0o644))
        {
            tracing::error!(member, %error, "could not write the term file");
        }
    }
}

/// Fences leaders whose leases ran out, until the agent stops.
pub async fn run(members: Members, stop: tokio_util::sync::CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(FENCE_LOOK) => members.fence_due().await,
        }
    }
}
