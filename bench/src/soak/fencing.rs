//! The fencing invariant, from the store's watch history of the
//! control-plane lease and the Commands: no write by a deposed leader
//! lands. A leader issues a Command in its term (`status.issued.term`, the
//! lease's transitions when it won the lease), and an issue is what makes
//! an agent act. The revision that stores an issue must come while the
//! lease is still in that term: an issue of an older term stored after
//! the lease moved on was written by a leader already deposed.
//!
//! The two histories come from two watches; an issue is judged once the
//! lease's history has reached past its revision (revisions are one total
//! order, and a watch delivers them in it).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use herd_client::{Client, ClientError, Following};
use herd_core::api::{StatusReason, WatchEvent};
use herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME;
use herd_core::kinds::{ClusterConfigSpec, Command, Lease};

use super::report::Seen;

#[derive(Default)]
struct Findings {
    checked: u32,
    violation: Option<Seen>,
}

/// Follows the lease's and the Commands' histories in the background
/// until dropped.
pub struct Watcher {
    seen: Arc<Mutex<Findings>>,
    task: tokio::task::JoinHandle<()>,
}

impl Watcher {
    pub async fn start(admin: &Client, clock: Instant) -> anyhow::Result<Watcher> {
        let config = admin.get::<ClusterConfigSpec>(CLUSTER_CONFIG_NAME).await?;
        let mut history = History::new(config.spec.leader_election.lock_name);
        let mut leases = history.list_leases(admin).await?;
        let mut commands = history.list_commands(admin).await?;
        let seen: Arc<Mutex<Findings>> = Arc::default();
        let (admin, into) = (admin.clone(), seen.clone());
        let task = tokio::spawn(async move {
            loop {
                let verdicts = tokio::select! {
                    event = leases.next() => match event {
                        Ok(event) => history.lease(event),
                        Err(error) => {
                            let listed = match gone(&error) {
                                true => history.list_leases(&admin).await.ok(),
                                false => None,
                            };
                            leases = listed.unwrap_or(leases);
                            Vec::new()
                        }
                    },
                    event = commands.next() => match event {
                        Ok(event) => {
                            history.command(event);
                            Vec::new()
                        }
                        Err(error) => {
                            let listed = match gone(&error) {
                                true => history.list_commands(&admin).await.ok(),
                                false => None,
                            };
                            commands = listed.unwrap_or(commands);
                            Vec::new()
                        }
                    },
                };
                let mut seen = into.lock().unwrap_or_else(|p| p.into_inner());
                for verdict in verdicts {
                    seen.checked += 1;
                    if let Err(what) = verdict {
                        println!("violation: {what}");
                        seen.violation.get_or_insert(Seen { at: clock.elapsed().as_nanos() as u64, what });
                    }
                }
            }
        });
        Ok(Watcher { seen, task })
    }

    /// The first issue stored by a deposed leader, if any.
    pub fn violation(&self) -> Option<Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).violation.clone()
    }

    /// How many issues were judged.
    pub fn checked(&self) -> u32 {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).checked
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Whether a watch lost history (compacted past where it got); any other
/// error is every server down for now, and the watch goes on from where
/// it got.
fn gone(error: &ClientError) -> bool {
    if error.reason() == Some(StatusReason::Gone) {
        println!("the fencing check's watch lost history ({error}); it follows from now on");
        return true;
    }
    false
}

/// An issue stored, not yet judged.
#[derive(Debug)]
struct Issued {
    revision: u64,
    term: u64,
    command: String,
}

struct History {
    lock_name: String,
    /// The lease's term from each revision that changed it on.
    terms: BTreeMap<u64, u64>,
    /// The lease's history is whole after this revision (its listing).
    known_after: u64,
    /// The newest revision of the lease seen.
    lease_reached: u64,
    /// Each Command's last issue (term, attempt).
    issues: HashMap<String, (u64, u32)>,
    waiting: Vec<Issued>,
}

impl History {
    fn new(lock_name: String) -> History {
        History {
            lock_name,
            terms: BTreeMap::new(),
            known_after: 0,
            lease_reached: 0,
            issues: HashMap::new(),
            waiting: Vec::new(),
        }
    }

    /// Lists the lease and follows it from there: its history is whole
    /// from the listing on (issues stored before are not judged).
    async fn list_leases(&mut self, admin: &Client) -> anyhow::Result<Following> {
        let listed = admin.list_values("leases", "").await?;
        let revision: u64 = listed.metadata.resource_version.parse()?;
        self.terms.clear();
        self.waiting.retain(|issued| issued.revision > revision);
        (self.known_after, self.lease_reached) = (revision, revision);
        for object in listed.items {
            if let Ok(lease) = Lease::from_json_value(object) {
                self.note_lease(&lease, revision);
            }
        }
        Ok(admin.follow("leases", &listed.metadata.resource_version, ""))
    }

    /// Lists the Commands and follows them from there: what they were
    /// issued by then is not judged.
    async fn list_commands(&mut self, admin: &Client) -> anyhow::Result<Following> {
        let listed = admin.list_values("commands", "").await?;
        self.issues.clear();
        for object in listed.items {
            if let Ok(command) = Command::from_json_value(object)
                && let Some(issue) = &command.status.issued
            {
                self.issues.insert(command.metadata.name, (issue.term, issue.attempt));
            }
        }
        Ok(admin.follow("commands", &listed.metadata.resource_version, ""))
    }

    fn note_lease(&mut self, lease: &Lease, revision: u64) {
        if lease.metadata.name != self.lock_name {
            return;
        }
        let term = lease.spec.lease_transitions;
        if self.terms.last_key_value().map(|(_, t)| *t) != Some(term) {
            self.terms.insert(revision, term);
        }
    }

    /// Takes in one revision of a lease; judges the issues it has now
    /// passed.
    fn lease(&mut self, event: WatchEvent<serde_json::Value>) -> Vec<Result<(), String>> {
        let Ok(lease) = Lease::from_json_value(event.object) else { return Vec::new() };
        let Ok(Some(revision)) = lease.metadata.revision() else { return Vec::new() };
        self.note_lease(&lease, revision);
        self.lease_reached = self.lease_reached.max(revision);
        let reached = self.lease_reached;
        let (ready, later): (Vec<Issued>, Vec<Issued>) =
            std::mem::take(&mut self.waiting).into_iter().partition(|issued| issued.revision < reached);
        self.waiting = later;
        ready.into_iter().map(|issued| self.judge(&issued)).collect()
    }

    /// Takes in one revision of a Command: a new issue waits to be judged.
    fn command(&mut self, event: WatchEvent<serde_json::Value>) {
        let Ok(command) = Command::from_json_value(event.object) else { return };
        let Ok(Some(revision)) = command.metadata.revision() else { return };
        let Some(issue) = &command.status.issued else { return };
        let now = (issue.term, issue.attempt);
        if self.issues.insert(command.metadata.name.clone(), now) == Some(now) {
            return;
        }
        if revision > self.known_after {
            self.waiting.push(Issued { revision, term: issue.term, command: command.metadata.name });
        }
    }

    /// Whether the lease was in the issue's term when it was stored.
    fn judge(&self, issued: &Issued) -> Result<(), String> {
        let Some((_, &term)) = self.terms.range(..issued.revision).next_back() else { return Ok(()) };
        match issued.term == term {
            true => Ok(()),
            false => Err(format!(
                "command {} was issued in term {} at revision {}, when the lease {} was in term {term}: \
                 a write by a leader {}",
                issued.command,
                issued.term,
                issued.revision,
                self.lock_name,
                if issued.term < term { "already deposed" } else { "of a term not begun" }
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use herd_core::kinds::command::Issue;
    use herd_core::kinds::{CommandSpec, LeaseSpec};
    use herd_core::time::Timestamp;

    use super::*;

    fn lease(revision: u64, term: u64) -> WatchEvent<serde_json::Value> {
        let mut lease = Lease::new("herd-leader", LeaseSpec { lease_transitions: term, ..Default::default() });
        lease.metadata.resource_version = Some(revision.to_string());
        WatchEvent { type_: herd_core::api::WatchEventType::Modified, object: serde_json::to_value(lease).unwrap() }
    }

    fn issue(revision: u64, name: &str, term: u64, attempt: u32) -> WatchEvent<serde_json::Value> {
        let mut command = Command::new(name, CommandSpec::default());
        command.status.issued = Some(Issue { term, attempt, at: Timestamp::default(), ..Default::default() });
        command.metadata.resource_version = Some(revision.to_string());
        WatchEvent { type_: herd_core::api::WatchEventType::Modified, object: serde_json::to_value(command).unwrap() }
    }

    fn history() -> History {
        let mut history = History::new("herd-leader".into());
        history.known_after = 10;
        assert!(history.lease(lease(11, 1)).is_empty());
        history
    }

    #[test]
    fn an_issue_in_the_leases_term_holds_once_the_lease_is_past_it() {
        let mut h = history();
        h.command(issue(12, "a", 1, 1));
        // Repeated (an agent's report carries the same issue): not again.
        h.command(issue(13, "a", 1, 1));
        assert_eq!(h.lease(lease(14, 1)), vec![Ok(())]);
        assert!(h.lease(lease(20, 1)).is_empty(), "judged once");
    }

    #[test]
    fn an_issue_of_the_old_term_stored_after_the_lease_moved_on_is_a_violation() {
        let mut h = history();
        assert!(h.lease(lease(15, 2)).is_empty());
        h.command(issue(16, "a", 1, 1));
        let verdicts = h.lease(lease(17, 2));
        assert_eq!(verdicts.len(), 1);
        assert!(verdicts[0].as_ref().is_err_and(|e| e.contains("already deposed")), "{verdicts:?}");
        // The new leader's issue of the same Command holds.
        h.command(issue(18, "a", 2, 2));
        assert_eq!(h.lease(lease(19, 2)), vec![Ok(())]);
    }

    #[test]
    fn an_issue_waits_for_the_leases_history_and_one_from_before_the_listing_is_not_judged() {
        let mut h = history();
        h.command(issue(9, "old", 0, 1));
        h.command(issue(30, "a", 1, 1));
        assert!(h.lease(lease(25, 1)).is_empty(), "the lease's history is not past revision 30 yet");
        assert_eq!(h.lease(lease(31, 1)), vec![Ok(())], "only the issue stored after the listing");
    }
}
