//! Members: the processes this agent runs, each in its own process group,
//! with its volumes and its log files.
//!
//! What runs is persisted (`<data-dir>/members/<name>/member.json`) so that
//! an agent that restarts re-adopts members that still run: their pid and
//! start time match, and their instance id stays. A member that is gone
//! (it exited, or the host rebooted) is started again with a fresh
//! instance id. Members outlive the agent: stopping the agent leaves them
//! running.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herd_core::Timestamp;
use herd_core::api::{CrashLoop, MemberReport, ReadinessReport};
use herd_core::kinds::command::{DrainHook, MemberRun, VolumeSpec};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::fsutil::write_atomic;
use crate::procs::{self, RunMark};

/// In a member's directory: its last readiness verdict.
const READINESS_FILE: &str = "readiness.json";
/// The `PATH` a member gets when the agent has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How long a stopping member gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How often a member the agent is not the parent of is looked at.
const ADOPTED_POLL: Duration = Duration::from_millis(500);
const FIRST_RESTART_DELAY: Duration = Duration::from_millis(500);
const MAX_RESTART_DELAY: Duration = Duration::from_secs(30);
/// A run this long was not a crash loop: the next restart waits only the
/// first delay again.
const STABLE_RUN: Duration = Duration::from_secs(10);

/// The pause before starting a member again after `streak` short runs in
/// a row: 500 ms, doubling, at most 30 s.
fn restart_delay(streak: u32) -> Duration {
    FIRST_RESTART_DELAY.saturating_mul(1 << streak.min(6)).min(MAX_RESTART_DELAY)
}

#[derive(Debug, thiserror::Error)]
pub enum MemberError {
    #[error("member {member}: {context}: {source}")]
    Io { member: String, context: String, source: std::io::Error },
    #[error("member {0} is not known on this node")]
    Unknown(String),
    #[error("member {member} is running; stop it first ({what})")]
    Running { member: String, what: String },
    #[error(
        "persistent volume {volume} of member {member} was lost on this node (its directory is gone): it is not \
         started on an empty one; `herd member replace {member}` recreates it with empty volumes"
    )]
    VolumeLost { member: String, volume: String },
}

/// A member as persisted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberRecord {
    pub name: String,
    pub run: MemberRun,
    /// Whether it should run.
    pub wanted: bool,
    /// The current run, when one was started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<Running>,
    /// A run being started: recorded before the spawn, so that an agent
    /// killed before it recorded the run's pid finds the process again
    /// (by `HERD_INSTANCE_ID` in its environment) instead of starting a
    /// second one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launching: Option<Launching>,
    /// Starts after the first.
    #[serde(default)]
    pub restarts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_exit: Option<String>,
    /// Runs in a row that ended within [`STABLE_RUN`] (the restart backoff).
    #[serde(default)]
    pub short_runs: u32,
    /// When it is started again, while it waits out the restart backoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_start: Option<Timestamp>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Running {
    pub instance_id: String,
    pub pid: u32,
    pub start_ticks: u64,
    pub started_at: Timestamp,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Launching {
    pub instance_id: String,
    pub started_at: Timestamp,
}

struct Slot {
    record: MemberRecord,
    /// Bumped at every start and stop: a watcher of an older run ends.
    generation: u64,
}

/// The members of this node.
#[derive(Clone)]
pub struct Members {
    data_dir: PathBuf,
    slots: Arc<Mutex<BTreeMap<String, Slot>>>,
    /// The last readiness check of each member (`readiness.rs` runs them).
    readiness: Arc<Mutex<BTreeMap<String, ReadinessReport>>>,
    /// Told when what the heartbeat reports of members changed.
    changed: Arc<tokio::sync::Notify>,
    /// Members whose setup run a task of this agent supervises.
    setups: Arc<Mutex<std::collections::BTreeSet<String>>>,
    stop: CancellationToken,
}

/// A setup run this agent supervises, while it is held.
pub struct SupervisedSetup {
    setups: Arc<Mutex<std::collections::BTreeSet<String>>>,
    member: String,
}

impl Drop for SupervisedSetup {
    fn drop(&mut self) {
        self.setups.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.member);
    }
}

impl Members {
    /// Loads what this node runs: members that still run are adopted,
    /// wanted members that are gone are started again.
    pub async fn open(data_dir: &Path, stop: CancellationToken) -> Result<Members, MemberError> {
        let members = Members {
            data_dir: data_dir.to_path_buf(),
            slots: Arc::default(),
            readiness: Arc::default(),
            changed: Arc::default(),
            setups: Arc::default(),
            stop,
        };
        let root = data_dir.join("members");
        let io =
            |source| MemberError::Io { member: "*".into(), context: format!("reading {}", root.display()), source };
        std::fs::create_dir_all(&root).map_err(io)?;
        for item in std::fs::read_dir(&root).map_err(io)? {
            let path = item.map_err(io)?.path().join("member.json");
            let Ok(text) = std::fs::read(&path) else { continue };
            let mut record: MemberRecord = match serde_json::from_slice(&text) {
                Ok(record) => record,
                Err(error) => {
                    tracing::error!(path = %path.display(), %error, "a member record does not parse; left as is");
                    continue;
                }
            };
            let name = record.name.clone();
            let launched = record.launching.take();
            if let Some(process) = launched.as_ref().and_then(find_launched) {
                tracing::info!(member = %name, instance = %process.instance_id, pid = process.pid, "found a member started just before the agent stopped");
                if record.process.is_some() {
                    record.restarts += 1;
                }
                record.process = Some(process);
            }
            let alive = record.process.as_ref().is_some_and(|p| procs::is_alive(p.pid, p.start_ticks));
            members.lock().insert(name.clone(), Slot { record: record.clone(), generation: 0 });
            if launched.is_some() {
                members.persist(&name)?;
            }
            match (alive, record.wanted) {
                (true, _) => {
                    let process = record.process.clone().expect("alive implies a process");
                    tracing::info!(member = %name, instance = %process.instance_id, pid = process.pid, "re-adopted a running member");
                    members.kept_readiness(&name, &process);
                    members.watch_adopted(name, 0, process);
                }
                (false, true) => {
                    tracing::info!(member = %name, "a wanted member is not running (host restart, or it exited); starting it");
                    members.launch(&name)?;
                }
                (false, false) => {}
            }
        }
        Ok(members)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The agent's data dir (absolute).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Resolves when the agent stops.
    pub async fn stopping(&self) {
        self.stop.cancelled().await
    }

    /// Marks `member`'s setup run as supervised by a task of this agent
    /// until the guard drops.
    pub fn supervise_setup(&self, member: &str) -> SupervisedSetup {
        self.setups.lock().unwrap_or_else(|p| p.into_inner()).insert(member.to_string());
        SupervisedSetup { setups: self.setups.clone(), member: member.to_string() }
    }

    /// Whether a task of this agent supervises `member`'s setup run.
    pub fn setup_supervised(&self, member: &str) -> bool {
        self.setups.lock().unwrap_or_else(|p| p.into_inner()).contains(member)
    }

    pub fn member_dir(&self, member: &str) -> PathBuf {
        self.data_dir.join("members").join(member)
    }

    pub fn volume_dir(&self, member: &str, volume: &str) -> PathBuf {
        self.data_dir.join("volumes").join(member).join(volume)
    }

    /// Where a copy of a volume is staged until it is verified (kept
    /// across attempts, so that a copy resumes).
    pub fn staging_dir(&self, member: &str, volume: &str) -> PathBuf {
        self.incoming_dir().join(member).join(volume)
    }

    /// Where every copy is staged, one directory per member.
    pub fn incoming_dir(&self) -> PathBuf {
        self.data_dir.join("volumes").join(".incoming")
    }

    /// Every volume and partial copy in the data dir, with whether this
    /// agent knows (and runs) its member.
    pub fn stored_volumes(&self) -> std::io::Result<Vec<herd_core::api::StoredVolume>> {
        use herd_core::api::{StoredKind, StoredVolume};
        let root = self.data_dir.join("volumes");
        let mut found = Vec::new();
        for (kind, dir) in [(StoredKind::Volume, root.clone()), (StoredKind::Staging, root.join(".incoming"))] {
            for (member, volume, path) in two_levels(&dir)? {
                if kind == StoredKind::Volume && member == ".incoming" {
                    continue;
                }
                let record = self.record(&member);
                found.push(StoredVolume {
                    bytes: crate::volumes::staged_bytes(&path).unwrap_or(0),
                    member_known: record.is_some(),
                    member_running: record.is_some_and(|r| r.wanted),
                    member,
                    volume,
                    kind,
                    owner: None,
                });
            }
        }
        Ok(found)
    }

    /// Starts `member` with `run`; a member already running with the same
    /// `run` is left alone (the same instance id is returned).
    pub async fn start(&self, member: &str, run: MemberRun) -> Result<String, MemberError> {
        {
            let mut slots = self.lock();
            if let Some(slot) = slots.get_mut(member)
                && let Some(process) = &slot.record.process
                && procs::is_alive(process.pid, process.start_ticks)
            {
                if slot.record.run == run {
                    slot.record.wanted = true;
                    return Ok(process.instance_id.clone());
                }
                return Err(MemberError::Running { member: member.into(), what: "it runs with other settings".into() });
            }
            let record = MemberRecord {
                name: member.into(),
                run,
                wanted: true,
                process: None,
                launching: None,
                restarts: slots.get(member).map_or(0, |s| s.record.restarts),
                last_exit: None,
                short_runs: 0,
                next_start: None,
            };
            let generation = slots.get(member).map_or(0, |s| s.generation);
            slots.insert(member.into(), Slot { record, generation });
        }
        self.launch(member)
    }

    /// Starts a new run of a known member: volumes prepared, a fresh
    /// instance id, recorded before it is watched.
    fn launch(&self, member: &str) -> Result<String, MemberError> {
        let io = |context: String| {
            let member = member.to_string();
            move |source| MemberError::Io { member, context, source }
        };
        let run = self.lock().get(member).map(|s| s.record.run.clone()).ok_or(MemberError::Unknown(member.into()))?;
        let dir = self.member_dir(member);
        std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
        // A setup run belongs to the instance that ended.
        crate::setup::kill_setup(&dir);
        let instance_id = uuid::Uuid::now_v7().to_string();
        let started_at = crate::now();
        if let Some(slot) = self.lock().get_mut(member) {
            slot.record.launching = Some(Launching { instance_id: instance_id.clone(), started_at });
        }
        self.persist(member)?;
        for volume in &run.volumes {
            match self.prepare_volume(member, volume) {
                Ok(_) => {}
                Err(PrepareError::Io(error)) => return Err(io(format!("preparing volume {}", volume.name))(error)),
                Err(PrepareError::Lost) => {
                    let lost = MemberError::VolumeLost { member: member.into(), volume: volume.name.clone() };
                    if let Some(slot) = self.lock().get_mut(member) {
                        slot.record.last_exit = Some(format!("not started: {lost}"));
                        slot.record.launching = None;
                    }
                    self.persist(member)?;
                    self.tell_changed();
                    return Err(lost);
                }
            }
        }
        let record = self.record(member).ok_or(MemberError::Unknown(member.into()))?;
        let mut command = self.command(&record, &run.command[0], Some(&instance_id));
        command.args(&run.command[1..]);
        let log = |name: &str| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join(name))
                .map_err(io(format!("opening {name}")))
        };
        command.stdout(log("stdout.log")?).stderr(log("stderr.log")?).kill_on_drop(false);
        let child = command.spawn().map_err(io(format!("starting {:?}", run.command[0])))?;
        let pid = child.id().unwrap_or_default();
        let process = Running {
            instance_id: instance_id.clone(),
            pid,
            start_ticks: procs::start_ticks(pid).unwrap_or_default(),
            started_at,
        };
        let generation = {
            let mut slots = self.lock();
            let slot = slots.get_mut(member).ok_or(MemberError::Unknown(member.into()))?;
            if slot.record.process.is_some() {
                slot.record.restarts += 1;
            }
            slot.record.process = Some(process.clone());
            slot.record.launching = None;
            slot.record.next_start = None;
            slot.generation += 1;
            slot.generation
        };
        self.persist(member)?;
        self.tell_changed();
        tracing::info!(member, instance = %instance_id, pid, "started a member");
        let members = self.clone();
        let name = member.to_string();
        tokio::spawn(async move {
            let mut child = child;
            let exit = tokio::select! {
                _ = members.stop.cancelled() => return,
                status = child.wait() => status.map_or_else(|e| format!("unknown ({e})"), |s| s.to_string()),
            };
            members.exited(&name, generation, exit).await;
        });
        Ok(instance_id)
    }

    /// Watches a member started by an earlier agent run.
    fn watch_adopted(&self, member: String, generation: u64, process: Running) {
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
    async fn exited(&self, member: &str, generation: u64, exit: String) {
        let (ended, delay) = {
            let mut slots = self.lock();
            let Some(slot) = slots.get_mut(member).filter(|s| s.generation == generation) else { return };
            slot.record.last_exit = Some(exit.clone());
            let ended = slot.record.process.as_ref().map(|p| p.instance_id.clone());
            let delay = slot.record.wanted.then(|| {
                // A member that ran a while and then died is not crash-looping.
                let ran = slot.record.process.as_ref().map(|p| p.started_at.age(crate::now())).unwrap_or_default();
                if ran >= STABLE_RUN {
                    slot.record.short_runs = 0;
                }
                let delay = restart_delay(slot.record.short_runs);
                slot.record.short_runs += 1;
                slot.record.next_start = Some(crate::now().plus(delay));
                delay
            });
            (ended, delay)
        };
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
        tokio::select! {
            _ = self.stop.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
        let still_wanted = self.lock().get(member).is_some_and(|s| s.generation == generation && s.record.wanted);
        if still_wanted && let Err(error) = self.launch(member) {
            tracing::error!(member, %error, "could not start a member again");
        }
    }

    /// Stops a member: SIGTERM to its group, SIGKILL after the grace
    /// period. Its volumes stay.
    pub async fn stop(&self, member: &str) -> Result<(), MemberError> {
        let record = self.record(member).ok_or(MemberError::Unknown(member.into()))?;
        if let (Some(hook), Some(process)) = (&record.run.drain, &record.process)
            && procs::is_alive(process.pid, process.start_ticks)
        {
            self.drain_hook(&record, hook).await;
        }
        let process = {
            let mut slots = self.lock();
            let slot = slots.get_mut(member).ok_or(MemberError::Unknown(member.into()))?;
            slot.record.wanted = false;
            slot.generation += 1;
            slot.record.process.clone()
        };
        self.persist(member)?;
        crate::setup::kill_setup(&self.member_dir(member));
        let Some(process) = process else { return Ok(()) };
        let io = |source| MemberError::Io { member: member.into(), context: "signalling".into(), source };
        if procs::is_alive(process.pid, process.start_ticks) {
            procs::signal_group(process.pid, libc::SIGTERM).map_err(io)?;
            let deadline = tokio::time::Instant::now() + STOP_GRACE;
            while procs::is_alive(process.pid, process.start_ticks) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            procs::signal_group(process.pid, libc::SIGKILL).map_err(io)?;
        }
        end_instance(&process.instance_id);
        if let Some(slot) = self.lock().get_mut(member) {
            slot.record.last_exit = Some("stopped".into());
            slot.record.next_start = None;
        }
        tracing::info!(member, instance = %process.instance_id, "stopped a member");
        self.persist(member)
    }

    /// `program` in the member's environment and nothing of the agent's:
    /// its directory, the role's variables, herd's member variables
    /// ([`Self::member_env`]), `HERD_INSTANCE_ID` (`instance`, else the
    /// run's), and of the agent's own only `PATH`, `HOME` and `LANG`, so
    /// that no herd credential (a join or admin token, the server, the
    /// CA) reaches a member, its setup, scripts or checks. In a process
    /// group of its own: signals reach all its processes, and none reach
    /// it from the agent's terminal. Standard input is empty.
    pub fn command(
        &self,
        record: &MemberRecord,
        program: impl AsRef<std::ffi::OsStr>,
        instance: Option<&str>,
    ) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(program);
        command.env_clear();
        for key in ["PATH", "HOME", "LANG"] {
            if let Some(value) = std::env::var_os(key) {
                command.env(key, value);
            }
        }
        if std::env::var_os("PATH").is_none() {
            command.env("PATH", DEFAULT_PATH);
        }
        command.envs(&record.run.env).envs(self.member_env(record));
        if let Some(instance) = instance.or(record.process.as_ref().map(|p| p.instance_id.as_str())) {
            command.env("HERD_INSTANCE_ID", instance);
        }
        command.current_dir(self.member_dir(&record.name)).stdin(Stdio::null()).process_group(0);
        command
    }

    /// `sh -c <script> <args>` in the member's environment (see
    /// [`Self::command`]), marked as one run, its output piped: a
    /// RunScript, a drain hook.
    pub fn shell(&self, record: &MemberRecord, script: &str, args: &[&str], mark: &RunMark) -> tokio::process::Command {
        let mut command = self.command(record, "sh", None);
        command.arg("-c").arg(script).args(args).env(procs::RUN_VAR, mark.as_str());
        command.stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
        command
    }

    /// Runs the member's drain hook (`sh -c <script> herd-drain --drain`,
    /// in its environment) for at most its timeout; what it says is logged.
    /// Whatever it started ends with it.
    async fn drain_hook(&self, record: &MemberRecord, hook: &DrainHook) {
        let member = &record.name;
        let mark = RunMark::fresh("drain");
        let child = match self.shell(record, &hook.script, &["herd-drain", "--drain"], &mark).spawn() {
            Ok(child) => child,
            Err(error) => {
                tracing::warn!(member, %error, "could not start the drain hook; stopping the member anyway");
                return;
            }
        };
        let pid = child.id().unwrap_or_default();
        match tokio::time::timeout(hook.timeout.get(), child.wait_with_output()).await {
            Ok(Ok(output)) => tracing::info!(
                member,
                status = %output.status,
                stderr = %String::from_utf8_lossy(&output.stderr).trim(),
                "drain hook ran"
            ),
            Ok(Err(error)) => tracing::warn!(member, %error, "the drain hook failed; stopping the member anyway"),
            Err(_) => {
                tracing::warn!(member, timeout = %hook.timeout, "the drain hook ran out of time; stopping the member");
            }
        }
        procs::end_run(Some(pid), &mark);
    }

    /// Forgets a member: stopped, its volumes, directory and record
    /// removed. Unknown members are not an error: forgetting is repeatable.
    pub async fn forget(&self, member: &str) -> Result<(), MemberError> {
        if self.record(member).is_some() {
            self.stop(member).await?;
        }
        self.lock().remove(member);
        self.readiness.lock().unwrap_or_else(|p| p.into_inner()).remove(member);
        let io = |path: PathBuf| {
            let member = member.to_string();
            move |source| MemberError::Io { member, context: format!("removing {}", path.display()), source }
        };
        for dir in [self.data_dir.join("volumes").join(member), self.member_dir(member)] {
            match std::fs::remove_dir_all(&dir) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(io(dir)(error)),
                _ => {}
            }
        }
        tracing::info!(member, "forgot a member (it moved away)");
        Ok(())
    }

    /// Whether `member` is known and wanted running.
    pub fn is_running(&self, member: &str) -> bool {
        self.lock().get(member).is_some_and(|s| s.record.wanted)
    }

    pub fn record(&self, member: &str) -> Option<MemberRecord> {
        self.lock().get(member).map(|s| s.record.clone())
    }

    /// What the heartbeat tells the server.
    pub fn report(&self) -> Vec<MemberReport> {
        let records: Vec<MemberRecord> = self.lock().values().map(|slot| slot.record.clone()).collect();
        let readiness = self.readiness.lock().unwrap_or_else(|p| p.into_inner()).clone();
        records
            .iter()
            .map(|record| {
                let live = record.process.as_ref().filter(|p| procs::is_alive(p.pid, p.start_ticks));
                let (setup_status, setup_stderr) = crate::setup::report(self, record);
                MemberReport {
                    name: record.name.clone(),
                    wanted: record.wanted,
                    running: live.is_some(),
                    instance_id: record.process.as_ref().map(|p| p.instance_id.clone()),
                    pid: live.map(|p| p.pid),
                    started_at: record.process.as_ref().map(|p| p.started_at),
                    restarts: record.restarts,
                    last_exit: record.last_exit.clone(),
                    cluster: record.run.env.get("HERD_CLUSTER").cloned(),
                    setup_status,
                    setup_stderr,
                    readiness: readiness.get(&record.name).cloned(),
                    crash_loop: crash_loop(record, live.is_some()),
                    lost_volumes: self.lost_volumes(record),
                }
            })
            .collect()
    }

    fn persist(&self, member: &str) -> Result<(), MemberError> {
        let Some(record) = self.record(member) else { return Ok(()) };
        let path = self.member_dir(member).join("member.json");
        let io =
            |source| MemberError::Io { member: member.into(), context: format!("writing {}", path.display()), source };
        std::fs::create_dir_all(self.member_dir(member)).map_err(io)?;
        let json = serde_json::to_vec_pretty(&record).expect("a member record always serialises");
        write_atomic(&path, &json, 0o644).map_err(io)
    }

    /// What herd adds to a member's environment (for its process, its
    /// scripts and its checks): `HERD_MEMBER`, `HERD_VOLUME_<NAME>` to the
    /// path of each of its volumes, and `HERD_CONFIGMETA` when it is an
    /// app-cluster member (and `HERD_CONFIGMETA_SH`, the same as shell variables).
    pub fn member_env(&self, record: &MemberRecord) -> Vec<(String, std::ffi::OsString)> {
        let mut env = vec![("HERD_MEMBER".to_string(), record.name.clone().into())];
        for volume in &record.run.volumes {
            env.push((volume_env(&volume.name), self.volume_dir(&record.name, &volume.name).into()));
        }
        if let Some(dir) = crate::setup::herd_volume(self, record) {
            env.push(("HERD_CONFIGMETA".into(), dir.join(crate::setup::CONFIGMETA).into()));
            env.push(("HERD_CONFIGMETA_SH".into(), dir.join(crate::setup::CONFIGMETA_SH).into()));
        }
        env
    }

    /// Records a readiness check's result (a changed verdict is reported
    /// at once, and kept in the member's directory: an agent that restarts
    /// reports the verdict its running members last had, rather than none
    /// until the first check, which would make them not ready meanwhile).
    pub fn set_readiness(&self, member: &str, report: ReadinessReport) {
        let mut readiness = self.readiness.lock().unwrap_or_else(|p| p.into_inner());
        let report = report.continuing(readiness.get(member));
        let before = readiness.insert(member.to_string(), report.clone());
        drop(readiness);
        if before.is_none_or(|b| (b.passing, &b.instance_id) != (report.passing, &report.instance_id)) {
            let path = self.member_dir(member).join(READINESS_FILE);
            let json = serde_json::to_vec(&report).expect("a readiness report always serialises");
            if let Err(error) = write_atomic(&path, &json, 0o644) {
                tracing::warn!(member, %error, "could not keep the readiness verdict");
            }
            self.tell_changed();
        }
    }

    /// The verdict kept for `process`, when it was of that instance.
    fn kept_readiness(&self, member: &str, process: &Running) {
        let Ok(text) = std::fs::read(self.member_dir(member).join(READINESS_FILE)) else { return };
        let Ok(report) = serde_json::from_slice::<ReadinessReport>(&text) else { return };
        if report.instance_id == process.instance_id {
            self.readiness.lock().unwrap_or_else(|p| p.into_inner()).insert(member.to_string(), report);
        }
    }

    /// Resolves when what the heartbeat reports of members changed.
    pub async fn changed(&self) {
        self.changed.notified().await
    }

    /// Says that members changed: the next heartbeat goes now.
    pub fn tell_changed(&self) {
        self.changed.notify_one();
    }

    /// Every member as recorded.
    pub fn records(&self) -> Vec<MemberRecord> {
        self.lock().values().map(|slot| slot.record.clone()).collect()
    }

    /// A persistent volume is kept; an ephemeral one starts empty. A
    /// persistent volume this node had (its mark beside it) and that is
    /// gone was lost: it is not made again empty (`Lost`), for the member
    /// would start on nothing as if it were its data.
    fn prepare_volume(&self, member: &str, volume: &VolumeSpec) -> Result<PathBuf, PrepareError> {
        let path = self.volume_dir(member, &volume.name);
        let mark = self.volume_mark(member, &volume.name);
        if !volume.persistent {
            if path.exists() {
                std::fs::remove_dir_all(&path)?;
            }
        } else if !path.is_dir() && mark.exists() {
            return Err(PrepareError::Lost);
        }
        std::fs::create_dir_all(&path)?;
        if volume.persistent && !mark.exists() {
            write_atomic(&mark, b"", 0o644)?;
        }
        Ok(path)
    }

    /// Beside a persistent volume: that this node has had it (a volume gone
    /// while its mark stays was lost, not never made).
    fn volume_mark(&self, member: &str, volume: &str) -> PathBuf {
        self.data_dir.join("volumes").join(member).join(format!(".{volume}.kept"))
    }

    /// The persistent volumes of `record` this node had and lost.
    pub fn lost_volumes(&self, record: &MemberRecord) -> Vec<String> {
        record
            .run
            .volumes
            .iter()
            .filter(|v| v.persistent)
            .filter(|v| {
                !self.volume_dir(&record.name, &v.name).is_dir() && self.volume_mark(&record.name, &v.name).exists()
            })
            .map(|v| v.name.clone())
            .collect()
    }

    /// Forgets that this node had `member`'s persistent volume `volume` (it
    /// was deleted on purpose): a start makes it afresh.
    pub fn forget_volume_mark(&self, member: &str, volume: &str) -> std::io::Result<()> {
        match std::fs::remove_file(self.volume_mark(member, volume)) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
            _ => Ok(()),
        }
    }
}

/// Why a volume could not be made ready for a start.
#[derive(Debug)]
enum PrepareError {
    /// A persistent volume this node had is gone.
    Lost,
    Io(std::io::Error),
}

impl From<std::io::Error> for PrepareError {
    fn from(error: std::io::Error) -> Self {
        PrepareError::Io(error)
    }
}

/// What the heartbeat says of a member whose last runs each ended within
/// [`STABLE_RUN`]: while it waits to be started again, or runs again for
/// less than that.
fn crash_loop(record: &MemberRecord, running: bool) -> Option<CrashLoop> {
    if !record.wanted || record.short_runs < CrashLoop::RUNS {
        return None;
    }
    let settled = running && record.process.as_ref().is_some_and(|p| p.started_at.age(crate::now()) >= STABLE_RUN);
    if settled {
        return None;
    }
    Some(CrashLoop {
        runs: record.short_runs,
        last_exit: record.last_exit.clone().unwrap_or_default(),
        next_start: record.next_start.filter(|_| !running),
    })
}

/// The process of a run that was being started, if it runs: it leads its
/// own group and carries the run's instance id.
fn find_launched(launching: &Launching) -> Option<Running> {
    let pid = procs::find_group_leader_by_env("HERD_INSTANCE_ID", &launching.instance_id)?;
    Some(Running {
        instance_id: launching.instance_id.clone(),
        pid,
        start_ticks: procs::start_ticks(pid)?,
        started_at: launching.started_at,
    })
}

/// The directories two levels under `dir` (`<member>/<volume>`), sorted;
/// none when `dir` does not exist.
fn two_levels(dir: &Path) -> std::io::Result<Vec<(String, String, PathBuf)>> {
    let subdirs = |dir: &Path| -> std::io::Result<Vec<(String, PathBuf)>> {
        let mut found = Vec::new();
        match std::fs::read_dir(dir) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(found),
            Err(error) => return Err(error),
            Ok(items) => {
                for item in items {
                    let item = item?;
                    if item.file_type()?.is_dir() {
                        found.push((item.file_name().to_string_lossy().into_owned(), item.path()));
                    }
                }
            }
        }
        found.sort();
        Ok(found)
    };
    let mut found = Vec::new();
    for (member, path) in subdirs(dir)? {
        for (volume, path) in subdirs(&path)? {
            found.push((member.clone(), volume, path));
        }
    }
    Ok(found)
}

/// Ends the processes of every member recorded in `data_dir` (SIGTERM to
/// each group, SIGKILL after the grace period), as a host shutdown would,
/// leaving the records: the next agent start brings wanted members back
/// with new instance ids. For `herd dev`, whose Ctrl-C stops everything it
/// started. Returns how many were running.
pub async fn stop_processes(data_dir: &Path) -> usize {
    let Ok(dirs) = std::fs::read_dir(data_dir.join("members")) else { return 0 };
    let running: Vec<Running> = dirs
        .flatten()
        .filter_map(|dir| std::fs::read(dir.path().join("member.json")).ok())
        .filter_map(|text| serde_json::from_slice::<MemberRecord>(&text).ok())
        .flat_map(|record| [record.process, record.launching.as_ref().and_then(find_launched)])
        .flatten()
        .filter(|p| procs::is_alive(p.pid, p.start_ticks))
        .collect();
    for process in &running {
        let _ = procs::signal_group(process.pid, libc::SIGTERM);
    }
    let deadline = tokio::time::Instant::now() + STOP_GRACE;
    while running.iter().any(|p| procs::is_alive(p.pid, p.start_ticks)) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for process in &running {
        let _ = procs::signal_group(process.pid, libc::SIGKILL);
        end_instance(&process.instance_id);
    }
    for dir in std::fs::read_dir(data_dir.join("members")).into_iter().flatten().flatten() {
        crate::setup::kill_setup(&dir.path());
    }
    running.len()
}

/// Ends every process of a member's instance that is left: each carries
/// its `HERD_INSTANCE_ID` (the member's own, its setup, scripts and
/// checks), wherever it went.
fn end_instance(instance: &str) {
    let killed = procs::kill_marked("HERD_INSTANCE_ID", instance);
    if killed > 0 {
        tracing::info!(instance, killed, "ended processes an instance that is over left behind");
    }
}

/// `HERD_VOLUME_<NAME>`, the name upper-cased with `-` and `.` as `_`.
fn volume_env(name: &str) -> String {
    let upper: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect();
    format!("HERD_VOLUME_{upper}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(script: &str, volumes: Vec<VolumeSpec>) -> MemberRun {
        MemberRun {
            command: vec!["sh".into(), "-c".into(), script.into()],
            env: BTreeMap::new(),
            volumes,
            readiness: None,
            drain: None,
        }
    }

    async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
        for _ in 0..200 {
            if check() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("timed out waiting for {what}");
    }

    #[tokio::test]
    async fn a_restarted_agent_adopts_running_members_and_a_reboot_starts_them_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let stop = CancellationToken::new();
        let members = Members::open(dir.path(), stop.clone()).await.unwrap();
        let volumes = vec![
            VolumeSpec { name: "data".into(), persistent: true },
            VolumeSpec { name: "scratch".into(), persistent: false },
        ];
        let script =
            "echo started >> \"$HERD_VOLUME_DATA/starts\"; touch \"$HERD_VOLUME_SCRATCH/x\"; echo out; exec sleep 60";
        let first = members.start("m1", run(script, volumes.clone())).await.unwrap();
        let starts = members.volume_dir("m1", "data").join("starts");
        let stdout = members.member_dir("m1").join("stdout.log");
        let log = || std::fs::read_to_string(&stdout).unwrap_or_default();
        eventually("the member ran its script", || log() == "out\n").await;
        assert_eq!(
            members.start("m1", run(script, volumes.clone())).await.unwrap(),
            first,
            "starting again is a no-op"
        );

        // The agent stops (members keep running) and starts again: adopted.
        stop.cancel();
        let stop = CancellationToken::new();
        let members = Members::open(dir.path(), stop.clone()).await.unwrap();
        let report = members.report();
        assert_eq!(report[0].instance_id.as_deref(), Some(first.as_str()));
        assert!(report[0].running);
        let pid = report[0].pid.unwrap();

        // A "host reboot": the agent and its members die; the member comes
        // back with a new instance id, its persistent volume kept and its
        // ephemeral one emptied.
        stop.cancel();
        procs::signal_group(pid, libc::SIGKILL).unwrap();
        eventually("the member died", || procs::start_ticks(pid).is_none()).await;
        let stop = CancellationToken::new();
        let members = Members::open(dir.path(), stop.clone()).await.unwrap();
        let second = members.report()[0].instance_id.clone().unwrap();
        assert_ne!(second, first);
        eventually("both runs' output in one log", || log() == "out\nout\n").await;
        assert_eq!(std::fs::read_to_string(&starts).unwrap().lines().count(), 2);
        members.stop("m1").await.unwrap();
        assert!(!members.report()[0].running);
        assert!(members.volume_dir("m1", "data").join("starts").exists(), "stopping keeps volumes");
        stop.cancel();
    }

    #[tokio::test]
    async fn a_member_started_just_before_the_agent_was_killed_is_found_not_started_twice() {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let stop = CancellationToken::new();
        let members = Members::open(dir.path(), stop.clone()).await.unwrap();
        let volumes = vec![VolumeSpec { name: "data".into(), persistent: true }];
        let script = "echo started >> \"$HERD_VOLUME_DATA/starts\"; exec sleep 60";
        let first = members.start("m1", run(script, volumes)).await.unwrap();
        let starts = members.volume_dir("m1", "data").join("starts");
        let count = || std::fs::read_to_string(&starts).unwrap_or_default().lines().count();
        eventually("the first run started", || count() == 1).await;
        let first_pid = members.report()[0].pid.unwrap();
        stop.cancel();

        // The first run dies and the agent starts a second one, but is
        // killed after the spawn and before recording its pid: the record
        // holds only the new instance id, marked as being launched.
        procs::signal_group(first_pid, libc::SIGKILL).unwrap();
        eventually("the first run died", || procs::start_ticks(first_pid).is_none()).await;
        let mut record = members.record("m1").unwrap();
        let launching = Launching { instance_id: uuid::Uuid::now_v7().to_string(), started_at: crate::now() };
        record.launching = Some(launching.clone());
        write_atomic(&members.member_dir("m1").join("member.json"), &serde_json::to_vec(&record).unwrap(), 0o644)
            .unwrap();
        let mut second = std::process::Command::new("sh")
            .args(["-c", script])
            .env("HERD_INSTANCE_ID", &launching.instance_id)
            .env("HERD_VOLUME_DATA", members.volume_dir("m1", "data"))
            .process_group(0)
            .spawn()
            .unwrap();
        eventually("the second run started", || count() == 2).await;

        let stop = CancellationToken::new();
        let members = Members::open(dir.path(), stop.clone()).await.unwrap();
        let report = members.report()[0].clone();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let runs = count();
        let _ = second.kill();
        let _ = second.wait();
        stop.cancel();
        assert_eq!(report.instance_id.as_deref(), Some(launching.instance_id.as_str()), "{report:?}");
        assert_ne!(report.instance_id.as_deref(), Some(first.as_str()));
        assert_eq!(report.pid, Some(second.id()));
        assert!(report.running);
        assert_eq!(runs, 2, "no third run was started");
        assert_eq!(members.record("m1").unwrap().launching, None, "the record now holds the found run");
    }

    #[tokio::test]
    async fn a_member_that_exits_is_started_again_with_a_new_instance_id() {
        let dir = tempfile::tempdir().unwrap();
        let stop = CancellationToken::new();
        let members = Members::open(dir.path(), stop.clone()).await.unwrap();
        let first = members.start("m1", run("sleep 0.2", vec![])).await.unwrap();
        eventually("a restart", || members.report()[0].restarts >= 1).await;
        let report = &members.report()[0];
        assert_ne!(report.instance_id.as_deref(), Some(first.as_str()));
        assert!(report.last_exit.as_deref().unwrap_or_default().contains("exit status: 0"), "{report:?}");
        members.stop("m1").await.unwrap();
        stop.cancel();
    }

    #[test]
    fn the_restart_backoff_doubles_over_short_runs_and_is_capped() {
        let delays: Vec<u64> = [0, 1, 2, 5, 6, 20].map(|streak| restart_delay(streak).as_millis() as u64).to_vec();
        assert_eq!(delays, [500, 1000, 2000, 16000, 30000, 30000]);
    }
}
