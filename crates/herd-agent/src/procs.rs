//! Processes the agent may not be the parent of: liveness by pid and start
//! time (a recycled pid has another start time), signals to process
//! groups, finding a group leader by its environment, and ending a run
//! with everything it started.
//!
//! A process group is not enough to end a run: a program may leave it
//! (coreutils `timeout` makes a group of its own, `setsid` a session).
//! What it cannot leave is its environment, inherited by every process it
//! starts: each run the agent starts carries a mark there ([`RunMark`]),
//! and [`end_run`] kills the group and then every process with the mark.

/// The start time of process `pid` in clock ticks since boot, None when
/// it does not exist or is a zombie.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses; the
    // fields after it start at the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state); starttime is field 22.
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// Whether the process that had `start_ticks` when it started still runs.
pub fn is_alive(pid: u32, expected_start: u64) -> bool {
    start_ticks(pid) == Some(expected_start)
}

/// Sends `signal` to the group led by the run `pid` started as
/// `start_ticks`, only while that run lives: once it is gone its pid, and
/// so its group id, may be another process's (pids come round in minutes
/// on a busy host).
pub fn signal_run(pid: u32, start_ticks: u64, signal: i32) -> std::io::Result<()> {
    if is_alive(pid, start_ticks) { signal_group(pid, signal) } else { Ok(()) }
}

/// Sends `signal` to every process of the group led by `pid`.
pub fn signal_group(pid: u32, signal: i32) -> std::io::Result<()> {
    let Ok(pgid) = libc::pid_t::try_from(pid) else {
        return Err(std::io::Error::other(format!("pid {pid} out of range")));
    };
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    if unsafe { libc::kill(-pgid, signal) } == 0 {
        Ok(())
    } else {
        let error = std::io::Error::last_os_error();
        // The group is already gone: nothing to signal.
        if error.raw_os_error() == Some(libc::ESRCH) { Ok(()) } else { Err(error) }
    }
}

/// The process that leads its own process group and whose environment
/// holds `key=value`: how a member started just before its agent was
/// killed (and never recorded with its pid) is found again by its
/// instance id.
pub fn find_group_leader_by_env(key: &str, value: &str) -> Option<u32> {
    let wanted = format!("{key}={value}").into_bytes();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let environ = std::fs::read(entry.path().join("environ")).ok()?;
        if !environ.split(|b| *b == 0).any(|pair| pair == wanted.as_slice()) {
            return None;
        }
        // SAFETY: getpgid(2) takes an integer and touches no memory of ours.
        let leads = unsafe { libc::getpgid(libc::pid_t::try_from(pid).ok()?) } == libc::pid_t::try_from(pid).ok()?;
        (leads && start_ticks(pid).is_some()).then_some(pid)
    })
}

/// The environment variable a run's mark is kept in.
pub const RUN_VAR: &str = "HERD_RUN";

/// What every process of one run carries in its environment
/// (`HERD_RUN=<kind>/<id>`): a setup, a script, a readiness check, a
/// drain hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunMark(String);

impl RunMark {
    /// A fresh mark for a run of `kind` (`script`, `check`, `drain`).
    pub fn fresh(kind: &str) -> RunMark {
        RunMark(format!("{kind}/{}", uuid::Uuid::now_v7()))
    }

    /// The mark of the setup of `instance` (one at most per instance).
    pub fn setup_of(instance: &str) -> RunMark {
        RunMark(format!("setup/{instance}"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Ends a run: SIGKILL to its process group (led by `group`), then to
/// every process that carries its mark, wherever it went.
pub fn end_run(group: Option<u32>, mark: &RunMark) {
    if let Some(group) = group {
        let _ = signal_group(group, libc::SIGKILL);
    }
    let killed = kill_marked(RUN_VAR, mark.as_str());
    if killed > 0 {
        tracing::info!(run = mark.as_str(), killed, "ended processes a run left outside its process group");
    }
}

/// SIGKILLs every process (but this one) whose environment holds
/// `key=value`, looking again until none is left (one may have forked
/// meanwhile); returns how many were killed.
pub fn kill_marked(key: &str, value: &str) -> usize {
    let wanted = format!("{key}={value}").into_bytes();
    let me = std::process::id();
    let mut killed = 0;
    // A few rounds: a process forked between the look and the kill is
    // found by the next one; a fork bomb is not this function's to win.
    for _ in 0..4 {
        let found = marked(&wanted, me);
        if found.is_empty() {
            break;
        }
        for pid in found {
            let Ok(pid) = libc::pid_t::try_from(pid) else { continue };
            // SAFETY: kill(2) takes plain integers and touches no memory of ours.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                killed += 1;
            }
        }
    }
    killed
}

/// The live processes (not zombies, not `me`) whose environment holds
/// the `key=value` pair `wanted`.
fn marked(wanted: &[u8], me: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            if pid == me {
                return None;
            }
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            let carries = environ.split(|b| *b == 0).any(|pair| pair == wanted);
            (carries && start_ticks(pid).is_some()).then_some(pid)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_fake_start_time_is_not() {
        let me = std::process::id();
        let ticks = start_ticks(me).unwrap();
        assert!(is_alive(me, ticks));
        assert!(!is_alive(me, ticks + 1), "a recycled pid is told apart by its start time");
        assert_eq!(start_ticks(u32::MAX), None);
    }

    #[test]
    fn a_group_leader_is_found_by_its_environment() {
        use std::os::unix::process::CommandExt;
        let marker = uuid::Uuid::now_v7().to_string();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env("HERD_TEST_MARKER", &marker)
            .process_group(0)
            .spawn()
            .unwrap();
        // spawn returns while the child is still inside execve, before its
        // new environment is readable: look for a moment.
        let mut found = None;
        for _ in 0..200 {
            found = find_group_leader_by_env("HERD_TEST_MARKER", &marker);
            if found.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let other = find_group_leader_by_env("HERD_TEST_MARKER", "someone-else");
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(found, Some(child.id()));
        assert_eq!(other, None);
        assert_eq!(find_group_leader_by_env("HERD_TEST_MARKER", &marker), None, "a dead process is not found");
    }

    #[test]
    fn a_run_is_signalled_only_while_it_lives_never_a_pid_that_came_round() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sleep").arg("30").process_group(0).spawn().unwrap();
        let pid = child.id();
        let started = start_ticks(pid).unwrap();
        // Another run under the same pid (another start time): left alone.
        signal_run(pid, started + 1, libc::SIGKILL).unwrap();
        assert!(is_alive(pid, started), "a pid with another start time is not the run");
        signal_run(pid, started, libc::SIGKILL).unwrap();
        child.wait().unwrap();
        assert!(!is_alive(pid, started));
        signal_run(pid, started, libc::SIGKILL).unwrap();
    }

    #[test]
    fn ending_a_run_kills_what_left_its_process_group() {
        use std::os::unix::process::CommandExt;
        let mark = RunMark::fresh("test");
        // The leader starts a `timeout` (a process group of its own) and a
        // `setsid` child (a session of its own), then waits.
        let mut leader = std::process::Command::new("sh")
            .args(["-c", "timeout 60 sleep 60 & setsid sleep 60 & wait"])
            .env(RUN_VAR, mark.as_str())
            .process_group(0)
            .spawn()
            .unwrap();
        let wanted = format!("{RUN_VAR}={}", mark.as_str()).into_bytes();
        let mut seen = 0;
        for _ in 0..200 {
            seen = marked(&wanted, std::process::id()).len();
            if seen >= 4 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(seen >= 4, "sh, timeout, its sleep and the setsid sleep carry the mark ({seen})");
        end_run(Some(leader.id()), &mark);
        leader.wait().unwrap();
        let mut left = usize::MAX;
        for _ in 0..200 {
            left = marked(&wanted, std::process::id()).len();
            if left == 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(left, 0, "nothing of the run is left");
    }
}
