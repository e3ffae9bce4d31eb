//! An app-cluster member's herd volume: its configmeta (as JSON and as
//! shell variables), its App's setup
//! script, and the setup run whose outcome outlives the agent and is
//! reported with the member.
//!
//! `setup.sh --configure` is launched detached, in a process group of its
//! own, by a small shell wrapper that writes `setup.status`: the agent
//! writes `<instance>=` before the launch, the wrapper `<instance>=<exit
//! code>` at the end. An agent that restarts meanwhile finds the file as
//! the run left it. The run belongs to its member's instance: when that
//! process ends, the agent kills the setup's group (`setup.pid`), so a
//! setup interrupted by a member restart leaves `<old instance>=` behind
//! and the server sets the new instance up again.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use herd_core::configmeta::ConfigMeta;
use herd_core::kinds::app::HERD_VOLUME;
use herd_core::setup_status::{launched, status_instance};

use crate::fsutil::write_atomic;
use crate::members::{MemberRecord, Members};
use crate::procs;

pub const CONFIGMETA: &str = "configmeta.json";
pub const CONFIGMETA_SH: &str = "configmeta.sh";
const SCRIPT: &str = "setup.sh";
const STATUS: &str = "setup.status";
const STDERR: &str = "setup.err";
const STDOUT: &str = "setup.out";
/// In the member's directory (not its volume): the setup run's group.
const PID_FILE: &str = "setup.pid";
/// How much of a failed setup's standard error is reported.
const STDERR_TAIL: u64 = 2048;

/// The wrapper that runs the setup and records its exit code. `$1` is the
/// herd volume, `$2` the timeout in seconds.
const WRAPPER: &str = r#"dir="$1"
timeout -k 5 "$2" sh "$dir/setup.sh" --configure >"$dir/setup.out" 2>"$dir/setup.err" </dev/null
code=$?
if [ "$code" = 124 ]; then echo "setup timed out after $2 s" >>"$dir/setup.err"; fi
printf '%s=%s\n' "$HERD_INSTANCE_ID" "$code" >"$dir/setup.status.tmp" && mv -f "$dir/setup.status.tmp" "$dir/setup.status"
"#;

/// What a ConfigureMember asks for.
pub struct Configure<'a> {
    pub configmeta: &'a str,
    pub setup_script: Option<&'a str>,
    pub run_setup: bool,
    pub setup_timeout_secs: u64,
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
        write_atomic(&dir.join(name), text.as_bytes(), mode).map_err(|e| format!("writing {name}: {e}"))
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
    kill_setup(&members.member_dir(member));
    write(STATUS, &launched(instance), 0o644)?;
    let mut command = std::process::Command::new("sh");
    command.arg("-c").arg(WRAPPER).arg("herd-setup").arg(&dir).arg(request.setup_timeout_secs.max(1).to_string());
    command.current_dir(members.member_dir(member)).envs(&record.run.env).envs(members.member_env(record));
    command.env("HERD_INSTANCE_ID", instance);
    command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).process_group(0);
    let mut child = command.spawn().map_err(|e| format!("launching the setup: {e}"))?;
    let pid = child.id();
    let ticks = procs::start_ticks(pid).unwrap_or_default();
    let pid_file = members.member_dir(member).join(PID_FILE);
    write_atomic(&pid_file, format!("{pid} {ticks}").as_bytes(), 0o644)
        .map_err(|e| format!("writing {}: {e}", pid_file.display()))?;
    // Reaped here while the agent lives (by init once it is gone); its end
    // is reported at once, not at the next look at the status files.
    let members = members.clone();
    std::thread::spawn(move || {
        let _ = child.wait();
        members.tell_changed();
    });
    tracing::info!(member, instance, pid, "launched a member's setup");
    Ok(format!("the setup of member {member} as {instance} was launched (pid {pid})"))
}

/// Kills the setup run recorded in `member_dir`, if it still runs.
pub fn kill_setup(member_dir: &Path) {
    let Ok(text) = std::fs::read_to_string(member_dir.join(PID_FILE)) else { return };
    let mut parts = text.split_whitespace().map(str::parse::<u64>);
    if let (Some(Ok(pid)), Some(Ok(ticks))) = (parts.next(), parts.next())
        && let Ok(pid) = u32::try_from(pid)
        && procs::is_alive(pid, ticks)
    {
        let _ = procs::signal_group(pid, libc::SIGKILL);
        tracing::info!(pid, dir = %member_dir.display(), "killed a setup run: its member's process ended");
    }
    let _ = std::fs::remove_file(member_dir.join(PID_FILE));
}

fn read_status(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(STATUS)).ok()?;
    Some(text.trim().chars().take(256).collect())
}

/// What the heartbeat reports of a member's setup: its status file, and
/// the tail of its standard error once it failed.
pub fn report(members: &Members, record: &MemberRecord) -> (Option<String>, Option<String>) {
    let Some(dir) = herd_volume(members, record) else { return (None, None) };
    let status = read_status(&dir);
    let failed = status.as_deref().and_then(|s| s.rsplit_once('=')).is_some_and(|(_, code)| !matches!(code, "" | "0"));
    let stderr = failed.then(|| tail(&dir.join(STDERR), STDERR_TAIL)).flatten();
    (status, stderr)
}

fn tail(path: &Path, bytes: u64) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path).ok()?;
    let length = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(length.saturating_sub(bytes))).ok()?;
    let mut text = Vec::new();
    file.read_to_end(&mut text).ok()?;
    Some(String::from_utf8_lossy(&text).into_owned())
}

/// The setup's output, for `herd logs member/NAME --setup`.
pub fn output(members: &Members, record: &MemberRecord) -> Option<String> {
    let dir = herd_volume(members, record)?;
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    let status = read_status(&dir).unwrap_or_else(|| "(no setup run)".into());
    Some(format!("# status: {status}\n# stdout\n{}# stderr\n{}", read(STDOUT), read(STDERR)))
}
