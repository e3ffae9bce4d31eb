//! Child processes that `herd dev` starts: they die with it, and are
//! stopped politely (SIGTERM, then SIGKILL after a grace period).

use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// Starts `herd <args>` as a child that receives SIGKILL if this process
/// dies without stopping it.
pub fn spawn_self(args: &[String], env: &[(&str, String)]) -> std::io::Result<Child> {
    let exe = std::env::current_exe()?;
    let mut command = Command::new(exe);
    command.args(args).envs(env.iter().map(|(k, v)| (*k, v.as_str()))).stdin(Stdio::null()).kill_on_drop(true);
    // SAFETY: prctl is async-signal-safe; the closure touches nothing else.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.spawn()
}

/// SIGTERM, wait up to `grace`, then SIGKILL; always reaps the child.
pub async fn stop(child: &mut Child, grace: Duration) {
    if let Some(pid) = child.id() {
        // SAFETY: sending a signal to our own child, whose pid we hold.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGTERM);
        }
    }
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}
