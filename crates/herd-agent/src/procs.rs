//! Processes the agent may not be the parent of: liveness by pid and start
//! time (a recycled pid has another start time), and signals to process
//! groups.

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
}
