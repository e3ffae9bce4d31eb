//! An app-cluster member's herd volume: its configmeta (as JSON and as
//! shell variables), its App's setup script, and the setup run whose
//! outcome outlives the agent and is reported with the member.
//!
//! `setup.sh --configure` runs detached, in a process group of its own,
//! under a small shell wrapper (no `timeout`: a program that makes a
//! process group of its own would escape the run's). `setup.status` says
//! how it went (`herd_core::setup_status`), and only the agent writes it:
//! `<instance>=` before the launch, `<instance>=<exit code>` at the end
//! (the wrapper's exit code, which it reaps while it lives, or the one
//! the wrapper recorded in `setup.result` for an agent that was not
//! there), with why when the volume was full (the agent's space reserve
//! gives the line room); its output files get space
//! reserved before it starts, so that what it says on a full volume
//! lands too, and are kept rotated as the member's own logs are (by
//! writers the wrapper runs, which end before it records the exit, so
//! a failure's detail quotes all it said). The agent enforces the
//! timeout itself (`setup.run.json` in the member's directory keeps the
//! deadline and the run's process, so a restarted agent goes on
//! enforcing it), and answers a run that is gone without a status. Every
//! process of the run carries its mark (`HERD_RUN=setup/<instance>`) and
//! ends with it: at its end, at its timeout, and when its member's
//! instance ends (a setup interrupted by a member restart leaves
//! `<old instance>=` behind and the server sets the new instance up
//! again).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use herd_core::Timestamp;
use herd_core::configmeta::ConfigMeta;
use herd_core::kinds::app::HERD_VOLUME;
use herd_core::setup_status::{
    SetupOutcome, ended, ended_without_code, finished, finished_noted, launched, setup_outcome, status_instance,
};
use herd_core::units::human_bytes;
use serde::{Deserialize, Serialize};

use crate::fsutil::{SpaceReserve, disk_space, is_disk_full, write_atomic};
use crate::members::{MemberRecord, Members};
use crate::procs::{self, RunMark};

pub const CONFIGMETA: &str = "configmeta.json";
pub const CONFIGMETA_SH: &str = "configmeta.sh";
const SCRIPT: &str = "setup.sh";
const STATUS: &str = "setup.status";
const STDERR: &str = "setup.err";
const STDOUT: &str = "setup.out";
/// In the member's directory (not its volume): the run in flight.
const RUN_FILE: &str = "setup.run.json";
/// How much of a failed setup's standard error is reported.
const STDERR_TAIL: u64 = 2048;
/// Below this much free space, a run that left no status is said to have
/// found its volume full.
const FULL: u64 = 64 << 10;

/// Space held for each of a setup's output files before it starts: what
/// it writes when its volume is full still lands (a setup that fills its
/// volume says why it failed).
const LOG_RESERVE: i64 = 64 << 10;

/// Where the wrapper records the setup's exit code, for an agent that was
/// not there to reap it (the agent alone writes `setup.status`).
const RESULT: &str = "setup.result";

/// The wrapper that runs the setup and records its exit code. `$1` is the
/// herd volume, `$2` the member's directory, `$3` the program whose
/// `log-writer` keeps each output file rotated (empty: none), the rest
/// the rotation's options. The writers are the wrapper's own children,
/// fed through named pipes in the member's directory: they belong to the
/// run (its mark, group and cgroup) and outlive the agent with it, and
/// the wrapper ends only once they have written everything (given 2 s: a
/// process the setup left holding its output is ended with the run).
/// Without them (or without a pipe) the output is appended to the files
/// straight. Either way it lands in files the agent emptied and reserved
/// space in (a truncating `>` would give the space back).
const WRAPPER: &str = r#"dir="$1"; pipes="$2"; writer="$3"; shift 3
out="$pipes/setup.out.pipe"; err="$pipes/setup.err.pipe"
if [ -n "$writer" ] && rm -f "$out" "$err" && mkfifo -m 600 "$out" "$err"; then
  "$writer" log-writer --path "$dir/setup.out" "$@" <"$out" & o=$!
  "$writer" log-writer --path "$dir/setup.err" "$@" <"$err" & e=$!
  sh "$dir/setup.sh" --configure >"$out" 2>"$err" </dev/null
  code=$?
  (sleep 2; kill -9 "$o" "$e") 2>/dev/null & late=$!
  wait "$o" "$e"
  kill "$late" 2>/dev/null
  rm -f "$out" "$err"
else
  sh "$dir/setup.sh" --configure >>"$dir/setup.out" 2>>"$dir/setup.err" </dev/null
  code=$?
fi
printf '%s=%s\n' "$HERD_INSTANCE_ID" "$code" >"$dir/setup.result.tmp" && mv -f "$dir/setup.result.tmp" "$dir/setup.result"
exit "$code"
"#;

/// What a ConfigureMember asks for.
pub struct Configure<'a> {
    pub configmeta: &'a str,
    pub setup_script: Option<&'a str>,
    pub run_setup: bool,
    pub setup_timeout_secs: u64,
}

/// A setup run in flight, as `setup.run.json` keeps it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SetupRun {
    instance: String,
    timeout_secs: u64,
    deadline: Timestamp,
    /// The wrapper (None while it is being started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    start_ticks: Option<u64>,
}

impl SetupRun {
    fn mark(&self) -> RunMark {
        RunMark::setup_of(&self.instance)
    }

    /// Whether its wrapper still runs: by pid and start time, or, when the
    /// agent stopped before recording them, by its mark.
    fn alive(&mut self) -> bool {
        if let (Some(pid), Some(ticks)) = (self.pid, self.start_ticks) {
            return procs::is_alive(pid, ticks);
        }
        let Some(pid) = procs::find_group_leader_by_env(procs::RUN_VAR, self.mark().as_str()) else { return false };
        self.pid = Some(pid);
        self.start_ticks = procs::start_ticks(pid);
        self.start_ticks.is_some()
    }
}

/// How a run ended.
enum End {
    /// Its wrapper exited with this code (None: a signal ended it).
    Exited(Option<i32>),
    /// Its deadline passed.
    TimedOut,
    /// It is gone, and no one saw it end (an agent restarted meanwhile):
    /// its wrapper's `setup.result` says how, if it could write it.
    Gone,
}

/// The member's herd volume, when it has one.
pub fn herd_volume(members: &Members, record: &MemberRecord) -> Option<PathBuf> {
    record.run.volumes.iter().any(|v| v.name == HERD_VOLUME).then(|| members.volume_dir(&record.name, HERD_VOLUME))
}

/// Writes the configmeta and script and, when asked, launches the setup
/// for `instance` unless its status file shows it was launched already.
/// Returns what the answer says.
pub fn configure(
    members: &Members,
    record: &MemberRecord,
    instance: &str,
    request: &Configure<'_>,
) -> Result<String, String> {
    let member = &record.name;
    let dir = herd_volume(members, record)
        .ok_or_else(|| format!("member {member} has no {HERD_VOLUME:?} volume: it is not an app-cluster member"))?;
    let write = |name: &str, text: &str, mode: u32| {
        write_atomic(&dir.join(name), text.as_bytes(), mode).map_err(|e| written(members, name, &e))
    };
    let meta: ConfigMeta =
        serde_json::from_str(request.configmeta).map_err(|e| format!("the configmeta does not read: {e}"))?;
    write(CONFIGMETA_SH, &meta.to_shell(), 0o644)?;
    // Sent compact; written indented, for the people who read it.
    let pretty = serde_json::to_string_pretty(&meta).map_err(|e| format!("writing {CONFIGMETA}: {e}"))?;
    write(CONFIGMETA, &pretty, 0o644)?;
    if let Some(script) = request.setup_script {
        write(SCRIPT, script, 0o755)?;
    }
    if !request.run_setup {
        return Ok(format!("member {member} has its configmeta"));
    }
    if request.setup_script.is_none() {
        return Err("runSetup needs a setupScript".into());
    }
    let status = read_status(&dir);
    if status_instance(status.as_deref()) == Some(instance) {
        return Ok(format!("the setup of member {member} as {instance} was launched already ({:?})", status));
    }
    let member_dir = members.member_dir(member);
    // An earlier run, or one of this instance that an agent killed at the
    // wrong moment never recorded, ends first.
    kill_setup(&member_dir);
    procs::end_run(None, &RunMark::setup_of(instance));
    let supervised = members.supervise_setup(member);
    let timeout_secs = request.setup_timeout_secs.max(1);
    let mut run = SetupRun {
        instance: instance.to_string(),
        timeout_secs,
        deadline: crate::now().plus(Duration::from_secs(timeout_secs)),
        pid: None,
        start_ticks: None,
    };
    // The run is recorded before the status says launched: a restarted
    // agent that finds the one finds the other.
    write_run(&member_dir, &run)?;
    for log in [STDOUT, STDERR] {
        let path = dir.join(log);
        crate::member_logs::forget_rotated(&path).map_err(|e| written(members, log, &e))?;
        reserve_log(&path).map_err(|e| written(members, log, &e))?;
    }
    let reserve = SpaceReserve::of(members.data_dir());
    reserve
        .write_atomic(&dir.join(STATUS), launched(instance).as_bytes(), 0o644)
        .map_err(|e| written(members, STATUS, &e))?;
    let mut command = members.command(record, "sh", Some(instance));
    let rotation = record.run.logs.unwrap_or_default();
    command.arg("-c").arg(WRAPPER).arg("herd-setup").arg(&dir).arg(&member_dir);
    command.arg(members.log_writer().map(Path::as_os_str).unwrap_or_default());
    command.arg("--max-size").arg(rotation.max_size.to_string()).arg("--keep").arg(rotation.keep.to_string());
    command.env(procs::RUN_VAR, run.mark().as_str());
    command.stdout(Stdio::null()).stderr(Stdio::null()).kill_on_drop(false);
    let child = command.spawn().map_err(|e| format!("launching the setup: {e}"))?;
    let pid = child.id().unwrap_or_default();
    run.pid = Some(pid);
    run.start_ticks = procs::start_ticks(pid);
    // It runs whatever comes of this write: the answer says so. A record
    // left without its pid is known by the run's mark (`SetupRun::alive`).
    if let Err(error) = write_run(&member_dir, &run) {
        tracing::warn!(member, %error, "could not record the setup's pid; it is known by its mark");
    }
    let members = members.clone();
    let name = member.clone();
    tokio::spawn(async move {
        let _supervised = supervised;
        let left = run.deadline.system_time().duration_since(std::time::SystemTime::now()).unwrap_or_default();
        let mut child = child;
        let end = tokio::select! {
            // The agent stops: the run goes on, and the next agent run
            // enforces its deadline.
            _ = members.stopping() => return,
            status = child.wait() => End::Exited(status.ok().and_then(|s| s.code())),
            _ = tokio::time::sleep(left) => End::TimedOut,
        };
        finish(&members, &name, &run, end);
    });
    tracing::info!(member, instance, pid, "launched a member's setup");
    Ok(format!("the setup of member {member} as {instance} was launched (pid {pid})"))
}

/// Looks at the setup run of `record` that no task of this agent
/// supervises (one an earlier agent run launched): it is ended at its
/// deadline, and one that is gone without a status is answered.
pub fn look(members: &Members, record: &MemberRecord) {
    let member_dir = members.member_dir(&record.name);
    let Some(mut run) = read_run(&member_dir) else { return };
    if members.setup_supervised(&record.name) {
        return;
    }
    let alive = run.alive();
    if alive && crate::now() < run.deadline {
        return;
    }
    finish(members, &record.name, &run, if alive { End::TimedOut } else { End::Gone });
}

/// A run ended: whatever it started ends too, and the status file records
/// how (the agent is its only writer): the exit code, with why when the
/// volume was full at the end; a signal; the timeout; or, for a run no one
/// saw end, the code its wrapper recorded, else that it left none.
fn finish(members: &Members, member: &str, run: &SetupRun, end: End) {
    procs::end_run(run.pid, &run.mark());
    // A run the agent ended itself (its member's instance ended) has no
    // run file any more: its status stays `<instance>=`, interrupted. One
    // recorded without its pid (the agent that launched it stopped first)
    // is this run when it is of this instance: `run` has the pid its mark
    // found.
    let member_dir = members.member_dir(member);
    let this_run =
        |current: SetupRun| current.instance == run.instance && current.pid.is_none_or(|pid| run.pid == Some(pid));
    if !read_run(&member_dir).is_some_and(this_run) {
        return;
    }
    let Some(record) = members.record(member) else { return };
    let Some(dir) = herd_volume(members, &record) else { return };
    let status = read_status(&dir);
    let recorded = std::fs::read_to_string(dir.join(RESULT)).ok();
    let full = full_volume(&dir);
    let with_full = |code: i32| match (&full, code) {
        (Some(full), code) if code != 0 => finished_noted(&run.instance, code, full),
        _ => finished(&run.instance, code),
    };
    let line = match end {
        // Ended by the agent (a restart of its member, a removal) meanwhile.
        _ if status_instance(status.as_deref()) != Some(run.instance.as_str()) => None,
        _ if ended(status.as_deref(), &run.instance) => None,
        End::Exited(Some(code)) => Some(with_full(code)),
        End::Exited(None) => Some(ended_without_code(&run.instance, "killed by a signal")),
        End::TimedOut => Some(ended_without_code(
            &run.instance,
            &format!("timed out after {} s; killed with everything it started", run.timeout_secs),
        )),
        End::Gone => match recorded.as_deref().and_then(|r| recorded_code(r, &run.instance)) {
            Some(code) => Some(with_full(code)),
            None => {
                let why = "it ended without recording its exit status";
                Some(ended_without_code(
                    &run.instance,
                    &match &full {
                        Some(full) => format!("{why}: {full}"),
                        None => why.to_string(),
                    },
                ))
            }
        },
    };
    if let Some(line) = line {
        let reserve = SpaceReserve::of(members.data_dir());
        match reserve.write_atomic(&dir.join(STATUS), line.as_bytes(), 0o644) {
            Ok(()) => tracing::info!(member, status = line.trim(), "recorded how a setup ended"),
            Err(error) => tracing::error!(member, %error, status = line.trim(), "could not record how a setup ended"),
        }
        reserve.take();
    }
    let _ = std::fs::remove_file(dir.join(RESULT));
    let _ = std::fs::remove_file(member_dir.join(RUN_FILE));
    members.tell_changed();
}

/// The exit code a wrapper recorded for `instance` (`<instance>=<code>`).
fn recorded_code(text: &str, instance: &str) -> Option<i32> {
    let (of, code) = text.trim().split_once('=')?;
    (of == instance).then(|| code.trim().parse().ok()).flatten()
}

/// Empties a setup's output file and holds [`LOG_RESERVE`] of real blocks
/// for it past its end (`FALLOC_FL_KEEP_SIZE`: its length stays 0), which
/// its appends use first. A file system that cannot reserve gets none,
/// and the output is written as space allows.
fn reserve_log(path: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).open(path)?;
    // SAFETY: fallocate(2) on a file descriptor this function owns, with plain integers.
    let reserved = unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, 0, LOG_RESERVE) };
    if reserved != 0 {
        let error = std::io::Error::last_os_error();
        if is_disk_full(&error) {
            return Err(error);
        }
        tracing::debug!(path = %path.display(), %error, "could not reserve space for a setup's output");
    }
    Ok(())
}

/// "no space left on the member's volume (12 kB free)" when it is full.
fn full_volume(dir: &Path) -> Option<String> {
    let (free, _) = disk_space(dir).ok()?;
    (free < FULL).then(|| format!("no space left on the member's volume ({} free)", human_bytes(free)))
}

/// Why writing `name` into a member's herd volume failed.
fn written(members: &Members, name: &str, error: &std::io::Error) -> String {
    if is_disk_full(error) {
        let free = disk_space(members.data_dir()).map(|(free, _)| human_bytes(free)).unwrap_or_default();
        format!("writing {name}: no space left on the member's volume ({free} free)")
    } else {
        format!("writing {name}: {error}")
    }
}

fn write_run(member_dir: &Path, run: &SetupRun) -> Result<(), String> {
    let path = member_dir.join(RUN_FILE);
    let json = serde_json::to_vec(run).map_err(|e| e.to_string())?;
    write_atomic(&path, &json, 0o644).map_err(|e| format!("writing {}: {e}", path.display()))
}

fn read_run(member_dir: &Path) -> Option<SetupRun> {
    serde_json::from_slice(&std::fs::read(member_dir.join(RUN_FILE)).ok()?).ok()
}

/// Ends the setup run recorded in `member_dir`, and everything it
/// started, if it still runs.
pub fn kill_setup(member_dir: &Path) {
    let Some(mut run) = read_run(member_dir) else { return };
    // The file goes first: the task that supervises the run then knows
    // its end was the agent's doing, not the run's.
    let _ = std::fs::remove_file(member_dir.join(RUN_FILE));
    if run.alive() {
        tracing::info!(pid = ?run.pid, dir = %member_dir.display(), "ending a setup run: its member's instance ended");
    }
    procs::end_run(run.pid, &run.mark());
}

fn read_status(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(STATUS)).ok()?;
    Some(text.trim().chars().take(512).collect())
}

/// What the heartbeat reports of a member's setup: its status file, and
/// the tail of its standard error once it failed.
pub fn report(members: &Members, record: &MemberRecord) -> (Option<String>, Option<String>) {
    let Some(dir) = herd_volume(members, record) else { return (None, None) };
    let status = read_status(&dir);
    let instance = status_instance(status.as_deref()).unwrap_or_default();
    let failed = ended(status.as_deref(), instance)
        && !matches!(setup_outcome(status.as_deref(), instance), SetupOutcome::Succeeded);
    let stderr = failed.then(|| last_of(&dir.join(STDERR), STDERR_TAIL)).flatten().map(|(_, text)| text);
    (status, stderr)
}

/// The last `most` bytes of a setup's output stream, across its rotated
/// files, and where in the stream they begin.
fn last_of(path: &Path, most: u64) -> Option<(u64, String)> {
    let (start, bytes) = crate::member_logs::read_window(path, None, most).ok()??;
    Some((start, String::from_utf8_lossy(&bytes).into_owned()))
}

/// The setup's output, for `herd logs member/NAME --setup`: its status
/// and the last bytes of each stream, in about `most` bytes in all.
pub fn output(members: &Members, record: &MemberRecord, most: u64) -> Option<String> {
    let dir = herd_volume(members, record)?;
    // The status line is at most 512 bytes; the headers are short.
    let each = most.saturating_sub(1024) / 2;
    let read = |name: &str| {
        let (start, mut text) = last_of(&dir.join(name), each).unwrap_or_default();
        // The next header on a line of its own.
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        match start {
            0 => format!("\n{text}"),
            start => format!(" (from byte {start}: what came before is not shown)\n{text}"),
        }
    };
    let status = read_status(&dir).unwrap_or_else(|| "(no setup run)".into());
    Some(format!("# status: {status}\n# stdout{}# stderr{}", read(STDOUT), read(STDERR)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::members::MemberHost;
    use herd_core::kinds::command::VolumeSpec;
    use herd_core::kinds::member_run::MemberRun;
    use std::os::unix::process::{CommandExt, ExitStatusExt};

    #[tokio::test]
    async fn a_run_whose_launcher_stopped_before_recording_its_pid_is_timed_out_by_the_next_agent() {
        let dir = tempfile::tempdir().unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let _stop = stop.clone().drop_guard();
        let members = Members::open(dir.path(), MemberHost::bare("not in this test"), stop).await.unwrap();
        let run = MemberRun {
            command: vec!["sleep".into(), "60".into()],
            volumes: vec![VolumeSpec { name: HERD_VOLUME.into(), persistent: true }],
            ..Default::default()
        };
        let instance = members.start("m1", run).await.unwrap();
        let record = members.record("m1").unwrap();
        let volume = herd_volume(&members, &record).unwrap();
        std::fs::create_dir_all(&volume).unwrap();
        std::fs::write(volume.join(STATUS), launched(&instance)).unwrap();
        // The agent stopped between the launch and recording its pid; the
        // run's deadline has passed since.
        let past = SetupRun {
            instance: instance.clone(),
            timeout_secs: 1,
            deadline: crate::now(),
            pid: None,
            start_ticks: None,
        };
        write_run(&members.member_dir("m1"), &past).unwrap();
        let mut wrapper = std::process::Command::new("sleep");
        wrapper.arg("60").env(procs::RUN_VAR, past.mark().as_str()).process_group(0);
        let mut wrapper = wrapper.spawn().unwrap();

        look(&members, &record);
        let status = read_status(&volume).unwrap();
        assert_eq!(
            status,
            ended_without_code(&instance, "timed out after 1 s; killed with everything it started").trim()
        );
        assert!(wrapper.wait().unwrap().signal().is_some(), "ended");
        members.stop("m1").await.unwrap();
    }
}
