//! Members' cgroups: each member's processes (its own, its setup, scripts,
//! checks and hooks) run in a cgroup of its own, under a group of this
//! agent's (`herd-<node>-<data dir hash>`) beneath the agent's own cgroup,
//! limited as its role's resources say (`limits.rs`).
//!
//! The layout is detected at start (`layout.rs`): cgroup v2, or the v1
//! hierarchies. A host without usable cgroups runs members unlimited, and
//! the agent says so in its reports. A member's cgroup directories are
//! recorded with it, so that an agent that restarts finds them again; they
//! are removed when the member is forgotten. What the cgroup counts (OOM
//! kills, peak and current memory, CPU time) is read from its files.

mod layout;
mod limits;

use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use herd_core::api::{CgroupLayout, IsolationReport, MemberUsage};
use herd_core::quantity::{Bytes, Millicores};
use herd_core::resources::Resources;
use serde::{Deserialize, Serialize};

pub use layout::Layout;

/// In the data dir: the agent's group's directories (a JSON list), for
/// whoever cleans up after the agent.
pub const GROUPS_FILE: &str = "cgroups.json";

/// The controllers a v2 member cgroup needs enabled above it.
const UNIFIED_CONTROLLERS: &str = "+memory +cpu +pids";

#[derive(Debug, thiserror::Error)]
#[error("cgroup {path}: {context}: {source}")]
pub struct CgroupError {
    path: PathBuf,
    context: &'static str,
    source: std::io::Error,
}

fn failed(path: &Path, context: &'static str) -> impl FnOnce(std::io::Error) -> CgroupError {
    let path = path.to_path_buf();
    move |source| CgroupError { path, context, source }
}

/// What this agent can do with cgroups.
#[derive(Clone, Debug)]
pub struct Cgroups(Arc<State>);

#[derive(Debug)]
enum State {
    /// The agent's group's directory in each hierarchy.
    Available {
        layout: Layout,
        group: Vec<(&'static str, PathBuf)>,
    },
    Unavailable(String),
}

impl Cgroups {
    /// This host's layout, with the agent's group made beneath its own
    /// cgroup; unavailable (and why) when there is none or it cannot be
    /// written.
    pub fn detect(node: &str, data_dir: &Path) -> Cgroups {
        let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
        let controllers = |dir: &Path| std::fs::read_to_string(dir.join("cgroup.controllers")).ok();
        let found =
            layout::detect(Path::new("/"), &read("/proc/self/mountinfo"), &read("/proc/self/cgroup"), &controllers);
        let cgroups = match found {
            Ok(layout) => Cgroups::under(layout, &group_name(node, data_dir)),
            Err(why) => Cgroups::unavailable(why),
        };
        if let State::Available { group, .. } = &*cgroups.0 {
            let dirs: Vec<&Path> = group.iter().map(|(_, dir)| dir.as_path()).collect();
            let path = data_dir.join(GROUPS_FILE);
            let text = serde_json::to_vec_pretty(&dirs).unwrap_or_default();
            if let Err(error) = crate::fsutil::write_atomic(&path, &text, 0o644) {
                tracing::warn!(path = %path.display(), %error, "could not record where the agent's cgroups are");
            }
        }
        match &*cgroups.0 {
            State::Available { .. } => tracing::info!(cgroups = %cgroups.report().detail, "members run in cgroups"),
            State::Unavailable(why) => tracing::warn!(%why, "no cgroups: members run without limits"),
        }
        cgroups
    }

    /// Members run without limits, for `why`.
    pub fn unavailable(why: impl Into<String>) -> Cgroups {
        Cgroups(Arc::new(State::Unavailable(why.into())))
    }

    /// The agent's group `name` made in `layout`.
    fn under(layout: Layout, name: &str) -> Cgroups {
        let made = match &layout {
            Layout::Unified(own) => unified_group(own, name).map(|dir| vec![("unified", dir)]),
            // Made to see that it can be, and made again with the first
            // member's: an agent that runs none leaves no trace.
            Layout::Legacy(hierarchies) => hierarchies
                .iter()
                .map(|(controller, own)| {
                    let dir = own.join(name);
                    std::fs::create_dir_all(&dir).map_err(failed(&dir, "making the agent's group"))?;
                    let _ = std::fs::remove_dir(&dir);
                    Ok((*controller, dir))
                })
                .collect(),
        };
        match made {
            Ok(group) => Cgroups(Arc::new(State::Available { layout, group })),
            Err(error) => Cgroups::unavailable(error.to_string()),
        }
    }

    /// Removes the agent's group where no member's cgroup is left in it
    /// (the agent stops; its members' stay until they are forgotten).
    pub fn remove_empty_groups(&self) {
        if let State::Available { layout: Layout::Legacy(_), group } = &*self.0 {
            for (_, dir) in group {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }

    /// The layout, for the node's condition.
    pub fn report(&self) -> IsolationReport {
        match &*self.0 {
            State::Available { layout: Layout::Unified(_), group } => IsolationReport {
                layout: CgroupLayout::V2,
                detail: format!("cgroup v2: members under {}", group[0].1.display()),
            },
            State::Available { layout: Layout::Legacy(_), group } => {
                let controllers: Vec<&str> = group.iter().map(|(c, _)| *c).collect();
                let memory = group.iter().find(|(c, _)| *c == "memory").map(|(_, d)| d.display().to_string());
                IsolationReport {
                    layout: CgroupLayout::V1,
                    detail: format!(
                        "cgroup v1 ({}): members under {}",
                        controllers.join(", "),
                        memory.unwrap_or_default()
                    ),
                }
            }
            State::Unavailable(why) => IsolationReport { layout: CgroupLayout::None, detail: why.clone() },
        }
    }

    /// Member `member`'s cgroup, made if need be and set to `resources`
    /// (None: no cgroups here).
    pub fn member(&self, member: &str, resources: &Resources) -> Result<Option<MemberCgroup>, CgroupError> {
        let State::Available { layout, group } = &*self.0 else { return Ok(None) };
        let (unified, settings) = match layout {
            Layout::Unified(_) => (true, limits::unified(resources)),
            Layout::Legacy(_) => (false, limits::legacy(resources)),
        };
        let mut dirs: Vec<(String, PathBuf)> = Vec::new();
        for (controller, parent) in group {
            let dir = parent.join(member);
            std::fs::create_dir_all(&dir).map_err(failed(&dir, "making the member's cgroup"))?;
            dirs.push((controller.to_string(), dir));
        }
        let cgroup = MemberCgroup { unified, dirs };
        for setting in settings {
            if let Some(dir) = cgroup.dir(setting.controller) {
                let path = dir.join(setting.file);
                if setting.optional && !path.exists() {
                    continue;
                }
                write_value(&path, &setting.value).map_err(failed(&path, "setting a limit"))?;
            }
        }
        Ok(Some(cgroup))
    }
}

/// Removes the cgroups the agent of `data_dir` made (its members', then
/// its group, as `GROUPS_FILE` records them) once their processes are
/// gone, waiting a moment for processes just killed: for whoever ends an
/// agent's members for good (`herd dev` stopping, benchmarks, tests).
pub fn remove_left(data_dir: &Path) {
    let Ok(text) = std::fs::read(data_dir.join(GROUPS_FILE)) else { return };
    let Ok(groups) = serde_json::from_slice::<Vec<PathBuf>>(&text) else { return };
    for group in groups {
        let members = std::fs::read_dir(&group).into_iter().flatten().flatten().filter(|e| e.path().is_dir());
        for dir in members.map(|e| e.path()).chain([group.clone()]) {
            for _ in 0..100 {
                if std::fs::remove_dir(&dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
}

/// `herd-<node>-<hash>`: one per agent data dir, so that agents side by
/// side on one host (and one cgroup) never share one.
fn group_name(node: &str, data_dir: &Path) -> String {
    let hash = blake3::hash(data_dir.as_os_str().as_bytes()).to_hex();
    format!("herd-{node}-{}", &hash[..8])
}

/// The agent's v2 group beneath `own`, with the controllers members need
/// enabled down to it. A cgroup with processes cannot enable controllers
/// for its children: the agent moves itself into a leaf of its own first.
fn unified_group(own: &Path, name: &str) -> Result<PathBuf, CgroupError> {
    let control = own.join("cgroup.subtree_control");
    if write_value(&control, UNIFIED_CONTROLLERS).is_err() {
        let leaf = own.join(format!("{name}-agent"));
        std::fs::create_dir_all(&leaf).map_err(failed(&leaf, "making the agent's own leaf"))?;
        let procs = leaf.join("cgroup.procs");
        write_value(&procs, &std::process::id().to_string()).map_err(failed(&procs, "moving the agent"))?;
        write_value(&control, UNIFIED_CONTROLLERS).map_err(failed(&control, "enabling controllers"))?;
    }
    let group = own.join(name);
    std::fs::create_dir_all(&group).map_err(failed(&group, "making the agent's group"))?;
    let control = group.join("cgroup.subtree_control");
    write_value(&control, UNIFIED_CONTROLLERS).map_err(failed(&control, "enabling controllers"))?;
    Ok(group)
}

/// One write, as the kernel wants a cgroup file written. (A cgroup file
/// system makes no files: `create` only serves a fake tree.)
fn write_value(path: &Path, value: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new().write(true).truncate(true).create(true).open(path)?;
    file.write_all(value.as_bytes())
}

/// A member's cgroup: its directory in each hierarchy (one for v2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberCgroup {
    pub unified: bool,
    pub dirs: Vec<(String, PathBuf)>,
}

impl MemberCgroup {
    fn dir(&self, controller: &str) -> Option<&Path> {
        let wanted = if self.unified { "unified" } else { controller };
        self.dirs.iter().find(|(c, _)| c == wanted).map(|(_, d)| d.as_path())
    }

    /// Each directory once (co-mounted controllers share one).
    fn distinct_dirs(&self) -> Vec<&Path> {
        let mut dirs: Vec<&Path> = Vec::new();
        for (_, dir) in &self.dirs {
            if !dirs.contains(&dir.as_path()) {
                dirs.push(dir);
            }
        }
        dirs
    }

    /// Makes every process `command` starts join this cgroup before it
    /// runs its program: it cannot fork out of it first.
    pub fn join_on_exec(&self, command: &mut tokio::process::Command) {
        let files: Vec<std::ffi::CString> = self
            .distinct_dirs()
            .into_iter()
            .filter_map(|dir| std::ffi::CString::new(dir.join("cgroup.procs").as_os_str().as_bytes()).ok())
            .collect();
        // SAFETY: between fork and exec the closure only calls open,
        // write and close (async-signal-safe) on paths made beforehand.
        unsafe {
            command.pre_exec(move || {
                for file in &files {
                    let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    // `0`: the writing process.
                    let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                    let error = std::io::Error::last_os_error();
                    libc::close(fd);
                    if written != 1 {
                        return Err(error);
                    }
                }
                Ok(())
            });
        }
    }

    fn read(&self, controller: &str, file: &str) -> Option<String> {
        std::fs::read_to_string(self.dir(controller)?.join(file)).ok()
    }

    /// `key value` lines (memory.stat, memory.events, cpu.stat).
    fn keyed(&self, controller: &str, file: &str, key: &str) -> Option<u64> {
        let text = self.read(controller, file)?;
        text.lines().find_map(|line| line.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
    }

    fn number(&self, controller: &str, file: &str) -> Option<u64> {
        self.read(controller, file)?.trim().parse().ok()
    }

    /// How many of its processes the kernel killed for want of memory.
    pub fn oom_kills(&self) -> Option<u64> {
        match self.unified {
            true => self.keyed("memory", "memory.events", "oom_kill"),
            false => self.keyed("memory", "memory.oom_control", "oom_kill"),
        }
    }

    /// Its memory cap (None: none).
    pub fn memory_limit(&self) -> Option<u64> {
        match self.unified {
            true => self.number("memory", "memory.max"),
            // v1 writes "unlimited" as the largest page-aligned number.
            false => self.number("memory", "memory.limit_in_bytes").filter(|limit| *limit < 1 << 62),
        }
    }

    /// The most memory it used since its run started.
    pub fn memory_peak(&self) -> Option<u64> {
        match self.unified {
            true => self.number("memory", "memory.peak"),
            false => self.number("memory", "memory.max_usage_in_bytes"),
        }
    }

    /// Its working set now: what it uses less the page cache the kernel
    /// can drop at once (what Kubernetes reports and evicts by).
    pub fn memory_working_set(&self) -> Option<u64> {
        let (usage, inactive) = match self.unified {
            true => (self.number("memory", "memory.current")?, self.keyed("memory", "memory.stat", "inactive_file")),
            false => (
                self.number("memory", "memory.usage_in_bytes")?,
                self.keyed("memory", "memory.stat", "total_inactive_file"),
            ),
        };
        Some(usage.saturating_sub(inactive.unwrap_or(0)))
    }

    /// The CPU time its processes used, in nanoseconds.
    pub fn cpu_nanos(&self) -> Option<u64> {
        match self.unified {
            true => self.keyed("cpu", "cpu.stat", "usage_usec").map(|micros| micros * 1000),
            false => self.number("cpuacct", "cpuacct.usage"),
        }
    }

    /// Removes its directories; a process left in one is killed first.
    pub async fn remove(&self) {
        for dir in self.distinct_dirs() {
            for _ in 0..50 {
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => break,
                    Err(_) => {
                        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                        // Listed by the cgroup a moment ago, as
                        // `procs::kill_marked` finds its processes.
                        for pid in procs.lines().filter_map(|p| p.trim().parse::<libc::pid_t>().ok()) {
                            // SAFETY: kill(2) takes plain integers and touches no memory of ours.
                            unsafe { libc::kill(pid, libc::SIGKILL) };
                        }
                        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    }
                }
            }
        }
    }
}

/// CPU use as a rate: each member's CPU time when it was last read.
#[derive(Clone, Debug, Default)]
pub struct UsageMeter(Arc<std::sync::Mutex<std::collections::HashMap<String, Sample>>>);

#[derive(Clone, Copy, Debug)]
struct Sample {
    at: std::time::Instant,
    nanos: u64,
    rate: Option<Millicores>,
}

/// Less time between two reads than this, and the rate read before stands.
const MIN_SAMPLE_GAP: std::time::Duration = std::time::Duration::from_millis(500);

impl UsageMeter {
    /// What `member` uses now, read from `cgroup`.
    pub fn read(&self, member: &str, cgroup: &MemberCgroup) -> MemberUsage {
        let memory = cgroup.memory_working_set().map(Bytes);
        let Some(nanos) = cgroup.cpu_nanos() else { return MemberUsage { cpu: None, memory } };
        let now = std::time::Instant::now();
        let mut samples = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let before = samples.get(member).copied();
        if let Some(before) = before.filter(|b| now - b.at < MIN_SAMPLE_GAP) {
            return MemberUsage { cpu: before.rate, memory };
        }
        let rate = before.map(|before| {
            let elapsed = (now - before.at).as_nanos().max(1);
            let used = u128::from(nanos.saturating_sub(before.nanos));
            Millicores(u64::try_from(used * 1000 / elapsed).unwrap_or(u64::MAX))
        });
        samples.insert(member.to_string(), Sample { at: now, nanos, rate });
        MemberUsage { cpu: rate, memory }
    }

    /// Forgets the members not in `members`.
    pub fn keep_only(&self, members: &std::collections::BTreeSet<&str>) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).retain(|member, _| members.contains(member.as_str()));
    }
}

#[cfg(test)]
mod tests;
