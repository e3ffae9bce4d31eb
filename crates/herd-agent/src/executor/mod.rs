//! Carrying out Commands: each accepted attempt is journaled before any
//! work starts, moved through its states as the work goes, bounded by its
//! timeout, and reported with every heartbeat until the server
//! acknowledges its final state (only then is its journal file removed).
//!
//! An agent refuses a Command issued in a term older than the newest it
//! has seen (a deposed leader's), answering so instead of acting.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use herd_core::Timestamp;
use herd_core::api::{CommandAck, CommandReport};
use herd_core::journal::{Backend, WorkEnd, backend_for, ending, recover};
use herd_core::kinds::command::AbandonRequest;
use herd_core::kinds::{Action, AgentState, Answer, AnswerDetails, Command, ManagementState};
use herd_core::role_leader::Position;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::fsutil::write_atomic;
use crate::journal::{Entry, Journal, JournalError};
use crate::members::{MemberRecord, Members};
use crate::peer_access::PeerAccess;
use crate::{procs, script, setup};

mod abandon;
mod migrate;
mod volumes;

/// Why an action did not succeed, as the answer will say.
pub type Failure = String;

/// Cancels one running attempt; must be harmless when it already ended
/// and when run twice.
pub type DisconnectHook = Arc<dyn Fn() + Send + Sync>;

/// How detached workers are started.
#[derive(Clone)]
pub struct Workers {
    /// `<program> agent-worker <job>`: the herd binary.
    pub program: PathBuf,
    /// This node's certificate, shown to peer agents (and handed to copy
    /// workers for that).
    pub access: PeerAccess,
    /// A copy's bandwidth limit in bytes per second (None: none).
    pub bandwidth: Option<u64>,
    /// This node's name, for the workers' messages.
    pub node: String,
}

/// Why an attempt's work was ended before it finished.
#[derive(Clone, Debug)]
struct Cancel {
    why: String,
    /// The operator abandoned it: the answer says ABANDONED's story, and
    /// a copy's partial staging goes unless the operator kept it.
    abandoned: Option<AbandonRequest>,
}

/// How long one disconnect hook may take.
const HOOK_BOUND: Duration = Duration::from_secs(10);

pub struct Executor {
    journal: Journal,
    members: Members,
    workers: Workers,
    /// Jobs, results and logs of workers: `<data>/workers/`.
    worker_dir: PathBuf,
    term_file: PathBuf,
    /// The journal, in memory: (command, attempt) to entry.
    entries: Mutex<BTreeMap<(String, u32), Entry>>,
    newest_term: Mutex<u64>,
    /// Fires when an entry changed: the heartbeat reports it at once.
    changed: Notify,
    /// What to do for each running attempt if the agent loses the server
    /// or shuts down.
    hooks: Mutex<BTreeMap<(String, u32), DisconnectHook>>,
    /// Attempts a disconnect hook or the operator cancelled, and why.
    cancelled: Mutex<BTreeMap<(String, u32), Cancel>>,
    stop: CancellationToken,
}

impl Executor {
    /// Opens the journal and recovers what a previous run left unfinished.
    pub fn open(
        data_dir: &Path,
        members: Members,
        workers: Workers,
        stop: CancellationToken,
    ) -> Result<Arc<Executor>, JournalError> {
        let journal = Journal::open(data_dir)?;
        let worker_dir = data_dir.join("workers");
        std::fs::create_dir_all(&worker_dir).map_err(|source| JournalError::Io { path: worker_dir.clone(), source })?;
        let term_file = data_dir.join("term");
        let newest_term = std::fs::read_to_string(&term_file).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0);
        let mut entries = BTreeMap::new();
        for mut entry in journal.load()? {
            let backend = match &entry.worker {
                Some(worker) if procs::is_alive(worker.pid, worker.start_ticks) => Backend::Alive,
                Some(worker) => match crate::worker::read_result(&worker.result) {
                    Some(result) => Backend::Finished { success: result.success },
                    None => Backend::Gone,
                },
                None => Backend::Gone,
            };
            let backend = backend_for(&entry.spec.action, backend);
            let recovered = recover(entry.state, backend);
            if recovered != entry.state {
                tracing::warn!(command = %entry.name, attempt = entry.attempt, from = ?entry.state, to = ?recovered, "recovered an unfinished command");
                entry.state = recovered;
                entry.updated = crate::now();
                if let (Backend::Finished { .. }, Some(worker)) = (backend, &entry.worker) {
                    entry.answer = crate::worker::read_result(&worker.result);
                } else if recovered == AgentState::Interrupted {
                    entry.answer = Some(Answer::said(false, "interrupted: the agent stopped while it ran"));
                }
                journal.write(&entry)?;
            }
            entries.insert((entry.name.clone(), entry.attempt), entry);
        }
        let executor = Arc::new(Executor {
            journal,
            members,
            workers,
            worker_dir,
            term_file,
            entries: Mutex::new(entries),
            newest_term: Mutex::new(newest_term),
            changed: Notify::new(),
            hooks: Mutex::default(),
            cancelled: Mutex::default(),
            stop,
        });
        let dangling: Vec<Entry> =
            executor.lock().values().filter(|e| e.state == AgentState::DangledInBackend).cloned().collect();
        for entry in dangling {
            let executor = executor.clone();
            tokio::spawn(async move { executor.reattach(entry).await });
        }
        Ok(executor)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, u32), Entry>> {
        self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Resolves when an entry changed since the last call.
    pub async fn changed(&self) {
        self.changed.notified().await
    }

    /// What the heartbeat carries: every entry not yet acknowledged, a
    /// copy in a worker with how far it got.
    pub fn reports(&self) -> Vec<CommandReport> {
        // The reports under the lock; a copy's progress (files read) after it.
        let reports: Vec<(CommandReport, Option<PathBuf>)> = self
            .lock()
            .values()
            .map(|e| {
                let copying = e.worker.is_some() && e.state == AgentState::ProcessingInBackend;
                let report = CommandReport {
                    name: e.name.clone(),
                    uid: e.uid.clone(),
                    attempt: e.attempt,
                    state: e.state,
                    answer: e.answer.clone(),
                    updated: e.updated,
                    progress: e.progress.clone(),
                };
                (report, copying.then(|| self.worker_file(e, "job.json")))
            })
            .collect();
        reports
            .into_iter()
            .map(|(mut report, job)| {
                if let Some(progress) = job.and_then(|job| crate::worker::progress(&job)) {
                    report.progress = progress;
                }
                report
            })
            .collect()
    }

    /// The server recorded these: forget them (journal file and all).
    pub fn acknowledge(&self, acks: &[CommandAck]) {
        for ack in acks {
            let key = (ack.name.clone(), ack.attempt);
            let entry = self.lock().get(&key).cloned();
            let Some(entry) = entry.filter(|e| e.state.is_over()) else {
                continue;
            };
            match self.journal.remove(&entry) {
                Ok(()) => {
                    self.lock().remove(&key);
                    for suffix in ["job.json", "result.json", "total.json", "log"] {
                        let _ = std::fs::remove_file(self.worker_file(&entry, suffix));
                    }
                }
                Err(error) => tracing::error!(%error, "could not remove an acknowledged journal entry"),
            }
        }
    }

    /// Takes a Command seen on the watch: a new attempt, issued to this
    /// agent and not settled, is journaled and started (or refused when its
    /// term is stale). Anything else is ignored, so seeing a Command again
    /// does nothing.
    pub fn accept(self: &Arc<Self>, command: Command) {
        let Some(issued) = command.status.issued.clone() else { return };
        if let Some(abandon) = &command.status.abandon {
            self.end_abandoned(&command.metadata.name, abandon);
        }
        if command.status.state_by_management != ManagementState::Created {
            return;
        }
        let key = (command.metadata.name.clone(), issued.attempt);
        if self.lock().contains_key(&key) {
            return;
        }
        let started = crate::now();
        let deadline = Timestamp::from_system_time(SystemTime::now() + command.spec.timeout());
        let mut entry = Entry {
            name: key.0.clone(),
            uid: command.metadata.uid.clone().unwrap_or_default(),
            attempt: issued.attempt,
            term: issued.term,
            spec: command.spec,
            state: AgentState::Started,
            started,
            updated: started,
            deadline,
            answer: None,
            worker: None,
            peers: issued.peers.clone(),
            grants: issued.grants.clone(),
            progress: BTreeMap::new(),
        };
        let stale = self.observe_term(issued.term);
        if let Some(newest) = stale {
            entry.state = AgentState::Failed;
            entry.answer = Some(Answer::said(
                false,
                format!("refused: issued in term {}, but this agent has seen term {newest}", issued.term),
            ));
        }
        if let Err(error) = self.journal.write(&entry) {
            // Not journaled, so not started: say so rather than leave the
            // leader waiting out the timeout. The answer lives in memory
            // only; if it is lost with the agent, the leader times the
            // Command out and reconciles it (nothing ran).
            tracing::error!(%error, command = %entry.name, "could not journal a command; not starting it");
            let why = self.journal_failure("journaling it", &error);
            entry.state = AgentState::Failed;
            entry.answer = Some(Answer::said(false, format!("not started: {why}")));
            self.lock().insert(key, entry);
            self.changed.notify_one();
            return;
        }
        self.lock().insert(key, entry.clone());
        self.changed.notify_one();
        if stale.is_none() {
            let executor = self.clone();
            tokio::spawn(async move { executor.run(entry).await });
        }
    }

    /// Remembers the newest term; Some(newest) when `term` is older.
    fn observe_term(&self, term: u64) -> Option<u64> {
        let mut newest = self.newest_term.lock().unwrap_or_else(|p| p.into_inner());
        if term < *newest {
            return Some(*newest);
        }
        if term > *newest {
            *newest = term;
            if let Err(error) = write_atomic(&self.term_file, term.to_string().as_bytes(), 0o644) {
                tracing::error!(%error, "could not persist the newest term");
            }
        }
        None
    }

    /// Runs every registered disconnect hook, in parallel, each bounded;
    /// returns how many ran. Called when the server has been unreachable
    /// for longer than the grace period, and on shutdown.
    pub async fn run_disconnect_hooks(&self, why: &str) -> usize {
        let hooks: Vec<((String, u32), DisconnectHook)> =
            self.hooks.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(k, h)| (k.clone(), h.clone())).collect();
        let mut running = tokio::task::JoinSet::new();
        for ((name, attempt), hook) in &hooks {
            tracing::warn!(command = %name, attempt, why, "running the disconnect hook");
            let cancel = Cancel { why: why.to_string(), abandoned: None };
            self.cancelled.lock().unwrap_or_else(|p| p.into_inner()).entry((name.clone(), *attempt)).or_insert(cancel);
            let hook = hook.clone();
            running.spawn(tokio::time::timeout(HOOK_BOUND, tokio::task::spawn_blocking(move || hook())));
        }
        while let Some(done) = running.join_next().await {
            if !matches!(done, Ok(Ok(Ok(())))) {
                tracing::error!("a disconnect hook failed or did not finish within {HOOK_BOUND:?}");
            }
        }
        hooks.len()
    }

    /// Sets (or clears) the hook that ends an attempt's work. An attempt
    /// already cancelled before its hook existed (an abandon that arrived
    /// while a restarted agent was re-attaching its worker) is ended now.
    fn set_hook(&self, entry: &Entry, hook: Option<DisconnectHook>) {
        let key = (entry.name.clone(), entry.attempt);
        let Some(hook) = hook else {
            self.hooks.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
            return;
        };
        self.hooks.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone(), hook.clone());
        if self.cancelled.lock().unwrap_or_else(|p| p.into_inner()).contains_key(&key) {
            tracing::warn!(command = %entry.name, attempt = entry.attempt, "cancelled before its work was attached: ending it");
            hook();
        }
    }

    /// Moves an entry and writes it; false when the journal refused.
    /// A move the journal could not write (the disk is full past its
    /// reserve) is still reported from memory: the leader hears the answer;
    /// should the agent die first, the journal's older state becomes
    /// INTERRUPTED and is reconciled.
    fn advance(&self, entry: &mut Entry, to: AgentState, answer: Option<Answer>) -> bool {
        match self.advance_journaled(entry, to, answer) {
            Err(JournalError::Io { .. }) => {
                self.lock().insert((entry.name.clone(), entry.attempt), entry.clone());
                self.changed.notify_one();
                true
            }
            moved => moved.is_ok(),
        }
    }

    /// Moves an entry and writes it; an error when the journal refused the
    /// move or could not write it.
    fn advance_journaled(&self, entry: &mut Entry, to: AgentState, answer: Option<Answer>) -> Result<(), JournalError> {
        if let Err(error) = self.journal.advance(entry, to, answer, crate::now()) {
            tracing::error!(%error, "journal");
            return Err(error);
        }
        self.lock().insert((entry.name.clone(), entry.attempt), entry.clone());
        self.changed.notify_one();
        Ok(())
    }

    async fn run(&self, mut entry: Entry) {
        if !self.advance(&mut entry, AgentState::Processing, None) {
            return;
        }
        let left = entry.deadline.system_time().duration_since(SystemTime::now()).unwrap_or(Duration::ZERO);
        let work = self.perform(&mut entry);
        let outcome = tokio::select! {
            // The agent is stopping: the entry stays PROCESSING (or
            // PROCESSING_IN_BACKEND, its worker running on) in the journal,
            // and the next start reports it INTERRUPTED or re-attaches.
            _ = self.stop.cancelled() => return,
            outcome = tokio::time::timeout(left, work) => outcome,
        };
        if outcome.is_err()
            && let Some(worker) = &entry.worker
        {
            // Timed out: the worker goes too.
            let _ = procs::signal_run(worker.pid, worker.start_ticks, libc::SIGKILL);
        }
        let end = match outcome {
            Err(_) => WorkEnd::TimedOut(entry.spec.timeout()),
            Ok(Ok(answer)) => WorkEnd::Answered(answer),
            Ok(Err(failure)) => WorkEnd::Failed(failure),
        };
        let (state, answer) = ending(end, self.take_cancel(&entry).as_deref());
        self.set_hook(&entry, None);
        tracing::info!(command = %entry.name, attempt = entry.attempt, ?state, message = %answer.message, "command finished");
        self.advance(&mut entry, state, Some(answer));
    }

    /// Why an IO step failed, naming a full data dir as such.
    fn io_failure(&self, what: &str, error: &std::io::Error) -> Failure {
        crate::fsutil::io_failure(&self.workers.node, &self.worker_dir, what, error)
    }

    /// Why the journal could not take a write.
    fn journal_failure(&self, what: &str, error: &JournalError) -> Failure {
        match error {
            JournalError::Io { source, .. } => self.io_failure(what, source),
            other => other.to_string(),
        }
    }

    /// Does the work of an action: its answer (which may say it failed,
    /// with details), or why it could not be done.
    async fn perform(&self, entry: &mut Entry) -> Result<Answer, Failure> {
        match &entry.spec.action.clone() {
            Action::StartMember { member, run } => {
                let instance = self.members.start(member, run.clone()).await.map_err(|e| e.to_string())?;
                let message = format!("member {member} runs as instance {instance}");
                let details = AnswerDetails::Started { instance_id: instance, checksums: BTreeMap::new() };
                Ok(Answer { success: true, message, details })
            }
            Action::StopMember { member } => {
                self.members.stop(member).await.map_err(|e| e.to_string())?;
                Ok(Answer::said(true, format!("member {member} stopped")))
            }
            Action::DeleteVolume { member, volume } => self.delete_volume(entry, member, volume),
            Action::RunScript { member, script, expected_instance } => {
                let record = self.member_as(member, expected_instance.as_deref(), "the script")?;
                self.run_script(entry, &record, script).await
            }
            Action::Promote { member, script, expected_instance, catch_up_to } => {
                let record = self.member_as(member, Some(expected_instance), "the promote")?;
                if let Some(target) = catch_up_to {
                    let target = target.parse::<Position>().map_err(|e| format!("catchUpTo: {e}"))?;
                    // Half the command's time to catch up; the rest is the hook's.
                    let left = entry.deadline.system_time().duration_since(SystemTime::now()).unwrap_or_default();
                    let until = tokio::time::Instant::now() + left / 2;
                    if let Err(why) = self.members.catch_up(&record, target, until).await {
                        return Ok(Answer::said(false, format!("not promoted: {why}")));
                    }
                }
                self.run_script(entry, &record, script).await
            }
            Action::Demote { member, term } => {
                let stood = self.members.stand_down(member, *term).await?;
                let at = stood.position.as_deref().map(|p| format!(" at {p}")).unwrap_or_default();
                let message = match &stood.fenced {
                    None => format!("member {member} stood down as leader of term {term}{at}"),
                    Some(why) => format!(
                        "member {member} stood down as leader of term {term}{at}: {why}, so its processes were ended"
                    ),
                };
                let details =
                    stood.position.map_or(AnswerDetails::None, |position| AnswerDetails::StoodDown { position });
                Ok(Answer { success: true, message, details })
            }
            Action::CopyVolume { member, volume, from_node } => {
                self.copy_volume(entry, member, volume, from_node).await
            }
            Action::MigrateMember { member, from_node, run } => self.migrate(entry, member, from_node, run).await,
            Action::ConfigureMember {
                member,
                expected_instance,
                configmeta,
                setup_script,
                run_setup,
                setup_timeout,
            } => {
                let record = self.member_as(member, Some(expected_instance), "its configuration")?;
                let request = setup::Configure {
                    configmeta,
                    setup_script: setup_script.as_deref(),
                    run_setup: *run_setup,
                    setup_timeout_secs: setup_timeout.map_or(300, |t| t.get().as_secs()),
                };
                let message = setup::configure(&self.members, &record, expected_instance, &request)?;
                Ok(Answer::said(true, message))
            }
            Action::RemoveMember { member } => {
                self.members.forget(member).await.map_err(|e| e.to_string())?;
                Ok(Answer::said(true, format!("member {member} is removed from this node")))
            }
        }
    }

    /// Runs `script` in the member's environment until the Command's
    /// deadline; a disconnect from the server ends what it started.
    async fn run_script(&self, entry: &Entry, record: &MemberRecord, script: &str) -> Result<Answer, Failure> {
        let started = |pid: Option<u32>, mark: &procs::RunMark| {
            let mark = mark.clone();
            let hook: DisconnectHook = Arc::new(move || procs::end_run(pid, &mark));
            self.set_hook(entry, Some(hook));
        };
        let outcome = script::run(&self.members, record, script, entry.deadline, started).await?;
        let message = format!("the script exited with {}", outcome.code);
        let details = AnswerDetails::Script { exit_code: outcome.code, stdout: outcome.stdout, stderr: outcome.stderr };
        Ok(Answer { success: outcome.code == 0, message, details })
    }

    /// The member's record, refused when it runs as another instance than
    /// the one `what` was for (it restarted; the server handles that first).
    fn member_as(&self, member: &str, expected: Option<&str>, what: &str) -> Result<MemberRecord, Failure> {
        let record = self.members.record(member).ok_or(format!("member {member} is not known on this node"))?;
        let running_as = record.process.as_ref().map(|p| p.instance_id.as_str());
        if let Some(expected) = expected
            && running_as != Some(expected)
        {
            return Err(format!(
                "refused: {what} was for member {member} as instance {expected}, but it now runs as {}; it \
                 restarted, and that is handled first",
                running_as.unwrap_or("nothing")
            ));
        }
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::members::MemberHost;
    use herd_core::kinds::command::Issue;
    use herd_core::kinds::{CommandSpec, CommandStatus};

    fn command(name: &str, term: u64, action: Action) -> Command {
        let mut command = Command::new(name, CommandSpec { node: "n1".into(), timeout: None, action, origin: None });
        command.metadata.uid = Some(format!("uid-{name}"));
        command.status = CommandStatus {
            issued: Some(Issue { term, attempt: 1, at: crate::now(), peers: BTreeMap::new(), grants: Vec::new() }),
            ..Default::default()
        };
        command
    }

    async fn settled(executor: &Executor, name: &str) -> CommandReport {
        for _ in 0..200 {
            if let Some(report) = executor.reports().into_iter().find(|r| r.name == name && r.state.is_over()) {
                return report;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("{name} did not finish: {:?}", executor.reports());
    }

    /// No copies in these tests: the worker program is the herd binary.
    fn no_workers() -> Workers {
        Workers {
            program: PathBuf::from("/nonexistent/herd"),
            access: PeerAccess::open(Path::new("/nonexistent"), "n1", None),
            bandwidth: None,
            node: "n1".into(),
        }
    }

    /// An executor whose node runs member `m` (started by a command).
    async fn with_member_m(dir: &Path, stop: &CancellationToken) -> (Members, Arc<Executor>) {
        let members = Members::open(dir, MemberHost::bare("not in this test"), stop.clone()).await.unwrap();
        let executor = Executor::open(dir, members.clone(), no_workers(), stop.clone()).unwrap();
        let command_line = vec!["sleep".into(), "60".into()];
        let run = herd_core::kinds::command::MemberRun {
            command: command_line,
            env: BTreeMap::new(),
            volumes: vec![],
            readiness: None,
            drain: None,
            demote: None,
            position: None,
            ..Default::default()
        };
        executor.accept(command("start", 1, Action::StartMember { member: "m".into(), run }));
        settled(&executor, "start").await;
        (members, executor)
    }

    #[tokio::test]
    async fn a_command_from_an_older_term_is_refused_and_answered() {
        let dir = tempfile::tempdir().unwrap();
        let stop = CancellationToken::new();
        let members = Members::open(dir.path(), MemberHost::bare("not in this test"), stop.clone()).await.unwrap();
        let executor = Executor::open(dir.path(), members, no_workers(), stop.clone()).unwrap();
        executor.accept(command("new", 5, Action::StopMember { member: "m".into() }));
        executor.accept(command("old", 4, Action::StopMember { member: "m".into() }));
        let old = settled(&executor, "old").await;
        assert_eq!(old.state, AgentState::Failed);
        let message = old.answer.unwrap().message;
        assert_eq!(message, "refused: issued in term 4, but this agent has seen term 5");
        // The newest term survives a restart of the agent.
        stop.cancel();
        let stop = CancellationToken::new();
        let members = Members::open(dir.path(), MemberHost::bare("not in this test"), stop.clone()).await.unwrap();
        let executor = Executor::open(dir.path(), members, no_workers(), stop.clone()).unwrap();
        executor.accept(command("older", 3, Action::StopMember { member: "m".into() }));
        assert_eq!(settled(&executor, "older").await.state, AgentState::Failed);
        stop.cancel();
    }

    #[tokio::test]
    async fn an_interrupted_command_is_reported_interrupted_after_a_restart_and_forgotten_once_acknowledged() {
        let dir = tempfile::tempdir().unwrap();
        let stop = CancellationToken::new();
        let (_, executor) = with_member_m(dir.path(), &stop).await;
        let script = "sleep 30".to_string();
        executor.accept(command(
            "script",
            1,
            Action::RunScript { member: "m".into(), script, expected_instance: None },
        ));
        for _ in 0..100 {
            if executor.reports().iter().any(|r| r.name == "script" && r.state == AgentState::Processing) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The agent stops while the script runs: its work is dropped (the
        // journal keeps it PROCESSING), and its disconnect hook ends it.
        stop.cancel();
        let hooks = executor.run_disconnect_hooks("shutting down").await;
        assert_eq!(hooks, 1);
        let stop = CancellationToken::new();
        let members = Members::open(dir.path(), MemberHost::bare("not in this test"), stop.clone()).await.unwrap();
        let executor = Executor::open(dir.path(), members.clone(), no_workers(), stop.clone()).unwrap();
        let script = executor.reports().into_iter().find(|r| r.name == "script").unwrap();
        assert_eq!(script.state, AgentState::Interrupted);
        executor.acknowledge(&[
            CommandAck { name: "script".into(), attempt: 1 },
            CommandAck { name: "start".into(), attempt: 1 },
        ]);
        assert!(executor.reports().is_empty());
        assert_eq!(std::fs::read_dir(dir.path().join("journal")).unwrap().count(), 0, "the journal files are removed");
        members.stop("m").await.unwrap();
        stop.cancel();
    }

    #[tokio::test]
    async fn a_script_for_another_instance_of_the_member_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let stop = CancellationToken::new();
        let (members, executor) = with_member_m(dir.path(), &stop).await;
        let instance = members.record("m").unwrap().process.unwrap().instance_id;
        let for_instance = |name: &str, expected: &str| {
            let action = Action::RunScript {
                member: "m".into(),
                script: "echo ran".into(),
                expected_instance: Some(expected.into()),
            };
            command(name, 1, action)
        };
        executor.accept(for_instance("stale", "an-earlier-instance"));
        let stale = settled(&executor, "stale").await;
        assert_eq!(stale.state, AgentState::Failed);
        let message = stale.answer.unwrap().message;
        assert!(
            message.starts_with(
                "refused: the script was for member m as instance an-earlier-instance, but it now runs as"
            ),
            "{message}"
        );
        executor.accept(for_instance("current", &instance));
        let current = settled(&executor, "current").await;
        assert_eq!(current.state, AgentState::Completed, "{:?}", current.answer);
        members.stop("m").await.unwrap();
        stop.cancel();
    }

    #[tokio::test]
    async fn a_disconnect_hook_cancels_a_running_script_and_the_answer_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let stop = CancellationToken::new();
        let (members, executor) = with_member_m(dir.path(), &stop).await;
        executor.accept(command(
            "script",
            1,
            Action::RunScript { member: "m".into(), script: "sleep 30".into(), expected_instance: None },
        ));
        while executor.run_disconnect_hooks("the server has been unreachable for over 30s").await == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let report = settled(&executor, "script").await;
        assert_eq!(report.state, AgentState::Interrupted, "for the server to reconcile");
        let message = report.answer.unwrap().message;
        assert!(message.starts_with("cancelled (the server has been unreachable for over 30s)"), "{message}");
        // Running the hooks again is harmless.
        assert_eq!(executor.run_disconnect_hooks("again").await, 0);
        members.stop("m").await.unwrap();
        stop.cancel();
    }
}
