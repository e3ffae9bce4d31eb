//! Members: the processes this agent runs, each in its own process group,
//! with its volumes and its log files.
//!
//! What runs is persisted (`<data-dir>/members/<name>/member.json`) so that
//! an agent that restarts re-adopts members that still run: their pid and
//! start time match, and their instance id stays. A member that is gone
//! (it exited, or the host rebooted) is started again with a fresh
//! instance id. Members outlive the agent: stopping the agent leaves them
//! running. `environment` is what every process of a member is given;
//! `volumes` where its volumes are and which this node had; `restarting`
//! starts a wanted member again when its run ended or could not start.

mod environment;
pub mod leadership;
mod restarting;
mod volumes;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herd_core::Timestamp;
use herd_core::api::{MemberReport, OomKill, ReadinessReport};
use herd_core::kinds::command::MemberRun;
use herd_core::kinds::member_run::LogRotation;
use herd_core::quantity::Bytes;
use herd_core::restarts;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use self::volumes::PrepareError;
use crate::cgroups::{Cgroups, MemberCgroup, UsageMeter};
use crate::fsutil::{SpaceReserve, write_atomic};
use crate::procs;

/// In a member's directory: its last readiness verdict.
const READINESS_FILE: &str = "readiness.json";
/// The `PATH` a member gets when the agent has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How long a stopping member gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How often a member the agent is not the parent of is looked at.
const ADOPTED_POLL: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
pub enum MemberError {
    #[error("member {member}: {context}: {source}")]
    Io { member: String, context: String, source: std::io::Error },
    #[error("member {0} is not known on this node")]
    Unknown(String),
    #[error("member {member} is running; stop it first ({what})")]
    Running { member: String, what: String },
    #[error("member {member} was not started: {why}")]
    NotStarted { member: String, why: String },
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
    /// Runs in a row that ended soon after their start (`herd_core::restarts`).
    #[serde(default)]
    pub short_runs: u32,
    /// When it is started again, while it waits out the restart backoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_start: Option<Timestamp>,
    /// Its cgroup (None: none on this host), made at its first start and
    /// removed when it is forgotten.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<MemberCgroup>,
    /// The last time the kernel killed one of its processes for want of
    /// memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_kill: Option<OomKill>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Running {
    pub instance_id: String,
    pub pid: u32,
    pub start_ticks: u64,
    pub started_at: Timestamp,
    /// Its cgroup's OOM kills when the run started: more at its end, and
    /// the kernel ended it for want of memory.
    #[serde(default)]
    pub oom_kills_before: u64,
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

/// What this host gives every member besides its run: cgroups, and the
/// program its output goes through to its rotated log files.
#[derive(Clone, Debug)]
pub struct MemberHost {
    pub cgroups: Cgroups,
    /// `herd` (run as `herd log-writer`); None: output goes straight to
    /// the log files, unrotated.
    pub log_writer: Option<PathBuf>,
}

impl MemberHost {
    /// Neither cgroups nor log rotation, because of `why`.
    pub fn bare(why: &str) -> MemberHost {
        MemberHost { cgroups: Cgroups::unavailable(why), log_writer: None }
    }
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
    /// Members that lead their role, with their leases (`leadership.rs`).
    leads: Arc<Mutex<std::collections::HashMap<String, leadership::Lead>>>,
    /// What each member's position command last printed (`leadership.rs`).
    positions: Arc<Mutex<BTreeMap<String, herd_core::api::PositionReport>>>,
    /// The highest term each member stood down from for a handover.
    stood_down: Arc<Mutex<std::collections::HashMap<String, u64>>>,
    /// Held while a leader stands down (fenced, handed over, or demoted
    /// before it starts again): the demote hook, the end of its processes
    /// and its term file are whole before the run that ended is cleared
    /// away or the member started again.
    fencing: Arc<tokio::sync::Mutex<()>>,
    host: MemberHost,
    usage: UsageMeter,
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
    pub async fn open(data_dir: &Path, host: MemberHost, stop: CancellationToken) -> Result<Members, MemberError> {
        let members = Members {
            host,
            usage: UsageMeter::default(),
            data_dir: data_dir.to_path_buf(),
            slots: Arc::default(),
            readiness: Arc::default(),
            changed: Arc::default(),
            setups: Arc::default(),
            leads: Arc::default(),
            positions: Arc::default(),
            stood_down: Arc::default(),
            fencing: Arc::default(),
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
            if let Some(process) = launched.as_ref().and_then(|l| find_launched(l, record.cgroup.as_ref())) {
                tracing::info!(member = %name, instance = %process.instance_id, pid = process.pid, "found a member started just before the agent stopped");
                if record.process.is_some() {
                    record.restarts += 1;
                }
                record.process = Some(process);
            }
            let alive = record.process.as_ref().is_some_and(|p| procs::is_alive(p.pid, p.start_ticks));
            members.lock().insert(name.clone(), Slot { record: record.clone(), generation: 0 });
            // Not kept on a disk too full: the next agent run finds the
            // same run again.
            if launched.is_some()
                && let Err(error) = members.persist(&name)
            {
                tracing::warn!(member = %name, %error, "could not record the run found");
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
                    // It led when it went down: no lease of its holds now
                    // that this agent knows of, so it comes back demoted.
                    members.demote_if_leading(&record).await;
                    if let Err(error) = members.launch(&name) {
                        let delay = members.start_failed(&name, &error);
                        let (members, name) = (members.clone(), name.clone());
                        tokio::spawn(async move { members.start_again(&name, 0, delay).await });
                    }
                }
                (false, false) => {}
            }
        }
        Ok(members)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How members are kept to their limits here.
    pub fn isolation(&self) -> herd_core::api::IsolationReport {
        self.host.cgroups.report()
    }

    /// The program whose `log-writer` keeps members' output rotated, if
    /// any.
    pub fn log_writer(&self) -> Option<&Path> {
        self.host.log_writer.as_deref()
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
                cgroup: slots.get(member).and_then(|s| s.record.cgroup.clone()),
                oom_kill: slots.get(member).and_then(|s| s.record.oom_kill.clone()),
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
                    self.not_started(member, &lost.to_string())?;
                    return Err(lost);
                }
            }
        }
        let cgroup = match self.host.cgroups.member(member, &run.resources) {
            Ok(cgroup) => cgroup,
            Err(error) => {
                let why = error.to_string();
                self.not_started(member, &why)?;
                return Err(MemberError::NotStarted { member: member.into(), why });
            }
        };
        let oom_kills_before = cgroup.as_ref().and_then(MemberCgroup::oom_kills).unwrap_or(0);
        if let Some(slot) = self.lock().get_mut(member) {
            slot.record.cgroup = cgroup;
        }
        let record = self.record(member).ok_or(MemberError::Unknown(member.into()))?;
        let mut command = self.command(&record, &run.command[0], Some(&instance_id));
        command.args(&run.command[1..]);
        let rotation = run.logs.unwrap_or_default();
        let log = |name: &str| self.log_output(&dir.join(name), &rotation).map_err(io(format!("opening {name}")));
        command.stdout(log("stdout.log")?).stderr(log("stderr.log")?).kill_on_drop(false);
        let child = command.spawn().map_err(io(format!("starting {:?}", run.command[0])))?;
        let pid = child.id().unwrap_or_default();
        let process = Running {
            instance_id: instance_id.clone(),
            pid,
            start_ticks: procs::start_ticks(pid).unwrap_or_default(),
            started_at,
            oom_kills_before,
        };
        let generation = match self.record_run(member, &process) {
            Ok(generation) => generation,
            Err(error) => {
                // A run the agent cannot record is not one it keeps: its
                // node would run a member herd was told did not start
                // (a migration onto a full disk ran it on both nodes).
                let _ = procs::signal_group(pid, libc::SIGKILL);
                end_instance(&instance_id);
                return Err(error);
            }
        };
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

    /// Records `process` as the member's run, in memory and on disk; when
    /// it cannot be written, the record stays as it was. Returns the run's
    /// generation.
    fn record_run(&self, member: &str, process: &Running) -> Result<u64, MemberError> {
        let (before, generation) = {
            let mut slots = self.lock();
            let slot = slots.get_mut(member).ok_or(MemberError::Unknown(member.into()))?;
            let before = slot.record.clone();
            if slot.record.process.is_some() {
                slot.record.restarts += 1;
            }
            slot.record.process = Some(process.clone());
            slot.record.launching = None;
            slot.record.next_start = None;
            slot.generation += 1;
            (before, slot.generation)
        };
        if let Err(error) = self.persist(member) {
            // As if never started: a retry waiting on this generation goes on.
            if let Some(slot) = self.lock().get_mut(member).filter(|s| s.generation == generation) {
                slot.record =
                    MemberRecord { last_exit: Some(format!("not started: {error}")), launching: None, ..before };
                slot.generation -= 1;
            }
            return Err(error);
        }
        Ok(generation)
    }

    /// Where a stream of a member goes: a pipe to a `herd log-writer`
    /// that keeps `path` rotated (it ends once the last process that
    /// holds the pipe has, with all it was given written), or the file
    /// itself.
    fn log_output(&self, path: &Path, rotation: &LogRotation) -> std::io::Result<Stdio> {
        // Made here first: a disk too full to hold the file fails the
        // start, as it does without a writer.
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        let Some(program) = self.log_writer() else { return Ok(file.into()) };
        let (reader, writer) = std::io::pipe()?;
        let mut command = tokio::process::Command::new(program);
        command.arg("log-writer").arg("--path").arg(path);
        command.arg("--max-size").arg(rotation.max_size.to_string()).arg("--keep").arg(rotation.keep.to_string());
        command.env_clear().stdin(reader).stdout(Stdio::null()).stderr(Stdio::null()).process_group(0);
        // Not waited for: tokio reaps it once it ends.
        command.kill_on_drop(false).spawn()?;
        Ok(writer.into())
    }

    /// Records a run that could not be started, and why: its last exit
    /// says so.
    fn not_started(&self, member: &str, why: &str) -> Result<(), MemberError> {
        if let Some(slot) = self.lock().get_mut(member) {
            slot.record.last_exit = Some(format!("not started: {why}"));
            slot.record.launching = None;
        }
        self.persist(member)?;
        self.tell_changed();
        Ok(())
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
            procs::signal_run(process.pid, process.start_ticks, libc::SIGKILL).map_err(io)?;
        }
        end_instance(&process.instance_id);
        if let Some(slot) = self.lock().get_mut(member) {
            slot.record.last_exit = Some("stopped".into());
            slot.record.next_start = None;
        }
        tracing::info!(member, instance = %process.instance_id, "stopped a member");
        self.persist(member)
    }

    /// Forgets a member: stopped, its volumes, directory and record
    /// removed. Unknown members are not an error: forgetting is repeatable.
    pub async fn forget(&self, member: &str) -> Result<(), MemberError> {
        if let Some(record) = self.record(member) {
            self.stop(member).await?;
            if let Some(cgroup) = &record.cgroup {
                cgroup.remove().await;
            }
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
        self.note_oom_kills();
        let records: Vec<MemberRecord> = self.lock().values().map(|slot| slot.record.clone()).collect();
        let readiness = self.readiness.lock().unwrap_or_else(|p| p.into_inner()).clone();
        self.usage.keep_only(&records.iter().map(|r| r.name.as_str()).collect());
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
                    position: self.position_of(record),
                    demoted_in: self.demoted_in(record),
                    crash_loop: restarts::crash_loop(&restarts::Runs {
                        wanted: record.wanted,
                        short_runs: record.short_runs,
                        last_exit: record.last_exit.as_deref(),
                        next_start: record.next_start,
                        running_for: live.and(record.process.as_ref()).map(|p| p.started_at.age(crate::now())),
                    }),
                    lost_volumes: self.lost_volumes(record),
                    oom_kill: record.oom_kill.clone(),
                    usage: record.cgroup.as_ref().filter(|_| live.is_some()).map(|c| self.usage.read(&record.name, c)),
                }
            })
            .collect()
    }

    /// OOM kills in the cgroup of a member whose own process lives (the
    /// kernel took a child of it): recorded as its last OOM kill, and the
    /// count goes on from there (its run's end counts only later kills).
    fn note_oom_kills(&self) {
        let noted: Vec<String> = {
            let mut slots = self.lock();
            let mut noted = Vec::new();
            for (name, slot) in slots.iter_mut() {
                let record = &mut slot.record;
                let Some(kill) = oom_kill_of(record) else { continue };
                let Some(process) = record.process.as_mut().filter(|p| procs::is_alive(p.pid, p.start_ticks)) else {
                    continue;
                };
                process.oom_kills_before = record.cgroup.as_ref().and_then(MemberCgroup::oom_kills).unwrap_or(0);
                record.oom_kill = Some(OomKill { survived: true, ..kill });
                noted.push(name.clone());
            }
            noted
        };
        for member in noted {
            tracing::warn!(member, "a process of it was killed for want of memory; it runs on");
            if let Err(error) = self.persist(&member) {
                tracing::error!(member, %error, "could not record an OOM kill");
            }
            self.tell_changed();
        }
    }

    fn persist(&self, member: &str) -> Result<(), MemberError> {
        let Some(record) = self.record(member) else { return Ok(()) };
        let path = self.member_dir(member).join("member.json");
        let io =
            |source| MemberError::Io { member: member.into(), context: format!("writing {}", path.display()), source };
        std::fs::create_dir_all(self.member_dir(member)).map_err(io)?;
        let json = serde_json::to_vec_pretty(&record).expect("a member record always serialises");
        // What runs must be on record, on a full disk too.
        SpaceReserve::of(&self.data_dir).write_atomic(&path, &json, 0o644).map_err(io)
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

    /// The readiness verdict `member` has now, if any.
    pub fn readiness_of(&self, member: &str) -> Option<ReadinessReport> {
        self.readiness.lock().unwrap_or_else(|p| p.into_inner()).get(member).cloned()
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
}

/// The OOM kill that ended `record`'s current run, if its cgroup counted
/// one since the run started.
fn oom_kill_of(record: &MemberRecord) -> Option<OomKill> {
    let (cgroup, process) = (record.cgroup.as_ref()?, record.process.as_ref()?);
    (cgroup.oom_kills()? > process.oom_kills_before).then(|| OomKill {
        instance_id: process.instance_id.clone(),
        survived: false,
        at: crate::now(),
        limit: cgroup.memory_limit().map(Bytes),
        peak: cgroup.memory_peak().map(Bytes),
    })
}

/// The process of a run that was being started, if it runs: it leads its
/// own group and carries the run's instance id. Its cgroup's OOM kills
/// are counted from now (`cgroup`: the member's).
fn find_launched(launching: &Launching, cgroup: Option<&MemberCgroup>) -> Option<Running> {
    let pid = procs::find_group_leader_by_env("HERD_INSTANCE_ID", &launching.instance_id)?;
    Some(Running {
        instance_id: launching.instance_id.clone(),
        pid,
        start_ticks: procs::start_ticks(pid)?,
        started_at: launching.started_at,
        oom_kills_before: cgroup.and_then(MemberCgroup::oom_kills).unwrap_or(0),
    })
}

/// Ends the processes of every member recorded in `data_dir` (SIGTERM to
/// each group, SIGKILL after the grace period), as a host shutdown would,
/// leaving the records (their cgroups are removed, and made again): the
/// next agent start brings wanted members back with new instance ids. For `herd dev`, whose Ctrl-C stops everything it
/// started. Returns how many were running.
pub async fn stop_processes(data_dir: &Path) -> usize {
    let Ok(dirs) = std::fs::read_dir(data_dir.join("members")) else { return 0 };
    let running: Vec<Running> = dirs
        .flatten()
        .filter_map(|dir| std::fs::read(dir.path().join("member.json")).ok())
        .filter_map(|text| serde_json::from_slice::<MemberRecord>(&text).ok())
        .flat_map(|record| {
            let launched = record.launching.as_ref().and_then(|l| find_launched(l, record.cgroup.as_ref()));
            [record.process, launched]
        })
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
        let _ = procs::signal_run(process.pid, process.start_ticks, libc::SIGKILL);
        end_instance(&process.instance_id);
    }
    for dir in std::fs::read_dir(data_dir.join("members")).into_iter().flatten().flatten() {
        crate::setup::kill_setup(&dir.path());
    }
    // Made again with each member's next start.
    let dir = data_dir.to_path_buf();
    let _ = tokio::task::spawn_blocking(move || crate::cgroups::remove_left(&dir)).await;
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

#[cfg(test)]
mod tests;
